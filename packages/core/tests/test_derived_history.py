"""The model-visible history a session derives as it grows (host-core §3 ``derive_messages``):
kept up to date by the log's folds, it always equals a full derivation of the log, and a view
taken earlier never changes."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh_core import (
    AgentCancelCause,
    Context,
    EventTypeRegistry,
    Host,
    LlmFailure,
    Message,
    MessageHistory,
    SessionEvent,
    SessionHeader,
    SessionStoreService,
    ToolDefinition,
    ToolRunContext,
    _sessions,
    user_message,
)
from dsh_core._persistence import install_jsonl_persistence
from dsh_core.testing import ScriptedReply, ScriptedRequest, ScriptedToolCall, scripted_host
from dsh_core.testing.strategies import session_logs

USER = AgentCancelCause(kind="user")


#: Every property holds twice: with views from the first message on, and as shipped (tuples
#: for short histories, views beyond).
THRESHOLDS = (0, _sessions._TUPLE_UP_TO)


@contextlib.contextmanager
def histories_as_views_beyond(threshold: int) -> Iterator[None]:
    """Sessions made inside keep their history a tuple up to ``threshold`` messages."""
    saved = _sessions._TUPLE_UP_TO
    _sessions._TUPLE_UP_TO = threshold
    try:
        yield
    finally:
        _sessions._TUPLE_UP_TO = saved


@pytest.fixture(scope="module", params=THRESHOLDS)
def tuple_up_to(request: pytest.FixtureRequest) -> Iterator[int]:
    """A test that drives a whole agent runs once per threshold (the pure properties check
    both thresholds on each generated log: drawing the logs is most of their time)."""
    with histories_as_views_beyond(request.param):
        yield request.param


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One JSONL root for every example (fresh session ids each): a folder made, synced and
    removed per example was much of their time."""
    return tmp_path_factory.mktemp("sessions")


_ids = (f"s{n}" for n in itertools.count())


def full_derivation(events: Sequence[SessionEvent]) -> tuple[Message, ...]:
    """host-core §3, read straight off the log: user/message as-is, non-empty
    assistant/message, tool/result's message; every other event contributes nothing."""
    out: list[Message] = []
    for event in events:
        kind = event.type
        if kind == "user/message":
            out.append(event.data)
        elif kind == "tool/result" or (kind == "assistant/message" and event.data.message.content):
            out.append(event.data.message)
    return tuple(out)


def host() -> Context:
    h = Host()
    ctx = Context(h, h.root)
    ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
    return ctx


def reads_like(view: Sequence[Message], expected: tuple[Message, ...]) -> None:
    """``view`` reads exactly like the tuple ``expected`` (equality both ways, hash, length,
    indexing from either end, slices, iteration either way)."""
    assert view == expected and expected == view and (view != expected) is False
    assert hash(view) == hash(expected) and len(view) == len(expected)
    assert tuple(view) == expected and tuple(reversed(view)) == expected[::-1]
    assert view[1:] == expected[1:] and view[::-2] == expected[::-2]
    assert view + expected == expected * 2 == expected + view and view + view == expected * 2
    if expected:
        assert view[0] is expected[0] and view[-1] is expected[-1]


def append_all(session: Any, events: Sequence[SessionEvent]) -> None:
    for event in events:
        session.append(
            event.type,
            event.data,
            source_event_seqs=event.source_event_seqs,
            ignorable=event.ignorable,
        )


@given(session_logs(max_turns=4), session_logs(max_turns=2))
def test_live_history_equals_a_full_derivation_and_views_never_change(
    log: tuple[SessionEvent, ...], more: tuple[SessionEvent, ...]
) -> None:
    """host-core §3, acp 16 performance: after every append derive_messages() (a view, not
    a copy) equals a full derivation of the log so far, and every view taken earlier still
    equals the derivation of its own prefix."""
    for threshold in THRESHOLDS:
        with histories_as_views_beyond(threshold):
            _live_history_matches(log, more)


def _live_history_matches(log: tuple[SessionEvent, ...], more: tuple[SessionEvent, ...]) -> None:
    session = host().sessions.create("s")
    views: list[tuple[int, Sequence[Message]]] = [(0, session.derive_messages())]
    for event in log + more:
        append_all(session, [event])
        views.append((session.seq, session.derive_messages()))
    events = session.events
    for seq, view in views:
        reads_like(view, full_derivation(events[:seq]))
    last = views[-1][1]
    shape = MessageHistory if len(last) > _sessions._TUPLE_UP_TO else tuple
    assert last == last and isinstance(last, shape)
    seeded = host().sessions.create("t", seed=log).derive_messages()
    assert seeded == views[len(log)][1]
    assert seeded is not views[len(log)][1] or not seeded  # distinct (but for the empty tuple)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=40)
@given(session_logs(max_turns=4, open_end=True), session_logs(max_turns=2))
async def test_seeded_and_stored_histories_equal_a_full_derivation(
    store: Path, log: tuple[SessionEvent, ...], more: tuple[SessionEvent, ...]
) -> None:
    """host-core §3, §4, §5, acp 16 performance: a seeded session and one restored from a
    stored (repaired) JSONL log derive what a full derivation of their log gives, before and
    after new appends."""
    for threshold in THRESHOLDS:
        with histories_as_views_beyond(threshold):
            await _stored_history_matches(store, log, more)


async def _stored_history_matches(
    store: Path, log: tuple[SessionEvent, ...], more: tuple[SessionEvent, ...]
) -> None:
    header = SessionHeader(id=next(_ids), created_at=1)
    ctx = host()
    persistence = install_jsonl_persistence(ctx, store)
    await persistence.create(header)
    await persistence.append(header.id, log)
    loaded_header, loaded = await persistence.load(header.id)  # an open end comes back closed
    restored = ctx.sessions.prepare(restored=loaded_header, seed=loaded)
    reads_like(restored.derive_messages(), full_derivation(restored.events))
    before = restored.derive_messages()
    append_all(restored, _renumbered(more))
    reads_like(restored.derive_messages(), full_derivation(restored.events))
    reads_like(before, full_derivation(loaded))
    seeded = ctx.sessions.prepare(next(_ids), seed=loaded)
    reads_like(seeded.derive_messages(), full_derivation(seeded.events))
    await ctx.dispose()


def _renumbered(events: Sequence[SessionEvent]) -> list[SessionEvent]:
    """``events`` as a continuation: surface events cite nothing (their seqs were the old
    log's), so they can follow any log."""
    return [e if e.source_event_seqs is None else _uncited(e) for e in events]


def _uncited(event: SessionEvent) -> SessionEvent:
    import attrs

    return attrs.evolve(event, source_event_seqs=())


def _until_the_turn_ends(replies: list[str]) -> list[str]:
    """The replies a turn reaches: it ends at the first that calls no tool."""
    for i, kind in enumerate(replies):
        if kind not in ("tool", "two-tools", "steer"):
            return replies[: i + 1]
    return replies


#: One model reply in a generated conversation.
_REPLIES = st.sampled_from(["text", "empty", "tool", "two-tools", "fail", "hang", "steer"])
_TURNS = st.lists(st.lists(_REPLIES, min_size=1, max_size=4), min_size=1, max_size=5)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=30)
@given(turns=_TURNS, after_resume=_TURNS)
async def test_every_loop_request_carries_a_full_derivation_of_the_log(
    tuple_up_to: int, store: Path, turns: list[list[str]], after_resume: list[list[str]]
) -> None:
    """host-core §3, §9 (loop step 3), acp 16 performance: every request the loop sends
    carries messages equal to a full derivation of its log at that moment, over text, empty
    answers, tool calls, failed and aborted turns, steers, and a resume from a stored JSONL
    log."""
    plan: list[str] = []
    hanging = asyncio.Event()
    seen: list[tuple[tuple[Message, ...], Sequence[Message]]] = []
    holder: dict[str, Any] = {}

    async def hang() -> None:
        hanging.set()
        await asyncio.Event().wait()  # until the turn's abort ends the request

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        session = holder["host"].ctx.sessions.get(request.session_id)
        seen.append((full_derivation(session.events), request.messages))
        kind = plan.pop(0) if plan else "text"
        if kind == "empty":
            return ScriptedReply(text="")
        if kind in ("tool", "two-tools"):
            calls = [ScriptedToolCall(name="echo", arguments={"text": str(request.index)})]
            if kind == "two-tools":
                calls.append(ScriptedToolCall(name="echo", arguments={"text": "again"}))
            return ScriptedReply(
                text="calling" if request.index % 2 else None, tool_calls=tuple(calls)
            )
        if kind == "fail":
            return ScriptedReply(text="half", failure=LlmFailure(message="down", code="UNKNOWN"))
        if kind == "hang":
            plan.clear()  # the turn is cancelled while this request hangs
            return ScriptedReply(text="partial" if request.index % 2 else None, wait=hang)
        if kind == "steer":
            holder["agent"].steer(user_message(f"steer {request.index}"))
            return ScriptedReply(
                tool_calls=(ScriptedToolCall(name="echo", arguments={"text": "s"}),)
            )
        return f"answer {request.index}"

    async def echo(args: Any, run: ToolRunContext) -> str:
        return "echoed " + args["text"]

    async def converse(agent: Any, conversation: list[list[str]]) -> None:
        holder["agent"] = agent
        for i, drawn in enumerate(conversation):
            replies = _until_the_turn_ends(drawn)
            plan[:] = replies
            hanging.clear()
            agent.followup(user_message(f"turn {i}"))
            async with asyncio.timeout(10):
                if "hang" in replies:
                    await hanging.wait()
                    agent.cancel(USER)
                await agent.when_idle()
            reads_like(agent.session.derive_messages(), full_derivation(agent.session.events))

    async with scripted_host(model=model, store="jsonl", store_root=store) as h:
        holder["host"] = h
        h.ctx.tools.register(
            ToolDefinition(
                name="echo",
                description="Echo a text.",
                parameters={"type": "object", "properties": {"text": {"type": "string"}}},
                execute=echo,
            )
        )
        handle = await h.create_agent()
        session_id = handle.agent.id
        await converse(handle.agent, turns)
        await handle.dispose()
        resumed = await h.resume_agent(session_id)
        reads_like(
            resumed.agent.session.derive_messages(),
            full_derivation(resumed.agent.session.events),
        )
        await converse(resumed.agent, after_resume)
        await resumed.dispose()
    assert seen
    for expected, sent in seen:
        reads_like(sent, expected)
