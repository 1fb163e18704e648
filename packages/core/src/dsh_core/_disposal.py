"""One disposal shared by every caller, which no caller's cancellation can cut short."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import cast

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
        # None (not started), _RUNNING (running and nobody else waits: no future yet, as on
        # every delegation's path), _DONE (finished), or the future the others wait on.
        self._done: asyncio.Future[None] | object | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def started(self) -> bool:
        """Whether a teardown has started (it may still be running)."""
        return self._done is not None

    async def run(self, op: Callable[[], Awaitable[None]]) -> None:
        """Start ``op`` (first call) or wait for it; raise what it raised, every caller alike."""
        done = self._done
        if done is not None:
            if done is _DONE:
                return
            if done is _RUNNING:
                done = self._done = asyncio.get_running_loop().create_future()
            await asyncio.shield(cast("asyncio.Future[None]", done))
            return
        self._done = _RUNNING
        try:
            await op()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or not task.cancelling():
                _settle(self._future(), asyncio.CancelledError())
                raise
            # This caller stopped waiting; the teardown does not stop with it.
            self._task = asyncio.ensure_future(_finish(op, self._future()))
            raise
        except BaseException as exc:
            _settle(self._future(), exc)
            raise
        else:
            done = self._done
            self._done = _DONE
            if done is not _RUNNING:  # others wait on it
                cast("asyncio.Future[None]", done).set_result(None)

    def _future(self) -> asyncio.Future[None]:
        """The future later callers wait on (made now if nobody waits yet)."""
        done = self._done
        if done is _RUNNING:
            done = self._done = asyncio.get_running_loop().create_future()
        return cast("asyncio.Future[None]", done)


_RUNNING = object()
_DONE = object()


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
