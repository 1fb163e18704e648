"""Durable listing: ``list_children`` and ``list_descendants`` (LIST-S, LIST-3, LIST-5, LIST-6;
issue seam-listing 14).

Most tests build sessions by hand on a bare host (sessions, persistence, session query and
``subagents``; no agents service): a child is a header naming its parent plus
``subagent/descriptor`` events, as the in-process driver and the continuation manager write
them. The restart, provider and fork tests run real one-shot children.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsh_subagent.plugin
from dsh_core import (
    AbortController,
    Context,
    EndSeedData,
    EventTypeRegistry,
    Host,
    SessionError,
    SessionHeader,
    SessionMeta,
    SessionQueryError,
    SessionStoreService,
    StoredScan,
    text_blocks,
)
from dsh_core._persistence import (
    JsonlSessionPersistence,
    MemorySessionPersistence,
    SessionPersistence,
)
from dsh_core._query import install_session_query
from dsh_core.testing import TestHost, scripted_host
from dsh_core.testing.strategies import LogBuilder
from dsh_subagent import (
    DESCRIPTOR_EVENT,
    DESCRIPTOR_EVENT_TYPE,
    NO_START_CAPABILITIES,
    SUBAGENTS,
    ResolvedSubagentStartRequest,
    SubagentCapabilities,
    SubagentChildEntry,
    SubagentDescendantListEntry,
    SubagentDiagnosticEntry,
    SubagentError,
    SubagentRun,
    SubagentService,
    SubagentStartRequest,
    SubagentState,
    descriptor_payload,
    snapshot_continuable_descriptor,
    snapshot_one_shot_descriptor,
)
from dsh_subagent.in_process import completed_turn_prefix, start_in_process_run

ONE_SHOT = descriptor_payload(snapshot_one_shot_descriptor("spawn", "sum up"))
UNLABELLED = descriptor_payload(snapshot_one_shot_descriptor("fork"))
CONTINUABLE = descriptor_payload(
    snapshot_continuable_descriptor(provider="spawn", label="reviewer", agent_model="m")
)
FUTURE = {"version": 3, "mode": "one-shot", "provider": "spawn"}
MALFORMED = {"version": 2, "mode": "one-shot", "provider": 7}


# -- a bare host ----------------------------------------------------------------------------------


def bare(persistence: SessionPersistence | None = None, *, query: bool = True) -> Context:
    """Sessions, optional persistence and query, and ``subagents``: no agents, no manager."""
    host = Host("listing")
    ctx = Context(host, host.root)
    types = EventTypeRegistry()
    types.register(DESCRIPTOR_EVENT_TYPE)
    ctx.provide("sessions", SessionStoreService(types))
    if persistence is not None:
        persistence.install(ctx)
        ctx.provide("session_persistence", persistence)
    if query:
        install_session_query(ctx)
    ctx.provide("subagents", SubagentState(ctx))
    return ctx


def svc(ctx: Context) -> SubagentService:
    return ctx[SUBAGENTS]


def log_of(*own: object, seed: Sequence[object] = ()) -> tuple[list[Any], int | None]:
    """Events: ``seed`` descriptors, ``session/end-seed``, then ``own`` descriptors (payloads);
    the seed length (``None`` without a seed)."""
    log = LogBuilder()
    for payload in seed:
        log.add(DESCRIPTOR_EVENT, payload, ignorable=True)
    seed_length = None
    if seed:
        seed_length = len(log.events)
        log.add("session/end-seed", EndSeedData())
    for payload in own:
        log.add(DESCRIPTOR_EVENT, payload, ignorable=True)
    return list(log.events), seed_length


async def stored(
    persistence: SessionPersistence,
    id: str,
    at: int,
    parent: str | None = None,
    *own: object,
    seed: Sequence[object] = (),
    origin: bool = True,
) -> SessionHeader:
    """A cold session: header, then the descriptors :func:`log_of` writes."""
    events, seed_length = log_of(*own, seed=seed)
    header = SessionHeader(
        id=id,
        created_at=at,
        parent_session=parent,
        seed_length=seed_length,
        origin="subagent" if origin and parent is not None else None,
    )
    await persistence.create(header)
    if events:
        await persistence.append(id, events)
    return header


def live(ctx: Context, id: str, parent: str, *own: object) -> None:
    """A live child session with ``own`` descriptors appended."""
    session = ctx.sessions.create(id, meta=SessionMeta(parent_session=parent, origin="subagent"))
    for payload in own:
        session.append(DESCRIPTOR_EVENT, payload, ignorable=True)


def child(id: str, mode: str = "one-shot", label: str | None = "sum up", **kw: Any) -> Any:
    return SubagentChildEntry(
        id=id, mode=mode, activity=kw.pop("activity", "inactive"), label=label, **kw
    )  # type: ignore[arg-type]


def diag(id: str, reason: str, has_children: bool = False) -> SubagentDiagnosticEntry:
    return SubagentDiagnosticEntry(id=id, reason=reason, has_children=has_children)  # type: ignore[arg-type]


class Counting(MemorySessionPersistence):
    """A memory store that counts the stored-log reads listing makes, by id."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []
        self.fail: dict[str, Exception] = {}
        self.on_read: Any = None

    def _scan(self, id: str, types: frozenset[str]) -> StoredScan:
        self.reads.append(id)
        if self.on_read is not None:
            self.on_read(id)
        if id in self.fail:
            raise self.fail[id]
        return super()._scan(id, types)


# -- LIST-S: classification by descriptors in the child's own suffix ------------------------------


async def test_healthy_corrupt_unsupported_unavailable_siblings_in_one_listing() -> None:
    """LIST-S, seam-listing 14.1: one listing holds a healthy child next to corrupt (two
    descriptors, a malformed one), unsupported (unknown version) and unavailable (a failed
    read) siblings; none hides another, and a child without a descriptor gives no entry."""
    store = Counting()
    ctx = bare(store)
    await stored(store, "p", 1)
    await stored(store, "a-healthy", 10, "p", ONE_SHOT)
    await stored(store, "b-twice", 11, "p", ONE_SHOT, ONE_SHOT)
    await stored(store, "c-malformed", 12, "p", MALFORMED)
    await stored(store, "d-future", 13, "p", FUTURE)
    await stored(store, "e-gone", 14, "p", ONE_SHOT)
    await stored(store, "f-plain", 15, "p", origin=False)
    store.fail["e-gone"] = SessionError("disk error", code="SESSION_IO")
    assert await svc(ctx).list_children("p") == [
        child("a-healthy"),
        diag("b-twice", "corrupt"),
        diag("c-malformed", "corrupt"),
        diag("d-future", "unsupported"),
        diag("e-gone", "unavailable"),
    ]
    await ctx.dispose()


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("SESSION_NOT_FOUND", "unavailable"),
        ("SESSION_IO", "unavailable"),
        ("SESSION_CORRUPT", "corrupt"),
        ("SESSION_FILE_UNSAFE", "corrupt"),
        ("SESSION_FORMAT_UNSUPPORTED", "unsupported"),
        ("SESSION_SOMETHING_NEW", "unavailable"),
        ("", "corrupt"),
    ],
)
async def test_a_failed_read_is_a_diagnostic_by_the_store_code(code: str, reason: str) -> None:
    """LIST-S, seam-listing 14.1: a child's failed read is a diagnostic named by what the store
    found (corrupt / unsupported / unavailable; a read that fails with no store error at all
    is corrupt); it never fails the listing or its siblings."""
    store = Counting()
    ctx = bare(store)
    await stored(store, "p", 1)
    await stored(store, "c", 2, "p", ONE_SHOT)
    await stored(store, "d", 3, "p", ONE_SHOT)
    store.fail["c"] = SessionError("no", code=code) if code else ValueError("crafted")
    assert await svc(ctx).list_children("p") == [diag("c", reason), child("d")]
    await ctx.dispose()


async def test_a_child_replaced_since_the_trace_is_corrupt() -> None:
    """LIST-3, seam-listing 14.1: a read whose header differs from the one the trace listed
    (the log was replaced in between) gives corrupt for that child alone."""

    class Replacing(MemorySessionPersistence):
        def _scan(self, id: str, types: frozenset[str]) -> StoredScan:
            found = super()._scan(id, types)
            if id != "replaced":
                return found
            return attrs.evolve(found, header=attrs.evolve(found.header, created_at=99))

    store = Replacing()
    ctx = bare(store)
    await stored(store, "p", 1)
    await stored(store, "replaced", 2, "p", ONE_SHOT)
    await stored(store, "kept", 3, "p", ONE_SHOT)
    assert await svc(ctx).list_children("p") == [diag("replaced", "corrupt"), child("kept")]
    await ctx.dispose()


async def test_children_are_ordered_by_created_at_then_id() -> None:
    """LIST-2, LIST-S: entries follow the trace: created_at, then id (not store order)."""
    store = MemorySessionPersistence()
    ctx = bare(store)
    await stored(store, "p", 1)
    for id, at in (("z", 5), ("b", 7), ("a", 7), ("m", 3)):
        await stored(store, id, at, "p", ONE_SHOT)
    assert [e.id for e in await svc(ctx).list_children("p")] == ["m", "z", "a", "b"]
    await ctx.dispose()


async def test_continuable_and_one_shot_entries() -> None:
    """LIST-S: a continuable child always carries its label; a one-shot one carries it only
    when the start gave one."""
    store = MemorySessionPersistence()
    ctx = bare(store)
    await stored(store, "p", 1)
    await stored(store, "c1", 2, "p", CONTINUABLE)
    await stored(store, "c2", 3, "p", UNLABELLED)
    assert await svc(ctx).list_children("p") == [
        child("c1", "continuable", "reviewer"),
        child("c2", "one-shot", None),
    ]
    await ctx.dispose()


async def test_only_the_own_suffix_counts() -> None:
    """LIST-S, DSC-3, seam-listing 14.1: descriptors in a fork seed are an ancestor's: a
    seeded child with one of its own is healthy (not "two"), one with none is left out."""
    store = MemorySessionPersistence()
    ctx = bare(store)
    await stored(store, "p", 1)
    await stored(store, "fork-child", 2, "p", UNLABELLED, seed=[ONE_SHOT])
    await stored(store, "plain-fork", 3, "p", seed=[ONE_SHOT, CONTINUABLE])
    assert await svc(ctx).list_children("p") == [child("fork-child", label=None)]
    await ctx.dispose()


async def test_has_children_counts_subagent_origin_only() -> None:
    """LIST-3, seam-listing 14.1: has_children, on every entry, says some direct descendant's
    header has origin subagent (a diagnostic-only grandchild counts, an ordinary one does
    not)."""
    store = MemorySessionPersistence()
    ctx = bare(store)
    await stored(store, "p", 1)
    await stored(store, "with", 2, "p", ONE_SHOT)
    await stored(store, "with-kid", 3, "with", FUTURE)
    await stored(store, "plain", 4, "p", ONE_SHOT)
    await stored(store, "plain-kid", 5, "plain", ONE_SHOT, origin=False)
    await stored(store, "broken", 6, "p", MALFORMED)
    await stored(store, "broken-kid", 7, "broken", ONE_SHOT)
    entries = await svc(ctx).list_children("p")
    assert [(e.id, e.kind, e.has_children) for e in entries] == [
        ("with", "child", True),
        ("plain", "child", False),
        ("broken", "diagnostic", True),
    ]
    await ctx.dispose()


async def test_live_child_is_running_and_costs_no_read() -> None:
    """LIST-3, LIST-5, seam-listing 14.3: a live child is running and read from memory (no
    store read); a cold sibling is inactive and read once; a live child whose descriptor is
    not written yet (the creation window) is left out."""
    store = Counting()
    ctx = bare(store)
    await stored(store, "p", 1)
    await stored(store, "cold", 2, "p", ONE_SHOT)
    live(ctx, "hot", "p", CONTINUABLE)
    live(ctx, "new", "p")
    assert await svc(ctx).list_children("p") == [
        child("cold"),
        child("hot", "continuable", "reviewer", activity="running"),
    ]
    assert store.reads == ["cold"]
    await ctx.dispose()


async def test_repeated_listings_follow_the_child_going_cold() -> None:
    """LIST-3, LIST-5: a listing repeated over an unchanged store answers the same; once a
    live child is disposed (its log stays stored) the next listing says inactive."""
    store = Counting()
    ctx = bare(store)
    await stored(store, "p", 1)
    owner = ctx.plugin("owner")
    live(owner, "c", "p", CONTINUABLE)
    running = [child("c", "continuable", "reviewer", activity="running")]
    assert await svc(ctx).list_children("p") == running
    assert await svc(ctx).list_children("p") == running
    await owner.dispose()
    assert await svc(ctx).list_children("p") == [child("c", "continuable", "reviewer")]
    assert store.reads == ["c"]
    await ctx.dispose()


async def test_no_session_query_is_refused() -> None:
    """LIST-S: without ctx.session_query both listings fail with
    SUBAGENT_CONTROL_SESSION_QUERY_UNAVAILABLE, before any read."""
    ctx = bare(MemorySessionPersistence(), query=False)
    for call in (svc(ctx).list_children, svc(ctx).list_descendants):
        with pytest.raises(SubagentError) as caught:
            await call("p")
        assert caught.value.code == "SUBAGENT_CONTROL_SESSION_QUERY_UNAVAILABLE"
    await ctx.dispose()


async def test_a_trace_failure_fails_the_call() -> None:
    """LIST-S: a failure building the trace (an unknown parent) fails the whole call."""
    ctx = bare(MemorySessionPersistence())
    with pytest.raises(SessionQueryError) as caught:
        await svc(ctx).list_children("nobody")
    assert caught.value.code == "SESSION_QUERY_SESSION_NOT_FOUND"
    await ctx.dispose()


async def test_listing_works_without_persistence() -> None:
    """LIST-1: without persistence the listing covers live sessions only."""
    ctx = bare()
    ctx.sessions.create("p")
    live(ctx, "c", "p", ONE_SHOT)
    assert await svc(ctx).list_children("p") == [child("c", activity="running")]
    await ctx.dispose()


# -- cancellation (LIST-5) ------------------------------------------------------------------------


async def test_pre_aborted_signal_is_cancelled_before_any_read() -> None:
    """LIST-5: an aborted signal fails with CANCELLED before any read."""
    store = Counting()
    ctx = bare(store)
    await stored(store, "p", 1)
    await stored(store, "c", 2, "p", ONE_SHOT)
    controller = AbortController()
    controller.abort("stop")
    for call in (svc(ctx).list_children, svc(ctx).list_descendants):
        with pytest.raises(SubagentError) as caught:
            await call("p", controller.signal)
        assert caught.value.code == "CANCELLED"
    assert store.reads == []
    await ctx.dispose()


@pytest.mark.parametrize("failing", [False, True])
async def test_abort_during_reads_is_cancelled_never_partial(failing: bool) -> None:
    """LIST-5, seam-listing 14.1: an abort observed around a read gives CANCELLED: neither a
    result nor an unavailable row comes back, whether the read then succeeds or fails."""
    store = Counting()
    ctx = bare(store)
    await stored(store, "p", 1)
    await stored(store, "a", 2, "p", ONE_SHOT)
    await stored(store, "b", 3, "p", ONE_SHOT)
    controller = AbortController()
    if failing:
        store.fail["a"] = SessionError("no", code="SESSION_IO")
    store.on_read = lambda id: controller.abort("user") if id == "a" else None
    for call in (svc(ctx).list_children, svc(ctx).list_descendants):
        with pytest.raises(SubagentError) as caught:
            await call("p", controller.signal)
        assert caught.value.code == "CANCELLED"
        controller = AbortController()
    await ctx.dispose()


async def test_abort_during_the_trace_is_cancelled() -> None:
    """LIST-5: an abort while the trace lists the store is CANCELLED, not the query's error."""
    controller = AbortController()

    class Aborting(MemorySessionPersistence):
        def _headers(self, signal: Any) -> list[SessionHeader]:
            controller.abort("now")
            return super()._headers(signal)

    store = Aborting()
    ctx = bare(store)
    await stored(store, "p", 1)
    with pytest.raises(SubagentError) as caught:
        await svc(ctx).list_children("p", controller.signal)
    assert caught.value.code == "CANCELLED"
    await ctx.dispose()


# -- LIST-6: descendants --------------------------------------------------------------------------


async def test_descendants_in_pre_order_through_ordinary_sessions() -> None:
    """LIST-6, seam-listing 14.2: a stable pre-order with parent_id and depth on every row;
    ordinary and descriptor-less sessions give no row but are walked through."""
    store = MemorySessionPersistence()
    ctx = bare(store)
    await stored(store, "root", 1)
    await stored(store, "a", 2, "root", ONE_SHOT)
    await stored(store, "a1", 3, "a", CONTINUABLE)
    await stored(store, "plain", 4, "root", origin=False)
    await stored(store, "plain1", 5, "plain", ONE_SHOT)
    await stored(store, "b", 6, "root", FUTURE)
    await stored(store, "b1", 7, "b", UNLABELLED)
    rows = await svc(ctx).list_descendants("root")
    assert [(r.entry.id, r.parent_id, r.depth) for r in rows] == [
        ("a", "root", 1),
        ("a1", "a", 2),
        ("plain1", "plain", 2),
        ("b", "root", 1),
        ("b1", "b", 2),
    ]
    assert rows[0].entry == child("a", has_children=True)
    assert rows[3].entry == diag("b", "unsupported", has_children=True)
    await ctx.dispose()


async def test_ten_thousand_deep_chain() -> None:
    """LIST-6, seam-listing 14.2: a 10,000-deep chain lists without hitting the recursion
    limit, each row one deeper than its parent."""
    store = MemorySessionPersistence()
    ctx = bare(store)
    await stored(store, "s0", 0)
    depth = 10_000
    for i in range(1, depth + 1):
        await stored(store, f"s{i}", i, f"s{i - 1}", ONE_SHOT)
    rows = await svc(ctx).list_descendants("s0")
    assert len(rows) == depth
    assert (rows[-1].entry.id, rows[-1].parent_id, rows[-1].depth) == (
        f"s{depth}",
        f"s{depth - 1}",
        depth,
    )
    assert await svc(ctx).list_children(f"s{depth - 1}") == [child(f"s{depth}")]
    await ctx.dispose()


async def test_parent_cycle_is_contained() -> None:
    """LIST-6, seam-listing 14.2: a parent cycle (root -> a -> root) ends the walk; the root is
    never revisited and both listings still answer."""
    store = MemorySessionPersistence()
    ctx = bare(store)
    await stored(store, "root", 1, "a", ONE_SHOT)
    await stored(store, "a", 2, "root", ONE_SHOT)
    await stored(store, "b", 3, "a", ONE_SHOT)
    rows = await svc(ctx).list_descendants("root")
    assert [(r.entry.id, r.parent_id, r.depth) for r in rows] == [("a", "root", 1), ("b", "a", 2)]
    assert [e.id for e in await svc(ctx).list_children("a")] == ["root", "b"]
    await ctx.dispose()


Forest = list[tuple[int, int | None, int, int]]  # (node, parent, created_at, kind)
KINDS = (ONE_SHOT, CONTINUABLE, FUTURE, MALFORMED, None, "plain")


@st.composite
def forests(draw: st.DrawFn) -> Forest:
    """Random forests: each node's parent is an earlier node or none; a few kinds of node."""
    size = draw(st.integers(1, 25))
    nodes: Forest = []
    for n in range(size):
        parent = draw(st.none() | st.integers(0, n - 1)) if n else None
        nodes.append((n, parent, draw(st.integers(0, 5)), draw(st.integers(0, len(KINDS) - 1))))
    return nodes


def reference(forest: Forest, root: int) -> list[tuple[str, str, int, str]]:
    """The naive walk: recursive pre-order, siblings by (created_at, id), a row per node with
    one own descriptor (or a diagnostic)."""
    names = {n: f"n{n:02d}" for n, _, _, _ in forest}

    def kids(of: int) -> list[tuple[int, int | None, int, int]]:
        return sorted((x for x in forest if x[1] == of), key=lambda x: (x[2], names[x[0]]))

    rows: list[tuple[str, str, int, str]] = []

    def walk(node: int, depth: int) -> None:
        for kid, _, _, kind in kids(node):
            payload = KINDS[kind]
            if payload is ONE_SHOT or payload is CONTINUABLE:
                rows.append((names[kid], names[node], depth, "child"))
            elif payload is FUTURE:
                rows.append((names[kid], names[node], depth, "unsupported"))
            elif payload is MALFORMED:
                rows.append((names[kid], names[node], depth, "corrupt"))
            walk(kid, depth + 1)

    walk(root, 1)
    return rows


def shape(row: SubagentDescendantListEntry) -> tuple[str, str, int, str]:
    entry = row.entry
    kind = entry.kind if isinstance(entry, SubagentChildEntry) else entry.reason
    return entry.id, row.parent_id, row.depth, kind


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forests(), st.data())
async def test_descendants_match_a_naive_reference_walk(
    forest: Forest, data: st.DataObject
) -> None:
    """LIST-6, seam-listing 14.2: over random session forests, list_descendants equals a
    naive recursive pre-order walk, and list_children its depth-1 rows."""
    store = MemorySessionPersistence()
    ctx = bare(store)
    for n, parent, at, kind in forest:
        payload = KINDS[kind]
        own = () if payload is None or payload == "plain" else (payload,)
        await stored(
            store,
            f"n{n:02d}",
            at,
            None if parent is None else f"n{parent:02d}",
            *own,
            origin=payload != "plain",
        )
    root = data.draw(st.sampled_from([n for n, _, _, _ in forest]))
    expected = reference(forest, root)
    assert [shape(r) for r in await svc(ctx).list_descendants(f"n{root:02d}")] == expected
    children = await svc(ctx).list_children(f"n{root:02d}")
    assert [e.id for e in children] == [r[0] for r in expected if r[2] == 1]
    await ctx.dispose()


# -- LIST-5: bounded reads --------------------------------------------------------------------


async def test_each_cold_child_is_read_once_and_an_unchanged_one_not_again() -> None:
    """LIST-5, seam-listing 14.3: one listing reads each cold node once; a second listing of
    an unchanged store reads nothing; a log that grew is read again (and its new descriptor
    counted)."""
    store = Counting()
    ctx = bare(store)
    await stored(store, "root", 1)
    await stored(store, "a", 2, "root", ONE_SHOT)
    await stored(store, "b", 3, "a", ONE_SHOT)
    await stored(store, "c", 4, "root", CONTINUABLE)
    first = await svc(ctx).list_descendants("root")
    assert sorted(store.reads) == ["a", "b", "c"]
    store.reads.clear()
    assert await svc(ctx).list_descendants("root") == first
    assert store.reads == []
    events, _ = log_of(ONE_SHOT)
    await store.append("b", [attrs.evolve(events[0], seq=1)])
    rows = await svc(ctx).list_descendants("root")
    assert store.reads == ["b"]
    assert rows[1].entry == diag("b", "corrupt")
    await ctx.dispose()


class Gated(JsonlSessionPersistence):
    """A JSONL store whose reads meet in groups of four (a barrier) and record how many run at
    once: a listing that reads fewer than four at a time breaks the barrier."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.reads: list[str] = []
        self.barrier = threading.Barrier(4, timeout=10)

    def _scan(self, id: str, types: frozenset[str]) -> StoredScan:
        return self._gated(id, lambda: super(Gated, self)._scan(id, types))

    def _scan_until(self, id: str, types: frozenset[str], until: frozenset[str]) -> StoredScan:
        return self._gated(id, lambda: super(Gated, self)._scan_until(id, types, until))

    def _gated(self, id: str, read: Callable[[], StoredScan]) -> StoredScan:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.reads.append(id)
        try:
            self.barrier.wait()
            return read()
        finally:
            with self.lock:
                self.running -= 1


async def test_at_most_four_reads_in_flight(tmp_path: Path) -> None:
    """LIST-5, seam-listing 14.3: over 40 cold children on the JSONL store, four reads run at
    once (they meet at a barrier of four), never more, and each child is read once."""
    store = Gated(tmp_path)
    ctx = bare(store)
    await stored(store, "p", 1)
    for i in range(40):
        await stored(store, f"c{i:02d}", 10 + i, "p", ONE_SHOT)
    async with asyncio.timeout(30):
        entries = await svc(ctx).list_children("p")
    assert len(entries) == 40
    assert store.most == 4
    assert sorted(store.reads) == [f"c{i:02d}" for i in range(40)]
    await ctx.dispose()


# -- the JSONL store, real children --------------------------------------------------------------


@attrs.frozen
class LocalProvider:
    """A provider over the shared in-process driver (``seeded``: a fork of the parent)."""

    name: str = "local"
    capabilities: SubagentCapabilities = NO_START_CAPABILITIES
    inherits_parent_context: bool = False
    seeded: bool = False

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        seed = completed_turn_prefix(request.parent) if self.seeded else None
        return await start_in_process_run(request, seed=seed)


@contextlib.asynccontextmanager
async def booted(root: Path) -> AsyncIterator[TestHost]:
    async with scripted_host(
        "subagent",
        model=lambda request: "answer: " + request.last_user_text,
        modules={"subagent": dsh_subagent.plugin},
        store="jsonl",
        store_root=root,
    ) as host:
        yield host


async def one_shot(parent: Any, provider: str = "local", label: str | None = None) -> str:
    run = await parent.ctx[SUBAGENTS].start(
        provider, SubagentStartRequest(prompt=text_blocks("task"), parent=parent, label=label)
    )
    await run.result
    await run.dispose()
    return run.id


LIST_IN_A_NEW_PROCESS = """
import asyncio, json, sys
from dsh_core import Context, EventTypeRegistry, Host, SessionStoreService
from dsh_core._persistence import install_jsonl_persistence
from dsh_core._query import install_session_query
from dsh_subagent import DESCRIPTOR_EVENT_TYPE, SUBAGENTS, SubagentState

async def main():
    host = Host("restarted")
    ctx = Context(host, host.root)
    types = EventTypeRegistry()
    types.register(DESCRIPTOR_EVENT_TYPE)
    ctx.provide("sessions", SessionStoreService(types))
    install_jsonl_persistence(ctx, sys.argv[1])
    install_session_query(ctx)
    ctx.provide("subagents", SubagentState(ctx))
    found = await ctx[SUBAGENTS].list_children(sys.argv[2])
    print(json.dumps([[e.kind, e.id, e.label, e.activity] for e in found]))
    await ctx.dispose()

asyncio.run(main())
"""


async def list_in_a_new_process(root: Path, parent_id: str) -> Any:
    """``list_children`` in a fresh interpreter on the JSONL folder ``root``."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LIST_IN_A_NEW_PROCESS,
        str(root),
        parent_id,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return json.loads(out)


async def test_listing_after_a_process_restart_on_the_jsonl_store(tmp_path: Path) -> None:
    """LIST-S, seam-listing 14.1: children started in one host are listed by another process
    and by a fresh host on the same JSONL folder (inactive, same order and labels), and a
    child corrupted on disk is a diagnostic beside its healthy sibling."""
    async with booted(tmp_path) as host:
        host.ctx.plugin("provider")[SUBAGENTS].register_provider(LocalProvider())
        parent = (await host.create_agent()).agent
        first = await one_shot(parent, label="first")
        second = await one_shot(parent)
        parent_id = parent.id
        assert [e.activity for e in await host.ctx[SUBAGENTS].list_children(parent_id)] == [
            "inactive",
            "inactive",
        ]
    assert await list_in_a_new_process(tmp_path, parent_id) == [
        ["child", first, "first", "inactive"],
        ["child", second, None, "inactive"],
    ]
    path = tmp_path / f"{second}.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[2] = b"not json"
    path.write_bytes(b"\n".join(lines))
    async with booted(tmp_path) as host:
        assert await host.ctx[SUBAGENTS].list_children(parent_id) == [
            child(first, label="first"),
            diag(second, "corrupt"),
        ]
        rows = await host.ctx[SUBAGENTS].list_descendants(parent_id)
        assert [(r.entry.id, r.parent_id, r.depth) for r in rows] == [
            (first, parent_id, 1),
            (second, parent_id, 1),
        ]


async def test_children_of_a_provider_no_longer_registered(tmp_path: Path) -> None:
    """LIST-3, seam-listing 14.1: listing never asks a provider: children of one that was
    unregistered are listed as before."""
    async with booted(tmp_path) as host:
        owner = host.ctx.plugin("provider")
        owner[SUBAGENTS].register_provider(LocalProvider(name="gone"))
        parent = (await host.create_agent()).agent
        kid = await one_shot(parent, "gone", "by a provider now gone")
        await owner.dispose()
        assert host.ctx[SUBAGENTS].get_provider("gone") is None
        assert await host.ctx[SUBAGENTS].list_children(parent.id) == [
            child(kid, label="by a provider now gone")
        ]


async def test_fork_child_whose_seed_carries_an_ancestors_descriptor(tmp_path: Path) -> None:
    """LIST-S, DSC-3, seam-listing 14.1: a fork of a subagent inherits that subagent's
    descriptor in its seed; listing counts only the fork's own one, so it is one healthy
    child of its parent, not a corrupt "two descriptors"."""
    async with booted(tmp_path) as host:
        owner = host.ctx.plugin("provider")
        owner[SUBAGENTS].register_provider(LocalProvider())
        owner[SUBAGENTS].register_provider(LocalProvider(name="fork", seeded=True))
        parent = (await host.create_agent()).agent
        run = await parent.ctx[SUBAGENTS].start(
            "local", SubagentStartRequest(prompt=text_blocks("task"), parent=parent, label="mid")
        )
        await run.result
        middle = run.local_agent
        assert middle is not None
        grandchild = await one_shot(middle, "fork", "forked")
        header = host.ctx.sessions.get(middle.id)
        assert header is not None
        fork_log = await host.ctx.session_query.read_session(grandchild)
        seed_length = fork_log[0].seed_length
        assert seed_length is not None
        inherited = [e for e in fork_log[1] if e.type == DESCRIPTOR_EVENT and e.seq < seed_length]
        assert len(inherited) == 1
        assert await host.ctx[SUBAGENTS].list_children(middle.id) == [
            child(grandchild, label="forked")
        ]
        rows = await host.ctx[SUBAGENTS].list_descendants(parent.id)
        assert [(r.entry.id, r.parent_id, r.depth, r.entry.activity) for r in rows] == [  # type: ignore[union-attr]
            (middle.id, parent.id, 1, "running"),
            (grandchild, middle.id, 2, "inactive"),
        ]
        await run.dispose()


async def test_listing_reads_a_child_only_up_to_its_first_turn_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-19: list_children reads a cold child's log only up to the first turn/end of its
    own part (its descriptor comes before): a long tail after it is never read."""
    import os

    store = JsonlSessionPersistence(tmp_path)
    ctx = bare(store)
    await stored(store, "p", 1)
    log = LogBuilder()
    log.turn_start()
    log.add(DESCRIPTOR_EVENT, ONE_SHOT, ignorable=True)
    log.turn_end()
    for n in range(400):
        log.add("x/pad", {"pad": "x" * 20_000, "n": n}, ignorable=True)
    header = SessionHeader(id="long", created_at=2, parent_session="p", origin="subagent")
    await store.create(header)
    await store.append("long", log.events)
    assert (tmp_path / "long.jsonl").stat().st_size > 7_000_000
    read = [0]
    real = os.pread

    def pread(fd: int, size: int, offset: int) -> bytes:
        data = real(fd, size, offset)
        read[0] += len(data)
        return data

    monkeypatch.setattr(os, "pread", pread)
    async with asyncio.timeout(30):
        assert await svc(ctx).list_children("p") == [child("long")]
    assert read[0] < 200_000
    await ctx.dispose()
