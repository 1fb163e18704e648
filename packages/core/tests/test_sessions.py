"""The session log and the live store (host-core §3, §4)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core import (
    AssistantMessageData,
    Context,
    EndSeedData,
    EpochHeader,
    EventTypeRegistry,
    EventTypeSpec,
    Host,
    LlmCallConfig,
    Message,
    ModelSource,
    RequestHeaderData,
    Session,
    SessionError,
    SessionEvent,
    SessionHeader,
    SessionMeta,
    SessionStoreService,
    StepData,
    TextBlock,
    TurnStartData,
    user_message,
)
from dsh_core.testing.strategies import LogBuilder

MODEL = ModelSource(provider="p", model="m")


def make_ctx(types: EventTypeRegistry | None = None) -> Context:
    host = Host()
    ctx = Context(host, host.root)
    ctx.provide("sessions", SessionStoreService(types or EventTypeRegistry()))
    return ctx


def record(ctx: Context, *names: str) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []
    for name in names:
        ctx.on(name, lambda *args, name=name: seen.append((name, args)), global_=True)
    return seen


def balanced_log() -> tuple[SessionEvent, ...]:
    log = LogBuilder()
    log.turn_start()
    log.step_start()
    log.user("hi")
    log.assistant("hello", calls=[("c1", "read")])
    log.tool_call("c1", "read")
    log.tool_result("c1", "contents")
    log.step_end()
    log.turn_end()
    return log.events


# -- append ---------------------------------------------------------------------------------------


def test_append_assigns_seq_and_time() -> None:
    """host-core §3: append gives seq = log length and an epoch-ms time."""
    session = make_ctx().sessions.create("s")
    first = session.append("turn/start", TurnStartData(turn=1))
    second = session.append("step/start", StepData(turn=1, step=1))
    assert (first.seq, second.seq, session.seq) == (0, 1, 2)
    assert first.time > 1_600_000_000_000
    assert session.events == (first, second)
    assert session.event(1) is second
    assert list(session.events_since(1)) == [second]


def test_append_refuses_non_json_data_and_writes_nothing() -> None:
    """host-core §3: non-lossless JSON data fails SESSION_EVENT_NOT_JSON; nothing is written."""
    ctx = make_ctx()
    seen = record(ctx, "session/event")
    session = ctx.sessions.create("s")
    for bad in ({"x": math.nan}, {"x": -0.0}, {1: "int key"}, {"x": object()}):
        with pytest.raises(SessionError) as info:
            session.append("plugin/note", bad, ignorable=True)
        assert info.value.code == "SESSION_EVENT_NOT_JSON"
    assert session.seq == 0
    assert seen == []


def test_append_freezes_free_form_data() -> None:
    """host-core §3: free-form data is stored as a frozen copy the caller cannot mutate."""
    session = make_ctx().sessions.create("s")
    data: dict[str, Any] = {"items": [1, 2]}
    event = session.append("plugin/note", data, ignorable=True)
    data["items"].append(3)
    assert event.data["items"] == (1, 2)
    with pytest.raises(TypeError):
        event.data["new"] = 1


def test_append_refuses_unknown_required_type() -> None:
    """host-core §3: an unregistered type may be appended only as ignorable."""
    session = make_ctx().sessions.create("s")
    with pytest.raises(SessionError) as info:
        session.append("plugin/note", {})
    assert info.value.code == "SESSION_EVENT_UNKNOWN_TYPE"
    assert session.seq == 0
    assert session.append("plugin/note", {}, ignorable=True).ignorable


def test_append_refuses_wrong_payload_class() -> None:
    """host-core §3: a typed event's data must be its registered payload class."""
    session = make_ctx().sessions.create("s")
    with pytest.raises(SessionError) as info:
        session.append("turn/start", {"turn": 1})
    assert info.value.code == "SESSION_EVENT_INVALID"
    assert session.seq == 0


def test_surface_metadata_is_required_exactly_on_surface_types() -> None:
    """host-core §3: surface metadata is required exactly on surface types, citing real events."""
    session = make_ctx().sessions.create("s")
    message = user_message("hi")
    with pytest.raises(SessionError) as missing:
        session.append("user/message", message)
    with pytest.raises(SessionError) as extra:
        session.append("turn/start", TurnStartData(turn=1), source_event_seqs=())
    with pytest.raises(SessionError) as dangling:
        session.append("user/message", message, source_event_seqs=(0,))
    assert {missing.value.code, extra.value.code, dangling.value.code} == {"SESSION_SURFACE"}
    assert session.seq == 0
    event = session.append("user/message", message, source_event_seqs=())
    assert (event.source_event_seqs, event.surface_op) == ((), "append")
    plain = session.append("turn/start", TurnStartData(turn=1))
    assert (plain.source_event_seqs, plain.surface_op) == (None, None)


@given(
    surface=st.sampled_from([True, False, 1, 0]),  # a plugin may spell a flag as an int
    trusted=st.booleans(),
    seqs=st.sampled_from([None, (), (0,), (1,), (-1,), (0, 1)]),
)
def test_every_append_path_applies_the_surface_rule(
    surface: Any, trusted: bool, seqs: tuple[int, ...] | None
) -> None:
    """host-core §3: trusted or not, a type's events carry surface metadata iff it is a
    surface type, and cite only events that exist; anything else fails SESSION_SURFACE."""
    types = EventTypeRegistry()
    types.register(
        EventTypeSpec(name="x/plugin", payload=StepData, surface=surface, trusted=trusted)
    )
    session = make_ctx(types).sessions.create("s")
    session.append("turn/start", TurnStartData(turn=1))
    valid = (seqs is not None) == bool(surface) and all(0 <= q < 1 for q in seqs or ())
    if not valid:
        with pytest.raises(SessionError) as info:
            session.append("x/plugin", StepData(turn=1, step=1), source_event_seqs=seqs)
        assert info.value.code == "SESSION_SURFACE"
        assert session.seq == 1
        return
    event = session.append("x/plugin", StepData(turn=1, step=1), source_event_seqs=seqs)
    assert event.source_event_seqs == seqs
    assert event.surface_op == ("append" if surface else None)


def test_validator_vetoes_before_commit() -> None:
    """host-core §3: a pre-commit validator that raises vetoes the append; nothing is written."""
    ctx = make_ctx()
    seen = record(ctx, "session/event")
    session = ctx.sessions.create("s")

    def refuse(_: Session, event: SessionEvent) -> None:
        if event.type == "step/start":
            raise ValueError("no steps")

    remove = session.add_validator(refuse)
    session.append("turn/start", TurnStartData(turn=1))
    with pytest.raises(ValueError):
        session.append("step/start", StepData(turn=1, step=1))
    assert [e.type for e in session.events] == ["turn/start"]
    assert [args[1].type for _, args in seen] == ["turn/start"]
    remove()
    session.append("step/start", StepData(turn=1, step=1))
    assert session.seq == 2


def test_session_event_is_published_after_commit() -> None:
    """host-core §3: session/event listeners see the committed event (already in the log)."""
    ctx = make_ctx()
    observed: list[tuple[int, int]] = []
    ctx.on("session/event", lambda s, e: observed.append((e.seq, s.seq)), global_=True)
    session = ctx.sessions.create("s")
    session.append("turn/start", TurnStartData(turn=1))
    assert observed == [(0, 1)]


def test_reentrant_append_is_refused_and_writes_nothing() -> None:
    """host-core §3: re-entrant append from session/event fails SESSION_REENTRANT_APPEND."""
    ctx = make_ctx()
    errors: list[SessionError] = []

    def listener(session: Session, event: SessionEvent) -> None:
        try:
            session.append("plugin/echo", {"of": event.seq}, ignorable=True)
        except SessionError as exc:
            errors.append(exc)

    ctx.on("session/event", listener, global_=True)
    session = ctx.sessions.create("s")
    session.append("turn/start", TurnStartData(turn=1))
    assert [e.code for e in errors] == ["SESSION_REENTRANT_APPEND"]
    assert [e.type for e in session.events] == ["turn/start"]
    session.append("step/start", StepData(turn=1, step=1))  # the guard is released afterwards
    assert session.seq == 2


def test_the_loops_own_append_is_refused_inside_a_publication_too() -> None:
    """host-core §3 (hardening 11.1): the agent loop's unchecked append (``_append_vouched``)
    from inside the session's own session/event publication fails SESSION_REENTRANT_APPEND
    like any append, and writes nothing."""
    ctx = make_ctx()
    errors: list[SessionError] = []

    def listener(session: Session, event: SessionEvent) -> None:
        try:
            session._append_vouched("step/start", StepData(turn=1, step=event.seq + 1))
        except SessionError as exc:
            errors.append(exc)

    ctx.on("session/event", listener, global_=True)
    session = ctx.sessions.create("s")
    session._append_vouched("turn/start", TurnStartData(turn=1))
    assert [e.code for e in errors] == ["SESSION_REENTRANT_APPEND"]
    assert [e.type for e in session.events] == ["turn/start"]


def test_watchers_see_only_their_types_after_the_listeners_and_stop_when_removed() -> None:
    """host-core §3: ``Session.watch`` is a post-commit observer of one session: called for
    its types only, after the ``session/event`` listeners, through either append, published
    or not; its remover stops it."""
    ctx = make_ctx()
    order: list[str] = []
    ctx.on("session/event", lambda s, e: order.append(f"listener {e.type}"), global_=True)
    session = ctx.sessions.prepare("s")
    remove = session.watch(["step/start", "turn/start"], lambda e: order.append(f"watch {e.type}"))
    session.append("turn/start", TurnStartData(turn=1))  # not published yet: no listener
    ctx.sessions.enter(session)
    session._append_vouched("step/start", StepData(turn=1, step=1))
    session.append("user/message", user_message("hi"), source_event_seqs=())
    remove()
    session.append("step/end", StepData(turn=1, step=1))
    session._append_vouched("step/start", StepData(turn=1, step=2))
    assert order == [
        "watch turn/start",
        "listener step/start",
        "watch step/start",
        "listener user/message",
        "listener step/end",
        "listener step/start",
    ]


def test_a_watcher_cannot_append_and_its_failure_is_contained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """host-core §3: inside a watcher the session refuses appends (SESSION_REENTRANT_APPEND,
    nothing written), and a watcher that raises is logged; the append and the watchers after
    it are unaffected."""
    ctx = make_ctx()
    session = ctx.sessions.create("s")
    errors: list[str] = []
    seen: list[int] = []

    def appends(event: SessionEvent) -> None:
        try:
            session._append_vouched("step/start", StepData(turn=1, step=1))
        except SessionError as exc:
            errors.append(exc.code)
        raise RuntimeError("watcher broke")

    session.watch(["turn/start"], appends)
    session.watch(["turn/start"], lambda e: seen.append(e.seq))
    event = session.append("turn/start", TurnStartData(turn=1))
    assert errors == ["SESSION_REENTRANT_APPEND"]
    assert seen == [0] and event.seq == 0
    assert [e.type for e in session.events] == ["turn/start"]
    assert "watcher of session 's' failed" in caplog.text
    session.append("step/start", StepData(turn=1, step=1))  # released afterwards
    assert session.seq == 2


def test_the_loops_own_append_runs_validators_and_needs_the_core_types() -> None:
    """host-core §3 (hardening 11.1): ``_append_vouched`` skips only the payload check: a
    validator still vetoes it, and on a registry that does not hold the core types as core
    declares them it takes ``append``'s checked route (here SESSION_EVENT_INVALID)."""
    session = make_ctx().sessions.create("s")
    session._append_vouched("turn/start", TurnStartData(turn=1))
    assert [(e.type, e.source_event_seqs) for e in session.events] == [("turn/start", None)]

    def veto(_: Session, event: SessionEvent) -> None:
        raise ValueError(f"no {event.type}")

    remove = session.add_validator(veto)
    with pytest.raises(ValueError, match="no step/start"):
        session._append_vouched("step/start", StepData(turn=1, step=1))
    remove()
    assert session.seq == 1

    odd = EventTypeRegistry([EventTypeSpec(name="turn/start", payload=StepData, trusted=True)])
    assert not odd._core and EventTypeRegistry()._core
    other = make_ctx(odd).sessions.create("s")
    with pytest.raises(SessionError) as raised:
        other._append_vouched("turn/start", TurnStartData(turn=1))
    assert raised.value.code == "SESSION_EVENT_INVALID"
    assert other.seq == 0


def test_appending_to_another_session_from_a_listener_is_allowed() -> None:
    """host-core §3: the re-entrancy guard is per session."""
    ctx = make_ctx()
    other = ctx.sessions.create("other")

    def mirror(session: Session, event: SessionEvent) -> None:
        if session is not other:
            other.append("plugin/mirror", {"seq": event.seq}, ignorable=True)

    ctx.on("session/event", mirror, global_=True)
    ctx.sessions.create("s").append("turn/start", TurnStartData(turn=1))
    assert [e.data["seq"] for e in other.events] == [0]


def test_observer_errors_are_contained() -> None:
    """host-core §3: a failing session/event observer does not undo or fail the append."""
    ctx = make_ctx()

    def boom(*_: object) -> None:
        raise RuntimeError("observer failed")

    ctx.on("session/event", boom, global_=True)
    session = ctx.sessions.create("s")
    session.append("turn/start", TurnStartData(turn=1))
    assert session.seq == 1


# -- derived views --------------------------------------------------------------------------------


def test_derive_messages_rules() -> None:
    """host-core §3: derive_messages yields user, non-empty assistant and tool-result messages."""
    session = make_ctx().sessions.create("s")
    log = LogBuilder()
    log.turn_start()
    log.step_start()
    prompt = log.user("question")
    log.chunk("tok")
    log.assistant("")  # empty content: logged, not derived
    log.step_end()
    log.step_start()
    answer = log.assistant("calling", calls=[("c1", "read")])
    log.tool_call("c1", "read")
    result = log.tool_result("c1", "text")
    log.step_end()
    log.turn_end()
    for event in log.events:
        session.append(event.type, event.data, source_event_seqs=event.source_event_seqs)
    assert [e.type for e in session.events].count("assistant/message") == 2
    assert session.derive_messages() == (
        prompt.data,
        answer.data.message,
        result.data.message,
    )


def test_request_header_is_the_latest() -> None:
    """host-core §3: request_header() returns the envelope of the latest request/header."""
    session = make_ctx().sessions.create("s")
    assert session.request_header() is None
    first = EpochHeader(config=LlmCallConfig(provider="p", model="a"))
    second = EpochHeader(config=LlmCallConfig(provider="p", model="b"), system="be brief")
    session.append("turn/start", TurnStartData(turn=1))
    session.append("request/header", RequestHeaderData(header=first, reason="initial"))
    session.append("request/header", RequestHeaderData(header=second, reason="change"))
    assert session.request_header() == second


# -- seeds ----------------------------------------------------------------------------------------


def test_seed_is_loaded_then_end_seed_appended() -> None:
    """host-core §4: a seeded session holds the seed, then session/end-seed at first_live_seq."""
    seed = balanced_log()
    session = make_ctx().sessions.create("s", seed=seed)
    assert session.events[: len(seed)] == seed
    assert session.events[-1].type == "session/end-seed"
    assert session.events[-1].seq == len(seed)
    assert session.first_live_seq == len(seed)
    assert [m.role for m in session.derive_messages()] == ["user", "assistant", "tool"]


def test_explicit_empty_seed_writes_end_seed_at_zero() -> None:
    """host-core §3: an explicit empty seed writes session/end-seed at seq 0; no seed, nothing."""
    ctx = make_ctx()
    seeded = ctx.sessions.create("a", seed=())
    assert [(e.type, e.seq) for e in seeded.events] == [("session/end-seed", 0)]
    assert seeded.first_live_seq == 0
    assert ctx.sessions.create("b").events == ()


def test_seed_ending_with_end_seed_gets_no_second_one() -> None:
    """host-core §4: a seed that already ends with session/end-seed is not given another."""
    log = LogBuilder()
    log.turn_start()
    log.turn_end()
    log.end_seed()
    session = make_ctx().sessions.create("s", seed=log.events)
    assert session.events == log.events


def test_seed_must_be_contiguous_from_zero() -> None:
    """host-core §4: a seed whose seqs are not 0..n-1 is refused (SESSION_SEED_INVALID)."""
    seed = balanced_log()
    gap = seed[:2] + seed[3:]
    with pytest.raises(SessionError) as info:
        make_ctx().sessions.create("s", seed=gap)
    assert info.value.code == "SESSION_SEED_INVALID"


@pytest.mark.parametrize("cut", ["open turn", "open step", "pending call"])
def test_seed_must_be_balanced(cut: str) -> None:
    """host-core §4: a seed with an open turn, open step or unanswered call is refused."""
    log = LogBuilder()
    log.turn_start()
    if cut != "open turn":
        log.step_start()
    if cut == "pending call":
        log.assistant(calls=[("c1", "t")])
        log.tool_call("c1", "t")
    ctx = make_ctx()
    with pytest.raises(SessionError) as info:
        ctx.sessions.create("s", seed=log.events)
    assert info.value.code == "SESSION_SEED_INVALID"
    assert ctx.sessions.get("s") is None


def test_seed_must_be_lossless_and_surface_valid() -> None:
    """host-core §4: seed events are lossless JSON with correct surface metadata."""
    ctx = make_ctx()
    not_json = SessionEvent(type="plugin/x", seq=0, time=1, data={"x": math.inf}, ignorable=True)
    with pytest.raises(SessionError) as info:
        ctx.sessions.create("a", seed=[not_json])
    assert info.value.code == "SESSION_EVENT_NOT_JSON"
    no_surface = SessionEvent(type="user/message", seq=0, time=1, data=user_message("x"))
    with pytest.raises(SessionError) as info:
        ctx.sessions.create("b", seed=[no_surface])
    assert info.value.code == "SESSION_SEED_INVALID"
    unknown = SessionEvent(type="plugin/x", seq=0, time=1, data={})
    with pytest.raises(SessionError) as info:
        ctx.sessions.create("c", seed=[unknown])
    assert info.value.code == "SESSION_FORMAT_UNSUPPORTED"


def test_seed_free_form_data_is_frozen() -> None:
    """host-core §3: seeded free-form data is stored frozen, immune to the caller's mutations."""
    data: dict[str, Any] = {"n": [1]}
    event = SessionEvent(type="plugin/x", seq=0, time=1, data=data, ignorable=True)
    session = make_ctx().sessions.create("s", seed=[event])
    data["n"].append(2)
    assert session.events[0].data["n"] == (1,)


# -- the store ------------------------------------------------------------------------------------


def test_prepare_is_unpublished() -> None:
    """host-core §3: prepare builds a session that is neither stored nor announced."""
    ctx = make_ctx()
    seen = record(ctx, "session/created", "session/event")
    session = ctx.sessions.prepare("s")
    session.append("turn/start", TurnStartData(turn=1))
    assert not session.published
    assert ctx.sessions.get("s") is None
    assert ctx.sessions.list() == []
    assert seen == []


def test_prepare_mints_ids_and_builds_the_header() -> None:
    """host-core §3: an omitted id is minted as session-<n>; meta fields land in the header."""
    ctx = make_ctx()
    meta = SessionMeta(
        cwd="/srv/project", parent_session="p", seed_length=0, origin="subagent", delegation_depth=1
    )
    first = ctx.sessions.prepare(meta=meta)
    second = ctx.sessions.prepare()
    assert first.id.startswith("session-") and first.id != second.id
    header = first.header
    assert (header.cwd, header.parent_session, header.origin) == ("/srv/project", "p", "subagent")
    assert (header.seed_length, header.delegation_depth, header.version) == (0, 1, 1)
    assert header.created_at > 1_600_000_000_000


def test_prepare_refuses_relative_cwd() -> None:
    """host-core §3: a relative cwd fails (SESSION_INVALID_CWD)."""
    with pytest.raises(SessionError) as info:
        make_ctx().sessions.prepare("s", meta=SessionMeta(cwd="relative/dir"))
    assert info.value.code == "SESSION_INVALID_CWD"


def test_duplicate_live_id_fails() -> None:
    """host-core §3: prepare, enter and create refuse an id that is already live."""
    ctx = make_ctx()
    ctx.sessions.create("s")
    with pytest.raises(SessionError) as prepared:
        ctx.sessions.prepare("s")
    with pytest.raises(SessionError) as created:
        ctx.sessions.create("s")
    assert prepared.value.code == created.value.code == "DUPLICATE_SESSION"


def test_enter_rechecks_duplicates() -> None:
    """host-core §3: enter re-checks the id, so two prepared twins cannot both go live."""
    ctx = make_ctx()
    a = ctx.sessions.prepare("s")
    b = ctx.sessions.prepare("s")
    ctx.sessions.enter(a)
    with pytest.raises(SessionError) as info:
        ctx.sessions.enter(b)
    assert info.value.code == "DUPLICATE_SESSION"
    assert ctx.sessions.get("s") is a


def test_restored_header_is_kept() -> None:
    """host-core §3: prepare(restored=header) rebuilds a session under its stored header."""
    header = SessionHeader(id="old", created_at=5, parent_session="p", seed_length=3)
    session = make_ctx().sessions.prepare("old", seed=balanced_log(), restored=header)
    assert session.header is header


def test_enter_publishes_and_detach_removes() -> None:
    """host-core §3: enter publishes, detach removes; no session/disposed without an announce."""
    ctx = make_ctx()
    seen = record(ctx, "session/event", "session/disposed")
    session = ctx.sessions.prepare("s")
    detach = ctx.sessions.enter(session)
    assert ctx.sessions.get("s") is session and session.published
    session.append("turn/start", TurnStartData(turn=1))
    detach()
    detach()  # idempotent
    assert ctx.sessions.get("s") is None and not session.published
    assert [name for name, _ in seen] == ["session/event"]


def test_announce_emits_created_once_and_disposed_pairs() -> None:
    """host-core §3: announce emits session/created once; detach pairs it with session/disposed."""
    ctx = make_ctx()
    seen = record(ctx, "session/created", "session/disposed")
    session = ctx.sessions.prepare("s")
    detach = ctx.sessions.enter(session)
    ctx.sessions.announce(session)
    ctx.sessions.announce(session)
    detach()
    assert [name for name, _ in seen] == ["session/created", "session/disposed"]


def test_announce_needs_an_entered_session() -> None:
    """host-core §3: announcing a session that is not entered fails (SESSION_NOT_LIVE)."""
    ctx = make_ctx()
    with pytest.raises(SessionError) as info:
        ctx.sessions.announce(ctx.sessions.prepare("s"))
    assert info.value.code == "SESSION_NOT_LIVE"


def test_vetoing_created_listener_rolls_back_with_paired_disposed() -> None:
    """host-core §3: a raising session/created listener vetoes; rollback emits session/disposed."""
    ctx = make_ctx()
    seen = record(ctx, "session/created", "session/disposed")

    def veto(session: Session) -> None:
        raise PermissionError("not this one")

    remove = ctx.on("session/created", veto, global_=True)
    with pytest.raises(PermissionError):
        ctx.sessions.create("s")
    assert ctx.sessions.get("s") is None
    assert [name for name, _ in seen] == ["session/created", "session/disposed"]
    remove()
    assert ctx.sessions.create("s").id == "s"  # the id is free again


async def test_create_is_owned_by_the_calling_context() -> None:
    """host-core §3: create = prepare + enter + announce, owned by the calling context."""
    ctx = make_ctx()
    seen = record(ctx, "session/created", "session/disposed")
    owner = ctx.plugin("owner")
    session = owner.sessions.create("s")
    assert ctx.sessions.get("s") is session
    await owner.dispose()
    assert ctx.sessions.get("s") is None
    assert [name for name, _ in seen] == ["session/created", "session/disposed"]


async def test_create_on_a_disposed_context_leaves_nothing_live() -> None:
    """host-core §3: create through a disposed owner fails and no session stays published."""
    ctx = make_ctx()
    seen = record(ctx, "session/created", "session/disposed")
    owner = ctx.plugin("owner")
    await owner.dispose()
    with pytest.raises(Exception) as info:
        owner.sessions.create("s")
    assert getattr(info.value, "code", None) == "INACTIVE_EFFECT"
    assert ctx.sessions.get("s") is None
    assert seen == []  # refused before anyone was told


def test_get_and_list_in_creation_order() -> None:
    """host-core §3: get returns a live session or None; list is in creation order."""
    ctx = make_ctx()
    b = ctx.sessions.create("b")
    a = ctx.sessions.create("a")
    assert ctx.sessions.list() == [b, a]
    assert ctx.sessions.get("a") is a and ctx.sessions.get("zzz") is None


async def test_flush_reports_whether_any_listener_took_part() -> None:
    """host-core §3: flush runs session/flush and returns whether any listener took part."""
    ctx = make_ctx()
    session = ctx.sessions.create("s")
    assert await ctx.sessions.flush(session) is False
    flushed: list[Session] = []

    async def listener(s: Session) -> None:
        flushed.append(s)

    ctx.on("session/flush", listener, global_=True)
    assert await ctx.sessions.flush(session) is True
    assert flushed == [session]


async def test_flush_raises_first_failure_after_all_settle() -> None:
    """host-core §3: flush waits for every listener, then raises the first failure."""
    ctx = make_ctx()
    session = ctx.sessions.create("s")
    finished: list[str] = []

    async def slow_ok(_: Session) -> None:
        for _ in range(3):
            await _yield()
        finished.append("ok")

    async def fails(_: Session) -> None:
        finished.append("first")
        raise OSError("disk full")

    async def fails_later(_: Session) -> None:
        await _yield()
        finished.append("second")
        raise ValueError("later")

    ctx.on("session/flush", fails, global_=True)
    ctx.on("session/flush", slow_ok, global_=True)
    ctx.on("session/flush", fails_later, global_=True)
    with pytest.raises(OSError, match="disk full"):
        await ctx.sessions.flush(session)
    assert sorted(finished) == ["first", "ok", "second"]


async def _yield() -> None:
    """Give other tasks one turn of the loop (not a timed wait)."""
    import asyncio

    await asyncio.sleep(0)


def test_events_snapshot_is_immutable() -> None:
    """host-core §3: events is an immutable snapshot that later appends do not change."""
    session = make_ctx().sessions.create("s")
    session.append("turn/start", TurnStartData(turn=1))
    snapshot = session.events
    session.append("step/start", StepData(turn=1, step=1))
    assert isinstance(snapshot, tuple) and len(snapshot) == 1
    assert len(session.events) == 2


def test_plugin_event_types_register_through_the_registry() -> None:
    """host-core §3: a registered plugin type with a payload class is appended typed."""
    registry = EventTypeRegistry()
    registry.register(EventTypeSpec(name="plugin/seed-marker", payload=EndSeedData))
    session = make_ctx(registry).sessions.create("s")
    event = session.append("plugin/seed-marker", EndSeedData())
    assert isinstance(event.data, EndSeedData) and not event.ignorable
    with pytest.raises(SessionError) as info:
        registry.register(EventTypeSpec(name="plugin/seed-marker", payload=None))
    assert info.value.code == "DUPLICATE_EVENT_TYPE"


def test_assistant_message_payload_round_trip_fields() -> None:
    """host-core §3: assistant/message keeps usage and interrupted flags."""
    session = make_ctx().sessions.create("s")
    session.append("turn/start", TurnStartData(turn=1))
    session.append("step/start", StepData(turn=1, step=1))
    message = Message(id="m", role="assistant", content=(TextBlock(text="x"),), source=MODEL)
    data = AssistantMessageData(turn=1, step=1, message=message, interrupted=True)
    event = session.append("assistant/message", data, source_event_seqs=())
    assert event.data.interrupted and session.derive_messages() == (message,)
