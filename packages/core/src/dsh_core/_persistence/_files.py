"""Session files: the default folder, opening a file never through a symlink, locks,
reads, writes and syncs."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from .._events import SessionError
from ._store import _Handle

if sys.platform != "win32":
    import fcntl


# -- JSONL ----------------------------------------------------------------------------------------


def default_sessions_dir() -> Path:
    """Where JSONL logs live by default: ``$DSH_SUBAGENTS_HOME/sessions`` when
    ``DSH_SUBAGENTS_HOME`` is set and not empty, else ``~/.dsh-subagents/sessions``.

    The folder is the project's own home (the ``dsh-subagents`` command keeps its state
    there too), named so that it never collides with another tool's (the DeepSeek Harness
    runtime keeps its state under ``DSH_HOME`` / ``~/.dsh``).
    """
    home = os.environ.get("DSH_SUBAGENTS_HOME")
    return (Path(home) if home else Path.home() / ".dsh-subagents") / "sessions"


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
    __slots__ = (
        "altered",
        "dir_synced",
        "fd",
        "ident",
        "lost",
        "name",
        "path",
        "size",
        "synced",
        "written",
    )

    def __init__(
        self, id: str, path: Path, fd: int, *, created: bool, ident: tuple[int, int]
    ) -> None:
        super().__init__(id, created=created)
        self.path = path
        self.name = str(path)  # what each write's check stats (no path conversion per write)
        self.fd = fd
        #: The open file's ``(st_ino, st_dev)``: fixed for the descriptor's life, so checking
        #: that the name still denotes the file takes one ``lstat`` of the name per write.
        self.ident = ident
        self.size = 0  # bytes of complete, valid lines; a torn tail lies beyond
        self.dir_synced = not created
        # Writes so far, and how many of them an fsync has covered (a sync in a worker thread
        # may run while the loop writes more: it covers what was written when it began).
        self.written = 0
        self.synced = 0
        #: Set when the file was found deleted or replaced under this writer: every later
        #: write fails with it (never written into a file nobody can read back).
        self.lost: SessionError | None = None
        #: Set once a write stored a stand-in for an event it could not encode: the file then
        #: differs from the session's events, and is never kept warm.
        self.altered = False


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


def _still_named(handle: _FileHandle) -> bool:
    """Whether ``handle``'s path still names its open file (not deleted, not replaced, by a
    symlink either: the name is not followed). One ``lstat``: the file's own identity was
    taken when it was opened."""
    try:
        named = os.lstat(handle.name)
    except FileNotFoundError:
        return False
    return (named.st_ino, named.st_dev) == handle.ident


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the open file (it may have been replaced before the lock,
    by a symlink too: the name is not followed)."""
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_ino, held.st_dev) == (named.st_ino, named.st_dev)
