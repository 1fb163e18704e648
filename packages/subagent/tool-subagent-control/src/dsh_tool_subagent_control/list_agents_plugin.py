"""The ``tool-subagent-list-agents`` entry point: ``list_agents``, loadable apart from
``send_message`` and ``interrupt_agent``.

Plugin ``tool-subagent-list-agents`` (no config) needs ``tools``, ``subagents`` and ``agents``
(the live registry gives each row its status) and registers ``list_agents`` once, globally
(CTL-4, CTL-5).
"""

from __future__ import annotations

from dsh_core import Context, PluginSpec, hookimpl

from ._listing import install_list_agents

__all__ = ["dsh_plugins"]


def _apply(ctx: Context, _: None) -> None:
    install_list_agents(ctx)


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The ``tool-subagent-list-agents`` plugin."""
    return [
        PluginSpec(
            name="tool-subagent-list-agents",
            apply=_apply,
            requires=("tools", "subagents", "agents"),
            description="the model's list_agents tool",
        )
    ]
