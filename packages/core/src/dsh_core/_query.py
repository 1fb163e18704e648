"""Session query (``ctx.session_query``): lineage traces and reads over every session (§6).

The corpus is the host's live sessions together with the persisted headers (when
``session_persistence`` is provided); for an id in both, the live session wins. Traces are
built from headers only (``parent_session`` links), so tracing never reads an event log.
A stored entry whose header cannot be read is not in the corpus; it is reported by id and
code (``damaged``) instead of failing the query (hardening 11.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from ._abort import AbortedError, AbortSignal
from ._errors import DshError
from ._events import SessionError, SessionEvent, SessionHeader
from ._log_checker import LogInvariantError, SessionLogChecker
from ._persistence import DamagedSession

if TYPE_CHECKING:
    from ._context import Context

__all__ = [
    "SessionLineageNode",
    "SessionLineageTrace",
    "SessionQuery",
    "SessionQueryError",
    "SessionQueryListing",
    "SessionRecord",
    "install_session_query",
]


class SessionQueryError(DshError):
    """A query failed; ``code`` is one of ``SESSION_QUERY_SESSION_NOT_FOUND``,
    ``SESSION_QUERY_INVALID_LINEAGE``, ``SESSION_QUERY_INVALID_LOG``,
    ``SESSION_QUERY_PERSISTENCE_FAILED`` (the cause is chained) or ``SESSION_QUERY_ABORTED``."""

    code = "SESSION_QUERY_ERROR"


@attrs.frozen(kw_only=True)
class SessionRecord:
    """One session of the corpus: its header, whether it is live here, whether it is stored."""

    header: SessionHeader
    live: bool
    persisted: bool

    @property
    def id(self) -> str:
        """The session id."""
        return self.header.id


@attrs.frozen(kw_only=True)
class SessionLineageNode:
    """A descendant and its own descendants (oldest first)."""

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

    target: SessionRecord
    ancestors: tuple[SessionRecord, ...]
    descendants: tuple[SessionLineageNode, ...]
    complete: bool
    root: SessionRecord | None
    unresolved_parent_id: str | None
    damaged: tuple[DamagedSession, ...] = ()


@attrs.frozen(kw_only=True)
class SessionQueryListing:
    """``listing()``: every record of the corpus (newest first) and, by id, the stored entries
    left out of it because their header cannot be read."""

    records: tuple[SessionRecord, ...]
    damaged: tuple[DamagedSession, ...] = ()


def _aborted(signal: AbortSignal | None) -> None:
    if signal is not None and signal.aborted:
        raise SessionQueryError(
            f"session query aborted: {signal.reason!r}", code="SESSION_QUERY_ABORTED"
        )


def _order(header: SessionHeader) -> tuple[int, str]:
    return header.created_at, header.id


class _Corpus:
    """Headers by id, which of them are live, which are stored, which stored ones are damaged."""

    __slots__ = ("damaged", "headers", "live", "persisted")

    def __init__(
        self,
        headers: dict[str, SessionHeader],
        live: set[str],
        persisted: set[str],
        damaged: tuple[DamagedSession, ...],
    ) -> None:
        self.headers = headers
        self.live = live
        self.persisted = persisted
        self.damaged = damaged

    def record(self, id: str) -> SessionRecord:
        return SessionRecord(
            header=self.headers[id], live=id in self.live, persisted=id in self.persisted
        )


class SessionQuery:
    """``session_query``: ``trace_session``, ``read_session`` and ``list_sessions``.

    Reads the store and (optionally) ``session_persistence`` at call time, so a query always
    sees the current corpus; persisted headers are cheap to list (backends cache them).
    """

    def __init__(self) -> None:
        self._ctx: Context | None = None

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
        persistence = ctx.get("session_persistence")
        if persistence is not None:
            try:
                listing = getattr(persistence, "listing", None)
                if listing is None:  # a backend without per-entry diagnostics
                    stored = await persistence.list(signal)
                else:
                    found = await listing(signal)
                    stored, damaged = found.headers, found.damaged
            except AbortedError as exc:
                raise SessionQueryError(
                    f"session query aborted: {exc.reason!r}", code="SESSION_QUERY_ABORTED"
                ) from exc
            except Exception as exc:
                raise SessionQueryError(
                    f"listing persisted sessions failed: {exc}",
                    code="SESSION_QUERY_PERSISTENCE_FAILED",
                ) from exc
        _aborted(signal)
        headers = {h.id: h for h in stored}
        persisted = set(headers)
        live: set[str] = set()
        for session in ctx.sessions.list():
            headers[session.header.id] = session.header
            live.add(session.header.id)
        if damaged and live:
            damaged = tuple(d for d in damaged if d.id not in live)  # the live session wins
        return _Corpus(headers, live, persisted, damaged)

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
        self, id: str, signal: AbortSignal | None = None
    ) -> SessionLineageTrace:
        """The ancestors (nearest first) and the descendant tree (oldest first) of ``id``.

        Fails with ``SESSION_QUERY_SESSION_NOT_FOUND`` for an unknown target,
        ``SESSION_QUERY_PERSISTENCE_FAILED`` for a damaged stored one (its header cannot be
        read) and ``SESSION_QUERY_INVALID_LINEAGE`` when the ancestry loops.
        """
        corpus = await self._corpus(signal)
        headers = corpus.headers
        if id not in headers:
            for damaged in corpus.damaged:
                if damaged.id == id:
                    raise SessionQueryError(
                        f"session {id!r} is stored but damaged: {damaged.message}",
                        code="SESSION_QUERY_PERSISTENCE_FAILED",
                    )
            raise SessionQueryError(
                f"no live or persisted session {id!r}", code="SESSION_QUERY_SESSION_NOT_FOUND"
            )
        ancestors: list[SessionRecord] = []
        seen = {id}
        parent = headers[id].parent_session
        unresolved: str | None = None
        while parent is not None:
            if parent in seen:
                raise SessionQueryError(
                    f"the lineage of session {id!r} loops through {parent!r}",
                    code="SESSION_QUERY_INVALID_LINEAGE",
                )
            if parent not in headers:
                unresolved = parent
                break
            seen.add(parent)
            ancestors.append(corpus.record(parent))
            parent = headers[parent].parent_session
        target = corpus.record(id)
        complete = unresolved is None
        root = (ancestors[-1] if ancestors else target) if complete else None
        return SessionLineageTrace(
            target=target,
            ancestors=tuple(ancestors),
            descendants=self._descendants(corpus, id),
            complete=complete,
            root=root,
            unresolved_parent_id=unresolved,
            damaged=corpus.damaged,
        )

    @staticmethod
    def _descendants(corpus: _Corpus, id: str) -> tuple[SessionLineageNode, ...]:
        children: dict[str, list[SessionHeader]] = {}
        for header in corpus.headers.values():
            parent = header.parent_session
            if parent is not None and parent != header.id:
                children.setdefault(parent, []).append(header)
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
        for node in reversed(order):
            kids = children.get(node)
            if kids:
                kids.sort(key=_order)
                built[node] = tuple(
                    SessionLineageNode(session=corpus.record(k.id), descendants=built.pop(k.id, ()))
                    for k in kids
                )
        return built.get(id, ())

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
                    f"no live session {id!r} and no session persistence",
                    code="SESSION_QUERY_SESSION_NOT_FOUND",
                )
            try:
                header, events = await persistence.inspect(id, signal)
            except AbortedError as exc:
                raise SessionQueryError(
                    f"session query aborted: {exc.reason!r}", code="SESSION_QUERY_ABORTED"
                ) from exc
            except SessionError as exc:
                if exc.code in ("SESSION_NOT_FOUND", "SESSION_INVALID_ID"):
                    raise SessionQueryError(
                        f"no live or persisted session {id!r}",
                        code="SESSION_QUERY_SESSION_NOT_FOUND",
                    ) from exc
                raise SessionQueryError(
                    f"reading session {id!r} failed: {exc}",
                    code="SESSION_QUERY_PERSISTENCE_FAILED",
                ) from exc
            except Exception as exc:
                raise SessionQueryError(
                    f"reading session {id!r} failed: {exc}",
                    code="SESSION_QUERY_PERSISTENCE_FAILED",
                ) from exc
            _aborted(signal)
        try:
            SessionLogChecker().replay(events)
        except LogInvariantError as exc:
            raise SessionQueryError(
                f"session {id!r} does not replay: {exc}", code="SESSION_QUERY_INVALID_LOG"
            ) from exc
        return header, events


def install_session_query(ctx: Context) -> SessionQuery:
    """Install a :class:`SessionQuery` over ``ctx``'s host and provide it as ``session_query``."""
    query = SessionQuery()
    query.install(ctx)
    ctx.provide("session_query", query)
    return query
