"""The in-memory backend: logs kept as event objects for the life of the process (or, with
``retain_disposed``, the logs of the most recently disposed sessions only)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import attrs

from .._abort import AbortSignal
from .._events import (
    SessionError,
    SessionEvent,
    SessionHeader,
)
from .._frozen import attrs_repr
from ._common import _not_found
from ._store import SessionPersistence, StoredScan, _Handle

if TYPE_CHECKING:
    from .._context import Context

# -- memory ---------------------------------------------------------------------------------------


@attrs.define(eq=False)
class _MemoryLog:
    __repr__ = attrs_repr
    header: SessionHeader
    events: list[SessionEvent]


class MemorySessionPersistence(SessionPersistence):
    """Keeps logs as event objects in this process (tests, ephemeral hosts); no file lock.

    What it keeps: the log of every session in use, and of every disposed one, for the life of
    the process; with ``retain_disposed=N`` only the N most recently disposed logs (the oldest
    is dropped first, and can no longer be resumed, listed or read). A log in use is never
    dropped; a resumed log counts as disposed again from its next disposal (PERF-1).
    """

    def __init__(self, retain_disposed: int | None = None) -> None:
        super().__init__()
        self._logs: dict[str, _MemoryLog] = {}
        self._retain = retain_disposed
        # The disposed logs in the order of their disposal (oldest first), when bounded.
        self._disposed: dict[str, None] = {}

    def _acquire(self, id: str, header: SessionHeader | None) -> _Handle:
        if header is not None:
            if id in self._logs:
                raise SessionError(f"session {id!r} is already stored", code="SESSION_EXISTS")
            self._logs[id] = _MemoryLog(header=header, events=[])
            return _Handle(id, created=True)
        if id not in self._logs:
            raise _not_found(id)
        self._disposed.pop(id, None)  # in use again: not droppable while held
        return _Handle(id, created=False)

    def _release(self, handle: _Handle, *, discard: bool) -> None:
        if discard and handle.created:
            self._logs.pop(handle.id, None)
            return
        retain = self._retain
        if retain is None or handle.id not in self._logs:
            return
        disposed = self._disposed
        disposed.pop(handle.id, None)
        disposed[handle.id] = None
        while len(disposed) > retain:  # the oldest disposed log leaves memory first (PERF-1)
            oldest = next(iter(disposed))
            del disposed[oldest]
            self._logs.pop(oldest, None)
            self._forget_warm(oldest)

    def _read(
        self, id: str, handle: _Handle | None
    ) -> tuple[SessionHeader, list[SessionEvent], Callable[[int], str]]:
        log = self._logs.get(id)
        if log is None:
            raise _not_found(id)
        return log.header, list(log.events), lambda i: f"session {id!r} event {i}"

    def _write(self, handle: _Handle, events: Sequence[SessionEvent], sync: bool = True) -> None:
        self._logs[handle.id].events.extend(events)

    def _headers(self, signal: AbortSignal | None) -> list[SessionHeader]:
        return [log.header for log in self._logs.values()]

    def _stored(self, id: str) -> bool:
        return id in self._logs

    def _stamps(self) -> dict[str, Hashable]:
        return {id: (log, len(log.events)) for id, log in self._logs.items()}

    def _warm_stamp(self, handle: _Handle) -> Hashable | None:
        log = self._logs.get(handle.id)
        return None if log is None else (log, len(log.events))

    def _unchanged(self, handle: _Handle | None, stamp: Hashable, id: str | None = None) -> bool:
        log = self._logs.get(handle.id if handle is not None else id or "")
        return log is not None and (log, len(log.events)) == stamp

    def _scan(self, id: str, types: frozenset[str]) -> StoredScan:
        log = self._logs.get(id)
        if log is None:
            raise _not_found(id)
        events = tuple(e for e in log.events if e.type in types)
        return StoredScan(header=log.header, events=events, stamp=(log, len(log.events)))


def install_memory_persistence(
    ctx: Context, retain_disposed: int | None = None
) -> MemorySessionPersistence:
    """Install an in-memory backend and provide it as ``session_persistence``.

    ``retain_disposed`` bounds how many disposed sessions' logs it keeps (``None``: all).
    """
    persistence = MemorySessionPersistence(retain_disposed)
    persistence.install(ctx)
    ctx.provide("session_persistence", persistence)
    return persistence
