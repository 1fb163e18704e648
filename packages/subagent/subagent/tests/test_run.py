"""The run handle: one result shared by independent awaiters, one memoised disposal (DRV-5,
hardening 11.8)."""

from __future__ import annotations

import asyncio

import pytest

from dsh_subagent import ResultFuture, SubagentResult, SubagentRun

DONE = SubagentResult(output=(), stop_reason="completed")


async def _noop() -> None:
    return None


def _pending_run(kind: str) -> tuple[SubagentRun, asyncio.Future[SubagentResult]]:
    loop = asyncio.get_running_loop()
    future = ResultFuture(loop=loop) if kind == "result-future" else loop.create_future()
    return SubagentRun(id="c", local_agent=None, result=future, dispose=_noop), future


# A provider may hand in a plain future (each wait is shielded) or a ResultFuture (each wait
# gets a future of its own, settled directly): both must keep every rule below.
KINDS = pytest.mark.parametrize("kind", ["plain-future", "result-future"])


@KINDS
async def test_a_timed_out_wait_never_cancels_the_result(kind: str) -> None:
    """DRV-5, hardening 11.8: asyncio.wait_for(run.result, ...) timing out cancels only that
    consumer's wait; the result stays pending and settles for every other awaiter."""
    run, future = _pending_run(kind)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(run.result, 0.01)
    assert not future.cancelled()
    assert not run.result.done()
    other = asyncio.ensure_future(asyncio.wait_for(run.result, 5))
    future.set_result(DONE)
    assert await other is DONE
    assert await run.result is DONE
    assert run.result.done() and run.result.result() is DONE and run.result.exception() is None


@KINDS
async def test_a_cancelled_awaiter_leaves_the_others_waiting(kind: str) -> None:
    """DRV-5, hardening 11.8: cancelling one task that awaits run.result cancels neither the
    result nor another task awaiting it; a fault reaches every awaiter."""
    run, future = _pending_run(kind)
    entered = [asyncio.Event(), asyncio.Event()]

    async def consume(i: int) -> SubagentResult:
        entered[i].set()
        return await run.result

    first = asyncio.ensure_future(consume(0))
    second = asyncio.ensure_future(consume(1))
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in entered)), 5)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not future.cancelled()
    fault = RuntimeError("log unreadable")
    future.set_exception(fault)
    with pytest.raises(RuntimeError) as caught:
        await asyncio.wait_for(second, 5)
    assert caught.value is fault
    assert run.result.exception() is fault


async def test_dispose_is_memoised() -> None:
    """DRV-5, hardening 11.8: concurrent and later dispose() calls share one disposal: the
    provider's dispose runs once and every caller sees the same outcome (the same error)."""
    calls: list[str] = []
    started, gate = asyncio.Event(), asyncio.Event()
    fault = RuntimeError("handle disposal failed")

    async def dispose() -> None:
        calls.append("dispose")
        started.set()
        await gate.wait()
        raise fault

    future: asyncio.Future[SubagentResult] = asyncio.get_running_loop().create_future()
    run = SubagentRun(id="c", local_agent=None, result=future, dispose=dispose)
    first = asyncio.ensure_future(run.dispose())
    await asyncio.wait_for(started.wait(), 5)
    second = asyncio.ensure_future(run.dispose())
    gate.set()
    outcomes = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 5)
    assert outcomes == [fault, fault] and outcomes[0] is outcomes[1] is fault
    with pytest.raises(RuntimeError) as again:
        await asyncio.wait_for(run.dispose(), 5)
    assert again.value is fault
    assert calls == ["dispose"]


async def test_a_cancelled_dispose_caller_never_cancels_the_disposal() -> None:
    """DRV-5, hardening 11.8: a caller that stops waiting for dispose() (cancelled) never stops
    the disposal: the provider's idempotent dispose runs again to its end in a task of its own,
    and a later caller waits for that same disposal to finish."""
    calls: list[str] = []
    started, gate = asyncio.Event(), asyncio.Event()

    async def dispose() -> None:
        calls.append("start")
        started.set()
        await gate.wait()
        calls.append("end")

    future: asyncio.Future[SubagentResult] = asyncio.get_running_loop().create_future()
    run = SubagentRun(id="c", local_agent=None, result=future, dispose=dispose)
    first = asyncio.ensure_future(run.dispose())
    await asyncio.wait_for(started.wait(), 5)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    later = asyncio.ensure_future(run.dispose())
    gate.set()
    await asyncio.wait_for(later, 5)
    assert calls == ["start", "start", "end"]
    assert run._disposal._task is not None and run._disposal._task.done()


@KINDS
@pytest.mark.parametrize("outcome", ["result", "fault", "cancelled"])
async def test_many_awaiters_see_the_one_outcome(kind: str, outcome: str) -> None:
    """DRV-5, hardening 11.8: every consumer still waiting sees the run's one outcome (its
    result, the same fault object, or the provider's cancellation), and a consumer that gave
    up earlier leaves no waiter behind."""
    run, future = _pending_run(kind)
    entered = [asyncio.Event() for _ in range(4)]

    async def consume(i: int) -> SubagentResult:
        entered[i].set()  # set in the same step that starts the wait below
        return await run.result

    waits = [asyncio.ensure_future(consume(i)) for i in range(3)]
    quitter = asyncio.ensure_future(consume(3))
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in entered)), 5)
    quitter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await quitter
    if isinstance(future, ResultFuture):
        assert len(future._waiters) == 3
    fault = RuntimeError("unreadable")
    if outcome == "result":
        future.set_result(DONE)
    elif outcome == "fault":
        future.set_exception(fault)
    else:
        future.cancel()
    got = await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), 5)
    if outcome == "result":
        assert got == [DONE] * 3
    elif outcome == "fault":
        assert all(g is fault for g in got)
    else:
        assert all(isinstance(g, asyncio.CancelledError) for g in got)
    if isinstance(future, ResultFuture):
        assert future._waiters == []
