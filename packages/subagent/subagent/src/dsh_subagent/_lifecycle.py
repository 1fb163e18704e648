"""The subagent lifecycle invariant checker (SVC-15), an invariant companion.

It fails on: a provider added with an empty name or added twice while live; removal of an
unknown name; ``subagent/start`` with an empty provider, run id or id, or a repeated run id;
``subagent/end`` without a matching start, or whose provider, id or locality differ from it.
Events naming a provider that has since been removed are accepted (provenance, SVC-12).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsh_core import Context, InvariantRegistry

    from ._types import SubagentProvider, SubagentRunEndInfo, SubagentRunInfo

__all__ = ["COMPANION", "install_lifecycle_checker"]

COMPANION = "subagent-lifecycle"


def install_lifecycle_checker(ctx: Context, registry: InvariantRegistry) -> None:
    """Watch every provider and run event of the host (global listeners)."""
    live: set[str] = set()
    starts: dict[str, SubagentRunInfo] = {}
    ended: set[str] = set()

    def fail(message: str) -> None:
        raise registry.violation(COMPANION, message)

    def added(provider: SubagentProvider) -> None:
        name = provider.name
        if not name:
            fail("a provider was added with an empty name")
        if name in live:
            fail(f"provider {name!r} was added twice while live")
        live.add(name)

    def removed(name: str) -> None:
        if name not in live:
            fail(f"provider {name!r} was removed but is not registered")
        live.discard(name)

    def started(info: SubagentRunInfo) -> None:
        if not info.provider or not info.run_id or not info.id:
            fail(f"subagent/start with an empty field: {info}")
        if info.run_id in starts:
            fail(f"subagent/start repeated run id {info.run_id}")
        starts[info.run_id] = info

    def finished(info: SubagentRunEndInfo) -> None:
        start = starts.get(info.run_id)
        if start is None or info.run_id in ended:
            fail(f"subagent/end without a matching start: {info.run_id}")
            return
        if (start.provider, start.id, start.local) != (info.provider, info.id, info.local):
            fail(f"subagent/end {info.run_id} does not match its start")
        ended.add(info.run_id)

    # Prepended: the checker sees an add before any listener can veto (and roll back) it.
    ctx.on("subagent/provider-added", added, global_=True, prepend=True)
    ctx.on("subagent/provider-removed", removed, global_=True, prepend=True)
    ctx.on("subagent/start", started, global_=True, prepend=True)
    ctx.on("subagent/end", finished, global_=True, prepend=True)
