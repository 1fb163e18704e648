"""Delegation depth helpers (DEP-1, DEP-2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsh_core import Agent, SessionMeta
from dsh_core.testing import TestHost, default_options, scripted_host
from dsh_subagent import (
    MAX_SAFE_INTEGER,
    SUBAGENT_DEPTH_KEY,
    DepthOverflowError,
    SubagentDepthError,
    SubagentError,
    assert_subagent_max_depth,
    delegation_depth_of,
    resolve_child_depth,
)


async def _agent(host: TestHost, header: int | None, runtime: Any = None) -> Agent:
    extensions = {} if runtime is None else {SUBAGENT_DEPTH_KEY: runtime}
    handle = await host.create_agent(
        options=default_options(extensions=extensions),
        meta=SessionMeta(cwd=str(Path.cwd()), delegation_depth=header),
    )
    return handle.agent


@pytest.mark.parametrize(
    ("header", "runtime", "depth"),
    [(None, None, 0), (1, None, 1), (None, 2, 2), (2, 1, 2), (1, 3, 3), (0, 0, 0)],
)
async def test_depth_is_the_larger_of_header_and_runtime(
    header: int | None, runtime: int | None, depth: int
) -> None:
    """DEP-1: delegation_depth_of is max(header delegation_depth, runtime subagent_depth),
    absence counting as 0."""
    async with scripted_host() as host:
        assert delegation_depth_of(await _agent(host, header, runtime)) == depth


@pytest.mark.parametrize("bad", [-1, True, "1", 1.5, 2**53])
async def test_invalid_runtime_depth_is_a_type_error(bad: object) -> None:
    """DEP-1: a runtime depth that is not a non-negative safe integer raises TypeError."""
    async with scripted_host() as host:
        agent = await _agent(host, 0, bad)
        with pytest.raises(TypeError, match="non-negative safe integer"):
            delegation_depth_of(agent)
        with pytest.raises(TypeError):
            resolve_child_depth(agent, None)


@pytest.mark.parametrize(
    ("header", "runtime", "child"),
    [(None, None, 1), (1, None, 2), (2, 1, 3), (None, 4, 5)],
)
async def test_child_depth_is_parent_plus_one(
    header: int | None, runtime: int | None, child: int
) -> None:
    """DEP-2: a child is one deeper than its parent; a resumed header depth 1 gives 2, and
    runtime options deepen but never lower (header 2, runtime 1 -> 3)."""
    async with scripted_host() as host:
        assert resolve_child_depth(await _agent(host, header, runtime), None) == child


async def test_max_depth_caps_the_child() -> None:
    """DEP-2: a child deeper than max_depth raises SubagentDepthError (not a SubagentError)
    naming both numbers; max_depth 0 forbids any child; equal is allowed."""
    async with scripted_host() as host:
        root = await _agent(host, None)
        with pytest.raises(SubagentDepthError) as caught:
            resolve_child_depth(root, 0)
        assert str(caught.value) == "subagent depth 1 exceeds maxDepth 0"
        assert (caught.value.attempted_depth, caught.value.max_depth) == (1, 0)
        assert not isinstance(caught.value, SubagentError)
        assert resolve_child_depth(root, 1) == 1
        deep = await _agent(host, 2, None)
        with pytest.raises(SubagentDepthError, match="subagent depth 3 exceeds maxDepth 2"):
            resolve_child_depth(deep, 2)


async def test_depth_overflow_is_a_range_error() -> None:
    """DEP-2: a derived depth beyond 2**53-1 raises the range error (OverflowError)."""
    async with scripted_host() as host:
        edge = await _agent(host, MAX_SAFE_INTEGER)
        with pytest.raises(DepthOverflowError) as caught:
            resolve_child_depth(edge, None)
        assert isinstance(caught.value, OverflowError)
        assert resolve_child_depth(await _agent(host, MAX_SAFE_INTEGER - 1), None) == (
            MAX_SAFE_INTEGER
        )


@pytest.mark.parametrize("bad", [-1, True, False, 2**53, 0.0, -0.0, None, "3"])
def test_assert_max_depth_rejects(bad: object) -> None:
    """SVC-6: assert_subagent_max_depth accepts only non-negative safe integers."""
    with pytest.raises(TypeError, match="non-negative safe integer"):
        assert_subagent_max_depth(bad)


@pytest.mark.parametrize("good", [0, 7, 2**53 - 1])
def test_assert_max_depth_accepts(good: int) -> None:
    """SVC-6: 0 through 2**53-1 pass unchanged."""
    assert assert_subagent_max_depth(good) == good


def test_max_depth_errors_name_the_python_argument() -> None:
    """SVC-6, DEP-2, hardening 11.10: an invalid max_depth is a TypeError naming max_depth (and
    "non-negative safe integer"); the model-visible refusal keeps "exceeds maxDepth"."""
    with pytest.raises(TypeError) as caught:
        assert_subagent_max_depth(-1)
    assert str(caught.value) == "max_depth must be a non-negative safe integer, got -1"
    assert str(SubagentDepthError(3, 2)) == "subagent depth 3 exceeds maxDepth 2"
