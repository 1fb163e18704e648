"""The ``subagent`` entry point: mounts ``ctx.subagents`` and registers the seam's vocabulary.

Plugin ``subagent`` provides the ``subagents`` service; its config
(:class:`~dsh_subagent.SubagentConfig`) is the run tree's cap,
``max_running_children_per_tree`` (a bad value fails the boot with ``PLUGIN_CONFIG``
naming the row and the key). The distribution also
registers the ``subagent/descriptor`` session event type and the message-source kinds
``coordinator``, ``subagent-report`` and ``subagent-settled`` before any log is loaded.
"""

from __future__ import annotations

from dsh_core import Context, EventTypeSpec, PluginSpec, hookimpl

from ._descriptor import DESCRIPTOR_EVENT_TYPE
from ._lifecycle import COMPANION, install_lifecycle_checker
from ._limits import SubagentConfig
from ._service import SubagentState
from ._types import (
    CoordinatorMessageSource,
    SubagentReportMessageSource,
    SubagentSettledMessageSource,
)

__all__ = ["dsh_message_source_kinds", "dsh_plugins", "dsh_session_event_types"]


def _apply(ctx: Context, config: SubagentConfig) -> None:
    ctx.provide("subagents", SubagentState(ctx, config))
    invariants = ctx.get("invariants")
    if invariants is not None:
        invariants.register(COMPANION, install_lifecycle_checker)


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The ``subagent`` plugin."""
    return [
        PluginSpec(
            name="subagent",
            apply=_apply,
            provides=("subagents",),
            after=("agents", "session_persistence", "session_query", "invariants"),
            config_type=SubagentConfig,
            description="ctx.subagents: named providers, one-shot runs, descriptors",
        )
    ]


@hookimpl
def dsh_session_event_types() -> list[EventTypeSpec]:
    """``subagent/descriptor``."""
    return [DESCRIPTOR_EVENT_TYPE]


@hookimpl
def dsh_message_source_kinds() -> list[type]:
    """The seam's message sources."""
    return [CoordinatorMessageSource, SubagentReportMessageSource, SubagentSettledMessageSource]
