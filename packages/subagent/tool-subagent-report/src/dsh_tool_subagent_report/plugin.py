"""The ``dsh`` entry point of dsh-tool-subagent-report: the ``tool-subagent-report`` plugin.

Mounting it registers one continuable setup (RPT-1): every fresh or resumed continuable child
gets its own ``report`` tool and ``tool:report`` section. Unmounting it revokes both from
resident children at once; mounting it again gives them to later Activations only (RPT-5).
It registers nothing else (no ``send_message``, no jobs).
"""

from __future__ import annotations

from dsh_core import Context, PluginSpec, hookimpl
from dsh_subagent import SUBAGENTS

from ._config import ReportConfig
from ._tool import report_setup

__all__ = ["dsh_plugins"]


def _apply(ctx: Context, config: ReportConfig) -> None:
    subagents = ctx[SUBAGENTS]
    subagents.register_continuable_setup(report_setup(subagents, config.report_delivery))


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The ``tool-subagent-report`` plugin."""
    return [
        PluginSpec(
            name="tool-subagent-report",
            apply=_apply,
            requires=("subagents", "tools", "system_prompt"),
            config_type=ReportConfig,
            description="the child-scoped `report` tool of continuable subagents",
        )
    ]
