"""The ``spawn`` provider: a fresh child: it sees nothing of the parent's conversation."""

from __future__ import annotations

import attrs

from dsh_core import attrs_eq, attrs_hash, attrs_repr
from dsh_subagent import (
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ResolvedSubagentStartRequest,
    SubagentCapabilities,
    SubagentRun,
)
from dsh_subagent.in_process import IN_PROCESS_CAPABILITIES, start_in_process_run

__all__ = ["SpawnProvider"]


@attrs.frozen(kw_only=True)
class SpawnProvider:
    """Subagent provider ``spawn`` (in-process; every start-time capability)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    name: str = "spawn"
    capabilities: SubagentCapabilities = IN_PROCESS_CAPABILITIES
    inherits_parent_context: bool = False

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        """Create and prompt a one-shot child (the shared in-process driver)."""
        return await start_in_process_run(request)

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        """The creation input of a continuable child: nothing (a fresh session)."""
        return ContinuableCreateSpec()
