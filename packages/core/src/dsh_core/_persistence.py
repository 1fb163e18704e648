"""Session persistence (``ctx.session_persistence``): memory and JSONL backends (host-core §5).

A backend follows every session of its host through three events: ``session/created`` starts
tracking (a new session's header and events so far; for a session this backend restored, only
what lies beyond the stored log), ``session/flush`` stores every event the session holds beyond
what is stored, durably, and ``session/disposed`` does that a last time and lets go. The
session keeps its events anyway, so the backend takes them from it at flush time instead of
copying each one as it is appended: appends cost the backend nothing, and a burst of events
costs one durable write per flush (group commit), not one per event.

Stored logs are *cold* once nobody tracks them. Reading a cold log whose last turn is open (the
process died mid-turn) closes that turn instead of truncating it: an error ``tool/result`` per
pending call, ``step/end`` if a step is open, ``turn/end(interrupted)``. ``inspect`` adds the
closers in memory only; ``prepare`` and ``load`` write them. A live session is never repaired.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import gc
import json
import logging
import os
import re
import stat
import sys
import threading
from collections.abc import Awaitable, Callable, Generator, Hashable, Iterable, Mapping, Sequence
from itertools import compress, islice
from json.encoder import encode_basestring
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import attrs

from ._abort import AbortedError, AbortSignal
from ._codec import Unfit, class_encoder
from ._content import Message, ToolCallBlock, ToolResultBlock, ToolSource, text_blocks
from ._events import (
    SESSION_FORMAT_VERSION,
    EventTypeRegistry,
    SessionError,
    SessionEvent,
    SessionHeader,
    StepData,
    ToolResultData,
    ToolResultError,
    TurnEndData,
    TurnEndReason,
    encode_header,
    structure_header,
)
from ._json import MAX_NESTING, NotJsonError, dumps
from ._log_checker import LogInvariantError, SessionLogChecker
from ._sessions import Session, check_session_id, now_ms

if sys.platform != "win32":
    import fcntl

if TYPE_CHECKING:
    from ._context import Context

__all__ = [
    "DamagedSession",
    "JsonlSessionPersistence",
    "MemorySessionPersistence",
    "SessionListing",
    "SessionPersistence",
    "SessionPreparation",
    "StoredScan",
    "default_sessions_dir",
    "install_jsonl_persistence",
    "install_memory_persistence",
    "repair_closers",
]

T = TypeVar("T")
_log = logging.getLogger("dsh.sessions")


def _check(signal: AbortSignal | None) -> None:
    if signal is not None and signal.aborted:
        raise AbortedError(signal.reason)


async def _settle(fut: asyncio.Future[T]) -> T:
    """Wait for ``fut`` even if the caller is cancelled meanwhile, then re-raise the cancel.

    Storage work that has started (a write in a worker thread) cannot be recalled, and what
    follows it (bookkeeping, releasing a lock) must see its true outcome.
    """
    cancelled = False
    while not fut.done():
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:
            break
    if cancelled:
        if not fut.cancelled():
            fut.exception()  # retrieved: the caller sees the cancel, the state reflects the rest
        raise asyncio.CancelledError
    return fut.result()


def _deliver(fut: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    """In the loop: settle ``fut`` with a worker thread's outcome (unless it was cancelled)."""
    if fut.cancelled():
        return
    ok, value = outcome
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


def _succeeded(fut: asyncio.Future[Any]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None


def _stored_anyway(fut: asyncio.Future[Any]) -> bool:
    """A write that failed only to encode some events: it stored stand-ins for them."""
    return fut.done() and not fut.cancelled() and isinstance(fut.exception(), _Unwritten)


# -- validation and crash repair --------------------------------------------------------------


@attrs.define(eq=False)
class _Scan:
    """What a replay of a log leaves open (for repair)."""

    checker: SessionLogChecker
    announced: dict[str, tuple[str, int]]  # call id -> (tool name, assistant/message seq)
    calls: dict[str, tuple[str, int]]  # call id -> (tool name, tool/call seq)
    answered: set[str]


def _result_call_id(data: ToolResultData) -> str:
    for block in data.message.content:
        if isinstance(block, ToolResultBlock):
            return block.tool_call_id
    return ""


def _scan(events: Sequence[SessionEvent], locate: Callable[[int], str]) -> _Scan:
    """Replay ``events`` through the log invariant, remembering the open step's tool calls.

    A violation raises ``SESSION_CORRUPT`` with a message that starts with ``locate(index)``.
    """
    checker = SessionLogChecker()
    check, apply = checker.check, checker.apply
    announced: dict[str, tuple[str, int]] = {}
    calls: dict[str, tuple[str, int]] = {}
    answered: set[str] = set()
    for i, event in enumerate(events):
        try:
            check(event)
        except LogInvariantError as exc:
            raise SessionError(f"{locate(i)}: {exc}", code="SESSION_CORRUPT") from exc
        seqs = event.source_event_seqs
        if seqs and (min(seqs) < 0 or max(seqs) >= event.seq):
            raise SessionError(
                f"{locate(i)}: cites events that do not precede it", code="SESSION_CORRUPT"
            )
        apply(event)
        t = event.type
        if t == "assistant/chunk":
            continue
        if t == "step/start" or t == "step/end":
            announced = {}
            calls = {}
            answered = set()
        elif t == "assistant/message":
            announced = {
                b.id: (b.name, event.seq)
                for b in event.data.message.content
                if isinstance(b, ToolCallBlock)
            }
        elif t == "tool/call":
            calls[event.data.call_id] = (event.data.name, event.seq)
        elif t == "tool/result":
            answered.add(_result_call_id(event.data))
    return _Scan(checker=checker, announced=announced, calls=calls, answered=answered)


_NOT_STARTED = "Error: the session ended before this tool call started; it never ran."
_OUTCOME_UNKNOWN = (
    "Error: the session ended while this tool call was running (tool/call at seq {seq}); "
    "its outcome is unknown. Check its effects before running it again."
)


def _tool_error(
    session_id: str, seq: int, time: int, where: tuple[int, int], call: tuple[str, str, str, int]
) -> SessionEvent:
    """A synthetic error ``tool/result`` for ``call = (call id, tool name, code, cited seq)``."""
    call_id, name, code, cite = call
    text = _NOT_STARTED if code == "TOOL_NOT_STARTED" else _OUTCOME_UNKNOWN.format(seq=cite)
    message = Message(
        id=f"{session_id}:repair:{seq}",
        role="tool",
        content=(ToolResultBlock(tool_call_id=call_id, content=text_blocks(text), is_error=True),),
        source=ToolSource(call_id=call_id),
    )
    data = ToolResultData(
        turn=where[0], step=where[1], message=message, error=ToolResultError(name=name, code=code)
    )
    return SessionEvent(
        type="tool/result",
        seq=seq,
        time=time,
        data=data,
        source_event_seqs=(cite,),
        surface_op="append",
    )


def _closers(session_id: str, scan: _Scan, next_seq: int) -> list[SessionEvent]:
    checker = scan.checker
    turn = checker.open_turn
    if turn is None:
        return []
    out: list[SessionEvent] = []
    time = now_ms()
    step = checker.open_step
    if step is not None:
        pending: list[tuple[str, str, str, int]] = []
        for call_id, (name, announced_at) in scan.announced.items():
            if call_id in scan.answered:
                continue
            logged = scan.calls.get(call_id)
            if logged is None:
                pending.append((call_id, name, "TOOL_NOT_STARTED", announced_at))
            else:
                pending.append((call_id, logged[0], "TOOL_OUTCOME_UNKNOWN", logged[1]))
        for call_id, (name, call_seq) in scan.calls.items():
            if call_id not in scan.answered and call_id not in scan.announced:
                pending.append((call_id, name, "TOOL_OUTCOME_UNKNOWN", call_seq))
        for call in pending:
            out.append(_tool_error(session_id, next_seq + len(out), time, (turn, step), call))
        out.append(
            SessionEvent(
                type="step/end",
                seq=next_seq + len(out),
                time=time,
                data=StepData(turn=turn, step=step),
            )
        )
    out.append(
        SessionEvent(
            type="turn/end",
            seq=next_seq + len(out),
            time=time,
            data=TurnEndData(turn=turn, reason=TurnEndReason(kind="interrupted")),
        )
    )
    return out


def repair_closers(session_id: str, events: Sequence[SessionEvent]) -> list[SessionEvent]:
    """The events that close ``events``' open final turn (empty when no turn is open).

    Per pending call of the open step an error ``tool/result``: ``TOOL_NOT_STARTED`` (citing
    the ``assistant/message``) when the call was announced but no ``tool/call`` was logged,
    ``TOOL_OUTCOME_UNKNOWN`` (citing the ``tool/call``) otherwise; then ``step/end`` if a step
    is open and ``turn/end`` with reason ``interrupted``. ``events`` must satisfy the log
    invariant (``SESSION_CORRUPT`` otherwise).
    """
    scan = _scan(events, lambda i: f"session {session_id!r} event {i}")
    return _closers(session_id, scan, len(events))


def _validate_appended(types: EventTypeRegistry, event: SessionEvent) -> None:
    """Refuse an event that a live session would have refused (type, JSON, surface)."""
    spec = types.get(event.type)
    if spec is None and not event.ignorable:
        raise SessionError(
            f"event {event.seq} has unknown required type {event.type!r}",
            code="SESSION_FORMAT_UNSUPPORTED",
        )
    try:
        types.snapshot(spec, event.type, event.data)
    except NotJsonError as exc:  # pragma: no cover - snapshot converts it already
        raise SessionError(str(exc), code="SESSION_EVENT_NOT_JSON") from exc
    surface = spec.surface if spec is not None else event.source_event_seqs is not None
    if surface != (event.surface_op == "append" and event.source_event_seqs is not None):
        raise SessionError(
            f"event {event.seq} ({event.type}) has wrong surface metadata", code="SESSION_SURFACE"
        )


# -- listing ------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class DamagedSession:
    """A stored entry that listing could not read (hardening 11.3).

    ``id`` is the id its name gives (possibly not a valid one); ``code`` is the stable
    ``SessionError`` code its own load would fail with (``SESSION_CORRUPT``,
    ``SESSION_FORMAT_UNSUPPORTED``, ``SESSION_FILE_UNSAFE``, ``SESSION_INVALID_ID`` or
    ``SESSION_IO``); ``message`` says what is wrong and names the file.
    """

    id: str
    code: str
    message: str


@attrs.frozen(kw_only=True)
class SessionListing:
    """What ``listing()`` found: the readable headers (oldest first) and, by id, the entries
    that are damaged. One damaged entry never hides the others."""

    headers: tuple[SessionHeader, ...]
    damaged: tuple[DamagedSession, ...] = ()
    #: By id, a token of each stored log as listed: a later read returning the same token
    #: read the same log (the JSONL store's file identity, change time and size; empty for a
    #: backend that cannot tell).
    stamps: Mapping[str, Hashable] = attrs.field(factory=dict, eq=False, repr=False)


@attrs.frozen(kw_only=True)
class StoredScan:
    """What :meth:`SessionPersistence.scan` read of one stored log: its header, the events of
    the asked types (oldest first), and the log's ``stamp`` taken before the read (``None``
    if the backend cannot tell)."""

    header: SessionHeader
    events: tuple[SessionEvent, ...]
    stamp: Hashable | None = None


# -- the service ------------------------------------------------------------------------------


class _Handle:
    """What a backend holds for one session while this host owns it (a lock, an open file)."""

    __slots__ = ("created", "id", "truncate")

    def __init__(self, id: str, *, created: bool) -> None:
        self.id = id
        self.created = created  # this holder created the log (a veto may delete it)
        self.truncate = False  # a torn tail must be cut before the next write


@attrs.frozen(kw_only=True)
class _Loaded:
    header: SessionHeader
    events: list[SessionEvent]


class _Tracked:
    """A session this host writes: how much of it is stored, and where its log ends."""

    __slots__ = ("end", "handle", "session", "stored", "unsynced", "writing")

    def __init__(self, session: Session, handle: _Handle, *, stored: int, unsynced: bool) -> None:
        self.session = session
        self.handle = handle
        self.stored = stored  # events [0, stored) are durable
        self.unsynced = unsynced  # a new log whose creation is not durable yet
        self.end: int | None = None  # set when tracking ends: later appends are not stored
        # The write under way, if any: done (always with None) once its outcome is counted.
        self.writing: asyncio.Future[None] | None = None

    def pending(self) -> Sequence[SessionEvent]:
        """The events to store next (a copy): everything beyond ``stored``, up to ``end``."""
        events = self.session.events_since(self.stored)
        if self.end is not None:
            return events[: self.end - self.stored]
        return events


@attrs.define(eq=False)
class _Prepared:
    session: Session
    handle: _Handle
    stored: int


class SessionPreparation:
    """A restored, unpublished session, plus what the backend holds for it (host-core §5).

    Entering and announcing ``session`` hands the hold over to the backend's tracking.
    ``dispose()`` (synchronous, idempotent) releases the hold of a session that was never
    announced, so an abandoned resume does not keep the log locked.
    """

    __slots__ = ("_release", "session")

    def __init__(self, session: Session, release: Callable[[], None]) -> None:
        self.session = session
        self._release: Callable[[], None] | None = release

    def dispose(self) -> None:
        """Release the hold unless the session was announced meanwhile; idempotent."""
        release, self._release = self._release, None
        if release is not None:
            release()

    def __repr__(self) -> str:
        return f"SessionPreparation({self.session!r})"


class SessionPersistence:
    """Stores session logs and restores them, with crash repair (``session_persistence``).

    Backends implement five storage hooks (``_acquire``, ``_release``, ``_read``, ``_write``,
    ``_headers``); this class owns tracking, batching, ordering and repair, so every backend
    has the same semantics. Storage hooks are synchronous; a backend whose hooks block sets
    ``_threaded`` and they run in a worker thread, one flush of a session at a time.

    The threads are the backend's own, not the event loop's default executor: tools that
    block in ``asyncio.to_thread`` can fill that one, and a turn must not wait behind them
    to make its log durable.
    """

    _threaded = False
    #: Whether tracked sessions write through at :meth:`Session.checkpoint` (a backend whose
    #: log outlives the process sets it; the memory backend is durable for the process's life).
    _checkpointing = False
    #: The most bytes a disposed session's last write may take on the loop (see _close_inline).
    _inline_close_limit = 64 * 1024
    #: Worker threads of a threaded backend (flushes of different sessions run side by side).
    _workers = min(32, (os.cpu_count() or 1) + 4)

    def __init__(self) -> None:
        self._ctx: Context | None = None
        self._types: EventTypeRegistry | None = None
        self._closed = False
        self._tracked: dict[str, _Tracked] = {}
        self._prepared: dict[str, _Prepared] = {}
        self._busy: set[str] = set()
        self._closing: dict[str, asyncio.Task[None]] = {}
        #: The final syncs of disposed sessions, run after their lock was let go.
        self._syncs: set[asyncio.Future[Any]] = set()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        #: Tracked sessions written by a checkpoint and not synced yet (group commit).
        self._unsynced: set[_Tracked] = set()
        self._commit_timer: asyncio.TimerHandle | None = None

    # -- wiring ----------------------------------------------------------------------------------

    def install(self, ctx: Context) -> None:
        """Follow every session of ``ctx``'s host; tracking ends when ``ctx`` is disposed.

        Sessions created before ``install`` are not tracked. Disposing ``ctx`` drains every
        tracked session and releases every hold.
        """
        if self._ctx is not None:
            raise SessionError(
                "this persistence is already installed", code="PERSISTENCE_INSTALLED"
            )
        types = ctx.sessions.types
        ctx.effect(lambda: self._shutdown)
        self._ctx = ctx
        self._types = types
        ctx.on("session/created", self._on_created, global_=True)
        ctx.on("session/flush", self._on_flush, global_=True)
        ctx.on("session/disposed", self._on_disposed, global_=True)

    def _installed(self) -> Context:
        if self._ctx is None or self._closed:
            raise SessionError(
                "session persistence is not installed in a live context",
                code="PERSISTENCE_NOT_INSTALLED",
            )
        return self._ctx

    @property
    def types(self) -> EventTypeRegistry:
        """The event types of the host this backend is installed in."""
        if self._types is None:
            raise SessionError(
                "session persistence is not installed", code="PERSISTENCE_NOT_INSTALLED"
            )
        return self._types

    def _submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Start a storage hook: in a worker thread if the backend blocks, else right away.

        A threaded hook reports straight back to the loop when it returns; once started it
        runs to the end (callers that stop waiting leave its future to the bookkeeping).
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        if not self._threaded:
            try:
                fut.set_result(fn(*args))
            except Exception as exc:
                fut.set_exception(exc)
            return fut

        def work() -> None:
            try:
                outcome: tuple[bool, Any] = (True, fn(*args))
            except BaseException as exc:  # delivered to the waiting loop, raised there
                outcome = (False, exc)
            try:
                loop.call_soon_threadsafe(_deliver, fut, outcome)
            except RuntimeError:  # the loop is closed: nobody is left to tell
                pass

        pool = self._pool
        if pool is None:
            pool = self._pool = concurrent.futures.ThreadPoolExecutor(
                self._workers, thread_name_prefix="dsh-session-io"
            )
        pool.submit(work)
        return fut

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await _settle(self._submit(fn, *args))

    async def _hold(self, id: str, header: SessionHeader | None) -> _Handle:
        """``_acquire`` off the loop; a hold obtained after a cancel is let go again."""
        fut = self._submit(self._acquire, id, header)
        try:
            return await _settle(fut)
        except BaseException:
            if _succeeded(fut):
                self._release(fut.result(), discard=header is not None)
            raise

    # -- listeners -------------------------------------------------------------------------------

    def _claimed(self, id: str) -> bool:
        return id in self._tracked or id in self._prepared or id in self._busy

    def _on_created(self, session: Session) -> None:
        if self._closed:
            return
        sid = session.header.id
        prepared = self._prepared.get(sid)
        if prepared is not None and prepared.session is session:
            del self._prepared[sid]
            rec = _Tracked(session, prepared.handle, stored=prepared.stored, unsynced=False)
        else:
            if self._claimed(sid) or sid in self._closing:
                raise SessionError(
                    f"session {sid!r} is held by this host's persistence", code="SESSION_LOCKED"
                )
            # Synchronous on purpose: a held or existing log must veto the creation.
            handle = self._acquire(sid, session.header)
            rec = _Tracked(session, handle, stored=0, unsynced=True)
        self._tracked[sid] = rec
        if self._checkpointing:
            session._checkpointer = self._checkpoint

    def _on_flush(self, session: Session) -> Awaitable[None] | None:
        rec = self._tracked.get(session.header.id)
        if rec is None or rec.session is not session:
            return None
        return self._drain(rec)

    def _on_disposed(self, session: Session) -> None:
        sid = session.header.id
        rec = self._tracked.get(sid)
        if rec is None or rec.session is not session:
            return
        del self._tracked[sid]
        rec.end = session.seq
        session._checkpointer = None
        ctx = self._ctx
        if ctx is not None and ctx.sessions.get(sid) is session:
            # Disposed while still live: a session/created listener vetoed the creation, so the
            # session never existed and nothing of it is kept.
            self._release(rec.handle, discard=True)
            return
        if rec.writing is None and (
            not self._threaded
            or (rec.end == rec.stored and not rec.unsynced and not self._dirty(rec.handle))
        ):
            # Nothing here blocks (the memory backend, or nothing left to write): close at once
            # instead of in a task, so the hold is gone when the detach returns.
            self._close_now(rec)
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._close_now(rec)
            return
        if rec.writing is None and self._close_inline(rec):
            return
        assert ctx is not None
        self._closing[sid] = ctx.host.spawn(self._close(rec), name=f"persist {sid}")

    def _close_inline(self, rec: _Tracked) -> bool:
        """Write a disposed session's last events right here, on the loop, if that is cheap
        (a backend decides; ``False``: not done, write them in a worker thread).

        The JSONL store does so for up to :attr:`_inline_close_limit` bytes: one ``write`` to
        the page cache, like a new file's header at creation, with the ``fsync`` left to a
        worker thread. That spares the disposal a round trip through the pool.
        """
        return False

    async def _close(self, rec: _Tracked) -> None:
        """Write a disposed session's last events and let go of it; its file's ``fsync``
        runs after the lock is released, off the disposal's path (the backend's shutdown
        waits for it)."""
        try:
            step = self._drain(rec, sync=False)
            if step is not None:
                await step
        except Exception as exc:
            _log_close_failure(rec, exc)
        finally:
            try:
                await self._writes_over(rec)  # the file is never closed under a write
            finally:
                self._let_go_later(rec)
                sid = rec.session.header.id
                if self._closing.get(sid) is asyncio.current_task():
                    del self._closing[sid]

    def _let_go_later(self, rec: _Tracked) -> None:
        """Release ``rec``'s hold now and start its deferred sync, if the backend has one."""
        sync = self._let_go(rec.handle)
        if sync is None:
            return
        try:
            fut = self._submit(sync)
        except BaseException:  # no worker thread to be had: sync here rather than never
            sync()
            raise
        self._syncs.add(fut)

        def synced(fut: asyncio.Future[None]) -> None:
            self._syncs.discard(fut)
            if not fut.cancelled() and fut.exception() is not None:
                _log.error(
                    "the last events of session %r were written but not synced: %s",
                    rec.session.header.id,
                    fut.exception(),
                )

        fut.add_done_callback(synced)

    @staticmethod
    async def _writes_over(rec: _Tracked) -> None:
        """Wait until no write of ``rec`` is under way, even if cancelled meanwhile."""
        cancelled = False
        while rec.writing is not None:
            try:
                await _settle(rec.writing)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError

    def _close_now(self, rec: _Tracked) -> None:
        """Drain and release without an event loop (a detach from synchronous code)."""
        try:
            batch = rec.pending()
            if batch or rec.unsynced:
                try:
                    self._write(rec.handle, batch)
                except _Unwritten:
                    rec.stored += len(batch)
                    raise
                rec.stored += len(batch)
        finally:
            self._release(rec.handle, discard=False)

    def _drain(self, rec: _Tracked, sync: bool = True) -> Awaitable[None] | None:
        """Store every event of ``rec`` not stored yet; ``None`` when there is nothing to do.

        ``sync=False`` (a disposed session's last write) leaves the ``fsync`` to
        :meth:`_let_go`, so the lock is released without waiting for the disk.

        The write starts at once, or after the one under way (writes of a session never
        overlap, so lines keep their order). Its outcome is counted when the storage hook
        returns, whoever still waits: the returned future only reports it, so a cancelled
        flush neither loses nor repeats a write. After a failure the next flush takes the
        same events again. Starting here rather than in a task saves the flush a loop turn
        before the worker thread even begins.
        """
        if rec.writing is not None:
            return self._drain_after(rec, sync)
        if self._checkpointing and rec.end is None:
            # A tracked session that checkpoints is only ever written here, on the loop, so
            # a checkpoint never races a write in a worker thread; the sync still runs there.
            try:
                self._write_through(rec)
            except Exception as exc:
                failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                failed.set_exception(exc)
                return failed
        batch = rec.pending()
        if not batch and not rec.unsynced and not self._dirty(rec.handle):
            return None
        loop = asyncio.get_running_loop()
        writing: asyncio.Future[None] = loop.create_future()
        reported: asyncio.Future[None] = loop.create_future()
        rec.writing = writing

        def count(job: asyncio.Future[None]) -> None:
            rec.writing = None
            if _succeeded(job) or _stored_anyway(job):
                rec.stored += len(batch)
                rec.unsynced = False
                if not reported.done():
                    if job.exception() is None:
                        reported.set_result(None)
                    else:  # stored, some events as stand-ins: report that (never retried)
                        reported.set_exception(cast("BaseException", job.exception()))
            elif not reported.done():
                if job.cancelled():
                    reported.cancel()
                else:
                    reported.set_exception(cast("BaseException", job.exception()))
            writing.set_result(None)

        try:
            job = self._submit(self._write, rec.handle, batch, sync)
        except BaseException:
            # Nothing started (no worker thread to be had, at interpreter exit say): no write
            # may look under way, or every later flush and the close would wait for it.
            rec.writing = None
            writing.set_result(None)
            raise
        if job.done():
            count(job)
        else:
            job.add_done_callback(count)
        return reported

    async def _drain_after(self, rec: _Tracked, sync: bool = True) -> None:
        """``_drain`` once the write under way (and any started before this turn) is over."""
        while rec.writing is not None:
            await asyncio.wait((rec.writing,))
        step = self._drain(rec, sync)
        if step is not None:
            await step

    async def _quiesce(self, id: str) -> None:
        """Wait for a disposed session's last drain, so a reader sees its whole log."""
        task = self._closing.get(id)
        if task is not None:
            await asyncio.wait((task,))

    async def _shutdown(self) -> None:
        self._closed = True
        timer, self._commit_timer = self._commit_timer, None
        if timer is not None:
            timer.cancel()  # each close below syncs what its session left unsynced
        self._unsynced.clear()
        tracked = list(self._tracked.values())
        self._tracked.clear()
        for rec in tracked:
            rec.end = rec.session.seq
        prepared = list(self._prepared.values())
        self._prepared.clear()
        for held in prepared:
            self._release(held.handle, discard=False)
        # Failures are logged by ``_close`` and by the host's task bookkeeping.
        await asyncio.gather(
            *(self._close(rec) for rec in tracked), *self._closing.values(), return_exceptions=True
        )
        while self._syncs:  # the syncs the closes above left behind (their errors are logged)
            await asyncio.wait(tuple(self._syncs))
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)  # idle by now: every write above has been awaited

    # -- write-through (checkpoints) and group commit ----------------------------------------

    def _checkpoint(self, session: Session) -> None:
        """``Session.checkpoint`` of a tracked session: write what is not stored yet, now.

        Raises ``SESSION_IO`` when the write fails; nothing is counted as stored then, so
        the next checkpoint or flush takes the same events again (after cutting off any
        partial line), and a file found deleted or replaced fails every later one.
        """
        rec = self._tracked.get(session.header.id)
        if rec is not None and rec.session is session:
            self._write_through(rec)

    def _write_through(self, rec: _Tracked) -> None:
        """Write ``rec``'s pending events on the loop (no sync unless the backend says so)."""
        raise NotImplementedError

    def _dirty(self, handle: _Handle) -> bool:
        """Whether ``handle`` holds written lines no ``fsync`` has covered yet."""
        return False

    def _commit_later(self, rec: _Tracked) -> None:
        """Have ``rec``'s written lines synced by the next group commit (within
        :attr:`_commit_window` seconds, in a worker thread)."""
        self._unsynced.add(rec)
        if self._commit_timer is None:
            loop = asyncio.get_running_loop()
            self._commit_timer = loop.call_later(self._commit_window, self._group_commit)

    #: How long a group commit collects written lines before one worker job syncs them all.
    _commit_window = 0.02

    def _group_commit(self) -> None:
        """Sync every tracked session a checkpoint left unsynced, in one worker job.

        Each such session's ``writing`` is the job meanwhile, so a flush, a close or the
        shutdown waits for it (the file is never closed under its sync). A session whose own
        flush is syncing waits for the next round. A failed sync is logged and fails every
        later checkpoint of that session (its lines may not be on the disk).
        """
        self._commit_timer = None
        if self._closed:
            self._unsynced.clear()
            return
        recs: builtins.list[_Tracked] = []
        again: builtins.list[_Tracked] = []
        for rec in self._unsynced:
            if self._tracked.get(rec.session.header.id) is not rec or not self._dirty(rec.handle):
                continue
            (recs if rec.writing is None else again).append(rec)
        self._unsynced.clear()
        for rec in again:
            self._commit_later(rec)
        if not recs:
            return
        loop = asyncio.get_running_loop()
        writing: asyncio.Future[None] = loop.create_future()
        for rec in recs:
            rec.writing = writing
        job = self._submit(self._sync_handles, [rec.handle for rec in recs])
        self._syncs.add(job)

        def done(job: asyncio.Future[builtins.list[tuple[_Handle, Exception]]]) -> None:
            self._syncs.discard(job)
            for rec in recs:
                if rec.writing is writing:
                    rec.writing = None
            if job.cancelled():
                failures: builtins.list[tuple[_Handle, Exception]] = []
            elif job.exception() is not None:
                exc = cast("Exception", job.exception())
                failures = [(rec.handle, exc) for rec in recs]
            else:
                failures = job.result()
            for handle, exc in failures:
                self._sync_failed(handle, exc)
            writing.set_result(None)

        if job.done():
            done(job)
        else:
            job.add_done_callback(done)

    def _sync_handles(
        self, handles: builtins.list[_Handle]
    ) -> builtins.list[tuple[_Handle, Exception]]:
        """Sync each of ``handles`` (in a worker thread); the failures, by handle."""
        raise NotImplementedError

    def _sync_failed(self, handle: _Handle, exc: Exception) -> None:
        """A group commit could not sync ``handle``: log it (and fail later checkpoints)."""
        _log.error("could not sync session %r: %s", handle.id, exc)

    # -- refusing and holding --------------------------------------------------------------------

    def _refuse_live(self, ctx: Context, id: str) -> None:
        if ctx.sessions.get(id) is not None:
            raise SessionError(
                f"session {id!r} is live in this host; its open turn is never repaired",
                code="SESSION_LIVE",
            )

    def _claim(self, id: str) -> None:
        if self._claimed(id) or id in self._closing:
            raise SessionError(
                f"session {id!r} is held by this host's persistence", code="SESSION_LOCKED"
            )
        self._busy.add(id)

    def _abandon(self, id: str, session: Session) -> None:
        prepared = self._prepared.get(id)
        if prepared is not None and prepared.session is session:
            del self._prepared[id]
            self._release(prepared.handle, discard=False)

    # -- reading ---------------------------------------------------------------------------------

    def _load_sync(self, id: str, handle: _Handle | None, commit: bool) -> _Loaded:
        loaded, closers = self._read_repaired(id, handle, commit)
        if commit and handle is not None and (closers or handle.truncate):
            self._write(handle, closers)
        return loaded

    def _read_repaired(
        self, id: str, handle: _Handle | None, commit: bool
    ) -> tuple[_Loaded, builtins.list[SessionEvent]]:
        """The stored log with its repair closers appended, and those closers (not written)."""
        header, events, locate = self._read(id, handle)
        scan = _scan(events, locate)
        closers = _closers(id, scan, len(events))
        if closers:
            _log.warning(
                "session %r ended inside turn %s; closed it with %d repair event(s)%s",
                id,
                scan.checker.open_turn,
                len(closers),
                "" if commit else " (in memory only)",
            )
        events.extend(closers)
        return _Loaded(header=header, events=events), closers

    # -- public API ------------------------------------------------------------------------------

    async def create(self, header: SessionHeader) -> None:
        """Store a new, empty session under ``header`` (durable on return).

        Fails with ``SESSION_EXISTS`` when the id is already stored, ``SESSION_LIVE`` when it is
        live in this host, ``SESSION_LOCKED`` when another holder has it.
        """
        ctx = self._installed()
        if header.version != SESSION_FORMAT_VERSION:
            raise SessionError(
                f"session format version {header.version!r} is not supported",
                code="SESSION_FORMAT_UNSUPPORTED",
            )
        await self._quiesce(header.id)
        self._refuse_live(ctx, header.id)
        self._claim(header.id)
        try:
            handle = await self._hold(header.id, header)
            try:
                await self._run(self._write, handle, [])
            finally:
                self._release(handle, discard=False)
        finally:
            self._busy.discard(header.id)

    async def append(self, id: str, events: Iterable[SessionEvent]) -> None:
        """Append ``events`` to a stored, untracked session (durable on return).

        The first event's seq must equal the stored next seq (``SESSION_SEQ_MISMATCH``), and the
        events must keep the log valid (``SESSION_APPEND_INVALID``). A torn last line is dropped
        first. Live sessions are written through their own log, never through this method.
        """
        await self._with_cold_log(id, self._append_sync, list(events))

    async def _with_cold_log(self, id: str, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(id, handle, *args)`` off the loop on the stored log of ``id``, held (and
        refused if live in this host) for just that call."""
        ctx = self._installed()
        await self._quiesce(id)
        self._refuse_live(ctx, id)
        self._claim(id)
        try:
            handle = await self._hold(id, None)
            try:
                return await self._run(fn, id, handle, *args)
            finally:
                self._release(handle, discard=False)
        finally:
            self._busy.discard(id)

    def _append_sync(self, id: str, handle: _Handle, batch: builtins.list[SessionEvent]) -> None:
        _, stored, locate = self._read(id, handle)
        if batch and batch[0].seq != len(stored):
            raise SessionError(
                f"append to session {id!r} must start at seq {len(stored)}, got {batch[0].seq}",
                code="SESSION_SEQ_MISMATCH",
            )
        types = self.types
        for event in batch:
            try:
                _validate_appended(types, event)
            except SessionError as exc:
                raise SessionError(
                    f"cannot append to session {id!r}: {exc}", code="SESSION_APPEND_INVALID"
                ) from exc
        scan = _scan(stored, locate)
        checker = scan.checker
        for event in batch:
            try:
                checker.check(event)
            except LogInvariantError as exc:
                raise SessionError(
                    f"cannot append to session {id!r}: {exc}", code="SESSION_APPEND_INVALID"
                ) from exc
            checker.apply(event)
        self._write(handle, batch)

    async def prepare(
        self,
        id: str,
        signal: AbortSignal | None = None,
        *,
        check: Callable[[SessionHeader, Sequence[SessionEvent]], object] | None = None,
    ) -> SessionPreparation:
        """Load ``id`` (committing crash repair) as an unpublished restored session.

        The backend holds the log (``SESSION_LOCKED`` for anyone else) until the session is
        announced and later disposed, or until the preparation is disposed unannounced.

        ``check``, if given, sees the stored header and events (repair closers included, as
        ``inspect`` gives them) once they are read, before any repair is written or the session
        is built; whatever it raises fails the preparation, and the log is let go unchanged. A
        caller that must judge a log before resuming it (its owner, its state) so reads it
        once instead of inspecting it first.
        """
        ctx = self._installed()
        _check(signal)
        await self._quiesce(id)
        self._refuse_live(ctx, id)
        self._claim(id)
        handle: _Handle | None = None
        try:
            handle = await self._hold(id, None)
            if check is None:
                loaded = await self._run(self._load_sync, id, handle, True)
                _check(signal)
            else:
                loaded, closers = await self._run(self._read_repaired, id, handle, True)
                _check(signal)
                check(loaded.header, loaded.events)
                if closers or handle.truncate:
                    await self._run(self._write, handle, closers)
                    _check(signal)
            session = ctx.sessions.prepare(id, seed=loaded.events, restored=loaded.header)
            self._prepared[id] = _Prepared(
                session=session, handle=handle, stored=len(loaded.events)
            )
        except BaseException:
            if handle is not None:
                self._release(handle, discard=False)
            raise
        finally:
            self._busy.discard(id)
        return SessionPreparation(session, lambda: self._abandon(id, session))

    async def load(self, id: str) -> tuple[SessionHeader, tuple[SessionEvent, ...]]:
        """The stored log of a cold session, crash repair committed.

        Refuses a session live in this host (``SESSION_LIVE``): its open turn is not a crash.
        """
        loaded = await self._with_cold_log(id, self._load_sync, True)
        return loaded.header, tuple(loaded.events)

    async def inspect(
        self, id: str, signal: AbortSignal | None = None
    ) -> tuple[SessionHeader, tuple[SessionEvent, ...]]:
        """The stored log with repair closers added in memory only; nothing is written or held.

        For a session live in this host this is the part stored so far.
        """
        self._installed()
        _check(signal)
        await self._quiesce(id)
        loaded = await self._run(self._load_sync, id, None, False)
        _check(signal)
        return loaded.header, tuple(loaded.events)

    async def stored(self, id: str, signal: AbortSignal | None = None) -> bool:
        """Whether ``id`` is taken in the store, without reading its events: what a
        :meth:`create` of ``id`` would find there (``SESSION_EXISTS``).

        A log is stored once its header is; the JSONL store reads at most that line, never
        through a symlink. An entry that is there but damaged (a symlink or other non-file, an
        unreadable header) takes the id too; a file cut inside its header line was never
        created and does not. An id that cannot name a session is ``SESSION_INVALID_ID``, a
        store that cannot be read ``SESSION_IO``.
        """
        self._installed()
        check_session_id(id)
        _check(signal)
        await self._quiesce(id)
        found = await self._run(self._stored, id)
        _check(signal)
        return found

    async def list(self, signal: AbortSignal | None = None) -> builtins.list[SessionHeader]:
        """The headers of every stored session, oldest first (events are never read).

        A damaged entry is left out (and logged); :meth:`listing` also reports it.
        """
        return builtins.list((await self.listing(signal)).headers)

    async def listing(self, signal: AbortSignal | None = None) -> SessionListing:
        """The readable headers, oldest first, and the damaged entries, by id.

        A stored entry whose header cannot be read (not JSON, an unsupported version, a header
        naming another id, a symlink or other non-regular file, an unreadable file) is a
        :class:`DamagedSession` instead of failing the whole listing; only its own load fails.
        """
        self._installed()
        _check(signal)
        headers, damaged = await self._run(self._entries, signal)
        _check(signal)
        headers.sort(key=lambda h: (h.created_at, h.id))
        damaged.sort(key=lambda d: d.id)
        return SessionListing(headers=tuple(headers), damaged=tuple(damaged), stamps=self._stamps())

    async def scan(
        self,
        ids: Sequence[str],
        types: Iterable[str],
        signal: AbortSignal | None = None,
        *,
        until: Iterable[str] | None = None,
    ) -> builtins.list[StoredScan | SessionError]:
        """Read the stored logs of ``ids`` one after another, each once, in one worker job,
        keeping only the events of ``types`` (so a caller bounds its reads in flight by the
        calls it makes). A log that cannot be read is its ``SessionError``, in its place;
        nothing is written or held. The JSONL store decodes only the kept events: every
        line must still be a JSON event of the next seq and a known or ignorable type,
        otherwise the log is parsed as ``load`` parses it and fails with the same error.
        Nesting rules are not checked (``load`` does).

        ``until`` bounds the read: each log is read only up to its first event of one of
        those types in its own part (from the header's ``seed_length`` on), that event
        included; nothing after it is read or checked. A log without one is read whole.
        """
        self._installed()
        _check(signal)
        for id in ids:
            if id in self._closing:
                await self._quiesce(id)
        stop = frozenset(until) if until is not None else None
        found = await self._run(self._scan_all, builtins.list(ids), frozenset(types), signal, stop)
        _check(signal)
        return found

    def _scan_all(
        self,
        ids: builtins.list[str],
        types: frozenset[str],
        signal: AbortSignal | None,
        until: frozenset[str] | None = None,
    ) -> builtins.list[StoredScan | SessionError]:
        out: builtins.list[StoredScan | SessionError] = []
        for id in ids:
            if signal is not None and signal.aborted:
                raise AbortedError(signal.reason)
            try:
                if until is None:
                    out.append(self._scan(id, types))
                else:
                    out.append(self._scan_until(id, types, until))
            except SessionError as exc:
                out.append(exc)
            except Exception as exc:  # one crafted log must not fail the others' reads
                failed = SessionError(
                    f"session {id!r} is unreadable: {type(exc).__name__}: {exc}",
                    code="SESSION_CORRUPT",
                )
                failed.__cause__ = exc
                out.append(failed)
        return out

    def released(self, id: str) -> Awaitable[None]:
        """Wait until this backend's hold on ``id`` from a disposed session is let go (its
        last drain written, its lock released); returns at once when nothing is pending.

        The last write's ``fsync`` may still be running: the backend's shutdown waits for it.
        Every disposal awaits this, so with nothing pending no coroutine is made.
        """
        if id not in self._closing:
            return _NOTHING_PENDING
        return self._quiesce(id)

    # -- storage hooks ---------------------------------------------------------------------------

    def _acquire(self, id: str, header: SessionHeader | None) -> _Handle:
        """Hold ``id`` exclusively. With ``header``: create it (``SESSION_EXISTS`` if stored)
        and store the header line; without: open it (``SESSION_NOT_FOUND``)."""
        raise NotImplementedError

    def _release(self, handle: _Handle, *, discard: bool) -> None:
        """Let go of ``handle``; ``discard`` also deletes a log that ``_acquire`` created."""
        raise NotImplementedError

    def _read(
        self, id: str, handle: _Handle | None
    ) -> tuple[SessionHeader, builtins.list[SessionEvent], Callable[[int], str]]:
        """The stored header and events, and where event ``i`` lives (for error messages).

        A torn tail is dropped (and, through ``handle``, truncated before the next write).
        """
        raise NotImplementedError

    def _write(self, handle: _Handle, events: Sequence[SessionEvent], sync: bool = True) -> None:
        """Append ``events`` durably (one sync), finishing a new log's creation; with
        ``sync=False`` only written, the sync left to :meth:`_let_go`."""
        raise NotImplementedError

    def _let_go(self, handle: _Handle) -> Callable[[], None] | None:
        """Release a disposed session's hold now (another holder may take it at once) and
        return what must still run off the loop to make its writes durable, if anything."""
        self._release(handle, discard=False)
        return None

    def _headers(self, signal: AbortSignal | None) -> builtins.list[SessionHeader]:
        """Every stored header, unordered."""
        raise NotImplementedError

    def _entries(
        self, signal: AbortSignal | None
    ) -> tuple[builtins.list[SessionHeader], builtins.list[DamagedSession]]:
        """Every readable stored header and every damaged entry, unordered (a backend that
        cannot hold damaged entries keeps the default: ``_headers`` and no damage)."""
        return self._headers(signal), []

    def _stored(self, id: str) -> bool:
        """Whether ``id`` is taken (see :meth:`stored`; default: ``_read`` finds it)."""
        try:
            self._read(id, None)
        except SessionError as exc:
            if exc.code == "SESSION_NOT_FOUND":
                return False
            if exc.code in ("SESSION_INVALID_ID", "SESSION_IO"):
                raise
        return True

    def _stamps(self) -> dict[str, Hashable]:
        """The stamp of each stored log as the last listing saw it (default: none)."""
        return {}

    def _scan(self, id: str, types: frozenset[str]) -> StoredScan:
        """One read of a stored log for :meth:`scan` (default: all of ``_read``)."""
        header, events, _ = self._read(id, None)
        return StoredScan(header=header, events=tuple(e for e in events if e.type in types))

    def _scan_until(self, id: str, types: frozenset[str], until: frozenset[str]) -> StoredScan:
        """:meth:`_scan` bounded by ``until`` (see :meth:`scan`; default: the whole log read,
        the kept events cut after the stop)."""
        found = self._scan(id, types | until)
        events = kept_until(found.events, types, until, found.header.seed_length or 0)
        return StoredScan(header=found.header, events=events, stamp=found.stamp)


def kept_until(
    events: Iterable[SessionEvent], types: frozenset[str], until: frozenset[str], start: int
) -> tuple[SessionEvent, ...]:
    """The events of ``types`` up to the first event of ``until`` at seq ``start`` or later
    (that one included if it is of ``types``)."""
    out: builtins.list[SessionEvent] = []
    for event in events:
        t = event.type
        if t in types:
            out.append(event)
        if t in until and event.seq >= start:
            break
    return tuple(out)


class _NothingPending:
    """An awaitable that is done at once (cheaper than a coroutine or a future)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


_NOTHING_PENDING = _NothingPending()


def _log_close_failure(rec: _Tracked, exc: Exception) -> None:
    """Log why a disposed session's last write failed: a disposal never raises for it."""
    if isinstance(exc, _Unwritten):  # stored, some events as stand-ins
        _log.error("%s", exc)
    else:
        _log.error(
            "could not store the last %d event(s) of session %r",
            len(rec.pending()),
            rec.session.header.id,
            exc_info=exc,
        )


def _not_found(id: str, where: str = "") -> SessionError:
    return SessionError(f"no stored session {id!r}{where}", code="SESSION_NOT_FOUND")


# -- memory ---------------------------------------------------------------------------------------


@attrs.define(eq=False)
class _MemoryLog:
    header: SessionHeader
    events: list[SessionEvent]


class MemorySessionPersistence(SessionPersistence):
    """Keeps logs as event objects in this process (tests, ephemeral hosts); no file lock."""

    def __init__(self) -> None:
        super().__init__()
        self._logs: dict[str, _MemoryLog] = {}

    def _acquire(self, id: str, header: SessionHeader | None) -> _Handle:
        if header is not None:
            if id in self._logs:
                raise SessionError(f"session {id!r} is already stored", code="SESSION_EXISTS")
            self._logs[id] = _MemoryLog(header=header, events=[])
            return _Handle(id, created=True)
        if id not in self._logs:
            raise _not_found(id)
        return _Handle(id, created=False)

    def _release(self, handle: _Handle, *, discard: bool) -> None:
        if discard and handle.created:
            self._logs.pop(handle.id, None)

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

    def _scan(self, id: str, types: frozenset[str]) -> StoredScan:
        log = self._logs.get(id)
        if log is None:
            raise _not_found(id)
        events = tuple(e for e in log.events if e.type in types)
        return StoredScan(header=log.header, events=events, stamp=(log, len(log.events)))


# -- JSONL ----------------------------------------------------------------------------------------


def default_sessions_dir() -> Path:
    """Where JSONL logs live by default.

    ``$DSH_HOME/sessions`` when ``DSH_HOME`` is set; otherwise the platform data directory:
    ``$XDG_DATA_HOME/dsh/sessions`` (or ``~/.local/share/dsh/sessions``) on Linux and other
    POSIX systems, ``~/Library/Application Support/dsh/sessions`` on macOS,
    ``%LOCALAPPDATA%\\dsh\\sessions`` on Windows.
    """
    home = os.environ.get("DSH_HOME")
    if home:
        return Path(home) / "sessions"
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        base = Path(local) if local else Path.home() / "AppData" / "Local"
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        xdg = os.environ.get("XDG_DATA_HOME")
        # The XDG spec says a relative value is invalid and must be ignored.
        base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "dsh" / "sessions"


_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK: int = getattr(os, "O_NONBLOCK", 0)
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def _unsafe(path: Path | str) -> SessionError:
    return SessionError(
        f"session file {path} is a symlink or not a regular file; session files are never "
        "opened through one",
        code="SESSION_FILE_UNSAFE",
    )


def _open_file(path: Path | str, flags: int) -> int:
    """Open the session file named ``path`` itself: never through a symlink, never a FIFO,
    device or folder (``SESSION_FILE_UNSAFE``); other failures raise ``OSError``.

    ``O_NOFOLLOW`` refuses a symlink (dangling or not) at the open, ``O_NONBLOCK`` keeps a FIFO
    from blocking it, and ``fstat`` then requires a regular file. Where ``O_NOFOLLOW`` does
    not exist (Windows) the name is ``lstat``-ed after the open and must be the opened file.
    """
    return _open_stat(path, flags)[0]


def _open_stat(path: Path | str, flags: int) -> tuple[int, os.stat_result]:
    """:func:`_open_file`, and the ``fstat`` of the opened file (taken before any read)."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK, 0o600)
    except FileNotFoundError:
        raise
    except OSError:
        # ELOOP (Linux, macOS), EMLINK (FreeBSD), EISDIR, ENXIO...: refuse what is no file.
        try:
            named = os.lstat(path)
        except OSError:
            named = None
        if named is not None and not stat.S_ISREG(named.st_mode):
            raise _unsafe(path) from None
        raise
    try:
        held = os.fstat(fd)
        if not stat.S_ISREG(held.st_mode):
            raise _unsafe(path)
        if not _NOFOLLOW:
            named = os.lstat(path)
            if not stat.S_ISREG(named.st_mode) or (named.st_ino, named.st_dev) != (
                held.st_ino,
                held.st_dev,
            ):
                raise _unsafe(path)
        if _NONBLOCK and flags & (os.O_WRONLY | os.O_RDWR):
            os.set_blocking(fd, True)  # a writer's writes block as usual
    except BaseException:
        os.close(fd)
        raise
    return fd, held


class _FileHandle(_Handle):
    __slots__ = ("dir_synced", "fd", "lost", "path", "size", "synced", "written")

    def __init__(self, id: str, path: Path, fd: int, *, created: bool) -> None:
        super().__init__(id, created=created)
        self.path = path
        self.fd = fd
        self.size = 0  # bytes of complete, valid lines; a torn tail lies beyond
        self.dir_synced = not created
        # Writes so far, and how many of them an fsync has covered (a sync in a worker thread
        # may run while the loop writes more: it covers what was written when it began).
        self.written = 0
        self.synced = 0
        #: Set when the file was found deleted or replaced under this writer: every later
        #: write fails with it (never written into a file nobody can read back).
        self.lost: SessionError | None = None


def _sync(handle: _FileHandle, fd: int | None = None) -> None:
    """Make what was written to ``handle`` durable (and a new file's name with it)."""
    written = handle.written
    os.fsync(handle.fd if fd is None else fd)
    handle.synced = max(handle.synced, written)
    if not handle.dir_synced:
        _fsync_dir(handle.path.parent)  # a new file's name must survive a power cut too
        handle.dir_synced = True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pread(fd: int, size: int, offset: int) -> bytes:
    if sys.platform == "win32":  # no pread there; appends ignore the file position anyway
        os.lseek(fd, offset, os.SEEK_SET)
        return os.read(fd, size)
    return os.pread(fd, size, offset)


def _read_all(fd: int, size: int | None = None) -> bytes:
    """All of the file: ``size`` (its ``fstat`` size, if known) plus one byte is asked for
    first, so a file still that size is read in one call that also finds its end."""
    if size is None:
        size = os.fstat(fd).st_size
    first = _pread(fd, size + 1, 0)
    if len(first) == size:
        return first
    parts: list[bytes] = [first]
    offset = len(first)
    while True:
        chunk = _pread(fd, max(size - offset, 1 << 16), offset)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        offset += len(chunk)


def _fsync_dir(path: Path) -> None:
    if sys.platform == "win32":  # directories cannot be opened for syncing there
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock(fd: int, path: Path) -> None:
    if sys.platform == "win32":
        return  # documented: the cross-process lock is POSIX-only
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SessionError(
            f"session file {path} is locked by another process", code="SESSION_LOCKED"
        ) from None


def _being_created(fd: int) -> bool:
    """Whether a file without a complete header line is one a live writer is creating right
    now, not the remnant of a crash: it is empty (created, its header not written yet), or
    another holder has it locked (POSIX; the creator locks it before writing the header)."""
    if os.fstat(fd).st_size == 0:
        return True
    if sys.platform == "win32":
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the open file (it may have been replaced before the lock,
    by a symlink too: the name is not followed)."""
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_ino, held.st_dev) == (named.st_ino, named.st_dev)


def _line_encoder(types: EventTypeRegistry, type_: str) -> Callable[[SessionEvent], str]:
    """The function writing one event line of ``type_``.

    For a type whose payload class compiles (:mod:`dsh_core._codec`) the line is written
    directly; any event it does not fit (a payload of another class, an unusual value) and every
    other type go through ``dumps(types.encode(event))``, which the fast line always equals.
    """

    def generic(event: SessionEvent) -> str:
        return dumps(types.encode(event)) + "\n"

    spec = types.get(type_)
    payload = class_encoder(spec.payload) if spec is not None and spec.payload else None
    if payload is None:
        return generic
    prefix = '{"type":' + encode_basestring(type_) + ',"seq":'

    def line(event: SessionEvent) -> str:
        try:
            seq = event.seq
            time = event.time
            if seq.__class__ is not int or time.__class__ is not int:
                raise Unfit
            data = payload(event.data)
            if (
                event.source_event_seqs is None
                and event.surface_op is None
                and event.ignorable is False
            ):
                return f'{prefix}{seq},"time":{time},"data":{data}}}\n'
            return f'{prefix}{seq},"time":{time},"data":{data}{_surface_text(event)}}}\n'
        except Exception:
            return generic(event)

    return line


def _surface_text(event: SessionEvent) -> str:
    """The optional keys of an event line, as ``EventTypeRegistry.encode`` writes them."""
    out = ""
    seqs = event.source_event_seqs
    if seqs is not None:
        if seqs.__class__ is not tuple or any(s.__class__ is not int for s in seqs):
            raise Unfit
        out = ',"source_event_seqs":[' + ",".join([int.__repr__(s) for s in seqs]) + "]"
    op = event.surface_op
    if op is not None:
        if op.__class__ is not str:
            raise Unfit
        out += ',"surface_op":' + encode_basestring(op)
    if event.ignorable is True:
        out += ',"ignorable":true'
    elif event.ignorable is not False:
        raise Unfit
    return out


class _Unwritten(SessionError):
    """A write that stored every event, some as ``session/unwritable`` stand-ins: the batch
    counts as stored (never retried), and the flush reports the loss (``SESSION_IO``)."""


def _unwritten(path: Path, failed: builtins.list[str]) -> _Unwritten:
    return _Unwritten(
        f"session file {path}: could not encode {'; '.join(failed)}; stored an ignorable "
        "session/unwritable event in its place",
        code="SESSION_IO",
    )


def _stand_in(event: SessionEvent, exc: Exception) -> str:
    """The line stored for an event that could not be encoded (same seq and time)."""
    data = {"type": event.type, "error": f"{type(exc).__name__}: {exc}"[:1000]}
    line = {"type": "session/unwritable", "seq": event.seq, "time": event.time, "data": data}
    return dumps({**line, "ignorable": True}) + "\n"


#: A line nests at most this deep: a payload's MAX_NESTING levels inside the event object.
_LINE_NESTING = MAX_NESTING + 1
#: How many lines of a sound log are parsed at once (see ``_parse_sound``). Small enough that
#: a chunk's parsed containers stay under the collector's first threshold (700 allocations):
#: 256 made a 100,000-event load run twice the collections and take 18 % longer than 32.
_PARSE_CHUNK = 32


class _CollectorPause:
    """``with _COLLECTOR_PAUSED:`` runs its block with the cyclic garbage collector off.

    A load builds some four collector-tracked objects per event that all survive it: with the
    collector on, a 10,000-event log sets off dozens of young-generation passes and several
    middle ones that walk those objects again and again (about a tenth of the load), and they
    find nothing, since a log holds no cycles. Paused, the objects are walked once, by the
    first pass after the load. The switch is process-wide, so it is held briefly (one log's
    parse and decode, in a worker thread; the event loop runs on meanwhile, its cyclic garbage
    waiting for the pass after), counted across overlapping loads, restored on every exit
    (an exception included), and left alone when the collector was already off. A program
    that turns the collector off itself while a load is under way sees it turned back on when
    the load ends.
    """

    __slots__ = ("_depth", "_lock", "_restore")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._restore = False

    def __enter__(self) -> None:
        with self._lock:
            if not self._depth:
                self._restore = gc.isenabled()
                gc.disable()
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if not self._depth and self._restore:
                gc.enable()


_COLLECTOR_PAUSED = _CollectorPause()


class _TooDeep(ValueError):
    """A complete line nests deeper than :data:`_LINE_NESTING` (corrupt, never torn)."""

    def __init__(self) -> None:
        super().__init__(f"it nests deeper than {_LINE_NESTING} levels")


def _loads(line: bytes) -> Any:
    try:
        return json.loads(line.decode("utf-8", "surrogatepass"))
    except RecursionError:
        raise _TooDeep from None


def _nests_deeper(value: Any, levels: int) -> bool:
    """Whether parsed JSON ``value`` opens more than ``levels`` levels (recursion bounded by
    ``levels``: the value may be as deep as the parser allows)."""
    if type(value) is dict:
        items: Iterable[Any] = value.values()
    elif type(value) is list:
        items = value
    else:
        return False
    if levels < 1:
        return True
    return any(_nests_deeper(v, levels - 1) for v in items)


def _first_too_deep(lines: builtins.list[bytes], values: builtins.list[Any]) -> int | None:
    """The index of the first line nesting deeper than :data:`_LINE_NESTING`, if any.

    A line that deep is longer than twice that and holds more brackets; most lines are
    shorter or hold far fewer (both counted at C speed), and only the others are walked.
    """
    limit = _LINE_NESTING
    longer = (2 * limit).__lt__
    # A torn last line has no value: the range stops before it.
    for i in compress(range(len(values)), map(longer, map(len, lines))):
        line = lines[i]
        if line.count(b"{") + line.count(b"[") > limit and _nests_deeper(values[i], limit):
            return i
    return None


#: The first read of a bounded scan (see ``_read_until``); each later one is twice the last.
_SCAN_CHUNK = 1 << 16


def _stop_pattern(until: frozenset[str]) -> re.Pattern[bytes]:
    """Matches the start of an event line of one of ``until``'s types as the store writes it
    (type first, then seq); group 1 is the seq."""
    names = b"|".join(
        re.escape(encode_basestring(t).encode("utf-8", "surrogatepass")) for t in sorted(until)
    )
    return re.compile(b'\n\\{"type":(?:' + names + b'),"seq":([0-9]+)[,}]')


def _header_seed(line: bytes) -> int | None:
    """The ``seed_length`` of a header line (0 without one); ``None``: not a header."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if type(value) is not dict:
        return None
    seed = value.get("seed_length", 0)
    return seed if type(seed) is int else 0


def _read_until(fd: int, stop: re.Pattern[bytes]) -> bytes:
    """The file up to the end of its first event line that ``stop`` matches at a seq of at
    least the header's ``seed_length`` (the whole file when there is none), read a growing
    chunk at a time, so a long tail after the stop costs nothing.

    The match is a fast path over the lines the store writes; whatever it misses only makes
    the read longer, and what was read is parsed as usual.
    """
    data = bytearray()
    offset = 0
    step = _SCAN_CHUNK
    seed: int | None = None
    searched = 0
    while True:
        chunk = _pread(fd, step, offset)
        if not chunk:
            return bytes(data)
        data += chunk
        offset += len(chunk)
        step = min(step * 2, 1 << 22)
        if seed is None:
            nl = data.find(b"\n")
            if nl < 0:
                if len(data) > HEADER_LINE_LIMIT:
                    data += _read_all_from(fd, offset)
                    return bytes(data)
                continue
            seed = _header_seed(bytes(data[:nl]))
            if seed is None:  # not a header: the usual parse says what is wrong
                data += _read_all_from(fd, offset)
                return bytes(data)
            searched = nl
        while True:
            found = stop.search(data, searched)
            if found is None:
                searched = max(searched, data.rfind(b"\n"))  # a match may begin there
                break
            end = data.find(b"\n", found.end())
            if end < 0:
                searched = found.start()  # its line is not complete yet
                break
            if int(found.group(1)) >= seed:
                return bytes(data[: end + 1])
            searched = end


def _read_all_from(fd: int, offset: int) -> bytes:
    parts: list[bytes] = []
    while True:
        chunk = _pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        offset += len(chunk)


#: When the JSONL store syncs what a checkpoint wrote (see ``JsonlSessionPersistence.sync``).
SyncMode = Literal["always", "batch", "detach"]
SYNC_MODES: tuple[SyncMode, ...] = ("always", "batch", "detach")

_HEADER_CHUNK = 4096
#: A stored file as ``stat`` sees it: (inode, ctime, size, mtime), in nanoseconds.
_Stamp = tuple[int, int, int, int]
#: The longest header line (bytes, without its newline) the store writes or lists: a header
#: holds a few short fields, so anything longer is not a header (and listing never reads more).
HEADER_LINE_LIMIT = 1 << 20
#: How often an open that races a concurrent rename or removal is tried before giving up.
_OPEN_ATTEMPTS = 16


class JsonlSessionPersistence(SessionPersistence):
    """One ``<root>/<id>.jsonl`` file per session: a header line, then one event per line.

    Flushes append and ``fsync`` once per batch (and sync the directory when a file is
    created), in a worker thread, one flush of a session at a time. While this host holds a
    session (from creation or ``prepare`` until disposal) the file carries an exclusive
    ``flock``; another process gets ``SESSION_LOCKED``. The lock is POSIX-only: on Windows
    nothing stops two processes from appending to one file.

    Session files are never opened through a symlink and must be regular files
    (``SESSION_FILE_UNSAFE`` otherwise); a store folder that group or others may write is
    reported once with a warning (hardening 11.5).
    """

    _threaded = True

    def __init__(self, root: Path | None = None, *, sync: SyncMode = "batch") -> None:
        super().__init__()
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {list(SYNC_MODES)}, got {sync!r}")
        self.root = Path(root) if root is not None else default_sessions_dir()
        #: When a checkpoint's lines are synced: ``"always"`` before it returns, ``"batch"``
        #: by the next group commit, ``"detach"``: checkpoints write nothing (flush, detach).
        self.sync: SyncMode = sync
        self._checkpointing = sync != "detach"
        # file name -> (stamp, header or damage): a header never changes once written. The
        # stamp (inode, ctime, size, mtime) changes with any write, so it also stamps the log.
        self._header_cache: dict[str, tuple[_Stamp, SessionHeader | DamagedSession]] = {}
        self._line_encoders: dict[str, Callable[[SessionEvent], str]] = {}
        self._root_noted = threading.Event()  # set once the folder was looked at
        self._root_lock = threading.Lock()

    def path_of(self, id: str) -> Path:
        """The file of session ``id`` (``SESSION_INVALID_ID`` if it cannot name one)."""
        check_session_id(id)
        return self.root / f"{id}.jsonl"

    # -- holding ---------------------------------------------------------------------------------

    def _ensure_root(self) -> None:
        if self.root.is_dir():
            return
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        _fsync_dir(self.root.parent)

    def _note_root(self) -> None:
        """Warn once (per backend) if the store folder is writable by group or others.

        Loose means ``mode & 0o022``: someone else could plant, replace or remove session
        files there. The folder is still used (it is the user's choice); the warning says so.
        POSIX only: Windows has no such mode bits.
        """
        if self._root_noted.is_set() or sys.platform == "win32":
            return  # every open asks: once noted, no lock and no stat
        with self._root_lock:  # worker threads may race to be first: warn once all the same
            if self._root_noted.is_set():
                return
            try:
                mode = os.stat(self.root).st_mode
            except OSError:
                return  # not there yet: checked once it is
            self._root_noted.set()
        if mode & 0o022:
            _log.warning(
                "session folder %s is writable by group or others (mode %03o): anyone who can "
                "write there can plant or replace session files; make it private (chmod 700)",
                self.root,
                stat.S_IMODE(mode),
            )

    def _acquire(self, id: str, header: SessionHeader | None) -> _Handle:
        path = self.path_of(id)
        try:
            if header is not None:
                self._ensure_root()
            self._note_root()
            handle = self._open_locked(id, path, create=header is not None)
            if header is not None:
                self._start(handle, header)
        except OSError as exc:
            raise SessionError(
                f"cannot open session file {path}: {exc}", code="SESSION_IO"
            ) from exc
        return handle

    def _open_locked(self, id: str, path: Path, *, create: bool) -> _FileHandle:
        """Open and lock ``path`` itself (never through a symlink; a regular file only).

        Racing a concurrent removal or rename is retried a bounded number of times; a name
        that keeps changing is ``SESSION_IO``.
        """
        flags = os.O_RDWR | os.O_APPEND | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
        for _ in range(_OPEN_ATTEMPTS):
            created = False
            try:
                if create:
                    try:
                        fd = _open_file(path, flags | os.O_CREAT | os.O_EXCL)
                        created = True
                    except FileExistsError:
                        fd = _open_file(path, flags)
                else:
                    fd = _open_file(path, flags)
            except FileNotFoundError:
                if create:
                    continue  # removed between the two opens: try again
                raise _not_found(id) from None
            try:
                _lock(fd, path)
                if _same_file(fd, path):
                    return _FileHandle(id, path, fd, created=created)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # replaced or removed while we waited for the lock: start over
        raise SessionError(
            f"session file {path} kept changing while it was opened ({_OPEN_ATTEMPTS} tries)",
            code="SESSION_IO",
        )

    def _start(self, handle: _FileHandle, header: SessionHeader) -> None:
        """Write a new log's header line (made durable by the first flush)."""
        try:
            if os.fstat(handle.fd).st_size:
                if self._header_of(handle.fd, handle.path) is not None:
                    raise SessionError(
                        f"session {handle.id!r} is already stored in {handle.path}",
                        code="SESSION_EXISTS",
                    )
                os.ftruncate(handle.fd, 0)  # a log that was never created: replace it
                handle.created = True
                handle.dir_synced = False
            line = (dumps(encode_header(header)) + "\n").encode("utf-8", "surrogatepass")
            if len(line) > HEADER_LINE_LIMIT:
                raise SessionError(
                    f"the header of session {handle.id!r} is {len(line)} bytes; a header line "
                    f"is at most {HEADER_LINE_LIMIT}",
                    code="SESSION_HEADER_TOO_LARGE",
                )
            _write_all(handle.fd, line)
            handle.size = len(line)
        except BaseException:
            self._release(handle, discard=handle.created)
            raise

    def _release(self, handle: _Handle, *, discard: bool) -> None:
        assert isinstance(handle, _FileHandle)
        if handle.fd < 0:
            return
        try:
            if discard and handle.created:
                try:
                    os.unlink(handle.path)
                except FileNotFoundError:
                    pass
        finally:
            fd, handle.fd = handle.fd, -1
            os.close(fd)  # also drops the lock

    def _let_go(self, handle: _Handle) -> Callable[[], None] | None:
        assert isinstance(handle, _FileHandle)
        if handle.fd < 0 or (handle.synced == handle.written and handle.dir_synced):
            self._release(handle, discard=False)
            return None
        fd, handle.fd = handle.fd, -1
        try:
            if sys.platform != "win32":
                fcntl.flock(fd, fcntl.LOCK_UN)  # the lines are written: another holder may go on
        except BaseException:
            os.close(fd)
            raise

        def sync() -> None:
            try:
                os.fsync(fd)
                if not handle.dir_synced:
                    _fsync_dir(handle.path.parent)
                    handle.dir_synced = True
            finally:
                os.close(fd)

        return sync

    # -- reading ---------------------------------------------------------------------------------

    def _read(
        self, id: str, handle: _Handle | None
    ) -> tuple[SessionHeader, list[SessionEvent], Callable[[int], str]]:
        path = self.path_of(id)
        self._note_root()
        try:
            if isinstance(handle, _FileHandle):
                data = _read_all(handle.fd)
            else:
                try:
                    fd = _open_file(path, _READ_FLAGS)
                except FileNotFoundError:
                    raise _not_found(id) from None
                try:
                    data = _read_all(fd)
                finally:
                    os.close(fd)
        except OSError as exc:
            raise SessionError(
                f"cannot read session file {path}: {exc}", code="SESSION_IO"
            ) from exc
        with _COLLECTOR_PAUSED:
            header, events, size = self._parse(id, path, data)
        if isinstance(handle, _FileHandle):
            handle.size = size
            handle.truncate = size != len(data)
        return header, events, lambda i: f"session file {path} line {i + 2}"

    def _parse(
        self, id: str, path: Path, data: bytes
    ) -> tuple[SessionHeader, list[SessionEvent], int]:
        """Header, events and the byte length of the valid part of ``data``."""
        end = data.rfind(b"\n") + 1
        lines = data[:end].split(b"\n")
        lines.pop()  # the empty remainder after the last newline
        torn = len(data) - end  # bytes after the last newline: a line cut mid-write
        fast = self._parse_sound(id, lines)
        if fast is not None:
            if torn:
                _log.warning(
                    "session file %s: dropped a torn last line (%d bytes of an unfinished write)",
                    path,
                    torn,
                )
            return fast[0], fast[1], end
        # Something is wrong (or the log is empty): every line on its own, to name it.
        values = self._parse_lines(lines)
        if values is None:
            values = []
            for number, line in enumerate(lines, start=1):
                try:
                    values.append(_loads(line))
                except ValueError as exc:
                    if number == len(lines) and not torn and not isinstance(exc, _TooDeep):
                        break  # an unparsable last line is torn too (e.g. zero-filled)
                    raise SessionError(
                        f"session file {path} line {number} is not JSON: {exc}",
                        code="SESSION_CORRUPT",
                    ) from None
        if len(values) < len(lines):
            torn += len(lines[-1]) + 1
            end -= len(lines[-1]) + 1
        deep = _first_too_deep(lines, values)
        if deep is not None:
            raise SessionError(
                f"session file {path} line {deep + 1} is not JSON: {_TooDeep()}",
                code="SESSION_CORRUPT",
            )
        if torn:
            _log.warning(
                "session file %s: dropped a torn last line (%d bytes of an unfinished write)",
                path,
                torn,
            )
        if not values:
            _log.warning("session file %s was cut inside its header: never created", path)
            raise _not_found(id, f" (its file {path} was cut inside the header line)")
        try:
            header = structure_header(values[0])
        except SessionError as exc:
            raise SessionError(f"session file {path} line 1: {exc}", code=exc.code) from exc
        if header.id != id:
            raise SessionError(
                f"session file {path} line 1: header names session {header.id!r}",
                code="SESSION_CORRUPT",
            )
        decode = self.types.decode
        events: list[SessionEvent] = []
        append = events.append
        try:
            for i in range(1, len(values)):
                append(decode(values[i]))
                values[i] = None  # free each parsed line at once: far less for the GC to walk
        except SessionError as exc:
            number = len(events) + 2
            raise SessionError(f"session file {path} line {number}: {exc}", code=exc.code) from exc
        return header, events, end

    def _parse_sound(
        self, id: str, lines: list[bytes]
    ) -> tuple[SessionHeader, list[SessionEvent]] | None:
        """Header and events of a log whose every line is sound, or ``None`` at the first sign
        of anything else (the caller then takes the route that finds and names it).

        Lines are parsed and decoded a chunk at a time, so the parsed JSON of a chunk is
        freed before the next is parsed: the collector never walks a whole log's worth of
        parsed JSON, and it dies young instead of filling the oldest generation.
        """
        if not lines:
            return None
        decode = self.types.decode
        events: list[SessionEvent] = []
        append = events.append
        header: SessionHeader | None = None
        for start in range(0, len(lines), _PARSE_CHUNK):
            chunk = lines[start : start + _PARSE_CHUNK]
            values = self._parse_lines(chunk)
            if values is None or _first_too_deep(chunk, values) is not None:
                return None
            try:
                if header is None:
                    header = structure_header(values[0])
                    if header.id != id:
                        return None
                    values[0] = None
                    values = values[1:]
                for value in values:
                    append(decode(value))
            except Exception:
                return None
            del values
        assert header is not None
        return header, events

    @staticmethod
    def _parse_lines(lines: list[bytes]) -> list[Any] | None:
        """All lines parsed in one call, or ``None`` when any of them is not one JSON object."""
        if not lines:
            return []
        try:
            text = b",".join(lines).decode("utf-8", "surrogatepass")
            values = json.loads(f"[{text}]")
        except (ValueError, RecursionError):  # line by line names the line
            return None
        if len(values) != len(lines) or not all(type(v) is dict for v in values):
            return None
        return values  # type: ignore[no-any-return]

    def _header_of(self, fd: int, path: Path | str) -> SessionHeader | None:
        """The header of an open log, or ``None`` if the file was cut inside it.

        Reads at most :data:`HEADER_LINE_LIMIT` bytes: a longer first line is not a header
        (``SESSION_CORRUPT``), however long the file.
        """
        parts: list[bytes] = []
        offset = 0
        while True:
            chunk = _pread(fd, _HEADER_CHUNK, offset)
            if not chunk:
                return None  # no complete header line
            end = chunk.find(b"\n")
            if end >= 0:
                parts.append(chunk[:end])
                break
            parts.append(chunk)
            offset += len(chunk)
            if offset > HEADER_LINE_LIMIT:
                raise SessionError(
                    f"session file {path} line 1 is longer than {HEADER_LINE_LIMIT} bytes: "
                    "not a session header",
                    code="SESSION_CORRUPT",
                )
        line = b"".join(parts)
        try:
            raw = _loads(line)
        except (ValueError, RecursionError) as exc:
            if os.fstat(fd).st_size == len(line) + 1:
                return None  # the header is the torn last line
            what = "nested too deeply" if isinstance(exc, RecursionError) else f"not JSON: {exc}"
            raise SessionError(
                f"session file {path} line 1 is {what}", code="SESSION_CORRUPT"
            ) from None
        try:
            return structure_header(raw)
        except SessionError as exc:
            raise SessionError(f"session file {path} line 1: {exc}", code=exc.code) from exc

    def _headers(self, signal: AbortSignal | None) -> list[SessionHeader]:
        return self._entries(signal)[0]

    def _entries(
        self, signal: AbortSignal | None
    ) -> tuple[list[SessionHeader], list[DamagedSession]]:
        """Every readable header and every damaged ``*.jsonl`` entry of the folder.

        Each entry is judged on its own (hardening 11.3): what cannot be read becomes a
        :class:`DamagedSession`, logged when first seen. Headers and damage are cached per
        file name under the entry's (inode, ctime, size, mtime), so an unchanged file is read
        once; ``SESSION_IO`` is never cached (it may pass), and a torn header is never cached.
        """
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return [], []
        self._note_root()
        cache = self._header_cache
        fresh: dict[str, tuple[_Stamp, SessionHeader | DamagedSession]] = {}
        out: list[SessionHeader] = []
        damaged: list[DamagedSession] = []
        for entry in entries:
            name = entry.name
            if not name.endswith(".jsonl"):
                continue
            if signal is not None and signal.aborted:
                raise AbortedError(signal.reason)
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while listing
            key = (st.st_ino, st.st_ctime_ns, st.st_size, st.st_mtime_ns)
            known = cache.get(name)
            if known is not None and known[0] == key:
                found: SessionHeader | DamagedSession | None = known[1]
            else:
                found = self._entry_at(name[:-6], entry.path, st.st_mode)
                if isinstance(found, DamagedSession):
                    _log.warning("session listing left out %s", found.message)
            if found is None:
                continue
            if isinstance(found, DamagedSession):
                damaged.append(found)
                if found.code == "SESSION_IO":
                    continue
            else:
                out.append(found)
            fresh[name] = (key, found)
        self._header_cache = fresh
        return out, damaged

    def _entry_at(
        self, id: str, path: Path | str, mode: int
    ) -> SessionHeader | DamagedSession | None:
        """The header stored at ``path`` (``None``: torn inside it), or what is wrong there."""
        try:
            check_session_id(id)
            if not stat.S_ISREG(mode):
                raise _unsafe(path)
            header = self._header_at(path)
            if header is not None and header.id != id:
                raise SessionError(
                    f"session file {path} line 1: header names session {header.id!r}",
                    code="SESSION_CORRUPT",
                )
            return header
        except SessionError as exc:
            code, message = exc.code, str(exc)
            if code == "SESSION_INVALID_ID":
                message = f"session file {path}: its name is no session id ({exc})"
        except OSError as exc:
            code, message = "SESSION_IO", f"cannot read session file {path}: {exc}"
        except Exception as exc:  # a crafted file must not fail the listing, whatever it holds
            code = "SESSION_CORRUPT"
            message = f"session file {path} line 1 is unreadable: {type(exc).__name__}: {exc}"
        return DamagedSession(id=id, code=code, message=message)

    def _header_at(self, path: Path | str) -> SessionHeader | None:
        try:
            fd = _open_file(path, _READ_FLAGS)
        except FileNotFoundError:
            return None
        try:
            header = self._header_of(fd, path)
            quiet = header is None and _being_created(fd)
        finally:
            os.close(fd)
        if header is None and not quiet:
            _log.warning("session file %s was cut inside its header: never created", path)
        return header

    def _stored(self, id: str) -> bool:
        """One open of the name itself and a read of the header line at most."""
        path = self.path_of(id)
        self._note_root()
        try:
            return self._header_at(path) is not None  # None: no file, or cut in its header
        except OSError as exc:
            raise SessionError(
                f"cannot read session file {path}: {exc}", code="SESSION_IO"
            ) from exc
        except SessionError:  # a symlink, a non-file, an unreadable header: the name is taken
            return True

    def _stamps(self) -> dict[str, Hashable]:
        return {
            found.id: key
            for key, found in self._header_cache.values()
            if isinstance(found, SessionHeader)
        }

    def _scan(self, id: str, types: frozenset[str]) -> StoredScan:
        """One read of the file; only the kept events are decoded (see :meth:`scan`)."""
        return self._scan_file(id, types, None)

    def _scan_until(self, id: str, types: frozenset[str], until: frozenset[str]) -> StoredScan:
        """Reads the file only up to the stop (see :meth:`scan`), a growing chunk at a time."""
        return self._scan_file(id, types, _stop_pattern(until))

    def _scan_file(
        self, id: str, types: frozenset[str], stop: re.Pattern[bytes] | None
    ) -> StoredScan:
        check_session_id(id)
        name = f"{id}.jsonl"
        path = os.path.join(self.root, name)  # what path_of names, without a Path per file
        try:
            try:
                # The stat of the open file, before the read: a later write changes the stamp.
                fd, st = _open_stat(path, _READ_FLAGS)
            except FileNotFoundError:
                raise _not_found(id) from None
            try:
                data = _read_all(fd, st.st_size) if stop is None else _read_until(fd, stop)
            finally:
                os.close(fd)
        except OSError as exc:
            raise SessionError(
                f"cannot read session file {path}: {exc}", code="SESSION_IO"
            ) from exc
        stamp = (st.st_ino, st.st_ctime_ns, st.st_size, st.st_mtime_ns)
        found = self._scan_lines(data, types)
        if found is None:  # anything unusual: the full parse gives load's own verdict
            header, events, _ = self._parse(id, Path(path), data)
            kept = tuple(e for e in events if e.type in types)
            return StoredScan(header=header, events=kept, stamp=stamp)
        try:
            known = self._header_cache.get(name)
            if known is not None and known[0] == stamp and isinstance(known[1], SessionHeader):
                header = known[1]  # the header the listing read from this very file
            else:
                header = structure_header(found[0])
                if header.id != id:
                    raise SessionError(
                        f"header names session {header.id!r}", code="SESSION_CORRUPT"
                    )
            decode = self.types.decode
            kept = tuple(decode(value) for value in found[1])
        except SessionError as exc:
            raise SessionError(f"session file {path}: {exc}", code=exc.code) from exc
        return StoredScan(header=header, events=kept, stamp=stamp)

    def _scan_lines(self, data: bytes, types: frozenset[str]) -> tuple[Any, list[Any]] | None:
        """The header value and the values of the kept events, or ``None`` unless every line
        is a complete JSON event of the next seq, of a known or ignorable type, not too deep."""
        if not data.endswith(b"\n"):
            return None  # empty, or a torn last line
        lines = data.split(b"\n")
        lines.pop()
        values = self._parse_lines(lines)
        if not values:
            return None
        # No line opens more brackets than the whole file: a small total spares the per-line walk.
        if (
            data.count(b"{") + data.count(b"[") > _LINE_NESTING
            and _first_too_deep(lines, values) is not None
        ):
            return None
        known = self.types.get
        kept: list[Any] = []
        for seq, value in enumerate(islice(values, 1, None)):
            type_ = value.get("type")
            at = value.get("seq")
            if at.__class__ is not int or at != seq or type_.__class__ is not str:
                return None
            if type_ in types:
                kept.append(value)
            elif known(type_) is None and value.get("ignorable") is not True:
                return None  # SESSION_FORMAT_UNSUPPORTED, said by the full parse
        return values[0], kept

    # -- writing ---------------------------------------------------------------------------------

    def _lines(
        self, events: Sequence[SessionEvent], failed: builtins.list[str] | None = None
    ) -> bytes:
        """The JSONL lines of ``events``: ``dumps(types.encode(event))`` each, by the fast
        per-type encoders where they apply.

        ``Session.append`` refuses what the log cannot write, so an event fails here only if
        the process changed under the log (a lowered ``sys.set_int_max_str_digits``, say).
        Given ``failed``, such an event is named there and its line is an ignorable
        ``session/unwritable`` stand-in (the seqs stay contiguous and later events are stored
        as usual; the write then reports it, see :func:`_unwritten`); without, it raises.
        """
        encoders = self._line_encoders
        lines: list[str] = []
        append = lines.append
        for event in events:
            encode = encoders.get(event.type)
            if encode is None:
                encode = encoders[event.type] = _line_encoder(self.types, event.type)
            try:
                append(encode(event))
            except Exception as exc:
                if failed is None:
                    raise
                failed.append(f"{event.type} at seq {event.seq} ({type(exc).__name__}: {exc})")
                append(_stand_in(event, exc))
        return "".join(lines).encode("utf-8", "surrogatepass")

    def _write(self, handle: _Handle, events: Sequence[SessionEvent], sync: bool = True) -> None:
        assert isinstance(handle, _FileHandle)
        failed: list[str] = []
        self._put(handle, self._lines(events, failed), failed, sync)

    def _write_through(self, rec: _Tracked) -> None:
        handle = rec.handle
        assert isinstance(handle, _FileHandle)
        always = self.sync == "always"
        batch = rec.pending()
        if not batch and not handle.truncate and handle.lost is None:
            if always and self._dirty(handle):
                self._put(handle, b"", [], True)  # a new file's header and name
                rec.unsynced = False
            return
        failed: list[str] = []
        data = self._lines(batch, failed)
        try:
            self._put(handle, data, failed, always)
        except _Unwritten:
            rec.stored += len(batch)  # stored, some events as stand-ins: never retried
            raise
        rec.stored += len(batch)
        if always:
            rec.unsynced = False
        else:
            self._commit_later(rec)

    def _dirty(self, handle: _Handle) -> bool:
        assert isinstance(handle, _FileHandle)
        return handle.fd >= 0 and (handle.synced != handle.written or not handle.dir_synced)

    def _sync_handles(self, handles: list[_Handle]) -> list[tuple[_Handle, Exception]]:
        failures: list[tuple[_Handle, Exception]] = []
        for handle in handles:
            assert isinstance(handle, _FileHandle)
            try:
                _sync(handle)
            except Exception as exc:
                failures.append((handle, exc))
        return failures

    def _sync_failed(self, handle: _Handle, exc: Exception) -> None:
        assert isinstance(handle, _FileHandle)
        if handle.lost is None:
            handle.lost = SessionError(
                f"cannot sync session file {handle.path}: {exc}; its last lines may not be on "
                "the disk, so nothing more is written to it",
                code="SESSION_IO",
            )
        _log.error("%s", handle.lost)

    def _close_inline(self, rec: _Tracked) -> bool:
        assert isinstance(rec.handle, _FileHandle)
        batch = rec.pending()
        failed: list[str] = []
        data = self._lines(batch, failed)
        if len(data) > self._inline_close_limit:
            return False
        try:
            self._put(rec.handle, data, failed, False)
            rec.stored += len(batch)
        except Exception as exc:
            if isinstance(exc, _Unwritten):  # stored, some events as stand-ins
                rec.stored += len(batch)
            _log_close_failure(rec, exc)
        self._let_go_later(rec)
        return True

    def _put(self, handle: _FileHandle, data: bytes, failed: list[str], sync: bool) -> None:
        """Append the encoded ``data`` (and sync it, if asked); ``failed`` names the events
        written as stand-ins."""
        fd = handle.fd
        lost = handle.lost
        if lost is not None:
            raise SessionError(str(lost), code=lost.code)
        try:
            if data and not _same_file(fd, handle.path):
                handle.lost = SessionError(
                    f"session file {handle.path} was deleted or replaced while this host was "
                    "writing it; nothing more is written to it",
                    code="SESSION_IO",
                )
                raise SessionError(str(handle.lost), code="SESSION_IO")
            if handle.truncate:
                os.ftruncate(fd, handle.size)
                handle.truncate = False
            if data:
                _write_all(fd, data)
                handle.written += 1
            if sync:
                _sync(handle)
        except OSError as exc:
            handle.truncate = True  # whatever was written goes before the retry
            raise SessionError(
                f"cannot write session file {handle.path}: {exc}", code="SESSION_IO"
            ) from exc
        handle.size += len(data)
        if failed:
            raise _unwritten(handle.path, failed)


# -- installation ---------------------------------------------------------------------------------


def install_memory_persistence(ctx: Context) -> MemorySessionPersistence:
    """Install an in-memory backend and provide it as ``session_persistence``."""
    persistence = MemorySessionPersistence()
    persistence.install(ctx)
    ctx.provide("session_persistence", persistence)
    return persistence


def install_jsonl_persistence(
    ctx: Context, root: Path | None = None, *, sync: SyncMode = "batch"
) -> JsonlSessionPersistence:
    """Install a JSONL backend (``root`` or :func:`default_sessions_dir`) as
    ``session_persistence``; ``sync`` is its checkpoint policy (see
    :attr:`JsonlSessionPersistence.sync`)."""
    persistence = JsonlSessionPersistence(root, sync=sync)
    persistence.install(ctx)
    ctx.provide("session_persistence", persistence)
    return persistence
