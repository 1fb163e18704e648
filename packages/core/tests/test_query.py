"""Session query: corpus, lineage traces, reads (host-core §6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsh_core import (
    AbortController,
    AbortedError,
    Context,
    EventTypeRegistry,
    Host,
    SessionError,
    SessionEvent,
    SessionHeader,
    SessionMeta,
    SessionStoreService,
    TurnStartData,
)
from dsh_core._persistence import SessionPersistence, install_memory_persistence
from dsh_core._query import (
    SessionLineageNode,
    SessionQuery,
    SessionQueryError,
    SessionRecord,
    install_session_query,
)
from dsh_core.testing.strategies import LogBuilder


def make_ctx() -> Context:
    host = Host()
    ctx = Context(host, host.root)
    ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
    return ctx


async def stored(
    persistence: SessionPersistence, id: str, at: int, parent: str | None = None
) -> None:
    await persistence.create(SessionHeader(id=id, created_at=at, parent_session=parent))


def ids(records: tuple[SessionRecord, ...] | list[SessionRecord]) -> list[str]:
    return [r.id for r in records]


def tree(nodes: tuple[SessionLineageNode, ...]) -> list[Any]:
    return [(n.session.id, tree(n.descendants)) for n in nodes]


class FakePersistence:
    """A stand-in backend whose list/inspect fail or return what a test scripts."""

    def __init__(self, headers: list[SessionHeader] | None = None) -> None:
        self.headers = headers or []
        self.error: BaseException | None = None
        self.log: tuple[SessionHeader, tuple[SessionEvent, ...]] | None = None

    async def list(self, signal: Any = None) -> list[SessionHeader]:
        if self.error is not None:
            raise self.error
        return list(self.headers)

    async def inspect(self, id: str, signal: Any = None) -> Any:
        if self.error is not None:
            raise self.error
        if self.log is None:
            raise SessionError("no such session", code="SESSION_NOT_FOUND")
        return self.log


def with_fake(fake: FakePersistence) -> tuple[Context, SessionQuery]:
    ctx = make_ctx()
    ctx.provide("session_persistence", fake)
    return ctx, install_session_query(ctx)


# -- corpus ---------------------------------------------------------------------------------------


async def test_corpus_is_live_union_persisted_and_live_wins() -> None:
    """host-core §6: the corpus is live + persisted; for an id in both the live session wins."""
    ctx = make_ctx()
    persistence = install_memory_persistence(ctx)
    query = install_session_query(ctx)
    await stored(persistence, "old", 1)
    both = ctx.sessions.create("both")  # tracked: its header is stored too
    only_live = ctx.sessions.prepare("live-only")
    ctx.sessions.enter(only_live)  # entered, never announced: not tracked
    records = {r.id: r for r in await query.list_sessions()}
    assert (records["old"].live, records["old"].persisted) == (False, True)
    assert (records["both"].live, records["both"].persisted) == (True, True)
    assert records["both"].header is both.header
    assert (records["live-only"].live, records["live-only"].persisted) == (True, False)
    await ctx.dispose()


async def test_corpus_without_persistence_is_the_live_store() -> None:
    """host-core §6: without session_persistence only live sessions are queried."""
    ctx = make_ctx()
    query = install_session_query(ctx)
    ctx.sessions.create("a")
    assert [(r.id, r.live, r.persisted) for r in await query.list_sessions()] == [
        ("a", True, False)
    ]


async def test_list_sessions_newest_first() -> None:
    """host-core §6: list_sessions orders by created_at (then id), newest first."""
    ctx = make_ctx()
    persistence = install_memory_persistence(ctx)
    query = install_session_query(ctx)
    await stored(persistence, "a", 1)
    await stored(persistence, "c", 3)
    await stored(persistence, "b", 3)
    assert ids(await query.list_sessions()) == ["c", "b", "a"]


# -- lineage --------------------------------------------------------------------------------------


async def family() -> tuple[Context, SessionQuery]:
    """root(t0) has children a(t3) and b(t2); a has a1(t4), a0(t5) and a2(t5)."""
    ctx = make_ctx()
    persistence = install_memory_persistence(ctx)
    query = install_session_query(ctx)
    await stored(persistence, "root", 0)
    await stored(persistence, "a", 3, "root")
    await stored(persistence, "b", 2, "root")
    await stored(persistence, "a2", 5, "a")
    await stored(persistence, "a1", 4, "a")
    await stored(persistence, "a0", 5, "a")
    return ctx, query


async def test_trace_ancestors_nearest_first_and_complete() -> None:
    """host-core §6: ancestors run nearest first; a parentless top makes the trace complete."""
    _, query = await family()
    trace = await query.trace_session("a1")
    assert trace.target.id == "a1"
    assert ids(trace.ancestors) == ["a", "root"]
    assert trace.complete and trace.root is not None and trace.root.id == "root"
    assert trace.unresolved_parent_id is None
    assert trace.descendants == ()


async def test_trace_descendants_sorted_by_creation_then_id() -> None:
    """host-core §6: descendants form a tree, each level sorted by (created_at, id)."""
    _, query = await family()
    trace = await query.trace_session("root")
    assert tree(trace.descendants) == [
        ("b", []),
        ("a", [("a1", []), ("a0", []), ("a2", [])]),
    ]
    assert trace.ancestors == () and trace.root == trace.target and trace.complete


async def test_trace_with_missing_parent_is_incomplete() -> None:
    """host-core §6: a parent the corpus lacks leaves the trace incomplete, naming it."""
    ctx = make_ctx()
    persistence = install_memory_persistence(ctx)
    query = install_session_query(ctx)
    await stored(persistence, "mid", 1, "gone")
    await stored(persistence, "leaf", 2, "mid")
    trace = await query.trace_session("leaf")
    assert ids(trace.ancestors) == ["mid"]
    assert not trace.complete and trace.root is None
    assert trace.unresolved_parent_id == "gone"


async def test_trace_mixes_live_and_persisted_sessions() -> None:
    """host-core §6: a live child of a persisted parent is traced from either end."""
    ctx = make_ctx()
    persistence = install_memory_persistence(ctx)
    query = install_session_query(ctx)
    await stored(persistence, "parent", 1)
    child = ctx.sessions.prepare("child", meta=SessionMeta(parent_session="parent"))
    ctx.sessions.enter(child)
    trace = await query.trace_session("parent")
    (node,) = trace.descendants
    assert (node.session.id, node.session.live, node.session.persisted) == ("child", True, False)
    up = await query.trace_session("child")
    assert ids(up.ancestors) == ["parent"] and up.target.live


async def test_unknown_target_is_not_found() -> None:
    """host-core §6: tracing an id nobody holds fails SESSION_QUERY_SESSION_NOT_FOUND."""
    _, query = await family()
    with pytest.raises(SessionQueryError) as info:
        await query.trace_session("nope")
    assert info.value.code == "SESSION_QUERY_SESSION_NOT_FOUND"


@pytest.mark.parametrize(
    "links", [[("x", "x")], [("x", "y"), ("y", "x")], [("t", "x"), ("x", "y"), ("y", "x")]]
)
async def test_ancestry_cycle_is_invalid_lineage(links: list[tuple[str, str]]) -> None:
    """host-core §6: a loop in the parent chain fails SESSION_QUERY_INVALID_LINEAGE."""
    headers = [SessionHeader(id=i, created_at=1, parent_session=p) for i, p in links]
    _, query = with_fake(FakePersistence(headers))
    with pytest.raises(SessionQueryError) as info:
        await query.trace_session(links[0][0])
    assert info.value.code == "SESSION_QUERY_INVALID_LINEAGE"


async def test_deep_lineage_does_not_recurse() -> None:
    """host-core §6: a 5000-deep lineage traces without exhausting the recursion limit."""
    headers = [
        SessionHeader(id=f"s{i}", created_at=i, parent_session=f"s{i - 1}" if i else None)
        for i in range(5000)
    ]
    _, query = with_fake(FakePersistence(headers))
    down = await query.trace_session("s0")
    depth, nodes = 0, down.descendants
    while nodes:
        depth += 1
        nodes = nodes[0].descendants
    assert depth == 4999
    up = await query.trace_session("s4999")
    assert len(up.ancestors) == 4999 and up.root is not None and up.root.id == "s0"


async def test_persistence_failure_is_reported_with_its_cause() -> None:
    """host-core §6: backend failures are SESSION_QUERY_PERSISTENCE_FAILED, cause chained."""
    fake = FakePersistence()
    fake.error = OSError("disk gone")
    ctx, query = with_fake(fake)
    ctx.sessions.create("live")
    for call in (query.trace_session("live"), query.list_sessions(), query.read_session("x")):
        with pytest.raises(SessionQueryError) as info:
            await call
        assert info.value.code == "SESSION_QUERY_PERSISTENCE_FAILED"
        assert isinstance(info.value.__cause__, OSError)


async def test_cancellation_is_session_query_aborted() -> None:
    """host-core §6: cancellation, before or inside the backend, is SESSION_QUERY_ABORTED."""
    _, query = await family()
    controller = AbortController()
    controller.abort("enough")
    for call in (
        query.trace_session("root", controller.signal),
        query.list_sessions(controller.signal),
        query.read_session("root", controller.signal),
    ):
        with pytest.raises(SessionQueryError) as info:
            await call
        assert info.value.code == "SESSION_QUERY_ABORTED"
    fake = FakePersistence()
    fake.error = AbortedError("mid-way")
    _, faked = with_fake(fake)
    with pytest.raises(SessionQueryError) as info:
        await faked.trace_session("x")
    assert info.value.code == "SESSION_QUERY_ABORTED"
    assert isinstance(info.value.__cause__, AbortedError)


# -- reads ----------------------------------------------------------------------------------------


async def test_read_live_session_is_its_snapshot() -> None:
    """host-core §6: read_session of a live session returns its header and event snapshot."""
    ctx = make_ctx()
    query = install_session_query(ctx)
    session = ctx.sessions.create("s")
    session.append("turn/start", TurnStartData(turn=1))  # an open live turn is fine
    header, events = await query.read_session("s")
    assert header is session.header and events == session.events


async def test_read_persisted_session_is_inspected_not_repaired(tmp_path: Path) -> None:
    """host-core §6: a stored log is read via inspect: closers in memory only, nothing written."""
    ctx = make_ctx()
    persistence = install_memory_persistence(ctx)
    query = install_session_query(ctx)
    log = LogBuilder()
    log.turn_start()
    log.step_start()
    await persistence.create(SessionHeader(id="s", created_at=1, seed_length=0))
    await persistence.append("s", log.events)
    header, events = await query.read_session("s")
    assert header.seed_length == 0
    assert [e.type for e in events] == ["turn/start", "step/start", "step/end", "turn/end"]
    _, again = await query.read_session("s")
    assert [e.type for e in again] == [e.type for e in events]  # nothing was committed
    await ctx.dispose()


async def test_read_unknown_session_is_not_found() -> None:
    """host-core §6: reading an unknown id is SESSION_QUERY_SESSION_NOT_FOUND."""
    ctx = make_ctx()
    bare = install_session_query(ctx)
    with pytest.raises(SessionQueryError) as info:
        await bare.read_session("nope")
    assert info.value.code == "SESSION_QUERY_SESSION_NOT_FOUND"
    _, query = await family()
    with pytest.raises(SessionQueryError) as info:
        await query.read_session("nope")
    assert info.value.code == "SESSION_QUERY_SESSION_NOT_FOUND"


async def test_read_refuses_a_log_that_does_not_replay() -> None:
    """host-core §6: read_session replay-validates; a broken log is SESSION_QUERY_INVALID_LOG."""
    log = LogBuilder()
    log.turn_start()
    bad = (*log.events, SessionEvent(type="turn/start", seq=1, time=1, data=TurnStartData(turn=7)))
    fake = FakePersistence()
    fake.log = (SessionHeader(id="s", created_at=1), bad)
    _, query = with_fake(fake)
    with pytest.raises(SessionQueryError) as info:
        await query.read_session("s")
    assert info.value.code == "SESSION_QUERY_INVALID_LOG"


async def test_install_session_query_provides_the_service() -> None:
    """host-core §6: install_session_query constructs, installs and provides session_query."""
    ctx = make_ctx()
    query = install_session_query(ctx)
    assert ctx.session_query is query
    with pytest.raises(SessionQueryError):
        await SessionQuery().list_sessions()
