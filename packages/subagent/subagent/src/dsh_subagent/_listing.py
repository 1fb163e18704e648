"""Durable enumeration: ``list_children`` and ``list_descendants`` (LIST-S, LIST-3/5/6).

Both read ONE ``ctx.session_query.trace_session()`` observation (headers only), then scan each
candidate once for its ``subagent/descriptor`` events (``scan_sessions``: a live child from
memory, a cold one from the store, at most 4 reads at a time, an unchanged log not read again),
each read stopping at the first ``turn/end`` of the child's own part.
A candidate is a subagent only if its OWN suffix (events from ``seed_length`` on, so a fork
seed's ancestor descriptor never counts) holds exactly one supported descriptor. Nothing here
loads or resumes an agent, or asks the agents service, a manager or a provider.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from dsh_core import (
    AbortSignal,
    Context,
    SessionQuery,
    SessionQueryError,
    SessionScan,
    reason_text,
)

from ._descriptor import (
    DESCRIPTOR_EVENT,
    ContinuableDescriptor,
    SubagentDescriptorData,
    parse_descriptor,
)
from ._errors import DescriptorError, SubagentError
from ._types import (
    SubagentChildEntry,
    SubagentDescendantListEntry,
    SubagentDiagnosticEntry,
    SubagentListEntry,
)

if TYPE_CHECKING:
    from dsh_core import SessionLineageNode, SessionRecord

__all__ = ["ListingMemo", "list_children", "list_descendants"]

#: By child id: (the scan an entry was built from, live, has_children, entry).
_Entries: TypeAlias = "dict[str, tuple[SessionScan, bool, bool, SubagentListEntry | None]]"
#: Entries (or calls) remembered before the memory is dropped and rebuilt.
_MEMO_LIMIT = 100_000


class _Call:
    """One listing as last answered: the traced tree it walked, the records it scanned (in
    walk order, with parent and depth), the scans it got, and its result."""

    __slots__ = ("found", "result", "tree", "walk")

    def __init__(
        self,
        tree: tuple[SessionLineageNode, ...],
        walk: list[tuple[SessionLineageNode, str, int]],
    ) -> None:
        self.tree = tree
        self.walk = walk
        self.found: list[SessionScan | SessionQueryError] = []
        self.result: list[Any] = []


class ListingMemo:
    """What a host's listings remember (``SubagentState.listing_memo``).

    A trace of an unchanged corpus gives back the same tree object and the query gives back
    the same scan object for an unchanged log, so a listing whose tree and scans are all the
    very same objects as last time has the same answer; one entry is likewise reused while
    its child's scan, activity and ``has_children`` are. Nothing here is trusted beyond that
    identity: the query proves the logs unchanged.
    """

    __slots__ = ("calls", "entries")

    def __init__(self) -> None:
        self.entries: _Entries = {}
        self.calls: dict[tuple[str, str], _Call] = {}

    def call(self, kind: str, id: str, tree: tuple[SessionLineageNode, ...]) -> _Call:
        """The call ``kind`` of ``id`` over ``tree``: as remembered, or a new walk of it."""
        key = (kind, id)
        known = self.calls.get(key)
        if known is not None and known.tree is tree:
            return known
        if len(self.calls) > _MEMO_LIMIT:
            self.calls.clear()
        walk = _children(id, tree) if kind == "children" else _pre_order(id, tree)
        known = self.calls[key] = _Call(tree, walk)
        return known


_KEPT = frozenset({DESCRIPTOR_EVENT})
#: Where a child's read stops: its descriptor comes before its first turn ends (a continuable
#: child's before its first turn, a one-shot child's before its first model request), so
#: nothing after the first ``turn/end`` of its own part is read (a long log costs its first
#: turn, not its length).
_UNTIL = frozenset({"turn/end"})
_Reason = Literal["corrupt", "unsupported", "unavailable"]
#: A stored log's failed read, by the backend's ``SessionError`` code (hardening 11.3).
_READ_FAILURES: dict[str, _Reason] = {
    "SESSION_CORRUPT": "corrupt",
    "SESSION_INVALID_ID": "corrupt",
    "SESSION_FILE_UNSAFE": "corrupt",
    "SESSION_FORMAT_UNSUPPORTED": "unsupported",
}


def _cancelled(signal: AbortSignal | None) -> None:
    if signal is not None and signal.aborted:
        raise SubagentError(
            f"subagent listing was cancelled: {reason_text(signal.reason)}", code="CANCELLED"
        )


def _query(ctx: Context, signal: AbortSignal | None) -> SessionQuery:
    query: SessionQuery | None = ctx.get("session_query")
    if query is None:
        raise SubagentError(
            "listing subagents requires the session query (mount the plugin session-query)",
            code="SUBAGENT_CONTROL_SESSION_QUERY_UNAVAILABLE",
        )
    _cancelled(signal)
    return query


async def _trace(
    query: SessionQuery, id: str, signal: AbortSignal | None
) -> tuple[SessionLineageNode, ...]:
    """The descendant tree of ``id``. A failure fails the listing; after an abort it is
    ``CANCELLED`` (the query's own abort error included)."""
    try:
        trace = await query.trace_session(id, signal, contain_loops=True)
    except BaseException:
        _cancelled(signal)
        raise
    _cancelled(signal)
    return trace.descendants


async def _scan(
    query: SessionQuery, records: list[SessionRecord], signal: AbortSignal | None
) -> list[SessionScan | SessionQueryError]:
    if not records:
        return []
    try:
        found = await query.scan_sessions(records, _KEPT, signal, until=_UNTIL)
    except BaseException:
        _cancelled(signal)
        raise
    _cancelled(signal)
    return found


class _Classifier:
    """Turns a candidate's scan into its entry, or ``None`` (no descriptor of its own)."""

    __slots__ = ("_memo",)

    def __init__(self, memo: ListingMemo) -> None:
        # A scan the query remembered (its log unchanged) gives back the same entry.
        if len(memo.entries) > _MEMO_LIMIT:
            memo.entries.clear()
        self._memo = memo.entries

    def entry(
        self, record: SessionRecord, found: SessionScan | SessionQueryError, has_children: bool
    ) -> SubagentListEntry | None:
        id = record.header.id
        live = record.live
        known = self._memo.get(id)
        if (
            known is not None
            and known[0] is found
            and known[1] is live
            and known[2] is has_children
        ):
            return known[3]
        entry = _classify(record, found, has_children)
        if isinstance(found, SessionScan):
            self._memo[id] = (found, live, has_children, entry)
        return entry


def _classify(
    record: SessionRecord, found: SessionScan | SessionQueryError, has_children: bool
) -> SubagentListEntry | None:
    header = record.header
    if isinstance(found, SessionQueryError):
        verdict: SubagentDescriptorData | _Reason | None = _failure(found)
    elif found.header is not header and found.header != header:  # replaced since the trace
        verdict = "corrupt"
    else:
        verdict = _own_descriptor(found, header.seed_length or 0)
    if verdict is None:
        return None
    if isinstance(verdict, str):
        return SubagentDiagnosticEntry(id=header.id, reason=verdict, has_children=has_children)
    return SubagentChildEntry(
        id=header.id,
        mode="continuable" if isinstance(verdict, ContinuableDescriptor) else "one-shot",
        activity="running" if record.live else "inactive",
        label=verdict.label,
        has_children=has_children,
    )


def _own_descriptor(found: SessionScan, start: int) -> SubagentDescriptorData | _Reason | None:
    """The one supported descriptor from ``start`` on; none: ``None``; more than one or a
    malformed one: ``corrupt``; an unknown version: ``unsupported`` (LIST-S)."""
    own = [e for e in found.events if e.seq >= start]
    if not own:
        return None
    if len(own) > 1:
        return "corrupt"
    try:
        descriptor = parse_descriptor(own[0].data)
    except DescriptorError:
        return "corrupt"
    return "unsupported" if descriptor is None else descriptor


def _failure(error: SessionQueryError) -> _Reason:
    """``corrupt`` / ``unsupported`` / ``unavailable`` for one child's failed read."""
    if error.code == "SESSION_QUERY_INVALID_LOG":
        return "corrupt"
    cause = error.__cause__
    code = getattr(cause, "code", None)
    return _READ_FAILURES.get(code, "unavailable") if isinstance(code, str) else "unavailable"


def _has_children(node: SessionLineageNode) -> bool:
    """LIST-3: some direct descendant's header says ``origin: subagent``."""
    kids = node.descendants
    return bool(kids) and any(d.session.header.origin == "subagent" for d in kids)


def _children(
    parent: str, tree: tuple[SessionLineageNode, ...]
) -> list[tuple[SessionLineageNode, str, int]]:
    return [(node, parent, 1) for node in tree]


def _pre_order(
    root: str, tree: tuple[SessionLineageNode, ...]
) -> list[tuple[SessionLineageNode, str, int]]:
    """(node, durable parent id, depth) in pre-order, without recursion: a 10,000-deep chain
    is just a long list."""
    order: list[tuple[SessionLineageNode, str, int]] = []
    stack = [(n, root, 1) for n in reversed(tree)]
    while stack:
        node, parent, depth = stack.pop()
        order.append((node, parent, depth))
        id = node.session.header.id
        stack.extend((kid, id, depth + 1) for kid in reversed(node.descendants))
    return order


async def _listing(
    ctx: Context, memo: ListingMemo, kind: str, id: str, signal: AbortSignal | None
) -> list[Any]:
    """One trace, one scan of every walked node, an entry (or a row) per subagent."""
    query = _query(ctx, signal)
    tree = await _trace(query, id, signal)
    call = memo.call(kind, id, tree)
    walk = call.walk
    found = await _scan(query, [node.session for node, _, _ in walk], signal)
    previous = call.found
    if len(previous) == len(found) and all(map(operator.is_, previous, found)):
        return list(call.result)  # the same tree and the very same scans: the same answer
    classify = _Classifier(memo).entry
    rows = kind == "descendants"
    result: list[Any] = []
    for (node, parent, depth), scan in zip(walk, found, strict=True):
        entry = classify(node.session, scan, _has_children(node))
        if entry is not None:
            if rows:
                result.append(
                    SubagentDescendantListEntry(entry=entry, parent_id=parent, depth=depth)
                )
            else:
                result.append(entry)
    _cancelled(signal)
    call.found = found
    call.result = result
    return list(result)


async def list_children(
    ctx: Context,
    memo: ListingMemo,
    parent_session_id: str,
    signal: AbortSignal | None,
) -> list[SubagentListEntry]:
    """See :meth:`SubagentService.list_children`."""
    return await _listing(ctx, memo, "children", parent_session_id, signal)


async def list_descendants(
    ctx: Context,
    memo: ListingMemo,
    root_session_id: str,
    signal: AbortSignal | None,
) -> list[SubagentDescendantListEntry]:
    """See :meth:`SubagentService.list_descendants`."""
    return await _listing(ctx, memo, "descendants", root_session_id, signal)
