"""Cancellation as a value: AbortController, AbortSignal, race_abort (host-core §1)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core import AbortController, AbortedError, AbortSignal, race_abort


def test_first_reason_wins_and_abort_is_idempotent() -> None:
    """host-core §1: the first abort() reason sticks; later aborts change nothing."""
    controller = AbortController()
    signal = controller.signal
    assert not signal.aborted
    assert signal.reason is None
    controller.abort("first")
    controller.abort("second")
    assert signal.aborted
    assert signal.reason == "first"


def test_listeners_run_synchronously_in_order_and_failures_are_contained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """host-core §1: abort listeners run inside abort() in registration order; a raise is logged."""
    controller = AbortController()
    seen: list[tuple[str, object]] = []

    def broken(reason: object) -> None:
        raise RuntimeError("listener broke")

    controller.signal.add_listener(lambda r: seen.append(("a", r)))
    controller.signal.add_listener(broken)
    remove = controller.signal.add_listener(lambda r: seen.append(("removed", r)))
    controller.signal.add_listener(lambda r: seen.append(("c", r)))
    remove()
    with caplog.at_level(logging.ERROR, logger="dsh.abort"):
        controller.abort("why")
    assert seen == [("a", "why"), ("c", "why")]
    assert "abort listener failed" in caplog.text
    controller.abort("again")
    assert seen == [("a", "why"), ("c", "why")]


def test_listener_added_after_abort_is_not_called() -> None:
    """host-core §1: add_listener on an aborted signal never calls the callback."""
    signal = AbortSignal.aborted_with("done")
    seen: list[object] = []
    remove = signal.add_listener(seen.append)
    remove()
    assert seen == []


def test_throw_if_aborted_raises_aborted_error_with_the_reason() -> None:
    """host-core §1: throw_if_aborted raises AbortedError(code ABORTED) carrying the reason."""
    controller = AbortController()
    controller.signal.throw_if_aborted()
    reason = object()
    controller.abort(reason)
    with pytest.raises(AbortedError) as err:
        controller.signal.throw_if_aborted()
    assert err.value.reason is reason
    assert err.value.code == "ABORTED"


async def test_wait_resolves_with_the_reason() -> None:
    """host-core §1: wait() resolves with the reason, also when already aborted."""
    controller = AbortController()
    waiter = asyncio.ensure_future(controller.signal.wait())
    other = asyncio.ensure_future(controller.signal.wait())
    controller.abort("stop")
    assert await waiter == "stop"
    assert await other == "stop"
    assert await controller.signal.wait() == "stop"


def test_any_aborts_with_the_first_input_reason() -> None:
    """host-core §1: AbortSignal.any fuses inputs; the first input to fire gives the reason."""
    a, b = AbortController(), AbortController()
    fused = AbortSignal.any((a.signal, None, b.signal))
    assert not fused.aborted
    b.abort("b-first")
    a.abort("a-later")
    assert fused.aborted
    assert fused.reason == "b-first"


def test_any_with_an_already_aborted_input_is_aborted_at_once() -> None:
    """host-core §1: fusing an already-aborted signal yields an aborted signal with its reason."""
    live = AbortController()
    fused = AbortSignal.any((live.signal, AbortSignal.aborted_with("early")))
    assert fused.aborted
    assert fused.reason == "early"
    live.abort("late")
    assert fused.reason == "early"


def test_any_of_nothing_never_fires() -> None:
    """host-core §1: any() over no live signal stays unaborted."""
    assert not AbortSignal.any(()).aborted
    assert not AbortSignal.any((None,)).aborted


async def test_race_abort_returns_the_value_when_work_wins() -> None:
    """host-core §1: race_abort returns the awaitable's value if the signal stays quiet."""
    controller = AbortController()

    async def work() -> int:
        return 7

    assert await race_abort(work(), controller.signal) == 7
    assert await race_abort(work(), None) == 7


async def test_race_abort_raises_the_reason_and_cancels_the_work() -> None:
    """host-core §1: when the signal wins, race_abort cancels the work and raises its reason."""
    controller = AbortController()
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def work() -> int:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1

    racing = asyncio.ensure_future(race_abort(work(), controller.signal))
    await started.wait()
    controller.abort("user stop")
    with pytest.raises(AbortedError) as err:
        await racing
    assert err.value.reason == "user stop"
    async with asyncio.timeout(5):
        await cancelled.wait()


async def test_race_abort_on_an_aborted_signal_does_not_start_the_work() -> None:
    """host-core §1: an already-aborted signal raises at once; the coroutine never runs."""
    ran: list[str] = []

    async def work() -> None:
        ran.append("ran")

    with pytest.raises(AbortedError) as err:
        await race_abort(work(), AbortSignal.aborted_with("gone"))
    assert err.value.reason == "gone"
    assert ran == []


@pytest.mark.parametrize("ended_by", ["abort", "caller cancelled"])
async def test_race_abort_releases_a_value_produced_after_the_race_ended(ended_by: str) -> None:
    """host-core §1, hardening 11.8: work that outruns the end of the race (the signal's abort,
    or a foreign cancel of its caller) still produces a value; it is handed to release rather
    than leaked."""
    controller = AbortController()
    started = asyncio.Event()
    released: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def stubborn() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # ignores the cancel and still produces its resource
        return "resource"

    racing = asyncio.ensure_future(
        race_abort(stubborn(), controller.signal, release=released.set_result)
    )
    await started.wait()
    if ended_by == "abort":
        controller.abort("stop")
        with pytest.raises(AbortedError):
            await racing
    else:
        racing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await racing
    async with asyncio.timeout(5):
        assert await released == "resource"


async def test_foreign_cancellation_propagates_and_is_not_converted() -> None:
    """host-core §1: a foreign CancelledError propagates (never AbortedError); work is cancelled."""
    controller = AbortController()
    started, work_cancelled = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            work_cancelled.set()
            raise

    outcome: list[str] = []

    async def caller() -> None:
        try:
            await race_abort(work(), controller.signal)
        except AbortedError:
            outcome.append("converted")
            raise
        finally:
            outcome.append("finally")

    task = asyncio.ensure_future(caller())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert outcome == ["finally"]
    assert not controller.signal.aborted
    async with asyncio.timeout(5):
        await work_cancelled.wait()


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=40))
def test_listeners_fire_once_in_order_whatever_was_removed(ops: list[tuple[bool, int]]) -> None:
    """host-core §1: after any mix of adds (the same callback possibly twice) and removes, an
    abort calls exactly the listeners still added, in the order they were added."""
    controller = AbortController()
    fired: list[int] = []
    callbacks = [lambda r, i=i: fired.append(i) for i in range(4)]
    model: list[tuple[int, int]] = []  # (registration number, callback index)
    removers = []
    for add, n in ops:
        if add or not removers:
            number = len(removers)
            removers.append(controller.signal.add_listener(callbacks[n % 4]))
            model.append((number, n % 4))
        else:
            number = n % len(removers)
            removers[number]()
            removers[number]()  # a remover is idempotent
            model = [(k, i) for k, i in model if k != number]
    controller.abort("x")
    assert fired == [i for _, i in model]


async def test_race_abort_releases_a_value_produced_as_the_caller_is_cancelled() -> None:
    """host-core §1, hardening 11.8: a caller cancelled when the work has just produced its
    value (too late for the cancel to reach the work) hands that value to release at once."""
    controller = AbortController()
    started = asyncio.Event()
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    released: list[str] = []

    async def work() -> str:
        started.set()
        return await gate

    racing = asyncio.ensure_future(race_abort(work(), controller.signal, release=released.append))
    await started.wait()
    gate.set_result("resource")  # the work finishes in the loop turn the caller is cancelled
    racing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await racing
    assert released == ["resource"]
