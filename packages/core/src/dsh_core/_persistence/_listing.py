"""The JSONL store's listing: every stored header of the folder, read once per file
version, and the damaged entries, each judged on its own."""

from __future__ import annotations

import os
import stat
from collections.abc import Hashable
from pathlib import Path

from .._abort import AbortedError, AbortSignal
from .._events import (
    SessionError,
    SessionHeader,
)
from .._sessions import check_session_id
from ._common import _log
from ._decode import _Stamp
from ._files import _READ_FLAGS, _being_created, _open_file, _unsafe
from ._reader import JsonlReader
from ._store import DamagedSession


class JsonlListing(JsonlReader):
    """Listing ``<root>``: headers and damaged entries (the part of
    :class:`JsonlSessionPersistence` that reads only headers)."""

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
