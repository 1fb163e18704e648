"""Session query scans and loop-tolerant traces, and the store's ``scan`` and stamps
(host-core §6; issue seam-listing 14.2/14.3)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings

from dsh_core import (
    AbortController,
    Context,
    EventTypeRegistry,
    Host,
    SessionError,
    SessionHeader,
    SessionQueryError,
    SessionScan,
    SessionStoreService,
    StoredScan,
)
from dsh_core._persistence import (
    JsonlSessionPersistence,
    MemorySessionPersistence,
    SessionPersistence,
)
from dsh_core._query import SessionQuery, install_session_query
from dsh_core.testing.strategies import PLUGIN_EVENT_TYPE, LogBuilder, session_logs

NOTE = "test/note"
KEPT = frozenset({NOTE})


def host(persistence: SessionPersistence | None) -> tuple[Context, SessionQuery]:
    h = Host("scan")
    ctx = Context(h, h.root)
    ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
    if persistence is not None:
        persistence.install(ctx)
        ctx.provide("session_persistence", persistence)
    return ctx, install_session_query(ctx)


def notes(*texts: str, start: int = 0) -> list[Any]:
    """Ignorable ``test/note`` events from seq ``start`` on."""
    log = LogBuilder()
    for text in texts:
        log.add(NOTE, {"text": text}, ignorable=True)
    return [attrs.evolve(e, seq=start + e.seq) for e in log.events]


async def store(p: SessionPersistence, id: str, at: int, *texts: str, parent: str | None = None):
    await p.create(SessionHeader(id=id, created_at=at, parent_session=parent))
    await p.append(id, notes(*texts))


class Counting(MemorySessionPersistence):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def _scan(self, id: str, types: frozenset[str]) -> StoredScan:
        self.reads.append(id)
        return super()._scan(id, types)


def texts(found: SessionScan | SessionQueryError) -> list[str]:
    assert isinstance(found, SessionScan)
    return [e.data["text"] for e in found.events]


# -- scan_sessions ------------------------------------------------------------------------------


async def test_scan_reads_live_from_memory_and_stored_once() -> None:
    """host-core §6, seam-listing 14.3: a live session is scanned from memory (no store read),
    a stored one from the store; only events of the asked types come back, oldest first."""
    p = Counting()
    ctx, query = host(p)
    await store(p, "cold", 1, "a", "b")
    ctx.sessions.create("hot").append(NOTE, {"text": "c"}, ignorable=True)
    trace = await query.listing()
    records = {r.id: r for r in trace.records}
    found = await query.scan_sessions([records["cold"], records["hot"]], KEPT)
    assert [texts(f) for f in found] == [["a", "b"], ["c"]]
    assert p.reads == ["cold"]
    await ctx.dispose()


async def test_an_unchanged_log_is_not_read_again_a_changed_one_is() -> None:
    """host-core §6, seam-listing 14.3: a scan remembered under the store's stamp answers
    while the stamp is unchanged; an append changes it and the log is read again."""
    p = Counting()
    ctx, query = host(p)
    await store(p, "s", 1, "a")
    record = (await query.listing()).records[0]
    assert texts((await query.scan_sessions([record], KEPT))[0]) == ["a"]
    record = (await query.listing()).records[0]
    assert texts((await query.scan_sessions([record], KEPT))[0]) == ["a"]
    assert p.reads == ["s"]
    await p.append("s", notes("b", start=1))
    record = (await query.listing()).records[0]
    assert texts((await query.scan_sessions([record], KEPT))[0]) == ["a", "b"]
    assert p.reads == ["s", "s"]
    await ctx.dispose()


async def test_scan_errors_are_per_session() -> None:
    """host-core §6, seam-listing 14.1: one failed read is that session's error (its store
    error chained), the others are scanned; a vanished session is not found."""

    class Failing(MemorySessionPersistence):
        def _scan(self, id: str, types: frozenset[str]) -> StoredScan:
            if id == "bad":
                raise SessionError("broken", code="SESSION_CORRUPT")
            if id == "gone":
                raise SessionError("gone", code="SESSION_NOT_FOUND")
            return super()._scan(id, types)

    p = Failing()
    ctx, query = host(p)
    for i, id in enumerate(("bad", "gone", "good")):
        await store(p, id, i, "x")
    records = (await query.listing()).records
    found = {
        r.id: f for r, f in zip(records, await query.scan_sessions(records, KEPT), strict=True)
    }
    bad, gone = found["bad"], found["gone"]
    assert isinstance(bad, SessionQueryError) and isinstance(gone, SessionQueryError)
    assert bad.code == "SESSION_QUERY_PERSISTENCE_FAILED"
    assert getattr(bad.__cause__, "code", None) == "SESSION_CORRUPT"
    assert gone.code == "SESSION_QUERY_SESSION_NOT_FOUND"
    assert texts(found["good"]) == ["x"]
    await ctx.dispose()


async def test_scan_without_persistence_and_after_an_abort() -> None:
    """host-core §6: without persistence a session that is no longer live is not found; an
    aborted signal fails the scan with SESSION_QUERY_ABORTED."""
    ctx, query = host(None)
    ctx.sessions.create("s")
    record = (await query.listing()).records[0]
    await ctx.dispose()
    ctx, query = host(None)
    found = await query.scan_sessions([record], KEPT)
    assert isinstance(found[0], SessionQueryError)
    assert found[0].code == "SESSION_QUERY_SESSION_NOT_FOUND"
    controller = AbortController()
    controller.abort("stop")
    with pytest.raises(SessionQueryError) as caught:
        await query.scan_sessions([record], KEPT, controller.signal)
    assert caught.value.code == "SESSION_QUERY_ABORTED"


# -- the JSONL store's scan -----------------------------------------------------------------------


def jsonl(root: Path) -> tuple[Context, JsonlSessionPersistence]:
    p = JsonlSessionPersistence(root)
    ctx, _ = host(p)
    return ctx, p


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(session_logs(max_turns=3))
async def test_jsonl_scan_keeps_what_a_full_read_keeps(tmp_path: Path, events: Any) -> None:
    """host-core §6, seam-listing 14.3: on any valid log, the JSONL scan (kept events decoded,
    the rest only checked) returns what the full read returns for the kept types."""
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    ctx, p = jsonl(root)
    await p.create(SessionHeader(id="s", created_at=1))
    await p.append("s", list(events))
    kept = frozenset({PLUGIN_EVENT_TYPE, "user/message", "tool/result"})
    (found,) = await p.scan(["s"], kept)
    header, full = await p.inspect("s")
    assert isinstance(found, StoredScan)
    assert found.header == header
    assert found.events == tuple(e for e in full if e.type in kept)
    await ctx.dispose()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file semantics (a symlink)")
async def test_jsonl_scan_gives_the_verdict_of_a_load(tmp_path: Path) -> None:
    """host-core §6 (hardening 11.3): a scanned log that is not what the store writes fails as
    its load would: a bad middle line SESSION_CORRUPT, an unknown required event type
    SESSION_FORMAT_UNSUPPORTED, a symlink SESSION_FILE_UNSAFE, a missing file
    SESSION_NOT_FOUND; a torn last line is dropped as a load drops it."""
    ctx, p = jsonl(tmp_path)
    for id in ("bad", "future", "torn"):
        await store(p, id, 1, "a", "b")
    bad = tmp_path / "bad.jsonl"
    lines = bad.read_bytes().split(b"\n")
    lines[1] = b"{not json"
    bad.write_bytes(b"\n".join(lines))
    future = tmp_path / "future.jsonl"
    future.write_bytes(future.read_bytes() + b'{"type":"x/new","seq":2,"time":9,"data":{}}\n')
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(torn.read_bytes() + b'{"type":"test/no')
    os.symlink(torn, tmp_path / "link.jsonl")
    found = await p.scan(["bad", "future", "torn", "link", "missing"], KEPT)
    codes = [f.code if isinstance(f, SessionError) else None for f in found]
    assert codes == [
        "SESSION_CORRUPT",
        "SESSION_FORMAT_UNSUPPORTED",
        None,
        "SESSION_FILE_UNSAFE",
        "SESSION_NOT_FOUND",
    ]
    assert [e.data["text"] for e in found[2].events] == ["a", "b"]  # type: ignore[union-attr]
    await ctx.dispose()


async def test_stamps_change_with_every_write() -> None:
    """host-core §6, seam-listing 14.3: a listing's stamp for a log equals the stamp of a scan
    of that same log, and differs once the log grew (both backends)."""
    with tempfile.TemporaryDirectory() as tmp:
        for p in (MemorySessionPersistence(), JsonlSessionPersistence(Path(tmp))):
            ctx, _ = host(p)
            await store(p, "s", 1, "a")
            before = (await p.listing()).stamps["s"]
            (found,) = await p.scan(["s"], KEPT)
            assert isinstance(found, StoredScan) and found.stamp == before
            await p.append("s", notes("b", start=1))
            assert (await p.listing()).stamps["s"] != before
            await ctx.dispose()


# -- loop-tolerant traces -------------------------------------------------------------------------


async def test_trace_contains_an_ancestry_loop_when_asked() -> None:
    """host-core §6, LIST-6: by default a looping ancestry fails the trace
    (SESSION_QUERY_INVALID_LINEAGE); with contain_loops the ancestors stop before the loop,
    which looped_parent_id names, and the target is never its own descendant."""
    p = MemorySessionPersistence()
    ctx, query = host(p)
    await store(p, "root", 1, parent="a")
    await store(p, "a", 2, parent="root")
    await store(p, "b", 3, parent="a")
    with pytest.raises(SessionQueryError) as caught:
        await query.trace_session("root")
    assert caught.value.code == "SESSION_QUERY_INVALID_LINEAGE"
    trace = await query.trace_session("root", contain_loops=True)
    assert [r.id for r in trace.ancestors] == ["a"]
    assert (trace.looped_parent_id, trace.complete, trace.root) == ("root", False, None)
    (a,) = trace.descendants
    assert a.session.id == "a"
    assert [n.session.id for n in a.descendants] == ["b"]
    await ctx.dispose()


async def test_an_unchanged_corpus_is_reused_a_changed_one_is_not() -> None:
    """host-core §6: a trace over the very same stored headers, stamps and live sessions reuses
    the tree it built; a new stored session, a new live one or a write is seen at once."""
    p = MemorySessionPersistence()
    ctx, query = host(p)
    await store(p, "root", 1)
    await store(p, "a", 2, "x", parent="root")
    first = await query.trace_session("root")
    assert (await query.trace_session("root")).descendants is first.descendants
    await store(p, "b", 3, parent="root")
    assert [n.session.id for n in (await query.trace_session("root")).descendants] == ["a", "b"]
    await p.append("a", notes("y", start=1))
    trace = await query.trace_session("root")
    stamp = trace.descendants[0].session.stamp
    assert stamp is not None and stamp != first.descendants[0].session.stamp
    await ctx.dispose()
    ctx, query = host(None)
    owner = ctx.plugin("owner")
    owner.sessions.create("c")
    assert [r.id for r in (await query.listing()).records] == ["c"]
    await owner.dispose()
    ctx.sessions.create("d")  # as many live sessions as before, another one
    assert [r.id for r in (await query.listing()).records] == ["d"]
    await ctx.dispose()


async def test_a_backend_without_scan_is_read_through_inspect() -> None:
    """host-core §6: a persistence without ``scan`` (list and inspect only) is scanned through
    ``inspect``, one session at a time per run; a failed inspect is that session's error."""

    class Plain:
        def __init__(self) -> None:
            self.headers = [
                SessionHeader(id="a", created_at=1),
                SessionHeader(id="b", created_at=2),
            ]

        async def list(self, signal: Any = None) -> list[SessionHeader]:
            return list(self.headers)

        async def inspect(self, id: str, signal: Any = None) -> Any:
            if id == "b":
                raise SessionError("unreadable", code="SESSION_IO")
            return self.headers[0], tuple(notes("x"))

    h = Host("plain")
    ctx = Context(h, h.root)
    ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
    ctx.provide("session_persistence", Plain())
    query = install_session_query(ctx)
    records = (await query.listing()).records
    found = dict(
        zip([r.id for r in records], await query.scan_sessions(records, KEPT), strict=True)
    )
    assert texts(found["a"]) == ["x"]
    assert isinstance(found["b"], SessionQueryError)
    assert getattr(found["b"].__cause__, "code", None) == "SESSION_IO"
    await ctx.dispose()


async def test_jsonl_scan_refuses_a_line_nested_too_deeply(tmp_path: Path) -> None:
    """host-core §6 (hardening 11.3): a skipped line nested deeper than the log allows fails
    the scan as it fails a load (its code), whether the file holds few brackets or many."""
    from dsh_core._json import MAX_NESTING

    ctx, p = jsonl(tmp_path)
    deep = b"[" * (MAX_NESTING + 1) + b"]" * (MAX_NESTING + 1)
    for id, padding in (("deep", b""), ("busy", b"[[[[]]]]," * (MAX_NESTING + 1))):
        await store(p, id, 1, "a")
        path = tmp_path / f"{id}.jsonl"
        line = b'{"type":"test/note","seq":1,"time":9,"data":{"x":[%s%s]}}\n' % (padding, deep)
        path.write_bytes(path.read_bytes() + line)
    found = await p.scan(["deep", "busy"], KEPT)
    for id, result in zip(["deep", "busy"], found, strict=True):
        with pytest.raises(SessionError) as loaded:
            await p.load(id)
        assert isinstance(result, SessionError) and result.code == loaded.value.code
    await ctx.dispose()
