"""Warm logs: a log this host wrote and closed itself is prepared and inspected again without
reading the store, only while the store's stamp proves it unchanged (DUR-50..DUR-58)."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_core import (
    Context,
    EventTypeRegistry,
    Host,
    Session,
    SessionError,
    SessionEvent,
    SessionHeader,
    SessionStoreService,
    StepData,
    TurnEndData,
    TurnEndReason,
    TurnStartData,
    dumps,
)
from dsh_core._agent import _last_snapshot
from dsh_core._inbox import Inbox
from dsh_core._persistence import (
    JsonlSessionPersistence,
    SessionPersistence,
    install_jsonl_persistence,
    install_memory_persistence,
)
from dsh_core._persistence._repair import _closers, _scan
from dsh_core._sessions import LogFold, fold_log
from dsh_core.testing.strategies import session_logs

BACKENDS = ["memory", "jsonl"]


class Env:
    """A host with the sessions store and one backend, counting the backend's reads."""

    def __init__(self, kind: str, root: Path, **options: Any) -> None:
        self.kind = kind
        self.root = root
        self.host = Host()
        self.ctx = Context(self.host, self.host.root)
        self.ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
        self.persistence: SessionPersistence = (
            install_memory_persistence(self.ctx, **options)
            if kind == "memory"
            else install_jsonl_persistence(self.ctx, root)
        )
        self.owner = self.ctx.plugin("owner")
        self.reads: list[str] = []
        read = self.persistence._read

        def counting(id: str, handle: Any) -> Any:
            self.reads.append(id)
            return read(id, handle)

        self.persistence._read = counting  # type: ignore[method-assign]

    async def close(self) -> None:
        await self.ctx.dispose()
        await self.host.drain_tasks()

    def file(self, id: str) -> Path:
        return self.root / f"{id}.jsonl"

    async def written(self, id: str, turns: int = 1, *, open_turn: bool = False) -> Session:
        """A new session ``id`` with ``turns`` closed turns (and an open one), disposed."""
        session = self.ctx.sessions.prepare(id)
        return await self.run(session, turns, open_turn=open_turn)

    async def resumed(self, id: str, turns: int = 1, *, open_turn: bool = False) -> Session:
        """``id`` prepared, entered, given ``turns`` more turns, disposed."""
        prepared = await self.persistence.prepare(id)
        return await self.run(prepared.session, turns, open_turn=open_turn)

    async def run(self, session: Session, turns: int, *, open_turn: bool) -> Session:
        detach = self.owner.sessions.enter(session)
        self.owner.sessions.announce(session)
        first = 1 + sum(e.type == "turn/start" for e in session.events)
        for turn in range(first, first + turns):
            append_turn(session, turn)
        if open_turn:
            session.append("turn/start", TurnStartData(turn=first + turns))
            session.append("step/start", StepData(turn=first + turns, step=1))
        detach()
        await self.persistence.released(session.header.id)
        return session

    async def cold(self, id: str) -> tuple[Any, tuple[SessionEvent, ...]]:
        """What a store that never saw ``id`` written reads of it (JSONL: a second store on
        the same folder; memory: the log itself, replayed)."""
        if self.kind == "memory":
            persistence = self.persistence
            kept, total, reads = dict(persistence._warm), persistence._warm_total, len(self.reads)
            persistence._warm.clear()
            try:
                return await persistence.inspect(id)
            finally:
                persistence._warm, persistence._warm_total = kept, total
                del self.reads[reads:]  # not this store's read
        other = Env("jsonl", self.root)
        try:
            return await other.persistence.inspect(id)
        finally:
            await other.close()


def append_turn(session: Session, turn: int) -> None:
    session.append("turn/start", TurnStartData(turn=turn))
    session.append("step/start", StepData(turn=turn, step=1))
    session.append("step/end", StepData(turn=turn, step=1))
    session.append("turn/end", TurnEndData(turn=turn, reason=TurnEndReason(kind="completed")))


def untimed(events: Sequence[SessionEvent]) -> list[SessionEvent]:
    """The events with their time left out (repair closers are stamped when made)."""
    return [attrs.evolve(e, time=0) for e in events]


@pytest.fixture(params=BACKENDS)
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    return Env(request.param, tmp_path / "sessions")


@pytest.fixture
def jsonl(tmp_path: Path) -> Env:
    return Env("jsonl", tmp_path / "sessions")


async def test_a_closed_log_is_prepared_again_without_a_read(env: Env) -> None:
    """DUR-50: a session this host wrote and disposed is prepared again without reading the
    store, into the very events a store that never saw it reads from disk."""
    await env.written("s", 3)
    session = (await env.persistence.prepare("s")).session
    assert env.reads == []
    _, cold = await env.cold("s")
    assert session.events[:-1] == cold  # minus the new end-seed
    assert session.events[-1].type == "session/end-seed"
    await env.close()


async def test_every_epoch_of_a_resumed_log_stays_warm(env: Env) -> None:
    """DUR-50: a log read from the store once stays warm across later epochs: each prepare
    after the first reads nothing, and each holds what the store holds."""
    await env.written("s", 1)
    env.persistence._warm.clear()  # as after a restart: the first prepare reads
    for _ in range(4):
        await env.resumed("s", 2)
    assert env.reads == ["s"]
    _, cold = await env.cold("s")
    prepared = await env.persistence.prepare("s")
    assert env.reads == ["s"]
    assert prepared.session.events[:-1] == cold
    prepared.dispose()
    await env.close()


def _append_line(env: Env, id: str) -> None:
    """Another writer appends a valid event (a plugin's ignorable one) to the closed log."""
    path = env.file(id)
    seq = len(path.read_bytes().splitlines()) - 1
    event = SessionEvent(type="x/other", seq=seq, time=1, data={"by": "another"}, ignorable=True)
    with path.open("ab") as f:
        f.write((dumps(env.ctx.sessions.types.encode(event)) + "\n").encode())


def _rewrite_same_size(env: Env, id: str) -> None:
    """Another writer changes a byte in place, size and modification time kept."""
    path = env.file(id)
    before = os.stat(path)
    data = path.read_bytes()
    at = data.rindex(b'"completed"')
    path.write_bytes(data[:at] + b'"cancelled"' + data[at + len(b'"completed"') :])
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _replace(env: Env, id: str) -> None:
    """The file is replaced by a copy with a changed event (another inode), mtime kept."""
    path = env.file(id)
    before = os.stat(path)
    data = path.read_bytes().replace(b'"completed"', b'"cancelled"')
    copy = path.with_suffix(".tmp")
    copy.write_bytes(data)
    os.utime(copy, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(copy, path)


def _touch(env: Env, id: str) -> None:
    """Only the modification time changes."""
    path = env.file(id)
    st_ = os.stat(path)
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))


@pytest.mark.parametrize("change", [_append_line, _rewrite_same_size, _replace, _touch])
async def test_a_log_changed_after_the_close_is_read_from_disk(jsonl: Env, change: Any) -> None:
    """DUR-51: a closed log changed by anyone else before the next prepare or inspect (a line
    appended, a byte rewritten in place with size and mtime kept, the file replaced, or just
    touched) is read from disk, and what it holds now is what the session holds."""
    written = await jsonl.written("s", 2)
    change(jsonl, "s")
    _, cold = await jsonl.cold("s")
    _, inspected = await jsonl.persistence.inspect("s")
    assert jsonl.reads == ["s"]
    assert inspected == cold
    session = (await jsonl.persistence.prepare("s")).session
    assert jsonl.reads == ["s", "s"]
    assert session.events[:-1] == cold
    if change is not _touch:
        assert session.events[:-1] != written.events
        assert any(
            e.type == "x/other" or (e.type == "turn/end" and e.data.reason.kind == "cancelled")
            for e in session.events
        )
    await jsonl.close()


async def test_a_log_written_through_the_api_is_read_again(env: Env) -> None:
    """DUR-51: append (and load) of a closed log in this host read it from the store again."""
    await env.written("s", 1)
    _, events = await env.persistence.inspect("s")
    event = SessionEvent(type="x/other", seq=len(events), time=1, data={"n": 1}, ignorable=True)
    await env.persistence.append("s", [event])
    reads = len(env.reads)
    session = (await env.persistence.prepare("s")).session
    assert len(env.reads) == reads + 1
    assert session.events[-2] == event
    await env.close()


async def test_inspect_of_a_warm_log_reads_nothing_and_writes_nothing(env: Env) -> None:
    """DUR-52: inspect of a warm log reads nothing, gives what a cold inspect gives (repair
    closers in memory only), and leaves the log warm and unchanged."""
    await env.written("s", 2, open_turn=True)
    before = env.file("s").read_bytes() if env.kind == "jsonl" else None
    header, events = await env.persistence.inspect("s")
    header2, events2 = await env.persistence.inspect("s")
    assert env.reads == []
    cold_header, cold = await env.cold("s")
    assert header == header2 == cold_header
    assert untimed(events) == untimed(events2) == untimed(cold)
    assert events[-1].type == "turn/end"
    if before is not None:
        assert env.file("s").read_bytes() == before
    assert "s" in env.persistence._warm
    await env.close()


async def test_a_warm_log_left_inside_a_turn_is_repaired_as_a_read_one(env: Env) -> None:
    """DUR-53: a warm log whose session was disposed inside a turn gets the repair closers a
    read from disk gives, and prepare writes them, so the stored log is balanced."""
    await env.written("s", 1)
    env.persistence._warm.clear()
    await env.resumed("s", 1, open_turn=True)  # warm now, with the replay of the first read
    _, cold = await env.cold("s")
    reads = len(env.reads)
    session = (await env.persistence.prepare("s")).session
    assert len(env.reads) == reads
    assert untimed(session.events[:-1]) == untimed(cold)
    assert [e.type for e in session.events[-3:]] == ["step/end", "turn/end", "session/end-seed"]
    repaired = session.events[:-1]
    env.persistence._warm.clear()
    _, stored = await env.cold("s")
    assert stored == repaired
    await env.close()


async def test_warm_logs_are_bounded_by_count_and_by_events(env: Env) -> None:
    """DUR-54: at most ``warm_sessions`` logs and ``warm_events`` events in all are kept warm
    (the least recently closed goes first), a longer log is never kept, 0 keeps none, and
    the host's close lets every one go."""
    persistence = env.persistence
    persistence.warm_sessions = 2
    for id in ("a", "b", "c"):
        await env.written(id, 1)
    assert list(persistence._warm) == ["b", "c"]
    assert persistence._warm_total == sum(len(w.events) for w in persistence._warm.values())
    size = len(persistence._warm["c"].events)
    persistence.warm_sessions = 10
    persistence.warm_events = 2 * size + 1
    await env.written("d", 1)  # one log too many by events: the oldest goes
    assert list(persistence._warm) == ["c", "d"]
    await env.written("e", 3)  # longer than the room left: the two oldest go
    assert list(persistence._warm) == ["e"] or persistence._warm_total <= 2 * size + 1
    assert persistence._warm_total <= persistence.warm_events
    persistence.warm_events = size - 1
    await env.written("f", 1)  # longer than the whole bound: never kept
    assert "f" not in persistence._warm
    persistence.warm_events = 0
    await env.resumed("e", 1)
    assert "e" not in persistence._warm
    persistence.warm_events = 10_000
    await env.written("g", 1)
    assert "g" in persistence._warm
    if env.kind == "jsonl":  # the files' bytes: a log larger than the room left is not kept
        persistence.warm_bytes = env.file("g").stat().st_size + 1
        await env.written("h", 1)
        assert list(persistence._warm) == ["h"]
        assert persistence._warm_size == env.file("h").stat().st_size
        persistence.warm_bytes = 10
        await env.resumed("h", 1)
        assert persistence._warm == {} and persistence._warm_size == 0
    reads = len(env.reads)
    (await persistence.prepare("a")).dispose()  # dropped: read from the store
    assert len(env.reads) == reads + 1
    await env.close()
    assert persistence._warm == {} and persistence._warm_total == persistence._warm_size == 0


async def test_a_log_with_a_stand_in_is_never_kept_warm(jsonl: Env) -> None:
    """DUR-55: a log whose last write stored a stand-in for an event it could not encode is
    not what the session holds: it is not kept warm, and the next prepare reads it."""
    session = jsonl.ctx.sessions.prepare("s")
    detach = jsonl.owner.sessions.enter(session)
    jsonl.owner.sessions.announce(session)
    session.append("x/n", {"n": 10**700}, ignorable=True)
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        detach()
        await jsonl.persistence.released("s")
    finally:
        sys.set_int_max_str_digits(limit)
    assert "s" not in jsonl.persistence._warm
    prepared = await jsonl.persistence.prepare("s")
    assert jsonl.reads == ["s"]
    assert prepared.session.events[0].type == "session/unwritable"
    prepared.dispose()
    await jsonl.close()


async def test_the_memory_store_drops_a_warm_log_with_its_log(tmp_path: Path) -> None:
    """DUR-56: a log the memory store drops (``retain_disposed``) leaves the warm logs too:
    it can no longer be resumed, from memory either."""
    env = Env("memory", tmp_path, retain_disposed=1)
    await env.written("a", 1)
    await env.written("b", 1)
    assert list(env.persistence._warm) == ["b"]
    with pytest.raises(SessionError) as info:
        await env.persistence.prepare("a")
    assert info.value.code == "SESSION_NOT_FOUND"
    await env.close()


async def test_a_warm_prepare_refused_by_its_check_lets_the_log_go(env: Env) -> None:
    """DUR-57: a warm prepare refused by its check writes nothing and lets the log go (a
    second prepare succeeds, from the store)."""
    await env.written("s", 1, open_turn=True)

    def refuse(header: Any, events: Any) -> None:
        raise LookupError("not yours")

    with pytest.raises(LookupError):
        await env.persistence.prepare("s", check=refuse)
    assert env.reads == []
    prepared = await env.persistence.prepare("s")
    assert env.reads == ["s"]
    prepared.dispose()
    await env.close()


@settings(max_examples=60, deadline=None)
@given(session_logs(max_turns=4, open_end=True), st.integers(0, 200))
def test_a_replay_resumed_part_way_is_the_whole_replay(
    events: tuple[SessionEvent, ...], cut: int
) -> None:
    """DUR-58: the log invariant's replay of a log, resumed from a replay of any prefix of
    it, reaches the whole replay's state: the same open turn and step, the same closers."""
    cut = min(cut, len(events))

    def locate(i: int) -> str:
        return f"event {i}"

    whole = _scan(events, locate)
    resumed = _scan(events, locate, resume=_scan(events[:cut], locate), start=cut)
    assert resumed.checker.open_turn == whole.checker.open_turn
    assert resumed.checker.open_step == whole.checker.open_step
    assert (resumed.announced, resumed.calls, resumed.answered) == (
        whole.announced,
        whole.calls,
        whole.answered,
    )
    assert untimed(_closers("s", resumed, len(events))) == untimed(
        _closers("s", whole, len(events))
    )


def _derived(session: Session) -> tuple[Any, ...]:
    """What a session and an agent on it derive from the log."""
    inbox = Inbox(session, lambda name, message: None)
    return (
        tuple(session.derive_messages()),
        session.request_header(),
        tuple(inbox.next_turn),
        tuple(inbox.next_step),
        _last_snapshot(session),
    )


def _fold_state(fold: LogFold) -> tuple[Any, ...]:
    return tuple(getattr(fold, name) for name in LogFold.__slots__)


@settings(max_examples=80, deadline=None)
@given(session_logs(max_turns=4), st.integers(0, 200), st.integers(0, 200))
def test_a_fold_resumed_part_way_is_the_whole_fold(
    events: tuple[SessionEvent, ...], cut: int, seed_length: int
) -> None:
    """DUR-58: a log's fold (the session's messages and request header, the agent's inbox
    and last snapshot), resumed from the fold of any prefix, is the whole fold; a session
    given its seed with that fold derives what one folding the seed itself derives."""
    cut, seed_length = min(cut, len(events)), min(seed_length, len(events))
    whole = fold_log(events, seed_length)
    resumed = fold_log(events, seed_length, fold_log(events[:cut], seed_length))
    assert _fold_state(resumed) == _fold_state(whole)
    header = SessionHeader(id="s", created_at=1, seed_length=seed_length)
    types = EventTypeRegistry()
    plain = Session(header, types=types, seed=events, stored=True)
    folded = Session(header, types=types, seed=list(events), stored=True, fold=resumed)
    assert untimed(folded.events) == untimed(plain.events)  # the end-seed is stamped anew
    assert _derived(folded) == _derived(plain)


def test_jsonl_store_keeps_warm_logs_by_default(tmp_path: Path) -> None:
    """DUR-54: the bounds a store starts with (documented in docs/sessions.md)."""
    store = JsonlSessionPersistence(tmp_path)
    assert (store.warm_sessions, store.warm_events, store.warm_bytes) == (1024, 50_000, 16 << 20)


async def test_a_warm_resume_takes_the_closed_sessions_list_over(env: Env) -> None:
    """PERF-22: closing a session keeps its own list warm and the next activation of the log
    takes that list over as its log (no copy and no snapshot of the whole log is made, then or
    at the prepare); the closed session still reads exactly its own events, never what the
    resumed one appends, and what it appends itself stays its own."""
    snapshots: list[int] = []
    events_property = Session.events

    def counting(self: Session) -> tuple[SessionEvent, ...]:
        snapshots.append(len(self._events))
        return events_property.fget(self)  # type: ignore[no-any-return,attr-defined]

    session = env.ctx.sessions.prepare("s")
    detach = env.owner.sessions.enter(session)
    env.owner.sessions.announce(session)
    for turn in (1, 2, 3):
        append_turn(session, turn)
    before = session.events
    own = session._events
    Session.events = property(counting)  # type: ignore[method-assign,assignment]
    try:
        detach()
        await env.persistence.released("s")
        warm = env.persistence._warm["s"]
        assert warm.events is own and len(own) == len(before)
        prepared = await env.persistence.prepare("s")
    finally:
        Session.events = events_property  # type: ignore[method-assign]
    assert snapshots == []
    resumed = prepared.session
    assert resumed._events is own
    detach = env.owner.sessions.enter(resumed)
    env.owner.sessions.announce(resumed)
    append_turn(resumed, 4)
    assert len(own) > len(before)
    assert session.events == before == tuple(session._events) and session.seq == len(before)
    assert list(reversed(session._events)) == list(reversed(before))
    assert session.events_since(len(before) - 2) == list(before[-2:])
    with pytest.raises(IndexError):
        session.event(len(before))
    late = session.append("x/late", {"n": 1}, ignorable=True)  # in memory only (host-core 5)
    assert session.events == (*before, late) and late.seq == len(before)
    assert late not in own
    assert resumed.events[: len(before)] == before
    detach()
    await env.persistence.released("s")
    _, cold = await env.cold("s")
    assert resumed.events == cold
    await env.close()


def test_a_replay_resumed_part_way_reads_only_the_events_after_it() -> None:
    """PERF-22: the replay of a warm log goes on from where it stopped without stepping over
    the events before (it used to walk them all again, so each resume of a long log cost the
    whole log): a log whose iteration fails replays from a start inside it."""

    class NoWalk(list[SessionEvent]):
        def __iter__(self) -> Any:
            raise AssertionError("the whole log was walked")

    header = SessionHeader(id="s", created_at=1)
    session = Session(header, types=EventTypeRegistry())
    for turn in (1, 2, 3):
        append_turn(session, turn)
    events = list(session.events)
    cut = 5
    prefix = _scan(events[:cut], str)
    whole = _scan(events, str)
    resumed = _scan(NoWalk(events), str, resume=prefix, start=cut)
    assert resumed.checker.open_turn == whole.checker.open_turn
    assert (resumed.announced, resumed.calls, resumed.answered) == (
        whole.announced,
        whole.calls,
        whole.answered,
    )


async def test_forty_logs_resumed_in_turn_all_stay_warm(env: Env) -> None:
    """DUR-54, PERF-22: by default a store keeps far more than a few dozen closed logs warm
    (the events and bytes bound the memory): a parent following up 40 children in turn, twice
    round, reads no log (with 32 kept, each resume found its log let go and read it)."""
    ids = [f"s{i}" for i in range(40)]
    for id in ids:
        await env.written(id, 2)
    for _ in range(2):
        for id in ids:
            await env.resumed(id, 1)
    assert env.reads == []
    await env.close()


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(BACKENDS),
    st.lists(
        st.tuples(st.integers(0, 3), st.booleans(), st.booleans(), st.booleans()),
        min_size=1,
        max_size=6,
    ),
)
def test_epochs_handed_over_keep_every_closed_session_its_own(
    kind: str, epochs: list[tuple[int, bool, bool, bool]]
) -> None:
    """PERF-22, DUR-50, DUR-53: a log resumed epoch after epoch from its warm log (each
    epoch some turns, maybe closed inside a turn, maybe appended to by a ``session/disposed``
    listener after its close, maybe inspected before the next resume): every closed session
    still shows exactly the events it had, its own late one included, and never a later
    epoch's; and the last session holds what a store that never saw the log reads of it."""

    async def scenario(root: Path) -> None:
        env = Env(kind, root)
        late_for: set[str] = set()
        lates: dict[int, SessionEvent] = {}

        def late(disposed: Session) -> None:  # after the backend's own listener
            if disposed.header.id in late_for:
                late_for.discard(disposed.header.id)
                lates[id(disposed)] = disposed.append("x/late", {"n": 1}, ignorable=True)

        env.ctx.on("session/disposed", late, global_=True)
        closed: list[tuple[Session, tuple[SessionEvent, ...]]] = []
        session: Session | None = None
        for n, (turns, open_turn, late_append, inspect) in enumerate(epochs):
            if late_append:
                late_for.add("s")
            if session is None:
                session = await env.written("s", turns, open_turn=open_turn)
            else:
                if inspect:
                    await env.persistence.inspect("s")
                session = await env.resumed("s", turns, open_turn=open_turn)
            own = session.events if id(session) not in lates else session.events[:-1]
            closed.append((session, own))
            assert n == len(closed) - 1
        for old, own in closed:
            mine = lates.get(id(old))
            expected = own if mine is None else (*own, mine)
            # Every way of reading the log, not only the snapshot the session caches.
            assert old.events == expected == tuple(old._events)
            assert tuple(old.events_since(0)) == expected
            assert tuple(old.event(i) for i in range(old.seq)) == expected
        _, cold = await env.cold("s")
        _, own = closed[-1]
        assert untimed(cold[: len(own)]) == untimed(own)
        await env.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp) / "sessions"))
