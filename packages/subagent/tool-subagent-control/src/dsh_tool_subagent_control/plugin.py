"""The ``tool-subagent-control`` entry point: ``send_message`` and ``interrupt_agent``.

Plugin ``tool-subagent-control`` (no config) needs ``tools`` and ``subagents`` and registers
both tools once, globally (CTL-1..3). ``list_agents`` is a plugin of its own, in
:mod:`dsh_tool_subagent_control.list_agents_plugin`, so either loads without the other.
"""

from __future__ import annotations

from dsh_core import Context, PluginSpec, hookimpl

from ._control import install_control_tools

__all__ = ["dsh_plugins"]


def _apply(ctx: Context, _: None) -> None:
    install_control_tools(ctx)


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The ``tool-subagent-control`` plugin."""
    return [
        PluginSpec(
            name="tool-subagent-control",
            apply=_apply,
            requires=("tools", "subagents"),
            description="the model's send_message and interrupt_agent tools",
        )
    ]
