"""Shared disposal: no caller that stops waiting can cut a teardown short (hardening 11.8)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest

from dsh_core import Fiber, SharedDisposal, ToolDefinition, ToolRunContext, user_message
from dsh_core.testing import ScriptedReply, ScriptedToolCall, scripted_host


async def bounded(aw: Awaitable[Any], seconds: float = 5) -> Any:
    async with asyncio.timeout(seconds):
        return await aw


async def test_concurrent_callers_share_one_run_and_one_outcome() -> None:
    """hardening 11.8: the teardown runs once; every caller sees the same error object."""
    runs: list[int] = []
    started, gate = asyncio.Event(), asyncio.Event()

    async def op() -> None:
        runs.append(1)
        started.set()
        await gate.wait()
        raise RuntimeError("teardown failed")

    disposal = SharedDisposal()
    callers = [asyncio.ensure_future(disposal.run(op))]
    await bounded(started.wait())  # the teardown runs: the next callers join it
    callers += [asyncio.ensure_future(disposal.run(op)) for _ in range(2)]
    gate.set()
    outcomes = await bounded(asyncio.gather(*callers, return_exceptions=True))
    assert runs == [1]
    assert all(o is outcomes[0] for o in outcomes) and isinstance(outcomes[0], RuntimeError)
    with pytest.raises(RuntimeError):
        await disposal.run(op)  # a later caller too
    assert runs == [1]


async def test_a_cancelled_first_caller_hands_the_teardown_to_a_task() -> None:
    """hardening 11.8: cancelling the caller that runs the teardown starts it again in a task
    of its own; it finishes with nobody waiting, and later callers wait for that run."""
    steps: list[str] = []
    started, gate = asyncio.Event(), asyncio.Event()

    async def op() -> None:
        steps.append("start")
        started.set()
        await gate.wait()
        steps.append("end")

    disposal = SharedDisposal()
    first = asyncio.ensure_future(disposal.run(op))
    await bounded(started.wait())
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    later = asyncio.ensure_future(disposal.run(op))
    gate.set()
    await bounded(later)
    assert steps == ["start", "start", "end"]


async def test_a_teardown_that_cancels_itself_is_its_own_outcome() -> None:
    """hardening 11.8: a CancelledError raised by the teardown itself (its caller not being
    cancelled) is the outcome every caller sees; nothing starts again."""
    runs: list[int] = []

    async def op() -> None:
        runs.append(1)
        raise asyncio.CancelledError

    disposal = SharedDisposal()
    with pytest.raises(asyncio.CancelledError):
        await disposal.run(op)
    with pytest.raises(asyncio.CancelledError):
        await disposal.run(op)
    assert runs == [1]


async def test_a_fiber_unwinds_every_effect_although_its_first_caller_stopped_waiting() -> None:
    """host-core §2, hardening 11.8: an effect whose disposer is slow does not let a cancelled
    dispose() caller leave the other effects registered."""
    fiber = Fiber("owner")
    gone: list[str] = []
    started, gate = asyncio.Event(), asyncio.Event()

    async def slow() -> None:
        started.set()
        await gate.wait()

    fiber.add(lambda: gone.append("first"))
    fiber.add(slow)
    first = asyncio.ensure_future(fiber.dispose())
    await bounded(started.wait())
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await bounded(fiber.dispose())
    assert gone == ["first"] and fiber.state == "disposed"


async def test_an_agent_is_released_although_its_first_dispose_caller_stopped_waiting() -> None:
    """host-core §9, hardening 11.8: dispose() of an agent whose tool ignores cancellation for
    a while: the caller gives up (timeout), yet the agent is still unregistered and its
    session detached once the tool returns, and a second dispose() waits for exactly that."""
    started, gate = asyncio.Event(), asyncio.Event()

    async def stubborn(args: Any, run: ToolRunContext) -> str:
        started.set()
        while not gate.is_set():
            try:
                await gate.wait()
            except asyncio.CancelledError:
                continue  # a tool that finishes its work whatever happens
        return "done"

    reply = ScriptedReply(tool_calls=(ScriptedToolCall(name="stubborn", id="c1"),))
    async with scripted_host(model=[reply, "after"]) as h:
        h.ctx.tools.register(ToolDefinition(name="stubborn", description="slow", execute=stubborn))
        handle = await h.create_agent()
        agent = handle.agent
        released = asyncio.Event()
        h.ctx.on("agent/disposed", lambda a: released.set() if a is agent else None)
        agent.followup(user_message("go"))
        await bounded(started.wait())
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(handle.dispose(), 0.05)
        assert h.ctx.agents.get(agent.id) is agent  # still tearing down
        gate.set()
        await bounded(released.wait())
        await bounded(handle.dispose())
        assert h.ctx.agents.get(agent.id) is None
        assert h.ctx.sessions.get(agent.id) is None
