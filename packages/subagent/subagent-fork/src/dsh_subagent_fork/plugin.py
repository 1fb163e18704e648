"""The ``dsh`` entry point of dsh-subagent-fork."""

from __future__ import annotations

from dsh_core import PluginSpec, hookimpl

__all__ = ["dsh_plugins"]


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The plugins dsh-subagent-fork can mount: none yet (a placeholder)."""
    return []
