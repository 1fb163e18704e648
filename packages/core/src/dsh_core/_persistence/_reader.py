"""The JSONL store's reader: a log read, parsed and checked (a torn last line dropped,
corruption named by file and line), and the scans that decode only the events asked for."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import threading
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

from .._events import (
    SessionError,
    SessionEvent,
    SessionHeader,
    structure_header,
)
from .._sessions import check_session_id
from ._common import _log, _not_found
from ._decode import (
    _COLLECTOR_PAUSED,
    _HEADER_CHUNK,
    _LINE_NESTING,
    _PARSE_CHUNK,
    HEADER_LINE_LIMIT,
    _first_too_deep,
    _loads,
    _read_until,
    _Stamp,
    _stop_pattern,
    _TooDeep,
)
from ._files import (
    _READ_FLAGS,
    _FileHandle,
    _open_file,
    _open_stat,
    _pread,
    _read_all,
    default_sessions_dir,
)
from ._store import DamagedSession, SessionPersistence, StoredScan, _Handle


class JsonlReader(SessionPersistence):
    """Reading ``<root>/<id>.jsonl`` logs (the part of :class:`JsonlSessionPersistence` that
    never writes)."""

    def __init__(self, root: Path | None = None) -> None:
        super().__init__()
        self.root = Path(root) if root is not None else default_sessions_dir()
        # file name -> (stamp, header or damage): a header never changes once written. The
        # stamp (inode, ctime, size, mtime) changes with any write, so it also stamps the log.
        self._header_cache: dict[str, tuple[_Stamp, SessionHeader | DamagedSession]] = {}
        self._root_noted = threading.Event()  # set once the folder was looked at
        self._root_lock = threading.Lock()

    def path_of(self, id: str) -> Path:
        """The file of session ``id`` (``SESSION_INVALID_ID`` if it cannot name one)."""
        check_session_id(id)
        return self.root / f"{id}.jsonl"

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

    def _locator(self, id: str) -> Callable[[int], str]:
        return lambda i: f"session file {self.path_of(id)} line {i + 2}"  # named on failure only

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
