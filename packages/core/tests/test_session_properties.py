"""Properties of session logs over generated inputs (host-core §3, §4, §5, §10)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core import (
    Context,
    EventTypeRegistry,
    Host,
    LogInvariantError,
    Message,
    SessionError,
    SessionEvent,
    SessionHeader,
    SessionLogChecker,
    SessionStoreService,
    StepData,
    ToolCallBlock,
    ToolResultBlock,
    ToolResultData,
    TurnEndData,
    TurnStartData,
    check_balanced,
    text_blocks,
)
from dsh_core._persistence import (
    SessionPersistence,
    install_jsonl_persistence,
    install_memory_persistence,
)
from dsh_core.testing.strategies import session_logs, unbalanced_session_logs

HEADER = SessionHeader(id="s", created_at=1, parent_session="p", seed_length=0)


#: A fresh session id per example: the examples of a test share one store folder (a folder
#: made, synced and removed per example was most of their time), each its own files in it.
#: Fixed width, so a file's length (which a test draws a cut from) never depends on it.
_ids = (f"s{n:07d}" for n in itertools.count())


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for every example's store roots (each root made once, on first use)."""
    return tmp_path_factory.mktemp("stores")


def host() -> Context:
    h = Host()
    ctx = Context(h, h.root)
    ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
    return ctx


async def stored(
    persistence: SessionPersistence, header: SessionHeader, events: tuple[SessionEvent, ...]
) -> None:
    await persistence.create(header)
    await persistence.append(header.id, events)


# -- (a) round trips ------------------------------------------------------------------------------


@given(session_logs())
async def test_valid_logs_round_trip_memory_and_jsonl(
    store: Path, events: tuple[SessionEvent, ...]
) -> None:
    """host-core §5: valid logs round-trip memory <-> JSONL as equal events."""
    header = attrs.evolve(HEADER, id=next(_ids))
    memory_ctx, jsonl_ctx = host(), host()
    memory = install_memory_persistence(memory_ctx)
    jsonl = install_jsonl_persistence(jsonl_ctx, store / "round-trip")
    await stored(memory, header, events)
    await stored(jsonl, header, events)
    header_m, from_memory = await memory.load(header.id)
    header_j, from_jsonl = await jsonl.load(header.id)
    assert from_memory == events == from_jsonl
    assert header_m == header == header_j
    moved_ctx = host()
    moved = install_jsonl_persistence(moved_ctx, store / "moved")
    await moved.create(header_m)
    await moved.append(header.id, from_memory)
    assert (await moved.load(header.id))[1] == events
    for ctx in (memory_ctx, jsonl_ctx, moved_ctx):
        await ctx.dispose()


@given(session_logs())
async def test_seeded_live_session_round_trips_through_jsonl(
    store: Path, events: tuple[SessionEvent, ...]
) -> None:
    """host-core §4/§5: a seeded, tracked, flushed session reloads as exactly its live events."""
    id = next(_ids)
    ctx = host()
    persistence = install_jsonl_persistence(ctx, store / "seeded")
    session = ctx.sessions.create(id, seed=events)
    await ctx.sessions.flush(session)
    live = session.events
    await ctx.dispose()
    await ctx.host.drain_tasks()
    reader = host()
    persistence = install_jsonl_persistence(reader, store / "seeded")
    _, loaded = await persistence.load(id)
    assert loaded == live
    assert loaded[-1].type == "session/end-seed"
    await reader.dispose()


# -- (b) rejection --------------------------------------------------------------------------------


@given(unbalanced_session_logs())
def test_unbalanced_logs_are_rejected_by_check_balanced(events: tuple[SessionEvent, ...]) -> None:
    """host-core §4: open turns, open steps and unanswered calls are never balanced."""
    checker = SessionLogChecker()
    checker.replay(events)
    assert not checker.balanced
    with pytest.raises(LogInvariantError):
        check_balanced(events)


def renumber(events: list[SessionEvent]) -> tuple[SessionEvent, ...]:
    return tuple(attrs.evolve(e, seq=i) for i, e in enumerate(events))


def indexes(events: tuple[SessionEvent, ...], type: str) -> list[int]:
    return [i for i, e in enumerate(events) if e.type == type]


Mutation = Callable[[tuple[SessionEvent, ...], st.DataObject], tuple[SessionEvent, ...]]


def wrong_turn_number(
    events: tuple[SessionEvent, ...], data: st.DataObject
) -> tuple[SessionEvent, ...]:
    i = data.draw(st.sampled_from(indexes(events, "turn/start")))
    turn = events[i].data.turn
    other = data.draw(st.integers(0, turn + 3).filter(lambda t: t != turn))
    out = list(events)
    out[i] = attrs.evolve(events[i], data=TurnStartData(turn=other))
    return tuple(out)


def wrong_step_number(
    events: tuple[SessionEvent, ...], data: st.DataObject
) -> tuple[SessionEvent, ...]:
    starts = indexes(events, "step/start")
    if not starts:
        return wrong_turn_number(events, data)
    i = data.draw(st.sampled_from(starts))
    d = events[i].data
    other = data.draw(st.integers(0, d.step + 3).filter(lambda s: s != d.step))
    out = list(events)
    out[i] = attrs.evolve(events[i], data=StepData(turn=d.turn, step=other))
    return tuple(out)


def seq_gap(events: tuple[SessionEvent, ...], data: st.DataObject) -> tuple[SessionEvent, ...]:
    i = data.draw(st.integers(0, len(events) - 2))
    return events[:i] + events[i + 1 :]


def turn_opened_twice(
    events: tuple[SessionEvent, ...], data: st.DataObject
) -> tuple[SessionEvent, ...]:
    i = data.draw(st.sampled_from(indexes(events, "turn/start")))
    return renumber([*events[: i + 1], events[i], *events[i + 1 :]])


def step_outside_turn(
    events: tuple[SessionEvent, ...], data: st.DataObject
) -> tuple[SessionEvent, ...]:
    i = data.draw(st.sampled_from(indexes(events, "turn/end")))
    step = attrs.evolve(
        events[i], type="step/start", data=StepData(turn=events[i].data.turn, step=1)
    )
    return renumber([*events[: i + 1], step, *events[i + 1 :]])


def turn_end_names_another_turn(
    events: tuple[SessionEvent, ...], data: st.DataObject
) -> tuple[SessionEvent, ...]:
    i = data.draw(st.sampled_from(indexes(events, "turn/end")))
    d = events[i].data
    out = list(events)
    out[i] = attrs.evolve(events[i], data=TurnEndData(turn=d.turn + 1, reason=d.reason))
    return tuple(out)


def orphan_result(
    events: tuple[SessionEvent, ...], data: st.DataObject
) -> tuple[SessionEvent, ...]:
    starts = indexes(events, "step/start")
    if not starts:
        return turn_opened_twice(events, data)
    i = data.draw(st.sampled_from(starts))
    d = events[i].data
    message = Message(
        id="orphan",
        role="tool",
        content=(ToolResultBlock(tool_call_id="never-called", content=text_blocks("x")),),
    )
    result = SessionEvent(
        type="tool/result",
        seq=0,
        time=1,
        data=ToolResultData(turn=d.turn, step=d.step, message=message),
        source_event_seqs=(),
        surface_op="append",
    )
    return renumber([*events[: i + 1], result, *events[i + 1 :]])


MUTATIONS: list[Mutation] = [
    wrong_turn_number,
    wrong_step_number,
    seq_gap,
    turn_opened_twice,
    step_outside_turn,
    turn_end_names_another_turn,
    orphan_result,
]


@given(session_logs(min_turns=1), st.sampled_from(MUTATIONS), st.data())
def test_broken_nesting_or_numbering_is_rejected(
    events: tuple[SessionEvent, ...], mutate: Mutation, data: st.DataObject
) -> None:
    """host-core §10: broken nesting, numbering, seqs or call pairing fail SessionLogChecker."""
    SessionLogChecker().replay(events)
    broken = mutate(events, data)
    with pytest.raises(LogInvariantError):
        SessionLogChecker().replay(broken)


# -- (c) torn files -------------------------------------------------------------------------------


def _balanced(events: tuple[SessionEvent, ...]) -> bool:
    checker = SessionLogChecker()
    checker.replay(events)
    return checker.balanced


def _unanswered_calls(events: tuple[SessionEvent, ...]) -> list[str]:
    """Calls announced by a step's last assistant message with no result in that step; each
    synthetic result must carry the right code (a call that was logged has an unknown
    outcome, one that was not never started)."""
    missing: list[str] = []
    announced: list[str] = []
    called: set[str] = set()
    answered: dict[str, str | None] = {}
    for event in events:
        if event.type == "step/start":
            announced, called, answered = [], set(), {}
        elif event.type == "assistant/message":
            announced = [b.id for b in event.data.message.content if isinstance(b, ToolCallBlock)]
        elif event.type == "tool/call":
            called.add(event.data.call_id)
        elif event.type == "tool/result":
            block = event.data.message.content[0]
            error = event.data.error
            answered[block.tool_call_id] = error.code if error is not None else None
        elif event.type == "step/end":
            for call_id in announced:
                if call_id not in answered:
                    missing.append(call_id)
                elif answered[call_id] == "TOOL_NOT_STARTED":
                    assert call_id not in called
                elif answered[call_id] == "TOOL_OUTCOME_UNKNOWN":
                    assert call_id in called
    return missing


@given(session_logs(open_end=True), st.data())
async def test_flushed_log_cut_anywhere_reloads_as_a_repaired_prefix(
    store: Path, events: tuple[SessionEvent, ...], data: st.DataObject
) -> None:
    """host-core §5: a flushed JSONL log cut at any byte reloads as a repaired prefix."""
    id = next(_ids)
    ctx = host()
    install_jsonl_persistence(ctx, store / "live")
    owner = ctx.plugin("owner")
    session = owner.sessions.create(id)
    for event in events:
        session.append(
            event.type,
            event.data,
            source_event_seqs=event.source_event_seqs,
            ignorable=event.ignorable,
        )
        if data.draw(st.integers(0, 9)) == 0:
            await owner.sessions.flush(session)
    await owner.sessions.flush(session)
    flushed = session.events
    content = (store / "live" / f"{id}.jsonl").read_bytes()
    await ctx.dispose()

    cut = data.draw(st.integers(0, len(content)))
    root = store / "cut"
    root.mkdir(exist_ok=True)
    (root / f"{id}.jsonl").write_bytes(content[:cut])
    reader = host()
    persistence = install_jsonl_persistence(reader, root)
    header_end = content.index(b"\n") + 1
    if cut < header_end:
        with pytest.raises(SessionError) as info:
            await persistence.load(id)
        assert info.value.code == "SESSION_NOT_FOUND"
        await reader.dispose()
        return
    kept = content[header_end:cut].count(b"\n")
    _, loaded = await persistence.load(id)
    assert loaded[:kept] == flushed[:kept]
    closers = loaded[kept:]
    prefix_open = not _balanced(flushed[:kept])
    assert [e.type for e in closers][-1:] == (["turn/end"] if prefix_open else [])
    assert {e.type for e in closers} <= {"tool/result", "step/end", "turn/end"}
    if closers:
        assert closers[-1].data.reason.kind == "interrupted"
    check_balanced(loaded)
    assert _unanswered_calls(loaded) == []
    assert (await persistence.load(id))[1] == loaded  # the repair was committed
    await reader.dispose()
