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

A log this backend wrote and closed itself stays *warm* for a while (bounded by count, events
and bytes): decoded, with its invariant replay and its fold. ``prepare`` and ``inspect`` of it
read nothing while the backend's stamp proves the stored log unchanged since that last write,
and check and fold only the events of its last activation; any other log is read from the store.

The modules show the concerns: ``_store`` the interface and its tracking, checkpoints and group
commit (every backend shares them), ``_repair`` validation and crash repair, ``_memory`` the
in-memory backend, and the JSONL backend in layers: ``_files`` (opening files safely, locks,
reads, syncs), ``_encode`` and ``_decode`` (event lines), ``_reader`` (reading and scanning a
log), ``_listing`` (headers and damaged entries of the folder) and ``_jsonl`` (holding and
writing files: the store itself).
"""

from typing import TYPE_CHECKING, Any

from ._decode import _COLLECTOR_PAUSED, HEADER_LINE_LIMIT
from ._files import _read_all, default_sessions_dir
from ._jsonl import SYNC_MODES, JsonlSessionPersistence, SyncMode, install_jsonl_persistence
from ._repair import repair_closers
from ._store import (
    DamagedSession,
    SessionListing,
    SessionPersistence,
    SessionPreparation,
    StoredScan,
    kept_until,
)

if TYPE_CHECKING:
    from ._memory import MemorySessionPersistence, install_memory_persistence

__all__ = [
    "HEADER_LINE_LIMIT",
    "SYNC_MODES",
    "DamagedSession",
    "JsonlSessionPersistence",
    "MemorySessionPersistence",
    "SessionListing",
    "SessionPersistence",
    "SessionPreparation",
    "StoredScan",
    "SyncMode",
    "_COLLECTOR_PAUSED",
    "_read_all",
    "default_sessions_dir",
    "install_jsonl_persistence",
    "install_memory_persistence",
    "kept_until",
    "repair_closers",
]


def __getattr__(name: str) -> Any:
    # The in-memory backend on first use: a host on the JSONL store never needs it (PERF-19).
    if name in ("MemorySessionPersistence", "install_memory_persistence"):
        from . import _memory

        return getattr(_memory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
