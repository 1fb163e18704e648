"""The ``fork`` provider: a child seeded with the parent's completed turns.

The seed is the balanced completed-turn prefix (FORK-1); the in-flight turn is excluded.
"""

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
from dsh_subagent.in_process import (
    IN_PROCESS_CAPABILITIES,
    completed_turn_prefix,
    start_in_process_run,
)

__all__ = ["ForkProvider"]


@attrs.frozen(kw_only=True)
class ForkProvider:
    """Subagent provider ``fork`` (in-process; every start-time capability)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    name: str = "fork"
    capabilities: SubagentCapabilities = IN_PROCESS_CAPABILITIES
    inherits_parent_context: bool = True

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        """Create and prompt a one-shot child (the shared in-process driver)."""
        return await start_in_process_run(request, seed=completed_turn_prefix(request.parent))

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        """A continuable child's creation input: the parent's completed-turn prefix."""
        return ContinuableCreateSpec(seed=completed_turn_prefix(request.parent))
