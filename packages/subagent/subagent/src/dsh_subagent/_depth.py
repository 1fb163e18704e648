"""Delegation depth (DEP-1..3).

Depth lives in two places: the durable ``SessionHeader.delegation_depth`` and the runtime
extension ``AgentOptions.extensions["subagent_depth"]``; absence means 0 and the larger value
is authoritative, so a resumed child can deepen but never lower its depth. Both are owned by
this seam; the agent loop neither sets nor reads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import DepthOverflowError, InvalidMaxDepthError, SubagentDepthError

if TYPE_CHECKING:
    from dsh_core import Agent

__all__ = [
    "MAX_SAFE_INTEGER",
    "SUBAGENT_DEPTH_KEY",
    "assert_subagent_max_depth",
    "delegation_depth_of",
    "resolve_child_depth",
]

#: The largest integer every JSON reader represents exactly (2**53 - 1).
MAX_SAFE_INTEGER = 2**53 - 1
#: The ``AgentOptions.extensions`` key holding an agent's runtime delegation depth.
SUBAGENT_DEPTH_KEY = "subagent_depth"


def _is_safe_nonnegative(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


def assert_subagent_max_depth(value: object) -> int:
    """Return ``value`` if it is a non-negative safe integer, else raise ``TypeError``."""
    if not _is_safe_nonnegative(value):
        raise InvalidMaxDepthError(f"max_depth must be a non-negative safe integer, got {value!r}")
    return value  # type: ignore[return-value]


def delegation_depth_of(agent: Agent) -> int:
    """The larger of the header's ``delegation_depth`` and the runtime ``subagent_depth``."""
    runtime = agent.options.extensions.get(SUBAGENT_DEPTH_KEY)
    if runtime is not None and not _is_safe_nonnegative(runtime):
        raise InvalidMaxDepthError(
            f"runtime subagent depth must be a non-negative safe integer, got {runtime!r}"
        )
    durable = agent.session.header.delegation_depth or 0
    return max(durable, runtime or 0)


def resolve_child_depth(parent: Agent, max_depth: int | None) -> int:
    """The depth of a child of ``parent``: parent's depth + 1, within ``max_depth``."""
    depth = delegation_depth_of(parent) + 1
    if depth > MAX_SAFE_INTEGER:
        raise DepthOverflowError(f"subagent depth {depth} is outside the safe-integer range")
    if max_depth is not None and depth > max_depth:
        raise SubagentDepthError(depth, max_depth)
    return depth
