"""The ``core`` entry point of dsh-core: the host's own plugins, registered like any other."""

from __future__ import annotations

from ._plugins import PluginSpec, hookimpl

__all__ = ["dsh_plugins"]


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The host plugins dsh-core can mount."""
    return []
