"""One disposal shared by every caller, which no caller's cancellation can cut short."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["SharedDisposal"]


class SharedDisposal:
    """Run an async teardown once for any number of callers (hardening 11.8).

    The first caller runs ``op`` inline (no task: disposal sits on every delegation's path).
    Later and concurrent callers wait for the same outcome. A caller that stops waiting, its
    task cancelled, cancels only its own wait: if the first caller is cancelled while ``op``
    runs, the teardown starts again in a task of its own, which every other caller then waits
    for. ``op`` must therefore be safe to start again after an interruption at an await (every
    dispose of this project is idempotent step by step). A ``CancelledError`` that ``op``
    raises while its caller is *not* being cancelled is ``op``'s own outcome.
    """

    __slots__ = ("_done", "_task")

    def __init__(self) -> None:
        self._done: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def started(self) -> bool:
        """Whether a teardown has started (it may still be running)."""
        return self._done is not None

    async def run(self, op: Callable[[], Awaitable[None]]) -> None:
        """Start ``op`` (first call) or wait for it; raise what it raised, every caller alike."""
        done = self._done
        if done is not None:
            await asyncio.shield(done)
            return
        done = self._done = asyncio.get_running_loop().create_future()
        try:
            await op()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or not task.cancelling():
                _settle(done, asyncio.CancelledError())
                raise
            # This caller stopped waiting; the teardown does not stop with it.
            self._task = asyncio.ensure_future(_finish(op, done))
            raise
        except BaseException as exc:
            _settle(done, exc)
            raise
        else:
            done.set_result(None)


async def _finish(op: Callable[[], Awaitable[None]], done: asyncio.Future[None]) -> None:
    try:
        await op()
    except BaseException as exc:
        _settle(done, exc)
    else:
        done.set_result(None)


def _settle(done: asyncio.Future[None], exc: BaseException) -> None:
    if isinstance(exc, asyncio.CancelledError):
        done.cancel()
    else:
        done.set_exception(exc)
    # Nobody else may ever wait: the first caller has the error already.
    done.add_done_callback(_observe)


def _observe(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()
