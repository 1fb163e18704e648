"""The ``dsh`` entry point of dsh-tool-subagent: the ``tool-subagent`` plugin.

One row binds one provider to one tool name (config: :class:`SubagentToolConfig`); several
rows with distinct ``tool_name`` coexist. The tool follows its provider's registration
(TOOL-1); unmounting the row removes it for good.
"""

from __future__ import annotations

from dsh_core import Context, PluginSpec, hookimpl

from ._config import SubagentToolConfig
from ._tool import install_subagent_tool

__all__ = ["dsh_plugins"]


def _apply(ctx: Context, config: SubagentToolConfig) -> None:
    install_subagent_tool(ctx, config)


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The ``tool-subagent`` plugin."""
    return [
        PluginSpec(
            name="tool-subagent",
            apply=_apply,
            requires=("tools",),
            after=("subagents", "jobs", "system_prompt", "agents"),
            config_type=SubagentToolConfig,
            description="the model-facing `subagent` delegation tool (one provider per row)",
        )
    ]
