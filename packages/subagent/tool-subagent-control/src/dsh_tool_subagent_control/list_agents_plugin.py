"""The ``tool-subagent-list-agents`` entry point of dsh-tool-subagent-control: ``list_agents``,
loadable apart from ``send_message`` and ``interrupt_agent``."""

from __future__ import annotations

from dsh_core import PluginSpec, hookimpl

__all__ = ["dsh_plugins"]


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The plugins this entry point can mount: none yet (a placeholder)."""
    return []
