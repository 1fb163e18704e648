"""The ``dsh`` entry point of dsh-tool-subagent."""

from __future__ import annotations

from dsh_core import PluginSpec, hookimpl

__all__ = ["dsh_plugins"]


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The plugins dsh-tool-subagent can mount: none yet (a placeholder)."""
    return []
