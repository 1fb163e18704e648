"""The JSONL store: one ``<root>/<id>.jsonl`` file per session. Holding a file (create,
open, lock, release), writing lines (flush, checkpoint, detach) and syncing them; reading and
listing come from its bases."""

from __future__ import annotations

import builtins
import os
import stat
import sys
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from .._events import (
    SessionError,
    SessionEvent,
    SessionHeader,
    encode_header,
)
from .._json import dumps
from ._common import _log, _not_found, _Unwritten, _unwritten
from ._decode import HEADER_LINE_LIMIT
from ._encode import _line_encoder, _stand_in, utf8_lines
from ._files import (
    _FileHandle,
    _fsync_dir,
    _lock,
    _open_stat,
    _same_file,
    _still_named,
    _sync,
    _write_all,
)
from ._listing import JsonlListing
from ._store import _Handle, _log_close_failure, _Tracked

if sys.platform != "win32":
    import fcntl
if TYPE_CHECKING:
    from .._context import Context

#: When the JSONL store syncs what a checkpoint wrote (see ``JsonlSessionPersistence.sync``).
SyncMode = Literal["always", "batch", "detach"]
SYNC_MODES: tuple[SyncMode, ...] = ("always", "batch", "detach")
#: How often an open that races a concurrent rename or removal is tried before giving up.
_OPEN_ATTEMPTS = 16


class JsonlSessionPersistence(JsonlListing):
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
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {list(SYNC_MODES)}, got {sync!r}")
        super().__init__(root)
        #: When a checkpoint's lines are synced: ``"always"`` before it returns, ``"batch"``
        #: by the next group commit, ``"detach"``: checkpoints write nothing (flush, detach).
        self.sync: SyncMode = sync
        self._checkpointing = sync != "detach"
        # With group commits running anyway, a disposed session's sync joins them.
        self._batch_let_go = sync == "batch"
        self._line_encoders: dict[str, Callable[[SessionEvent], str]] = {}

    # -- holding ---------------------------------------------------------------------------------

    def _ensure_root(self) -> None:
        if self.root.is_dir():
            return
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        _fsync_dir(self.root.parent)

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
                        fd, held = _open_stat(path, flags | os.O_CREAT | os.O_EXCL)
                        created = True
                    except FileExistsError:
                        fd, held = _open_stat(path, flags)
                else:
                    fd, held = _open_stat(path, flags)
            except FileNotFoundError:
                if create:
                    continue  # removed between the two opens: try again
                raise _not_found(id) from None
            try:
                _lock(fd, path)
                if _same_file(fd, path):
                    ident = (held.st_ino, held.st_dev)
                    return _FileHandle(id, path, fd, created=created, ident=ident)
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
            line = utf8_lines(dumps(encode_header(header)) + "\n")
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
            try:
                if sys.platform != "win32":
                    # Explicitly: a group commit may still hold a duplicate of the descriptor.
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def _hand_over(self, handle: _Handle) -> int | None:
        """Unlock a disposed session's file and keep its descriptor for the sync still owed
        (``None``: everything written is synced, the file is closed)."""
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
        return fd

    def _let_go(self, handle: _Handle) -> Callable[[], None] | None:
        assert isinstance(handle, _FileHandle)
        fd = self._hand_over(handle)
        if fd is None:
            return None

        def sync() -> None:
            try:
                os.fsync(fd)
                if not handle.dir_synced:
                    _fsync_dir(handle.path.parent)
                    handle.dir_synced = True
            finally:
                os.close(fd)

        return sync

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
        return utf8_lines("".join(lines))

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

    # -- warm logs -------------------------------------------------------------------------------

    def _warm_stamp(self, handle: _Handle) -> Hashable | None:
        assert isinstance(handle, _FileHandle)
        if handle.fd < 0 or handle.lost is not None or handle.truncate or handle.altered:
            return None  # not the session's events as written: a stand-in, a failed write
        try:
            st = os.fstat(handle.fd)
        except OSError:
            return None
        if st.st_size != handle.size:
            return None  # more or less than this holder wrote
        return _file_stamp(st)

    def _stored_size(self, stamp: Hashable) -> int:
        assert isinstance(stamp, tuple)
        size: int = stamp[3]
        return size

    def _unchanged(self, handle: _Handle | None, stamp: Hashable, id: str | None = None) -> bool:
        try:
            if handle is None:
                assert id is not None
                st = os.lstat(self.path_of(id))  # never followed: a symlink's stamp differs
            else:
                assert isinstance(handle, _FileHandle)
                st = os.fstat(handle.fd)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or _file_stamp(st) != stamp:
            return False
        if handle is not None:  # what a read would have noted: every line complete
            handle.size = st.st_size
            handle.truncate = False
        return True

    def _dirty(self, handle: _Handle) -> bool:
        assert isinstance(handle, _FileHandle)
        return handle.fd >= 0 and (handle.synced != handle.written or not handle.dir_synced)

    def _sync_later(
        self, handles: list[_Handle], owed: list[tuple[_Handle, object]]
    ) -> list[Callable[[], list[tuple[_Handle, Exception]]]]:
        # A duplicate of each live session's descriptor: a close of the session meanwhile never
        # leaves the sync a closed (or reused) descriptor, and never waits for it. A disposed
        # session's descriptor is the sync's own already (see _hand_over).
        held: list[tuple[_FileHandle, int]] = []
        refused: list[tuple[_Handle, Exception]] = []
        for handle in handles:
            assert isinstance(handle, _FileHandle)
            try:
                held.append((handle, os.dup(handle.fd)))
            except OSError as exc:
                refused.append((handle, exc))
        for handle, fd in owed:
            assert isinstance(handle, _FileHandle) and isinstance(fd, int)
            held.append((handle, fd))
        # Each new file's folder is synced once for all the files created in it (by the first
        # job: the name and the lines are two syncs, in either order).
        folders: dict[Path, list[_FileHandle]] = {}
        for handle, _ in held:
            if not handle.dir_synced:
                folders.setdefault(handle.path.parent, []).append(handle)
        jobs = max(1, min(self._commit_jobs, len(held)))
        works = [_syncer(held[i::jobs], folders if i == 0 else {}) for i in range(jobs)]
        if refused:
            works.append(lambda: refused)
        return works

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
            if data and not _still_named(handle):
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
            handle.altered = True  # the file no longer holds the session's events as they are
            raise _unwritten(handle.path, failed)


def _file_stamp(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """A log file's stamp: its identity, change time, size and modification time (any write
    changes it, as does a file put in its place)."""
    return (st.st_ino, st.st_dev, st.st_ctime_ns, st.st_size, st.st_mtime_ns)


def _syncer(
    held: list[tuple[_FileHandle, int]], folders: dict[Path, list[_FileHandle]]
) -> Callable[[], list[tuple[_Handle, Exception]]]:
    """A group commit's job: sync each of ``held`` (closing the descriptor), then each of
    ``folders``, once, for the files created in it; the failures, by handle."""

    def sync() -> list[tuple[_Handle, Exception]]:
        failures: list[tuple[_Handle, Exception]] = []
        for handle, fd in held:
            try:
                written = handle.written
                os.fsync(fd)
                handle.synced = max(handle.synced, written)
            except Exception as exc:
                failures.append((handle, exc))
            finally:
                os.close(fd)
        for folder, created in folders.items():
            try:
                _fsync_dir(folder)
            except Exception as exc:
                failures.extend((handle, exc) for handle in created)
                continue
            for handle in created:
                handle.dir_synced = True
        return failures

    return sync


# -- installation ---------------------------------------------------------------------------------


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
