"""Session persistence: tracking, durability, crash repair, torn lines, locks (host-core §5)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import json
import logging
import os
import stat
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from dsh_core import (
    AbortController,
    AbortedError,
    Context,
    EventTypeRegistry,
    Host,
    Session,
    SessionError,
    SessionEvent,
    SessionHeader,
    SessionLogChecker,
    SessionStoreService,
    StepData,
    TurnEndData,
    TurnEndReason,
    TurnStartData,
    check_balanced,
    dumps,
    encode_header,
)
from dsh_core._persistence import (
    JsonlSessionPersistence,
    MemorySessionPersistence,
    SessionPersistence,
    default_sessions_dir,
    install_jsonl_persistence,
    install_memory_persistence,
    repair_closers,
)
from dsh_core.testing.strategies import LogBuilder

BACKENDS = ["memory", "jsonl"]


class Env:
    """A host with the sessions store and one persistence backend; ``owner`` owns sessions."""

    def __init__(self, kind: str, root: Path, sync: Any = "batch") -> None:
        self.kind = kind
        self.root = root
        self.host = Host()
        self.ctx = Context(self.host, self.host.root)
        self.ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
        self.persistence: SessionPersistence = (
            install_memory_persistence(self.ctx)
            if kind == "memory"
            else install_jsonl_persistence(self.ctx, root, sync=sync)
        )
        self.owner = self.ctx.plugin("owner")

    async def close(self) -> None:
        await self.ctx.dispose()
        await self.host.drain_tasks()

    async def store(self, id: str, events: tuple[SessionEvent, ...], **header: Any) -> None:
        """Store a cold log through the public API."""
        await self.persistence.create(SessionHeader(id=id, created_at=1_000, **header))
        await self.persistence.append(id, events)

    def file(self, id: str) -> Path:
        return self.root / f"{id}.jsonl"


@pytest.fixture(params=BACKENDS)
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    """Each backend in turn (JSONL under a temporary root)."""
    return Env(request.param, tmp_path / "sessions")


@pytest.fixture
def jsonl(tmp_path: Path) -> Env:
    """The JSONL backend under a temporary root."""
    return Env("jsonl", tmp_path / "sessions")


@pytest.fixture
def jsonl_detach(tmp_path: Path) -> Env:
    """The JSONL backend with ``sync = "detach"``: no checkpoints, every flush writes in a
    worker thread (with write-through a tracked session's lines are written on the loop)."""
    return Env("jsonl", tmp_path / "sessions", sync="detach")


def balanced() -> tuple[SessionEvent, ...]:
    log = LogBuilder()
    log.turn_start()
    log.step_start()
    log.user("question")
    log.assistant("answer")
    log.step_end()
    log.turn_end()
    return log.events


def open_turn_with_calls() -> LogBuilder:
    """Turn 2 is open: its step announced c1, c2, c3; c1 finished, c2 was called, c3 never ran."""
    log = LogBuilder()
    log.turn_start()
    log.turn_end()
    log.turn_start()
    log.step_start()
    log.assistant("working", calls=[("c1", "read"), ("c2", "write"), ("c3", "grep")])
    log.tool_call("c1", "read")
    log.tool_result("c1")
    log.tool_call("c2", "write")
    return log


def types_of(events: tuple[SessionEvent, ...] | list[SessionEvent]) -> list[str]:
    return [e.type for e in events]


def append_turn(session: Session, turn: int) -> None:
    session.append("turn/start", TurnStartData(turn=turn))
    session.append("step/start", StepData(turn=turn, step=1))
    session.append("step/end", StepData(turn=turn, step=1))


# -- tracking live sessions -----------------------------------------------------------------------


async def test_new_session_is_stored_with_header_and_events_so_far(env: Env) -> None:
    """host-core §5: a new session's header and events before session/created are stored."""
    session = env.ctx.sessions.prepare("s")
    detach = env.ctx.sessions.enter(session)
    session.append("turn/start", TurnStartData(turn=1))  # before announce
    env.ctx.sessions.announce(session)
    session.append("turn/end", _turn_end(1))
    assert await env.ctx.sessions.flush(session) is True
    header, events = await env.persistence.inspect("s")
    assert header == session.header
    assert events == session.events
    detach()
    await env.close()


def _turn_end(turn: int) -> TurnEndData:
    return TurnEndData(turn=turn, reason=TurnEndReason(kind="completed"))


async def test_events_are_stored_by_the_next_flush(env: Env) -> None:
    """host-core §5: appends are not stored one by one; session/flush makes them durable."""
    session = env.owner.sessions.create("s")
    append_turn(session, 1)
    _, before = await env.persistence.inspect("s")
    assert types_of(before) == []  # the header is stored, the events are not yet
    await env.owner.sessions.flush(session)
    _, after = await env.persistence.inspect("s")
    assert after[:3] == session.events
    await env.close()


async def test_disposal_drains_and_releases(env: Env) -> None:
    """host-core §5: session/disposed stores what is left and releases the session."""
    session = env.owner.sessions.create("s")
    append_turn(session, 1)
    events = session.events
    await env.owner.dispose()
    header, stored = await env.persistence.load("s")  # waits for the last drain
    # The open turn of a disposed (now cold) session is closed by repair on load.
    assert stored[: len(events)] == events
    assert types_of(stored[len(events) :]) == ["turn/end"]
    assert header.id == "s"
    prepared = await env.persistence.prepare("s")
    prepared.dispose()
    await env.close()


async def test_backend_takes_events_from_the_session_not_from_session_event(env: Env) -> None:
    """host-core §5: tracking costs appends nothing; a flush takes what the session holds."""
    session = env.owner.sessions.create("s")
    assert not env.ctx.has_listeners("session/event")
    append_turn(session, 1)
    await env.owner.sessions.flush(session)
    session.append("turn/end", _turn_end(1))
    await env.owner.sessions.flush(session)
    _, stored = await env.persistence.inspect("s")
    assert stored == session.events
    await env.close()


async def test_events_appended_after_disposal_are_not_stored(env: Env) -> None:
    """host-core §5: tracking ends at session/disposed; later appends stay in memory only."""
    session = env.owner.sessions.create("s")
    append_turn(session, 1)
    events = session.events

    def late(disposed: Session) -> None:  # runs after the backend's own listener
        disposed.append("x/late", {"n": 1}, ignorable=True)

    env.ctx.on("session/disposed", late, global_=True)
    await env.owner.dispose()
    assert session.events[-1].type == "x/late"
    _, stored = await env.persistence.load("s")
    assert stored[: len(events)] == events
    assert types_of(stored[len(events) :]) == ["turn/end"]  # the repair closer, nothing else
    await env.close()


class GatedWrites:
    """Holds every storage write of ``persistence`` until ``gate`` opens; ``started`` fires as
    a write begins and ``writes`` counts the events of each."""

    def __init__(self, persistence: Any) -> None:
        self.gate = threading.Event()
        self.started = asyncio.Event()
        self.writes: list[int] = []
        real_write = persistence._write
        loop = asyncio.get_running_loop()

        def slow_write(handle: Any, events: Any, sync: bool = True) -> None:
            self.writes.append(len(events))
            loop.call_soon_threadsafe(self.started.set)
            assert self.gate.wait(30), "the test never opened the gate"
            real_write(handle, events, sync)

        persistence._write = slow_write
        persistence._inline_close_limit = -1  # every close writes in a worker thread


async def test_cancelled_flush_still_counts_its_write(jsonl_detach: Env) -> None:
    """host-core §5: a write outlives its cancelled flush and is never repeated by the next."""
    session = jsonl_detach.owner.sessions.create("s")
    persistence = jsonl_detach.persistence
    held = GatedWrites(persistence)
    append_turn(session, 1)
    flush = asyncio.ensure_future(jsonl_detach.owner.sessions.flush(session))
    await asyncio.wait_for(held.started.wait(), 30)
    flush.cancel()
    held.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await flush
    session.append("turn/end", _turn_end(1))
    await jsonl_detach.owner.sessions.flush(session)
    assert held.writes == [3, 1]
    _, stored = await persistence.inspect("s")
    assert stored == session.events
    await jsonl_detach.close()


async def test_cancelled_close_releases_the_file_only_after_its_write(jsonl: Env) -> None:
    """host-core §5: a disposed session's last write completes before its file is let go."""
    session = jsonl.owner.sessions.create("s")
    persistence = jsonl.persistence
    held = GatedWrites(persistence)
    append_turn(session, 1)
    events = session.events
    await jsonl.owner.dispose()
    await asyncio.wait_for(held.started.wait(), 30)
    closing = persistence._closing["s"]
    closing.cancel()
    held.gate.set()
    await asyncio.wait((closing,))
    assert closing.cancelled()
    _, stored = await persistence.load("s")  # released (not SESSION_LOCKED), write complete
    assert stored[: len(events)] == events
    await jsonl.close()


async def test_a_full_default_executor_does_not_hold_up_a_flush(jsonl: Env) -> None:
    """host-core §5: file work runs on the backend's own threads, so blocking work that fills
    the loop's default executor (tools in ``asyncio.to_thread``) never delays durability."""
    loop = asyncio.get_running_loop()
    busy = concurrent.futures.ThreadPoolExecutor(1)
    loop.set_default_executor(busy)
    release = threading.Event()
    blocked = loop.run_in_executor(None, release.wait, 30)
    try:
        session = jsonl.owner.sessions.create("s")
        append_turn(session, 1)
        session.append("turn/end", _turn_end(1))
        assert await asyncio.wait_for(jsonl.owner.sessions.flush(session), 30)
        _, stored = await asyncio.wait_for(jsonl.persistence.inspect("s"), 30)
        assert stored == session.events
        assert not blocked.done()
    finally:
        release.set()
        await blocked
    await jsonl.close()


async def test_a_write_that_cannot_start_leaves_nothing_pending(jsonl: Env) -> None:
    """host-core §5: when no worker can take a write (interpreter exit, say) the flush fails,
    and the next flush writes the same events instead of waiting for a phantom write."""
    session = jsonl.owner.sessions.create("s")
    persistence = jsonl.persistence
    append_turn(session, 1)
    session.append("turn/end", _turn_end(1))
    real_submit = persistence._submit

    def refuse(fn: Any, *args: Any) -> Any:
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    persistence._submit = refuse  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="cannot schedule"):
        await jsonl.owner.sessions.flush(session)
    persistence._submit = real_submit  # type: ignore[method-assign]
    assert await asyncio.wait_for(jsonl.owner.sessions.flush(session), 30)
    _, stored = await persistence.inspect("s")
    assert stored == session.events
    await asyncio.wait_for(jsonl.close(), 30)


async def test_memory_backend_keeps_event_objects(tmp_path: Path) -> None:
    """host-core §5: the memory backend stores the SessionEvent objects themselves."""
    env = Env("memory", tmp_path)
    session = env.owner.sessions.create("s")
    append_turn(session, 1)
    session.append("turn/end", _turn_end(1))
    await env.owner.sessions.flush(session)
    _, stored = await env.persistence.inspect("s")
    assert all(a is b for a, b in zip(stored, session.events, strict=True))
    await env.close()


async def test_flush_without_persistence_listener_reports_false() -> None:
    """host-core §3/§5: without a backend, flush reports that nobody took part."""
    host = Host()
    ctx = Context(host, host.root)
    ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
    assert await ctx.sessions.flush(ctx.sessions.create("s")) is False


async def test_sessions_before_install_are_not_tracked(tmp_path: Path) -> None:
    """host-core §5: only sessions announced after install are tracked."""
    host = Host()
    ctx = Context(host, host.root)
    ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
    early = ctx.sessions.create("early")
    persistence = install_memory_persistence(ctx)
    assert await ctx.sessions.flush(early) is True  # the listener took part, nothing to do
    assert await persistence.list() == []
    await ctx.dispose()


async def test_install_twice_fails(tmp_path: Path) -> None:
    """host-core §5: one backend instance is installed in one host only."""
    env = Env("memory", tmp_path)
    with pytest.raises(SessionError) as info:
        env.persistence.install(env.ctx)
    assert info.value.code == "PERSISTENCE_INSTALLED"
    await env.close()


async def test_host_disposal_drains_every_tracked_session(jsonl: Env) -> None:
    """host-core §5: disposing the installing context drains and releases all sessions."""
    session = jsonl.owner.sessions.create("s")
    append_turn(session, 1)
    session.append("turn/end", _turn_end(1))
    events = session.events
    await jsonl.close()
    other = Env("jsonl", jsonl.root)
    _, stored = await other.persistence.load("s")
    assert stored == events
    await other.close()


async def test_vetoed_new_session_leaves_nothing_stored(env: Env) -> None:
    """host-core §3/§5: a session vetoed by a later session/created listener is not kept."""

    def veto(_: Session) -> None:
        raise PermissionError("no")

    remove = env.ctx.on("session/created", veto, global_=True)
    with pytest.raises(PermissionError):
        env.owner.sessions.create("s")
    remove()
    assert await env.persistence.list() == []
    if env.kind == "jsonl":
        assert not env.file("s").exists()
    session = env.owner.sessions.create("s")  # the id is free
    await env.owner.sessions.flush(session)
    assert [h.id for h in await env.persistence.list()] == ["s"]
    await env.close()


async def test_new_session_with_a_stored_id_is_vetoed(env: Env) -> None:
    """host-core §5: a new live session cannot take the id of a stored one (SESSION_EXISTS)."""
    await env.store("s", balanced())
    disposed: list[Session] = []
    env.ctx.on("session/disposed", disposed.append, global_=True)
    with pytest.raises(SessionError) as info:
        env.owner.sessions.create("s")
    assert info.value.code == "SESSION_EXISTS"
    assert env.ctx.sessions.get("s") is None and len(disposed) == 1
    _, stored = await env.persistence.load("s")
    assert stored == balanced()
    await env.close()


# -- restoring ------------------------------------------------------------------------------------


async def test_prepare_restores_an_unpublished_session(env: Env) -> None:
    """host-core §5: prepare restores an unpublished Session from the stored log, plus end-seed."""
    await env.store("s", balanced(), parent_session="p", seed_length=2)
    prepared = await env.persistence.prepare("s")
    session = prepared.session
    assert not session.published and env.ctx.sessions.get("s") is None
    assert session.header.parent_session == "p" and session.header.seed_length == 2
    assert session.events[: len(balanced())] == balanced()
    assert types_of(session.events[len(balanced()) :]) == ["session/end-seed"]
    prepared.dispose()
    await env.close()


async def test_restored_session_writes_only_events_beyond_the_stored_log(env: Env) -> None:
    """host-core §5: a restored session writes only events beyond the stored count."""
    await env.store("s", balanced())
    prepared = await env.persistence.prepare("s")
    session = prepared.session
    detach = env.owner.sessions.enter(session)
    env.owner.sessions.announce(session)
    prepared.dispose()  # announced: the hold now belongs to tracking, dispose is a no-op
    append_turn(session, 2)
    session.append("turn/end", _turn_end(2))
    await env.owner.sessions.flush(session)
    detach()
    _, stored = await env.persistence.load("s")
    assert stored == session.events
    assert [e.seq for e in stored] == list(range(len(stored)))
    await env.close()


async def test_preparation_dispose_releases_and_is_idempotent(env: Env) -> None:
    """host-core §5: disposing an unannounced preparation releases the hold; twice is fine."""
    await env.store("s", balanced())
    prepared = await env.persistence.prepare("s")
    with pytest.raises(SessionError) as info:
        await env.persistence.prepare("s")
    assert info.value.code == "SESSION_LOCKED"
    with pytest.raises(SessionError) as info:
        await env.persistence.load("s")
    assert info.value.code == "SESSION_LOCKED"
    prepared.dispose()
    prepared.dispose()
    again = await env.persistence.prepare("s")
    again.dispose()
    await env.close()


async def test_prepare_commits_repair_and_load_returns_it(env: Env) -> None:
    """host-core §5: prepare writes the repair closers; the stored log is balanced after."""
    log = open_turn_with_calls()
    await env.store("s", log.events)
    prepared = await env.persistence.prepare("s")
    repaired = prepared.session.events[:-1]  # minus the end-seed
    prepared.dispose()
    check_balanced(repaired)
    _, stored = await env.persistence.load("s")
    assert stored == repaired
    await env.close()


async def test_prepare_check_sees_the_log_before_repair_is_written(env: Env) -> None:
    """host-core §5, issue 13: prepare's check sees the header and the events as inspect gives
    them (closers in memory) before anything is written; a passing check then commits the
    repair and the session holds that very read."""
    log = open_turn_with_calls()
    await env.store("s", log.events, parent_session="p")
    _, inspected = await env.persistence.inspect("s")
    seen: list[tuple[str | None, tuple[SessionEvent, ...]]] = []
    prepared = await env.persistence.prepare(
        "s", check=lambda header, events: seen.append((header.parent_session, tuple(events)))
    )
    assert [(parent, untimed(events)) for parent, events in seen] == [("p", untimed(inspected))]
    assert prepared.session.events[:-1] == seen[0][1]  # that very read, closers and all
    prepared.dispose()
    _, stored = await env.persistence.load("s")
    assert stored == seen[0][1]
    await env.close()


def untimed(events: Sequence[SessionEvent]) -> list[SessionEvent]:
    """The events with their time left out (closers are stamped when they are made)."""
    return [attrs.evolve(e, time=0) for e in events]


async def test_prepare_refused_by_its_check_writes_nothing_and_lets_go(env: Env) -> None:
    """host-core §5, issue 13: what prepare's check raises fails the prepare as it is; the
    open log keeps no repair and is not held (a second prepare succeeds)."""
    log = open_turn_with_calls()
    await env.store("s", log.events)
    before = env.file("s").read_bytes() if env.kind == "jsonl" else None

    def refuse(header: SessionHeader, events: Sequence[SessionEvent]) -> None:
        raise LookupError("not yours")

    with pytest.raises(LookupError, match="not yours"):
        await env.persistence.prepare("s", check=refuse)
    if before is not None:
        assert env.file("s").read_bytes() == before
    else:
        assert isinstance(env.persistence, MemorySessionPersistence)
        assert tuple(env.persistence._logs["s"].events) == log.events
    assert env.ctx.sessions.get("s") is None
    again = await env.persistence.prepare("s")
    again.dispose()
    await env.close()


async def test_load_refuses_a_live_session(env: Env) -> None:
    """host-core §5: load and prepare refuse a live session (SESSION_LIVE); inspect does not."""
    session = env.owner.sessions.create("s")
    session.append("turn/start", TurnStartData(turn=1))
    await env.owner.sessions.flush(session)
    for call in (env.persistence.load("s"), env.persistence.prepare("s")):
        with pytest.raises(SessionError) as info:
            await call
        assert info.value.code == "SESSION_LIVE"
    _, inspected = await env.persistence.inspect("s")  # allowed; repairs in memory only
    assert types_of(inspected) == ["turn/start", "turn/end"]
    assert session.seq == 1
    await env.close()


async def test_unknown_id_is_not_found(env: Env) -> None:
    """host-core §5: an id with no stored log fails SESSION_NOT_FOUND everywhere."""
    calls = [
        env.persistence.load("nope"),
        env.persistence.inspect("nope"),
        env.persistence.prepare("nope"),
        env.persistence.append("nope", []),
    ]
    for call in calls:
        with pytest.raises(SessionError) as info:
            await call
        assert info.value.code == "SESSION_NOT_FOUND"
    await env.close()


async def test_aborted_signal_is_honoured(env: Env) -> None:
    """host-core §5: prepare, inspect and list raise AbortedError(reason) once aborted."""
    await env.store("s", balanced())
    controller = AbortController()
    controller.abort("stop")
    for call in (
        env.persistence.prepare("s", controller.signal),
        env.persistence.inspect("s", controller.signal),
        env.persistence.list(controller.signal),
    ):
        with pytest.raises(AbortedError) as info:
            await call
        assert info.value.reason == "stop"
    prepared = await env.persistence.prepare("s")  # nothing was left held
    prepared.dispose()
    await env.close()


async def test_stored_says_whether_an_id_is_taken(env: Env) -> None:
    """host-core §5, issue 13: stored(id) is False for an unknown id and True once a log is
    stored; an id no store can hold is SESSION_INVALID_ID, an aborted signal AbortedError."""
    assert await env.persistence.stored("s") is False
    await env.store("s", balanced())
    assert await env.persistence.stored("s") is True
    with pytest.raises(SessionError) as info:
        await env.persistence.stored("a/b")
    assert info.value.code == "SESSION_INVALID_ID"
    controller = AbortController()
    controller.abort("stop")
    with pytest.raises(AbortedError):
        await env.persistence.stored("s", controller.signal)
    await env.close()


async def test_jsonl_stored_reads_only_the_header(jsonl: Env, tmp_path: Path) -> None:
    """host-core §5, issue 13: the JSONL store answers stored(id) from the name and the header
    line: a log with corrupt events, a symlink or a folder takes the id; a file cut inside its
    header does not (it was never created)."""
    await jsonl.store("s", balanced())
    path = jsonl.file("s")
    path.write_bytes(path.read_bytes() + b"{not json\n{neither\n")
    assert await jsonl.persistence.stored("s") is True
    jsonl.file("cut").write_bytes(b'{"id":"cut","crea')
    assert await jsonl.persistence.stored("cut") is False
    jsonl.file("dir").mkdir()
    assert await jsonl.persistence.stored("dir") is True
    if sys.platform != "win32":
        (tmp_path / "elsewhere.jsonl").write_bytes(path.read_bytes())
        jsonl.file("link").symlink_to(tmp_path / "elsewhere.jsonl")
        assert await jsonl.persistence.stored("link") is True
    await jsonl.close()


# -- create / append ------------------------------------------------------------------------------


async def test_create_and_append_round_trip(env: Env) -> None:
    """host-core §5: create(header) then append(id, events) store a log load returns."""
    await env.store("s", balanced(), cwd="/srv/project", delegation_depth=2)
    header, events = await env.persistence.load("s")
    assert (header.cwd, header.delegation_depth) == ("/srv/project", 2)
    assert events == balanced()
    await env.persistence.append("s", ())
    more = LogBuilder()
    for e in balanced():
        more.add(e.type, e.data, source_event_seqs=e.source_event_seqs)
    more.turn += 1
    more.turn_start()
    more.turn_end()
    await env.persistence.append("s", more.events[len(balanced()) :])
    _, events = await env.persistence.load("s")
    assert types_of(events[-2:]) == ["turn/start", "turn/end"]
    await env.close()


async def test_create_refuses_an_existing_id(env: Env) -> None:
    """host-core §5: creating a stored id again fails SESSION_EXISTS."""
    await env.persistence.create(SessionHeader(id="s", created_at=1))
    with pytest.raises(SessionError) as info:
        await env.persistence.create(SessionHeader(id="s", created_at=2))
    assert info.value.code == "SESSION_EXISTS"
    await env.close()


async def test_create_refuses_unknown_version(env: Env) -> None:
    """host-core §5: a header of an unknown version is unsupported."""
    with pytest.raises(SessionError) as info:
        await env.persistence.create(SessionHeader(id="s", created_at=1, version=99))
    assert info.value.code == "SESSION_FORMAT_UNSUPPORTED"
    await env.close()


async def test_append_first_seq_must_be_the_stored_next_seq(env: Env) -> None:
    """host-core §5: append's first seq must equal the stored next seq, else a clear error."""
    await env.store("s", balanced())
    with pytest.raises(SessionError) as info:
        await env.persistence.append("s", balanced()[:1])
    assert info.value.code == "SESSION_SEQ_MISMATCH"
    assert f"seq {len(balanced())}" in str(info.value)
    await env.close()


async def test_append_refuses_events_that_break_the_log(env: Env) -> None:
    """host-core §5/§10: append refuses events that break the invariant or are not JSON."""
    await env.store("s", balanced())
    bad_turn = SessionEvent(
        type="turn/start", seq=len(balanced()), time=1, data=TurnStartData(turn=5)
    )
    not_json = SessionEvent(
        type="x/y", seq=len(balanced()), time=1, data={"v": float("nan")}, ignorable=True
    )
    for event in (bad_turn, not_json):
        with pytest.raises(SessionError) as info:
            await env.persistence.append("s", [event])
        assert info.value.code == "SESSION_APPEND_INVALID"
    _, stored = await env.persistence.load("s")
    assert stored == balanced()
    await env.close()


async def test_append_refuses_a_live_session(env: Env) -> None:
    """host-core §5: a live session is written through its own log only."""
    env.owner.sessions.create("s")
    with pytest.raises(SessionError) as info:
        await env.persistence.append("s", [])
    assert info.value.code == "SESSION_LIVE"
    await env.close()


# -- list ------------------------------------------------------------------------------------------


async def test_list_returns_headers_oldest_first(env: Env) -> None:
    """host-core §5: list returns every stored header, ordered by creation time then id."""
    await env.persistence.create(SessionHeader(id="b", created_at=2))
    await env.persistence.create(SessionHeader(id="a", created_at=2))
    await env.persistence.create(SessionHeader(id="c", created_at=1, parent_session="a"))
    live = env.owner.sessions.create("live")
    headers = await env.persistence.list()
    assert [h.id for h in headers] == ["c", "a", "b", "live"]
    assert headers[0].parent_session == "a" and live.header in headers
    await env.close()


async def test_list_reads_headers_only(jsonl: Env) -> None:
    """host-core §5: list never reads events (a corrupt event line does not disturb it)."""
    await jsonl.store("s", balanced())
    with jsonl.file("s").open("a") as f:
        f.write("not json at all\n{}\n")
    assert [h.id for h in await jsonl.persistence.list()] == ["s"]
    with pytest.raises(SessionError) as info:
        await jsonl.persistence.load("s")
    assert info.value.code == "SESSION_CORRUPT"
    await jsonl.close()


async def test_list_notices_files_that_change(jsonl: Env) -> None:
    """host-core §5: list reflects files added and removed since the last call."""
    await jsonl.persistence.create(SessionHeader(id="a", created_at=1))
    assert [h.id for h in await jsonl.persistence.list()] == ["a"]
    jsonl.file("a").unlink()
    await jsonl.persistence.create(SessionHeader(id="a", created_at=5, parent_session="z"))
    await jsonl.persistence.create(SessionHeader(id="b", created_at=6))
    headers = await jsonl.persistence.list()
    assert [(h.id, h.parent_session) for h in headers] == [("a", "z"), ("b", None)]
    await jsonl.close()


# -- crash repair ---------------------------------------------------------------------------------


async def test_inspect_closes_an_open_turn_in_memory_only(env: Env) -> None:
    """host-core §5: inspect adds the closers in memory; the stored log is unchanged."""
    log = open_turn_with_calls()
    await env.store("s", log.events)
    before = env.file("s").read_bytes() if env.kind == "jsonl" else None
    _, first = await env.persistence.inspect("s")
    _, second = await env.persistence.inspect("s")
    assert types_of(first) == types_of(second)
    assert len(first) == len(log.events) + 4
    if before is not None:
        assert env.file("s").read_bytes() == before
    await env.close()


async def test_repair_closes_never_truncates(env: Env) -> None:
    """host-core §5: repair closes an open turn (results, step/end, turn/end), never truncates."""
    log = open_turn_with_calls()
    await env.store("s", log.events)
    _, events = await env.persistence.load("s")
    n = len(log.events)
    assert events[:n] == log.events
    closers = events[n:]
    assert types_of(closers) == ["tool/result", "tool/result", "step/end", "turn/end"]
    unknown, not_started = closers[0], closers[1]
    call_seq = next(e.seq for e in log.events if e.type == "tool/call" and e.data.call_id == "c2")
    message_seq = next(e.seq for e in log.events if e.type == "assistant/message")
    assert unknown.data.error.code == "TOOL_OUTCOME_UNKNOWN"
    assert unknown.data.error.name == "write"
    assert unknown.source_event_seqs == (call_seq,)
    assert f"seq {call_seq}" in unknown.data.message.content[0].content[0].text
    assert not_started.data.error.code == "TOOL_NOT_STARTED"
    assert not_started.data.error.name == "grep"
    assert not_started.source_event_seqs == (message_seq,)
    for result in (unknown, not_started):
        block = result.data.message.content[0]
        assert block.is_error and result.data.message.role == "tool"
    assert (closers[2].data.turn, closers[2].data.step) == (2, 1)
    assert closers[3].data.turn == 2 and closers[3].data.reason.kind == "interrupted"
    assert [e.seq for e in events] == list(range(len(events)))
    check_balanced(events)
    _, again = await env.persistence.load("s")  # committed: nothing more to repair
    assert again == events
    await env.close()


@pytest.mark.parametrize(
    ("shape", "closers"),
    [
        ("turn", ["turn/end"]),
        ("step", ["step/end", "turn/end"]),
        ("answered", ["step/end", "turn/end"]),
        ("balanced", []),
    ],
)
def test_repair_closer_shapes(shape: str, closers: list[str]) -> None:
    """host-core §5: repair closes only what is open."""
    log = LogBuilder()
    log.turn_start()
    if shape != "turn":
        log.step_start()
    if shape == "answered":
        log.assistant(calls=[("c1", "t")])
        log.tool_call("c1", "t")
        log.tool_result("c1")
    if shape == "balanced":
        log.step_end()
        log.turn_end()
    repaired = repair_closers("s", log.events)
    assert types_of(repaired) == closers
    check_balanced(log.events + tuple(repaired))


def test_repair_rejects_an_invalid_log() -> None:
    """host-core §5: repair needs a log that satisfies the invariant (SESSION_CORRUPT)."""
    log = LogBuilder()
    log.turn_end()
    with pytest.raises(SessionError) as info:
        repair_closers("s", log.events)
    assert info.value.code == "SESSION_CORRUPT"


# -- JSONL format ---------------------------------------------------------------------------------


async def test_jsonl_layout_is_header_then_one_event_per_line(jsonl: Env) -> None:
    """host-core §5: <root>/<id>.jsonl holds the header line then one compact event per line."""
    session = jsonl.owner.sessions.create("s")
    append_turn(session, 1)
    await jsonl.owner.sessions.flush(session)
    lines = jsonl.file("s").read_text().splitlines()
    assert json.loads(lines[0]) == encode_header(session.header)
    types = jsonl.persistence.types
    assert [json.loads(x) for x in lines[1:]] == [types.encode(e) for e in session.events]
    assert lines[1] == dumps(types.encode(session.events[0]))
    await jsonl.close()


@pytest.mark.parametrize("bad", ["a/b", "..", ".", "a\\b", "a\0b", ""])
async def test_jsonl_rejects_ids_that_are_not_file_names(jsonl: Env, bad: str) -> None:
    """host-core §5: ids that could leave the root ('/', backslash, NUL, '.', '..') are refused."""
    for call in (
        jsonl.persistence.load(bad),
        jsonl.persistence.inspect(bad),
        jsonl.persistence.create(SessionHeader(id=bad, created_at=1)),
    ):
        with pytest.raises(SessionError) as info:
            await call
        assert info.value.code == "SESSION_INVALID_ID"
    if bad:
        with pytest.raises(SessionError) as info:
            jsonl.owner.sessions.create(bad)
        assert info.value.code == "SESSION_INVALID_ID"
    await jsonl.close()


def test_default_sessions_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """host-core §5, [cli] 1: $DSH_SUBAGENTS_HOME/sessions, else ~/.dsh-subagents/sessions
    (never DeepSeek Harness's $DSH_HOME or ~/.dsh)."""
    monkeypatch.setenv("DSH_HOME", str(tmp_path / "other-tool"))
    monkeypatch.setenv("DSH_SUBAGENTS_HOME", str(tmp_path / "home"))
    assert default_sessions_dir() == tmp_path / "home" / "sessions"
    assert JsonlSessionPersistence().root == tmp_path / "home" / "sessions"
    monkeypatch.setenv("DSH_SUBAGENTS_HOME", "")  # empty: unset
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_sessions_dir() == tmp_path / ".dsh-subagents" / "sessions"


# -- durability -----------------------------------------------------------------------------------


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every os.fsync as "file" or "dir"."""
    calls: list[str] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


async def test_group_commit_one_fsync_per_flush(jsonl: Env, fsyncs: list[str]) -> None:
    """host-core §5: a flush costs one file fsync however many events it carries (group commit)."""
    jsonl.root.mkdir(parents=True)
    session = jsonl.owner.sessions.create("s")
    assert fsyncs == []  # nothing is synced per event or at creation
    await jsonl.owner.sessions.flush(session)
    assert sorted(fsyncs) == ["dir", "file"]
    fsyncs.clear()
    session.append("turn/start", TurnStartData(turn=1))
    session.append("step/start", StepData(turn=1, step=1))
    for i in range(1000):
        session.append("x/tick", {"i": i}, ignorable=True)
    assert fsyncs == []
    await jsonl.owner.sessions.flush(session)
    assert fsyncs == ["file"]
    fsyncs.clear()
    assert await jsonl.owner.sessions.flush(session) is True
    assert fsyncs == []  # nothing buffered: nothing to sync
    _, stored = await jsonl.persistence.inspect("s")
    assert len(stored) >= 1002
    await jsonl.close()


async def test_concurrent_flushes_never_interleave(jsonl_detach: Env) -> None:
    """host-core §5: flushes of one session are serialised, so lines keep their order."""
    session = jsonl_detach.owner.sessions.create("s")
    persistence = jsonl_detach.persistence
    held = GatedWrites(persistence)
    session.append("turn/start", TurnStartData(turn=1))
    first = asyncio.ensure_future(jsonl_detach.owner.sessions.flush(session))
    await asyncio.wait_for(held.started.wait(), 30)
    session.append("step/start", StepData(turn=1, step=1))
    session.append("step/end", StepData(turn=1, step=1))
    second = asyncio.ensure_future(jsonl_detach.owner.sessions.flush(session))
    held.gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 30)
    assert held.writes == [1, 2]
    _, stored = await persistence.inspect("s")
    assert stored[:3] == session.events
    await jsonl_detach.close()


async def test_failed_write_is_undone_and_retried(
    jsonl: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """host-core §5: a failed flush undoes its partial write; the retry stores each event once."""
    import dsh_core._persistence._jsonl as persistence_module

    session = jsonl.owner.sessions.create("s")
    await jsonl.owner.sessions.flush(session)
    append_turn(session, 1)
    real = persistence_module._write_all

    def half_then_fail(fd: int, data: bytes) -> None:
        real(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(persistence_module, "_write_all", half_then_fail)
    with pytest.raises(SessionError) as info:
        await jsonl.owner.sessions.flush(session)
    assert info.value.code == "SESSION_IO"
    monkeypatch.setattr(persistence_module, "_write_all", real)
    session.append("turn/end", _turn_end(1))
    await jsonl.owner.sessions.flush(session)
    _, stored = await jsonl.persistence.inspect("s")
    assert stored == session.events
    await jsonl.close()


# -- torn lines and corruption --------------------------------------------------------------------


async def test_torn_last_line_is_dropped_with_a_warning(
    jsonl: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """host-core §5: a torn last line is dropped with a warning; load cuts it, inspect does not."""
    await jsonl.store("s", balanced())
    path = jsonl.file("s")
    good = path.read_bytes()
    path.write_bytes(good + b'{"type":"turn/start","seq":6,"ti')
    with caplog.at_level(logging.WARNING, logger="dsh.sessions"):
        _, inspected = await jsonl.persistence.inspect("s")
    assert inspected == balanced()
    assert "torn" in caplog.text and str(path) in caplog.text
    assert path.read_bytes() != good  # inspect writes nothing
    _, loaded = await jsonl.persistence.load("s")
    assert loaded == balanced()
    assert path.read_bytes() == good
    await jsonl.close()


async def test_complete_but_unparsable_last_line_is_torn(jsonl: Env) -> None:
    """host-core §5: an unparsable last line (e.g. zero-filled after a power cut) is torn too."""
    await jsonl.store("s", balanced())
    path = jsonl.file("s")
    good = path.read_bytes()
    path.write_bytes(good + b"\0" * 40 + b"\n")
    _, loaded = await jsonl.persistence.load("s")
    assert loaded == balanced()
    assert path.read_bytes() == good
    await jsonl.close()


async def test_torn_tail_is_cut_before_new_events(jsonl: Env) -> None:
    """host-core §5: a resumed session's new lines start after the last complete line."""
    await jsonl.store("s", balanced())
    path = jsonl.file("s")
    path.write_bytes(path.read_bytes() + b'{"type":"tu')
    prepared = await jsonl.persistence.prepare("s")
    session = prepared.session
    detach = jsonl.owner.sessions.enter(session)
    jsonl.owner.sessions.announce(session)
    append_turn(session, 2)
    session.append("turn/end", _turn_end(2))
    detach()
    _, stored = await jsonl.persistence.load("s")
    assert stored == session.events
    await jsonl.close()


@pytest.mark.parametrize(
    ("mangle", "line", "code"),
    [
        (lambda lines: lines.__setitem__(2, b"{not json"), 3, "SESSION_CORRUPT"),
        (lambda lines: lines.__delitem__(3), 4, "SESSION_CORRUPT"),  # a seq gap
        (
            lambda lines: lines.__setitem__(
                2, b'{"type":"step/start","seq":1,"time":1,"data":{"turn":2,"step":1}}'
            ),
            3,
            "SESSION_CORRUPT",
        ),  # breaks the invariant: a step of a turn that is not open
        (
            lambda lines: lines.__setitem__(2, b'{"type":"x","seq":1,"time":1}'),
            3,
            "SESSION_FORMAT_UNSUPPORTED",
        ),
        (
            lambda lines: lines.__setitem__(0, lines[0].replace(b'"version":1', b'"version":7')),
            1,
            "SESSION_FORMAT_UNSUPPORTED",
        ),
        (
            lambda lines: lines.__setitem__(0, b'{"id":"other","created_at":1,"version":1}'),
            1,
            "SESSION_CORRUPT",
        ),
    ],
    ids=["bad-json", "seq-gap", "invariant", "unknown-type", "header-version", "header-id"],
)
async def test_corruption_names_file_and_line(
    jsonl: Env, mangle: Any, line: int, code: str
) -> None:
    """host-core §5: other corruption fails loud, naming the file and the 1-based line."""
    await jsonl.store("s", balanced())
    path = jsonl.file("s")
    lines = path.read_bytes().split(b"\n")[:-1]
    mangle(lines)
    path.write_bytes(b"\n".join(lines) + b"\n")
    for call in (jsonl.persistence.inspect("s"), jsonl.persistence.load("s")):
        with pytest.raises(SessionError) as info:
            await call
        assert info.value.code == code
        assert f"{path} line {line}" in str(info.value)
    await jsonl.close()


def long_log(turns: int) -> tuple[SessionEvent, ...]:
    """Balanced turns of six events each: a log longer than one parse chunk."""
    log = LogBuilder()
    for _ in range(turns):
        log.turn_start()
        log.step_start()
        log.user("question")
        log.assistant("answer")
        log.step_end()
        log.turn_end()
    return log.events


@pytest.mark.parametrize(
    ("mangle", "line", "code"),
    [
        (None, None, None),
        (lambda lines: lines.__setitem__(600, b"{not json"), 601, "SESSION_CORRUPT"),
        (lambda lines: lines.__setitem__(600, b"[1]"), 601, "SESSION_CORRUPT"),
        (
            lambda lines: lines.__setitem__(600, b'{"type":"x","seq":599,"time":1}'),
            601,
            "SESSION_FORMAT_UNSUPPORTED",
        ),
        (
            lambda lines: lines.__setitem__(600, lines[600].replace(b'"turn":', b'"turn":"', 1)),
            601,
            "SESSION_CORRUPT",
        ),
        (  # a payload error early and bad JSON later: the JSON is named, as for any log
            lambda lines: (
                lines.__setitem__(5, b'{"type":"x","seq":4,"time":1}'),
                lines.__setitem__(700, b"{not json"),
            ),
            701,
            "SESSION_CORRUPT",
        ),
        (lambda lines: lines.append(b'{"type":"turn/start","seq":'), None, None),  # torn
    ],
    ids=["sound", "bad-json", "no-object", "unknown-type", "bad-payload", "first-json", "torn"],
)
async def test_a_long_log_loads_or_fails_as_a_short_one(
    jsonl: Env, mangle: Any, line: int | None, code: str | None
) -> None:
    """host-core §5, issue 13: a log of many parse chunks loads to the events stored, drops a
    torn tail, and fails on corruption in a later chunk naming that line, with the verdict a
    line-by-line read gives (JSON before payloads)."""
    events = long_log(150)  # 900 events
    await jsonl.store("s", events)
    path = jsonl.file("s")
    if mangle is not None:
        lines = path.read_bytes().split(b"\n")[:-1]
        mangle(lines)
        torn = code is None
        path.write_bytes(b"\n".join(lines) + (b"" if torn else b"\n"))
    if code is None:
        _, loaded = await jsonl.persistence.inspect("s")
        assert loaded == events
    else:
        with pytest.raises(SessionError) as info:
            await jsonl.persistence.inspect("s")
        assert info.value.code == code
        assert f"{path} line {line}" in str(info.value)
    await jsonl.close()


@pytest.mark.parametrize("corrupt", [False, True])
async def test_a_load_pauses_the_collector_and_restores_it(
    jsonl: Env, monkeypatch: pytest.MonkeyPatch, corrupt: bool
) -> None:
    """host-core §5, issue 13: the collector is off while a log is parsed and decoded and on
    again afterwards, whether the load succeeds or fails (SESSION_CORRUPT)."""
    await jsonl.store("s", balanced())
    if corrupt:
        path = jsonl.file("s")
        lines = path.read_bytes().split(b"\n")
        lines[2] = b"{not json"
        path.write_bytes(b"\n".join(lines))
    seen: list[bool] = []
    parse = JsonlSessionPersistence._parse

    def spy(self: JsonlSessionPersistence, *args: Any) -> Any:
        seen.append(gc.isenabled())
        return parse(self, *args)

    monkeypatch.setattr(JsonlSessionPersistence, "_parse", spy)
    assert gc.isenabled()
    if corrupt:
        with pytest.raises(SessionError) as info:
            await jsonl.persistence.inspect("s")
        assert info.value.code == "SESSION_CORRUPT"
    else:
        _, loaded = await jsonl.persistence.inspect("s")
        assert loaded == balanced()
    assert seen == [False]
    assert gc.isenabled()
    await jsonl.close()


def test_collector_pauses_overlap_and_leave_a_disabled_collector_off() -> None:
    """host-core §5, issue 13: overlapping pauses (loads in two threads) turn the collector
    back on only when the last one ends, and never turn on a collector that was off."""
    from dsh_core._persistence import _COLLECTOR_PAUSED as paused

    assert gc.isenabled()
    with paused:
        with paused:
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with paused:
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


async def test_unknown_ignorable_event_type_loads(jsonl: Env) -> None:
    """host-core §3/§5: an unknown type marked ignorable is kept, not refused."""
    log = LogBuilder()
    log.plugin_event({"k": [1, 2.5, None]}, type="future/thing")
    await jsonl.store("s", log.events)
    _, loaded = await jsonl.persistence.load("s")
    assert loaded == log.events
    await jsonl.close()


@pytest.mark.parametrize("content", [b"", b'{"id":"s","crea', b'{"id":"s","created_at":1,"versi\n'])
async def test_file_cut_inside_the_header_was_never_created(
    jsonl: Env, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    """host-core §5: a file cut inside its header line is a session that was never created
    (listed with a warning, unless empty: a file being created looks the same, DUR-17)."""
    jsonl.root.mkdir(parents=True)
    jsonl.file("s").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="dsh.sessions"):
        assert await jsonl.persistence.list() == []
    assert ("never created" in caplog.text) == bool(content)
    with pytest.raises(SessionError) as info:
        await jsonl.persistence.load("s")
    assert info.value.code == "SESSION_NOT_FOUND"
    await jsonl.persistence.create(SessionHeader(id="s", created_at=3))
    assert [h.created_at for h in await jsonl.persistence.list()] == [3]
    await jsonl.close()


async def test_unparsable_header_followed_by_events_is_corrupt(jsonl: Env) -> None:
    """host-core §5, hardening 11.3: a bad header that is not the last line is corruption,
    never skipped silently: listing reports it (by id and code), loading and creating fail."""
    await jsonl.store("s", balanced())
    path = jsonl.file("s")
    lines = path.read_bytes().split(b"\n")
    lines[0] = b"{garbage"
    path.write_bytes(b"\n".join(lines))
    assert await jsonl.persistence.list() == []
    [damaged] = (await jsonl.persistence.listing()).damaged
    assert damaged.id == "s" and damaged.code == "SESSION_CORRUPT"
    assert f"{path} line 1" in damaged.message
    with pytest.raises(SessionError) as info:
        await jsonl.persistence.load("s")
    assert info.value.code == "SESSION_CORRUPT" and f"{path} line 1" in str(info.value)
    with pytest.raises(SessionError) as info:
        await jsonl.persistence.create(SessionHeader(id="s", created_at=1))
    assert info.value.code == "SESSION_CORRUPT"
    await jsonl.close()


# -- locks ----------------------------------------------------------------------------------------

CHILD = """
import asyncio, sys
from pathlib import Path
from dsh_core import Context, EventTypeRegistry, Host, SessionError, SessionStoreService
from dsh_core._persistence import install_jsonl_persistence

async def main(root, id, mode):
    host = Host()
    ctx = Context(host, host.root)
    ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
    persistence = install_jsonl_persistence(ctx, Path(root))
    line = lambda: asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    while True:
        try:
            if mode == "hold":
                prepared = await persistence.prepare(id)
                print("held", flush=True)
                await line()
                prepared.dispose()
            else:
                await persistence.load(id)
            print("ok", flush=True)
        except SessionError as exc:
            print(exc.code, exc, flush=True)
        if mode == "hold" or not await line():  # "load": again for each line read
            break
    await ctx.dispose()

asyncio.run(main(*sys.argv[1:]))
"""


async def _child(root: Path, id: str, mode: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        str(root),
        id,
        mode,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


@pytest.mark.slow
async def test_second_process_cannot_take_a_held_session(jsonl: Env) -> None:
    """host-core §5: another process gets SESSION_LOCKED for a session this host holds."""
    session = jsonl.owner.sessions.create("s")
    await jsonl.owner.sessions.flush(session)
    proc = await _child(jsonl.root, "s", "load")  # one child, two loads (a start is costly)
    assert proc.stdout is not None and proc.stdin is not None
    first = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    assert first.startswith("SESSION_LOCKED")
    assert str(jsonl.file("s")) in first
    await jsonl.owner.dispose()
    await jsonl.host.drain_tasks()
    proc.stdin.write(b"\n")
    proc.stdin.close()
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert out.decode().strip() == "ok"
    await jsonl.close()


@pytest.mark.slow
async def test_session_held_by_another_process_is_locked_here(jsonl: Env) -> None:
    """host-core §5: a session another process holds is SESSION_LOCKED here until released."""
    await jsonl.store("s", balanced())
    proc = await _child(jsonl.root, "s", "hold")
    assert proc.stdout is not None and proc.stdin is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line.decode().strip() == "held"
    try:
        for call in (jsonl.persistence.prepare("s"), jsonl.persistence.load("s")):
            with pytest.raises(SessionError) as info:
                await call
            assert info.value.code == "SESSION_LOCKED"
            assert str(jsonl.file("s")) in str(info.value)
        with pytest.raises(SessionError) as info:
            jsonl.owner.sessions.create("s")
        assert info.value.code == "SESSION_LOCKED"
    finally:
        proc.stdin.write(b"\n")
        await proc.stdin.drain()
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert out.decode().strip() == "ok"
    _, loaded = await jsonl.persistence.load("s")
    assert loaded == balanced()
    await jsonl.close()


# -- service wiring -------------------------------------------------------------------------------


async def test_install_helpers_provide_the_service(tmp_path: Path) -> None:
    """host-core §5: install_*_persistence install the backend and provide session_persistence."""
    for install in (install_memory_persistence, install_jsonl_persistence):
        host = Host()
        ctx = Context(host, host.root)
        ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
        persistence = (
            install(ctx) if install is install_memory_persistence else install(ctx, tmp_path)
        )
        assert ctx.session_persistence is persistence
        assert isinstance(persistence, MemorySessionPersistence | JsonlSessionPersistence)
        await ctx.dispose()
        assert ctx.get("session_persistence") is None


async def test_methods_need_an_installed_backend() -> None:
    """host-core §5: an uninstalled backend refuses work (PERSISTENCE_NOT_INSTALLED)."""
    with pytest.raises(SessionError) as info:
        await MemorySessionPersistence().list()
    assert info.value.code == "PERSISTENCE_NOT_INSTALLED"


def test_replayed_repair_satisfies_the_checker() -> None:
    """host-core §5/§10: closers continue the seq numbering and replay cleanly."""
    log = open_turn_with_calls()
    checker = SessionLogChecker()
    checker.replay(log.events + tuple(repair_closers("s", log.events)))
    assert checker.balanced


@pytest.mark.parametrize("stated", [0, 3, 5, 6, 1 << 17])
def test_read_all_reads_the_whole_file_whatever_size_it_was_told(
    tmp_path: Path, stated: int
) -> None:
    """host-core §6 (listing 14): a whole-file read given the file's stat size reads every
    byte even when the file has since grown or shrunk (the size only shapes the first read)."""
    from dsh_core._persistence import _read_all

    path = tmp_path / "f.jsonl"
    data = b"abcde\n" * 20_000  # longer than one 64 KiB follow-up read
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _read_all(fd, stated) == data
        assert _read_all(fd) == data
    finally:
        os.close(fd)
