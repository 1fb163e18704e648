"""Session query (``ctx.session_query``): lineage traces and reads over every session (§6).

The corpus is the host's live sessions together with the persisted headers (when
``session_persistence`` is provided); for an id in both, the live session wins. Traces are
built from headers only (``parent_session`` links), so tracing never reads an event log.
A stored entry whose header cannot be read is not in the corpus; it is reported by id and
code (``damaged``) instead of failing the query (hardening 11.3).
"""

from __future__ import annotations

import asyncio
import logging
import operator
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ._abort import AbortedError, AbortSignal
from ._errors import DshError
from ._events import SessionError, SessionEvent, SessionHeader
from ._frozen import attrs_eq, attrs_hash, attrs_repr
from ._log_checker import LogInvariantError, SessionLogChecker
from ._persistence import DamagedSession, StoredScan, kept_until
from ._words import reason_text, shown_id

if TYPE_CHECKING:
    from ._context import Context

__all__ = [
    "SCAN_READS_IN_FLIGHT",
    "SessionLineageNode",
    "SessionLineageTrace",
    "SessionQuery",
    "SessionQueryError",
    "SessionQueryListing",
    "SessionRecord",
    "SessionScan",
    "install_session_query",
]

_log = logging.getLogger("dsh.sessions")

#: ``scan_sessions`` reads at most this many stored logs at a time.
SCAN_READS_IN_FLIGHT = 4


class SessionQueryError(DshError):
    """A query failed; ``code`` is one of ``SESSION_QUERY_SESSION_NOT_FOUND``,
    ``SESSION_QUERY_INVALID_LINEAGE``, ``SESSION_QUERY_INVALID_LOG``,
    ``SESSION_QUERY_PERSISTENCE_FAILED`` (the cause is chained) or ``SESSION_QUERY_ABORTED``."""

    code = "SESSION_QUERY_ERROR"


@attrs.frozen(kw_only=True)
class SessionRecord:
    """One session of the corpus: its header, whether it is live here, whether it is stored."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    header: SessionHeader
    live: bool
    persisted: bool
    #: For a stored session that is not live: the backend's token of its log as listed
    #: (equal tokens, same log), or ``None`` if the backend cannot tell.
    stamp: Hashable | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def id(self) -> str:
        """The session id."""
        return self.header.id


@attrs.frozen(kw_only=True)
class SessionLineageNode:
    """A descendant and its own descendants (oldest first)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    session: SessionRecord
    descendants: tuple[SessionLineageNode, ...] = ()


@attrs.frozen(kw_only=True)
class SessionLineageTrace:
    """Where a session sits in its lineage.

    ``ancestors`` run nearest first. A trace is ``complete`` when the chain reaches a session
    without a parent (``root``); otherwise ``unresolved_parent_id`` names the first parent the
    corpus does not hold and ``root`` is ``None``. ``damaged`` lists the stored entries left
    out of the corpus because their header cannot be read (their lineage is unknown).
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    target: SessionRecord
    ancestors: tuple[SessionRecord, ...]
    descendants: tuple[SessionLineageNode, ...]
    complete: bool
    root: SessionRecord | None
    unresolved_parent_id: str | None
    damaged: tuple[DamagedSession, ...] = ()
    #: With ``contain_loops``: the parent id at which the ancestry loops back on itself
    #: (``ancestors`` stop before it; ``complete`` is False and ``root`` None).
    looped_parent_id: str | None = None


@attrs.frozen(kw_only=True)
class SessionScan:
    """``scan_sessions``: one session's header and its events of the asked types, oldest
    first (from the live log, or read from the store)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    header: SessionHeader
    events: tuple[SessionEvent, ...]


@attrs.frozen(kw_only=True)
class SessionQueryListing:
    """``listing()``: every record of the corpus (newest first) and, by id, the stored entries
    left out of it because their header cannot be read."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    records: tuple[SessionRecord, ...]
    damaged: tuple[DamagedSession, ...] = ()


def _aborted(signal: AbortSignal | None) -> None:
    if signal is not None and signal.aborted:
        raise SessionQueryError(
            f"session query aborted: {reason_text(signal.reason)}", code="SESSION_QUERY_ABORTED"
        )


def _order(header: SessionHeader) -> tuple[int, str]:
    return header.created_at, header.id


class _Corpus:
    """Headers by id, which of them are live, which are stored, which stored ones are damaged.

    Immutable once built, so what is derived from it (records, the children of each session,
    descendant trees) is kept on it and reused while the query finds the corpus unchanged.
    """

    __slots__ = (
        "damaged",
        "headers",
        "kids",
        "live",
        "persisted",
        "records",
        "seen",
        "stamps",
        "trees",
    )

    def __init__(
        self,
        headers: dict[str, SessionHeader],
        live: set[str],
        persisted: set[str],
        damaged: tuple[DamagedSession, ...],
        stamps: Mapping[str, Hashable] | None = None,
    ) -> None:
        self.headers = headers
        self.live = live
        self.persisted = persisted
        self.damaged = damaged
        self.stamps = stamps or {}
        self.records: dict[str, SessionRecord] = {}
        self.kids: dict[str, list[SessionHeader]] | None = None
        self.trees: dict[str, tuple[SessionLineageNode, ...]] = {}
        # What it was built from: (stored headers, damaged, stamps, live headers).
        self.seen: tuple[Sequence[SessionHeader], object, object, list[SessionHeader]] | None
        self.seen = None

    def record(self, id: str) -> SessionRecord:
        record = self.records.get(id)
        if record is None:
            live = id in self.live
            record = self.records[id] = SessionRecord(
                header=self.headers[id],
                live=live,
                persisted=id in self.persisted,
                stamp=None if live else self.stamps.get(id),
            )
        return record

    def children(self) -> dict[str, list[SessionHeader]]:
        """Each session's children, oldest first (built once)."""
        kids = self.kids
        if kids is None:
            kids = {}
            for header in self.headers.values():
                parent = header.parent_session
                if parent is not None and parent != header.id:
                    kids.setdefault(parent, []).append(header)
            for group in kids.values():
                if len(group) > 1:
                    group.sort(key=_order)
            self.kids = kids
        return kids

    def same(
        self,
        stored: Sequence[SessionHeader],
        damaged: object,
        stamps: object,
        live: list[SessionHeader],
    ) -> bool:
        """Whether a new observation is the one this corpus was built from: the very same
        header objects (a backend hands out one object per unchanged header), the same
        damage and stamps, the same live sessions."""
        seen = self.seen
        if seen is None:
            return False
        before, damaged_before, stamps_before, live_before = seen
        return (
            len(before) == len(stored)
            and len(live_before) == len(live)
            and all(map(operator.is_, before, stored))
            and all(map(operator.is_, live_before, live))
            and damaged_before == damaged
            and stamps_before == stamps
        )


class SessionQuery:
    """``session_query``: ``trace_session``, ``read_session`` and ``list_sessions``.

    Reads the store and (optionally) ``session_persistence`` at call time, so a query always
    sees the current corpus; persisted headers are cheap to list (backends cache them).
    """

    def __init__(self) -> None:
        self._ctx: Context | None = None
        # By the kept types, then id: (stamp, scan) of stored logs read before.
        self._scans: dict[
            tuple[frozenset[str], frozenset[str] | None], dict[str, tuple[Hashable, SessionScan]]
        ] = {}
        self._last: _Corpus | None = None  # the latest corpus, reused while unchanged

    def install(self, ctx: Context) -> None:
        """Answer queries over the sessions of ``ctx``'s host."""
        self._ctx = ctx

    def _installed(self) -> Context:
        if self._ctx is None:
            raise SessionQueryError("session query is not installed", code="SESSION_QUERY_ERROR")
        return self._ctx

    async def _corpus(self, signal: AbortSignal | None) -> _Corpus:
        ctx = self._installed()
        _aborted(signal)
        stored: Sequence[SessionHeader] = ()
        damaged: tuple[DamagedSession, ...] = ()
        stamps: Mapping[str, Hashable] | None = None
        persistence = ctx.get("session_persistence")
        if persistence is not None:
            try:
                listing = getattr(persistence, "listing", None)
                if listing is None:  # a backend without per-entry diagnostics
                    stored = await persistence.list(signal)
                else:
                    found = await listing(signal)
                    stored, damaged = found.headers, found.damaged
                    stamps = getattr(found, "stamps", None)
            except AbortedError as exc:
                raise SessionQueryError(
                    f"session query aborted: {reason_text(exc.reason)}",
                    code="SESSION_QUERY_ABORTED",
                ) from exc
            except Exception as exc:
                raise SessionQueryError(
                    f"listing persisted sessions failed: {exc}",
                    code="SESSION_QUERY_PERSISTENCE_FAILED",
                ) from exc
        _aborted(signal)
        live_headers = [session.header for session in ctx.sessions.list()]
        last = self._last
        if last is not None and last.same(stored, damaged, stamps, live_headers):
            return last
        seen = (stored, damaged, stamps, live_headers)
        headers = {h.id: h for h in stored}
        persisted = set(headers)
        live: set[str] = set()
        for header in live_headers:
            headers[header.id] = header
            live.add(header.id)
        if damaged and live:
            damaged = tuple(d for d in damaged if d.id not in live)  # the live session wins
        corpus = _Corpus(headers, live, persisted, damaged, stamps)
        corpus.seen = seen
        self._last = corpus
        return corpus

    async def list_sessions(self, signal: AbortSignal | None = None) -> list[SessionRecord]:
        """Every session of the corpus, newest first (by ``created_at``, then id)."""
        return list((await self.listing(signal)).records)

    async def listing(self, signal: AbortSignal | None = None) -> SessionQueryListing:
        """``list_sessions`` plus the damaged stored entries left out of it, by id."""
        corpus = await self._corpus(signal)
        ids = sorted(corpus.headers, key=lambda i: _order(corpus.headers[i]), reverse=True)
        return SessionQueryListing(
            records=tuple(corpus.record(i) for i in ids), damaged=corpus.damaged
        )

    async def trace_session(
        self, id: str, signal: AbortSignal | None = None, *, contain_loops: bool = False
    ) -> SessionLineageTrace:
        """The ancestors (nearest first) and the descendant tree (oldest first) of ``id``.

        Fails with ``SESSION_QUERY_SESSION_NOT_FOUND`` for an unknown target,
        ``SESSION_QUERY_PERSISTENCE_FAILED`` for a damaged stored one (its header cannot be
        read) and ``SESSION_QUERY_INVALID_LINEAGE`` when the ancestry loops, unless
        ``contain_loops``: then the ancestors stop before the loop, which
        ``looped_parent_id`` names. The descendant tree never loops (each session once).
        """
        corpus = await self._corpus(signal)
        headers = corpus.headers
        if id not in headers:
            for damaged in corpus.damaged:
                if damaged.id == id:
                    raise SessionQueryError(
                        f"session {shown_id(id)} is stored but damaged: {damaged.message}",
                        code="SESSION_QUERY_PERSISTENCE_FAILED",
                    )
            raise SessionQueryError(
                f"no live or persisted session {shown_id(id)}",
                code="SESSION_QUERY_SESSION_NOT_FOUND",
            )
        ancestors: list[SessionRecord] = []
        seen = {id}
        parent = headers[id].parent_session
        unresolved: str | None = None
        looped: str | None = None
        while parent is not None:
            if parent in seen:
                if contain_loops:
                    looped = parent
                    break
                raise SessionQueryError(
                    f"the lineage of session {shown_id(id)} loops through {shown_id(parent)}",
                    code="SESSION_QUERY_INVALID_LINEAGE",
                )
            if parent not in headers:
                unresolved = parent
                break
            seen.add(parent)
            ancestors.append(corpus.record(parent))
            parent = headers[parent].parent_session
        target = corpus.record(id)
        complete = unresolved is None and looped is None
        root = (ancestors[-1] if ancestors else target) if complete else None
        return SessionLineageTrace(
            target=target,
            ancestors=tuple(ancestors),
            descendants=self._descendants(corpus, id),
            complete=complete,
            root=root,
            unresolved_parent_id=unresolved,
            damaged=corpus.damaged,
            looped_parent_id=looped,
        )

    @staticmethod
    def _descendants(corpus: _Corpus, id: str) -> tuple[SessionLineageNode, ...]:
        tree = corpus.trees.get(id)
        if tree is None:
            tree = corpus.trees[id] = SessionQuery._tree(corpus, id)
        return tree

    @staticmethod
    def _tree(corpus: _Corpus, id: str) -> tuple[SessionLineageNode, ...]:
        children = corpus.children()
        # Children before parents (reversed pre-order): no recursion, so depth is unbounded.
        order: list[str] = []
        stack = [id]
        seen = {id}
        while stack:
            node = stack.pop()
            order.append(node)
            for kid in children.get(node, ()):
                if kid.id not in seen:
                    seen.add(kid.id)
                    stack.append(kid.id)
        built: dict[str, tuple[SessionLineageNode, ...]] = {}
        record = corpus.record
        for node in reversed(order):
            kids = children.get(node)
            if kids:
                # The target is never its own descendant, even when the parent links loop.
                built[node] = tuple(
                    SessionLineageNode(session=record(k.id), descendants=built.pop(k.id, ()))
                    for k in kids
                    if k.id != id
                )
        return built.get(id, ())

    async def scan_sessions(
        self,
        records: Sequence[SessionRecord],
        types: Iterable[str],
        signal: AbortSignal | None = None,
        *,
        until: Iterable[str] | None = None,
    ) -> list[SessionScan | SessionQueryError]:
        """For each record (as a trace or listing gave it), in order: its header and its
        events of ``types``, or the ``SessionQueryError`` of that session alone.

        ``until`` bounds each read: a session is read only up to its first event of one of
        those types in its own part (from its header's ``seed_length`` on), and only the
        events of ``types`` up to there are returned (see ``SessionPersistence.scan``).

        A live session is read from memory. A stored one is read from the store at most
        once, with at most :data:`SCAN_READS_IN_FLIGHT` reads at a time; a log read before
        whose ``stamp`` is unchanged is not read again (the store proves it unchanged). Per
        session: ``SESSION_QUERY_SESSION_NOT_FOUND`` (gone, or no persistence) or
        ``SESSION_QUERY_PERSISTENCE_FAILED`` (its read failed; the backend's ``SessionError``
        is chained). Only an abort fails the call (``SESSION_QUERY_ABORTED``).
        """
        ctx = self._installed()
        _aborted(signal)
        kept = frozenset(types)
        stop = frozenset(until) if until is not None else None
        cache = self._scans.setdefault((kept, stop), {})
        out: list[SessionScan | SessionQueryError | None] = [None] * len(records)
        cold: list[int] = []
        sessions = ctx.sessions
        remembered = cache.get
        for i, record in enumerate(records):
            if record.live:
                session = sessions.get(record.header.id)
                if session is not None:
                    if stop is None:
                        events = tuple(e for e in session.events if e.type in kept)
                    else:
                        seed = session.header.seed_length or 0
                        events = kept_until(session.events, kept, stop, seed)
                    out[i] = SessionScan(header=session.header, events=events)
                    continue
            stamp = record.stamp
            if stamp is not None:
                known = remembered(record.header.id)
                if known is not None and known[0] == stamp:
                    out[i] = known[1]
                    continue
            cold.append(i)
        if cold:
            persistence = ctx.get("session_persistence")
            if persistence is None:
                for i in cold:
                    out[i] = SessionQueryError(
                        f"no live session {shown_id(records[i].id)} and no session persistence",
                        code="SESSION_QUERY_SESSION_NOT_FOUND",
                    )
            else:
                ids = [records[i].id for i in cold]
                found = await self._read_scans(persistence, ids, kept, signal, stop)
                if len(cache) > _SCAN_CACHE_LIMIT:
                    cache.clear()
                for i, id, result in zip(cold, ids, found, strict=True):
                    if isinstance(result, StoredScan):
                        scan = SessionScan(header=result.header, events=result.events)
                        if result.stamp is not None:
                            cache[id] = (result.stamp, scan)
                        out[i] = scan
                    else:
                        out[i] = _scan_error(id, result)
        _aborted(signal)
        return out  # type: ignore[return-value]  # every slot is filled

    async def _read_scans(
        self,
        persistence: Any,
        ids: list[str],
        kept: frozenset[str],
        signal: AbortSignal | None,
        stop: frozenset[str] | None = None,
    ) -> list[StoredScan | BaseException]:
        """``ids`` read in at most :data:`SCAN_READS_IN_FLIGHT` runs of consecutive ids side
        by side (one read at a time each), results in order."""
        runs = min(SCAN_READS_IN_FLIGHT, len(ids))
        size, extra = divmod(len(ids), runs)
        chunks: list[list[str]] = []
        start = 0
        for n in range(runs):
            end = start + size + (1 if n < extra else 0)
            chunks.append(ids[start:end])
            start = end
        scan = getattr(persistence, "scan", None)

        async def run(chunk: list[str]) -> Sequence[StoredScan | BaseException]:
            if scan is not None:
                if stop is None:
                    return await scan(chunk, kept, signal)  # type: ignore[no-any-return]
                return await scan(chunk, kept, signal, until=stop)  # type: ignore[no-any-return]
            found: list[StoredScan | BaseException] = []
            for id in chunk:  # a backend without scan: its inspect, one at a time
                try:
                    header, events = await persistence.inspect(id, signal)
                except AbortedError:
                    raise
                except Exception as exc:
                    found.append(exc)
                else:
                    kept_events = (
                        tuple(e for e in events if e.type in kept)
                        if stop is None
                        else kept_until(events, kept, stop, header.seed_length or 0)
                    )
                    found.append(StoredScan(header=header, events=kept_events))
            return found

        results = await asyncio.gather(*map(run, chunks), return_exceptions=True)
        out: list[StoredScan | BaseException] = []
        for chunk, result in zip(chunks, results, strict=True):
            if isinstance(result, AbortedError):
                raise SessionQueryError(
                    f"session query aborted: {reason_text(result.reason)}",
                    code="SESSION_QUERY_ABORTED",
                ) from result
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                out.extend(result for _ in chunk)  # the whole run failed: each of its ids
            else:
                out.extend(result)
        return out

    async def read_session(
        self, id: str, signal: AbortSignal | None = None
    ) -> tuple[SessionHeader, tuple[SessionEvent, ...]]:
        """The header and events of ``id``: the live log, or the stored one as inspected
        (repair closers in memory only), replay-validated either way."""
        ctx = self._installed()
        _aborted(signal)
        session = ctx.sessions.get(id)
        if session is not None:
            header, events = session.header, session.events
        else:
            persistence = ctx.get("session_persistence")
            if persistence is None:
                raise SessionQueryError(
                    f"no live session {shown_id(id)} and no session persistence",
                    code="SESSION_QUERY_SESSION_NOT_FOUND",
                )
            try:
                header, events = await persistence.inspect(id, signal)
            except AbortedError as exc:
                raise SessionQueryError(
                    f"session query aborted: {reason_text(exc.reason)}",
                    code="SESSION_QUERY_ABORTED",
                ) from exc
            except SessionError as exc:
                if exc.code in ("SESSION_NOT_FOUND", "SESSION_INVALID_ID"):
                    raise SessionQueryError(
                        f"no live or persisted session {shown_id(id)}",
                        code="SESSION_QUERY_SESSION_NOT_FOUND",
                    ) from exc
                raise SessionQueryError(
                    f"reading session {shown_id(id)} failed: {exc}",
                    code="SESSION_QUERY_PERSISTENCE_FAILED",
                ) from exc
            except Exception as exc:
                raise SessionQueryError(
                    f"reading session {shown_id(id)} failed: {exc}",
                    code="SESSION_QUERY_PERSISTENCE_FAILED",
                ) from exc
            _aborted(signal)
        try:
            SessionLogChecker().replay(events)
        except LogInvariantError as exc:
            raise SessionQueryError(
                f"session {shown_id(id)} does not replay: {exc}", code="SESSION_QUERY_INVALID_LOG"
            ) from exc
        return header, events


#: Scans remembered per kept types before the memory is dropped and rebuilt.
_SCAN_CACHE_LIMIT = 100_000


def _scan_error(id: str, exc: BaseException) -> SessionQueryError:
    """The per-session error of a failed stored read (its cause chained)."""
    if isinstance(exc, SessionError) and exc.code == "SESSION_NOT_FOUND":
        error = SessionQueryError(
            f"no live or persisted session {shown_id(id)}", code="SESSION_QUERY_SESSION_NOT_FOUND"
        )
    else:
        if not isinstance(exc, SessionError):
            _log.warning("reading session %r failed", id, exc_info=exc)
        error = SessionQueryError(
            f"reading session {shown_id(id)} failed: {exc}",
            code="SESSION_QUERY_PERSISTENCE_FAILED",
        )
    error.__cause__ = exc
    return error


def install_session_query(ctx: Context) -> SessionQuery:
    """Install a :class:`SessionQuery` over ``ctx``'s host and provide it as ``session_query``."""
    query = SessionQuery()
    query.install(ctx)
    ctx.provide("session_query", query)
    return query
