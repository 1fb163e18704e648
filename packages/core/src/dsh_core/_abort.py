"""Cancellation as a value: ``AbortController`` / ``AbortSignal`` (host-core §1).

A signal carries *why* work should stop and is honoured cooperatively: work reaches
quiescence, nothing is hard-killed. ``asyncio`` task cancellation is used only inside helpers
such as :func:`race_abort`; a foreign ``CancelledError`` (loop shutdown) is never turned into a
product outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from ._errors import DshError

__all__ = ["AbortController", "AbortSignal", "AbortedError", "fuse", "race_abort"]

T = TypeVar("T")
_log = logging.getLogger("dsh.abort")


class AbortedError(DshError):
    """Work stopped because a signal fired; ``reason`` is the signal's reason."""

    code = "ABORTED"

    def __init__(self, reason: object = None, message: str | None = None) -> None:
        super().__init__(message or f"aborted: {reason!r}")
        self.reason = reason


class AbortSignal:
    """Observes one abort. First reason wins; listeners run synchronously, in order."""

    __slots__ = ("_listeners", "_reason", "_waiters", "aborted")

    def __init__(self) -> None:
        self.aborted = False
        self._reason: object = None
        self._listeners: dict[object, Callable[[object], None]] | None = None
        self._waiters: list[asyncio.Future[object]] | None = None

    @property
    def reason(self) -> object:
        """The reason given to the first ``abort()`` (``None`` while not aborted)."""
        return self._reason

    def add_listener(self, callback: Callable[[object], None]) -> Callable[[], None]:
        """Call ``callback(reason)`` on abort; returns a remover (not called if already aborted)."""
        if self.aborted:
            return _noop
        if self._listeners is None:
            self._listeners = {}
        # Keyed by a token of its own: a signal many children listen to (one shared parent
        # signal) drops any of them in constant time, insertion order keeps the firing order,
        # and the key refers to nothing (the remover as key would make a cycle via ``self``).
        key = object()
        self._listeners[key] = callback
        return _Remover(self, key)

    def throw_if_aborted(self) -> None:
        """Raise :class:`AbortedError` carrying the reason if aborted."""
        if self.aborted:
            raise AbortedError(self._reason)

    async def wait(self) -> object:
        """Resolve with the reason once aborted."""
        if self.aborted:
            return self._reason
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(fut)
        try:
            return await fut
        finally:
            if self._waiters and fut in self._waiters:
                self._waiters.remove(fut)

    def _fire(self, reason: object) -> None:
        if self.aborted:
            return
        self.aborted = True
        self._reason = reason
        listeners, self._listeners = self._listeners, None
        waiters, self._waiters = self._waiters, None
        for cb in listeners.values() if listeners else ():
            try:
                cb(reason)
            except Exception:
                _log.exception("abort listener failed")
        for fut in waiters or ():
            if not fut.done():
                fut.set_result(reason)

    @staticmethod
    def any(signals: Iterable[AbortSignal | None]) -> AbortSignal:
        """A signal that aborts when any input does, with that input's reason (first wins).

        It stays subscribed to its inputs until one fires; for a short-lived use of
        long-lived inputs prefer :func:`fuse`, which can be detached.
        """
        return fuse(signals)[0]

    @staticmethod
    def aborted_with(reason: object) -> AbortSignal:
        """An already-aborted signal."""
        controller = AbortController()
        controller.abort(reason)
        return controller.signal

    def __repr__(self) -> str:
        return f"AbortSignal(aborted={self.aborted}, reason={self._reason!r})"


def _noop() -> None:
    return None


def fuse(signals: Iterable[AbortSignal | None]) -> tuple[AbortSignal, Callable[[], None]]:
    """A signal that aborts with the first input's reason, and a ``detach`` that unsubscribes
    it from every input (so long-lived inputs do not accumulate listeners)."""
    inputs = [s for s in signals if s is not None]
    for signal in inputs:
        if signal.aborted:
            return AbortSignal.aborted_with(signal.reason), _noop
    if len(inputs) == 1:
        return inputs[0], _noop
    fused = AbortController()
    removers: list[Callable[[], None]] = []

    def detach() -> None:
        for remove in removers:
            remove()
        removers.clear()

    def on_abort(reason: object) -> None:
        detach()
        fused.abort(reason)

    removers.extend(signal.add_listener(on_abort) for signal in inputs)
    return fused.signal, detach


class AbortController:
    """Owns one :class:`AbortSignal`; ``abort()`` is idempotent."""

    __slots__ = ("signal",)

    def __init__(self) -> None:
        self.signal = AbortSignal()

    def abort(self, reason: object = None) -> None:
        """Fire the signal with ``reason`` unless it already fired."""
        self.signal._fire(reason)


#: A signal that never fires (shared, for callers with nothing to cancel them).
NEVER = AbortSignal()


async def race_abort(
    aw: Awaitable[T],
    signal: AbortSignal | None,
    *,
    release: Callable[[T], object] | None = None,
) -> T:
    """Await ``aw`` unless ``signal`` fires first, then raise :class:`AbortedError`.

    The awaitable runs as a task that is cancelled when the signal fires, or when the caller
    itself is cancelled. A value it produces after that (it ignored or outran the cancel, or
    finished in the very loop turn the caller left) is handed to ``release``, so an abandoned
    resource is disposed rather than leaked (hardening 11.8).
    """
    if signal is None:
        return await aw
    if signal.aborted:
        if asyncio.iscoroutine(aw):
            aw.close()
        raise AbortedError(signal.reason)
    task: asyncio.Future[T] = asyncio.ensure_future(aw)
    if task.done():
        return task.result()
    waiter = asyncio.get_running_loop().create_future()

    def on_abort(reason: object) -> None:
        if not waiter.done():
            waiter.set_result(reason)

    remove = signal.add_listener(on_abort)
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        remove()
        _abandon(task, release)
        raise
    remove()
    if task.done():
        return task.result()
    _abandon(task, release)
    raise AbortedError(signal.reason)


def _abandon(task: asyncio.Future[T], release: Callable[[T], object] | None) -> None:
    """Cancel ``task`` nobody waits for any more; any value it produces goes to ``release``
    (now, if it is already there)."""

    def released(t: asyncio.Future[T]) -> None:
        if t.cancelled():
            return
        exc = t.exception()  # retrieved either way: nobody else will
        if exc is None and release is not None:
            try:
                release(t.result())
            except Exception:
                _log.exception("release of an abandoned value failed")

    if task.done():
        released(task)
        return
    task.cancel()
    task.add_done_callback(released)


class _Remover:
    """The remover :meth:`AbortSignal.add_listener` returns. One slotted object instead of a
    closure (a function, its cell tuple and two cells): a live agent holds a few, and each is
    one more object the cyclic collector walks while it lives (PERF-5)."""

    __slots__ = ("_key", "_signal")

    def __init__(self, signal: AbortSignal, key: object) -> None:
        self._signal = signal
        self._key = key

    def __call__(self) -> None:
        listeners = self._signal._listeners
        if listeners is not None:
            listeners.pop(self._key, None)
