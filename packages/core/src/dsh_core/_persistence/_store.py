"""The store interface (``ctx.session_persistence``): tracking a host's live sessions,
batching and ordering their writes, checkpoints and group commit, restoring and repairing
stored logs. Backends implement the storage hooks."""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import os
from collections.abc import Awaitable, Callable, Generator, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import attrs

from .._abort import AbortedError, AbortSignal
from .._events import (
    SESSION_FORMAT_VERSION,
    EventTypeRegistry,
    SessionError,
    SessionEvent,
    SessionHeader,
)
from .._frozen import attrs_eq, attrs_hash, attrs_repr
from .._log_checker import LogInvariantError
from .._sessions import LogFold, Session, check_session_id, fold_log
from ._common import T, _check, _deliver, _log, _settle, _stored_anyway, _succeeded, _Unwritten
from ._repair import _closers, _Scan, _scan, _validate_appended

if TYPE_CHECKING:
    from .._context import Context

#: How many closed logs a store keeps warm by default (``SessionPersistence.warm_sessions``).
WARM_SESSIONS = 1024
#: How many events those logs hold together by default (``SessionPersistence.warm_events``).
WARM_EVENTS = 50_000
#: How many stored bytes they take together by default (``SessionPersistence.warm_bytes``).
WARM_BYTES = 16 * 1024 * 1024

# -- listing ------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class DamagedSession:
    """A stored entry that listing could not read (hardening 11.3).

    ``id`` is the id its name gives (possibly not a valid one); ``code`` is the stable
    ``SessionError`` code its own load would fail with (``SESSION_CORRUPT``,
    ``SESSION_FORMAT_UNSUPPORTED``, ``SESSION_FILE_UNSAFE``, ``SESSION_INVALID_ID`` or
    ``SESSION_IO``); ``message`` says what is wrong and names the file.
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    id: str
    code: str
    message: str


@attrs.frozen(kw_only=True)
class SessionListing:
    """What ``listing()`` found: the readable headers (oldest first) and, by id, the entries
    that are damaged. One damaged entry never hides the others."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

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

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

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
    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash
    header: SessionHeader
    events: list[SessionEvent]  # the stored events, then the repair closers
    closers: list[SessionEvent] = attrs.field(factory=list)
    # The log invariant's replay of events[:scanned] (the stored part), carried to the warm log.
    scan: _Scan | None = None
    scanned: int = 0
    fold: LogFold | None = None  # what the session derives of ``events`` (a warm log's only)


class _Warm:
    """A log this host wrote and closed itself, kept decoded (see :attr:`warm_events`).

    ``events`` is the log as this host wrote it (its events are immutable, and the store reads
    back what it writes, equal): the closed session's own list, which that session now reads
    through a ``_ClosedLog`` (its own appends go to a copy), so nothing changes it while it is
    warm; a resume takes it over as the new session's log when it takes the warm log, an
    inspect copies it.
    ``stamp`` is the backend's stamp of the log right after that last write, ``scan`` the log
    invariant's replay of ``events[:scanned]`` (``None``: none yet). It stands for the stored
    log only while the log's stamp is still ``stamp``.
    """

    __slots__ = ("events", "fold", "header", "scan", "scanned", "size", "stamp")

    def __init__(
        self,
        header: SessionHeader,
        events: builtins.list[SessionEvent],
        stamp: Hashable,
        scan: _Scan | None,
        scanned: int,
        size: int,
        fold: LogFold | None,
    ) -> None:
        self.header = header
        self.fold = fold  # what the session derives of events[:fold.length], if known
        self.events = events
        self.stamp = stamp
        self.size = size  # the stored log's bytes, if the backend counts them (else 0)
        self.scan = scan
        self.scanned = scanned if scan is not None else 0


class _Tracked:
    """A session this host writes: how much of it is stored, and where its log ends."""

    __slots__ = (
        "end",
        "fold",
        "handle",
        "scan",
        "scanned",
        "session",
        "stored",
        "unsynced",
        "writing",
    )

    def __init__(
        self,
        session: Session,
        handle: _Handle,
        *,
        stored: int,
        unsynced: bool,
        scan: _Scan | None = None,
        scanned: int = 0,
        fold: LogFold | None = None,
    ) -> None:
        self.session = session
        self.handle = handle
        self.stored = stored  # events [0, stored) are durable
        self.unsynced = unsynced  # a new log whose creation is not durable yet
        self.end: int | None = None  # set when tracking ends: later appends are not stored
        # The write under way, if any: done (always with None) once its outcome is counted.
        self.writing: asyncio.Future[None] | None = None
        # The replay of the restored part (events[:scanned]), if this host read it: a warm
        # log of this session goes on from it instead of replaying the whole log again.
        self.scan = scan
        self.scanned = scanned
        self.fold = fold  # the restored part's fold, likewise

    def pending(self) -> Sequence[SessionEvent]:
        """The events to store next (a copy): everything beyond ``stored``, up to ``end``."""
        events = self.session.events_since(self.stored)
        if self.end is not None:
            return events[: self.end - self.stored]
        return events


@attrs.define(eq=False)
class _Prepared:
    __repr__ = attrs_repr
    session: Session
    handle: _Handle
    stored: int
    scan: _Scan | None = None
    scanned: int = 0
    fold: LogFold | None = None


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
    #: Whether a disposed session's deferred sync joins the next group commit (one worker job
    #: for every sync of the window) rather than taking a worker job of its own.
    _batch_let_go = False
    #: The most disposed sessions waiting for a group commit (each holds a descriptor); past
    #: it, a disposal's sync takes a worker job of its own, as without batching.
    _owed_limit = 256
    #: How many worker jobs one group commit spreads its syncs over (a file system commits
    #: concurrent syncs together); the other workers stay free for flushes.
    _commit_jobs = max(1, _workers // 2)

    def __init__(self) -> None:
        #: The most closed logs kept warm (decoded, in memory) for a quick resume; 0: none.
        self.warm_sessions: int = WARM_SESSIONS
        #: The most events those logs hold together (a longer log is never kept); 0: none.
        self.warm_events: int = WARM_EVENTS
        #: The most bytes their stored logs take together (the JSONL store's files; decoded,
        #: a log takes about three times its file's size in memory).
        self.warm_bytes: int = WARM_BYTES
        #: The warm logs by id, the least recently closed first, and their events and bytes.
        self._warm: dict[str, _Warm] = {}
        self._warm_total = 0
        self._warm_size = 0
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
        self._commit_timer: asyncio.Handle | None = None
        #: The group commit under way (one at a time: flushes keep the other worker threads).
        self._committing: asyncio.Future[Any] | None = None
        #: Disposed sessions whose sync waits for the next group commit: the handle, what the
        #: backend kept to sync it (see _hand_over), and the future that reports it (in _syncs).
        self._owed: builtins.list[tuple[_Handle, object, asyncio.Future[None]]] = []

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
            rec = _Tracked(
                session,
                prepared.handle,
                stored=prepared.stored,
                unsynced=False,
                scan=prepared.scan,
                scanned=prepared.scanned,
                fold=prepared.fold,
            )
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
        # The next group commit skips a record no longer tracked (its close syncs it): drop it
        # now so the disposed session leaves memory without waiting for that commit (PERF-4).
        self._unsynced.discard(rec)
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
        """Release ``rec``'s hold now and start its deferred sync, if the backend has one
        (with :attr:`_batch_let_go`: have the next group commit run it)."""
        self._keep_warm(rec)
        if self._batch_let_go and not self._closed and len(self._owed) < self._owed_limit:
            owed = self._hand_over(rec.handle)
            if owed is None:
                return
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._owed.append((rec.handle, owed, fut))
            self._schedule_commit()
        else:
            sync = self._let_go(rec.handle)
            if sync is None:
                return
            try:
                fut = self._submit(sync)
            except BaseException:  # no worker thread to be had: sync here rather than never
                sync()
                raise
        self._syncs.add(fut)
        # Only the id, not ``rec``: the disposed session and its whole log leave memory now,
        # not when the deferred fsync is done (PERF-4).
        sid = rec.session.header.id

        def synced(fut: asyncio.Future[None]) -> None:
            self._syncs.discard(fut)
            if not fut.cancelled() and fut.exception() is not None:
                _log.error(
                    "the last events of session %r were written but not synced: %s",
                    sid,
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
            self._keep_warm(rec)
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
        if sync:
            self._unsynced.discard(rec)  # this write syncs it: the group commit need not
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
        self._warm.clear()
        self._warm_total = self._warm_size = 0
        if self._owed and self._committing is None:
            self._group_commit()  # the deferred syncs of disposed sessions, now
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
        """Have ``rec``'s written lines synced by the next group commit (in a worker thread,
        :attr:`_commit_window` seconds from now, or once the one under way is over)."""
        self._unsynced.add(rec)
        self._schedule_commit()

    def _schedule_commit(self) -> None:
        """Start the group commit timer, unless one is set or a commit is under way (its end
        starts the next round)."""
        if self._commit_timer is None and self._committing is None:
            loop = asyncio.get_running_loop()
            self._commit_timer = loop.call_later(self._commit_window, self._group_commit)

    #: How long a group commit collects written lines before one worker job syncs them all.
    _commit_window = 0.02

    def _group_commit(self) -> None:
        """Sync every tracked session a checkpoint left unsynced, and every disposed session
        whose sync was deferred to it, in one worker job.

        Nothing waits for the job but the shutdown: a flush syncs on its own, and a close
        neither waits for it nor pulls a file from under it (the backend syncs what
        :meth:`_sync_later` held for it, not the session's own handle). A failed sync of a
        tracked session is logged and fails every later checkpoint of that session (its lines
        may not be on the disk); one of a disposed session is logged.
        """
        self._commit_timer = None
        unsynced = self._unsynced
        owed, self._owed = self._owed, []
        handles: builtins.list[_Handle] = []
        if not self._closed:
            tracked = self._tracked
            handles = [
                rec.handle
                for rec in unsynced
                if tracked.get(rec.session.header.id) is rec and self._dirty(rec.handle)
            ]
        unsynced.clear()
        if not handles and not owed:
            return
        waiting = {handle: fut for handle, _, fut in owed}
        works = self._sync_later(handles, [(handle, kept) for handle, kept, _ in owed])

        def report(failures: builtins.list[tuple[_Handle, Exception]]) -> None:
            for handle, exc in failures:
                fut = waiting.pop(handle, None)
                if fut is None:
                    self._sync_failed(handle, exc)
                elif not fut.done():
                    fut.set_exception(exc)
            for fut in waiting.values():
                if not fut.done():
                    fut.set_result(None)

        jobs: builtins.list[asyncio.Future[builtins.list[tuple[_Handle, Exception]]]] = []
        inline: builtins.list[tuple[_Handle, Exception]] = []
        for work in works:
            try:
                jobs.append(self._submit(work))
            except BaseException:  # no worker thread to be had: sync here rather than never
                inline.extend(work())
        if not jobs:
            report(inline)
            return
        job = self._committing = asyncio.gather(*jobs, return_exceptions=True)
        self._syncs.add(job)

        def done(job: asyncio.Future[builtins.list[Any]]) -> None:
            self._syncs.discard(job)
            self._committing = None
            if self._owed or (self._unsynced and not self._closed):
                # Written or disposed while this one ran: the next round.
                self._commit_timer = asyncio.get_running_loop().call_soon(self._group_commit)
            failures = inline
            outcomes = [] if job.cancelled() else job.result()
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    exc = outcome if isinstance(outcome, Exception) else RuntimeError(outcome)
                    failures = [(handle, exc) for handle in (*handles, *waiting)]
                    break
                failures.extend(outcome)
            report(failures)

        job.add_done_callback(done)

    def _sync_later(
        self, handles: builtins.list[_Handle], owed: builtins.list[tuple[_Handle, object]]
    ) -> builtins.list[Callable[[], builtins.list[tuple[_Handle, Exception]]]]:
        """On the loop: what worker threads run (at most :attr:`_commit_jobs` jobs, side by
        side) to sync ``handles`` and the disposed sessions ``owed`` (each with what
        :meth:`_hand_over` kept for it), each job returning its failures, by handle; it holds
        on the loop whatever that needs to outlive a close."""
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

    # -- warm logs ---------------------------------------------------------------------------------

    # A follow-up to a settled child resumes its session right after this host closed it: the
    # log it would read is the one it just wrote. A warm log spares that read (and the decode
    # and replay of every event) when the backend's stamp proves the stored log unchanged
    # since; anything else reads the store (DUR-50..DUR-53). Bounded by count and by events
    # (DUR-54).

    def _keep_warm(self, rec: _Tracked) -> None:
        """Keep a disposed session's log warm if everything of it was written faithfully (no
        stand-in, no failure) and the backend can stamp the log as it now stands."""
        sid = rec.session.header.id
        self._forget_warm(sid)
        end = rec.end
        if (
            end is None
            or rec.stored != end
            or self._closed
            or end > self.warm_events
            or self.warm_events <= 0
            or self.warm_sessions <= 0
        ):
            return
        stamp = self._warm_stamp(rec.handle)
        if stamp is None:
            return
        size = self._stored_size(stamp)
        if size > self.warm_bytes:
            return
        # The disposed session's own list, not a snapshot of it (PERF-22): the session reads
        # its first ``end`` events from then on, the next activation takes the list over.
        events = rec.session._hand_over(end)
        if events is None:
            return
        warm = _Warm(rec.session.header, events, stamp, rec.scan, rec.scanned, size, rec.fold)
        rec.scan = rec.fold = None  # handed over: the replay is the warm log's now
        self._warm[sid] = warm
        self._warm_total += len(events)
        self._warm_size += size
        while (
            len(self._warm) > self.warm_sessions
            or self._warm_total > self.warm_events
            or self._warm_size > self.warm_bytes
        ):
            self._forget_warm(next(iter(self._warm)))  # the least recently closed goes first

    def _forget_warm(self, id: str) -> _Warm | None:
        warm = self._warm.pop(id, None)
        if warm is not None:
            self._warm_total -= len(warm.events)
            self._warm_size -= warm.size
        return warm

    def _warm_loaded(self, id: str, warm: _Warm, commit: bool) -> _Loaded:
        """``_read_repaired`` from a warm log: the same events, verdict and closers, with only
        the events its replay has not seen replayed (those of the last activation). With
        ``commit`` (a resume) also the log's fold, likewise (the first time: all of it)."""
        # A resume takes the list over from the warm log (which it leaves, see prepare): no
        # copy of the log at all (PERF-22). An inspect leaves it warm, so it reads a copy.
        events = warm.events if commit else builtins.list(warm.events)
        scan = _scan(events, self._locator(id), resume=warm.scan, start=warm.scanned)
        warm.scan, warm.scanned = scan, len(events)
        loaded = self._repaired(id, warm.header, events, scan, commit)
        if not commit:
            return loaded
        fold = fold_log(events, warm.header.seed_length, warm.fold)
        return attrs.evolve(loaded, fold=fold)

    # -- reading ---------------------------------------------------------------------------------

    def _load_sync(self, id: str, handle: _Handle | None, commit: bool) -> _Loaded:
        loaded = self._read_repaired(id, handle, commit)
        if commit and handle is not None and (loaded.closers or handle.truncate):
            self._write(handle, loaded.closers)
        return loaded

    def _read_repaired(self, id: str, handle: _Handle | None, commit: bool) -> _Loaded:
        """The stored log with its repair closers appended (not written)."""
        header, events, locate = self._read(id, handle)
        return self._repaired(id, header, events, _scan(events, locate), commit)

    def _repaired(
        self,
        id: str,
        header: SessionHeader,
        events: builtins.list[SessionEvent],
        scan: _Scan,
        commit: bool,
    ) -> _Loaded:
        scanned = len(events)
        closers = _closers(id, scan, scanned)
        if closers:
            _log.warning(
                "session %r ended inside turn %s; closed it with %d repair event(s)%s",
                id,
                scan.checker.open_turn,
                len(closers),
                "" if commit else " (in memory only)",
            )
        events.extend(closers)
        return _Loaded(header=header, events=events, closers=closers, scan=scan, scanned=scanned)

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
        self._forget_warm(id)  # the call may write: the store is read again next time
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
            warm = self._forget_warm(id)
            if warm is not None:
                # Opening and locking a file takes no longer than the creation's, which is
                # synchronous too: no round trip through a worker thread for a warm log.
                handle = self._acquire(id, None)
                if not self._unchanged(handle, warm.stamp):
                    warm = None  # changed since this host wrote it: read the store (DUR-51)
            else:
                handle = await self._hold(id, None)
            written = False
            if warm is not None:
                loaded = self._warm_loaded(id, warm, True)
            elif check is None:
                loaded = await self._run(self._load_sync, id, handle, True)
                written = True
                _check(signal)
            else:
                loaded = await self._run(self._read_repaired, id, handle, True)
                _check(signal)
            if check is not None:
                check(loaded.header, loaded.events)
            if not written and (loaded.closers or handle.truncate):
                await self._run(self._write, handle, loaded.closers)
                _check(signal)
            # Counted before the session takes the list over (it becomes the session's log,
            # which then grows by its own events).
            stored = len(loaded.events)
            session = ctx.sessions.prepare(
                id, seed=loaded.events, restored=loaded.header, fold=loaded.fold
            )
            self._prepared[id] = _Prepared(
                session=session,
                handle=handle,
                stored=stored,
                scan=loaded.scan,
                scanned=loaded.scanned,
                fold=loaded.fold,
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
        warm = self._warm.get(id)
        if warm is not None and self._unchanged(None, warm.stamp, id):
            try:
                loaded = self._warm_loaded(id, warm, False)
            except BaseException:
                self._forget_warm(id)  # its replay stopped half way
                raise
        else:
            self._forget_warm(id)
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

    def _hand_over(self, handle: _Handle) -> object | None:
        """:meth:`_let_go` for a backend with :attr:`_batch_let_go`: release the hold now and
        return what :meth:`_sync_later` needs to sync the session later (``None``: nothing)."""
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

    def _warm_stamp(self, handle: _Handle) -> Hashable | None:
        """The stamp of a disposed session's log right after its last write, through its
        hold: ``None`` unless the log holds exactly the session's events as written (default:
        ``None``, so nothing is ever kept warm)."""
        return None

    def _stored_size(self, stamp: Hashable) -> int:
        """The bytes of the stored log that ``stamp`` (of :meth:`_warm_stamp`) stamps, for
        :attr:`warm_bytes` (default: 0, a backend whose logs are in memory anyway)."""
        return 0

    def _unchanged(self, handle: _Handle | None, stamp: Hashable, id: str | None = None) -> bool:
        """Whether the stored log (through ``handle``, held; or of ``id``, unheld) still has
        ``stamp``. Through a handle it then takes the place of a read: whatever ``_read`` would
        have noted on the handle is noted from the stamp."""
        return False

    def _locator(self, id: str) -> Callable[[int], str]:
        """Where event ``i`` of ``id`` lives, as ``_read`` names it (for error messages)."""
        return lambda i: f"session {id!r} event {i}"

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
