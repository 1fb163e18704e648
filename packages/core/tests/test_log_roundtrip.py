"""What an append commits, the JSONL log writes and reads back (host-core §3, §5; hardening 11).

Every payload ``Session.append`` accepts must survive the JSONL backend: written, read back,
equal. Anything else is refused at the append with a documented code, and a line that nests
deeper than the payload limit allows is ``SESSION_CORRUPT`` on load, never a ``RecursionError``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dsh_core import (
    ContentBlock,
    Context,
    EventTypeRegistry,
    Host,
    InboxSplicedData,
    Message,
    NotJsonError,
    PluginSource,
    SessionError,
    SessionEvent,
    SessionHeader,
    SessionMeta,
    SessionStoreService,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    TurnStartData,
    UnknownBlock,
    UserSource,
    _agent,
    _content,
    text_blocks,
    user_message,
)
from dsh_core._codec import class_checker
from dsh_core._events import TurnEndData, make_event
from dsh_core._inbox import Inbox
from dsh_core._json import MAX_INT_DIGITS, MAX_NESTING
from dsh_core._persistence import install_jsonl_persistence, install_memory_persistence
from dsh_core.testing import scripted_host

BACKENDS = ["memory", "jsonl"]
#: The codes an append may refuse a payload with (docs/sessions.md, "Payload limits").
REFUSALS = {"SESSION_EVENT_NOT_JSON", "SESSION_EVENT_INVALID"}


class Env:
    """A host with the sessions store and one persistence backend."""

    def __init__(self, kind: str, root: Path) -> None:
        self.root = root
        self.host = Host()
        self.ctx = Context(self.host, self.host.root)
        self.ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
        self.persistence = (
            install_memory_persistence(self.ctx)
            if kind == "memory"
            else install_jsonl_persistence(self.ctx, root)
        )
        self.owner = self.ctx.plugin("owner")

    async def reloaded(self, id: str) -> tuple[SessionEvent, ...]:
        """The stored log of ``id`` as a fresh backend on the same storage reads it."""
        _, events = await self.persistence.inspect(id)
        return events

    async def close(self) -> None:
        await self.ctx.dispose()
        await self.host.drain_tasks()


@pytest.fixture(params=BACKENDS)
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    """Each backend in turn (JSONL under a temporary root)."""
    return Env(request.param, tmp_path / "sessions")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One JSONL root for every example of the properties, each example's sessions under
    fresh ids (a folder made, synced and removed per example was most of their time)."""
    return tmp_path_factory.mktemp("sessions")


_ids = (f"s{n}" for n in itertools.count())


def nested(depth: int, leaf: object = 0) -> object:
    """A JSON value with ``depth`` nested arrays around ``leaf``."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def block_chain(depth: int) -> ToolResultBlock:
    """``depth`` tool-result blocks, each inside the previous one's content."""
    block = ToolResultBlock(tool_call_id="c", content=())
    for _ in range(depth - 1):
        block = ToolResultBlock(tool_call_id="c", content=(block,))
    return block


# -- 11.1: core payloads the writer cannot encode or the reader cannot decode --------------------

BAD_MESSAGES: dict[str, Callable[[], Message]] = {
    "str-in-content": lambda: user_message(["hi"]),  # type: ignore[list-item]
    "dict-in-content": lambda: user_message([{"type": "text", "text": "hi"}]),  # type: ignore[list-item]
    "int-text": lambda: user_message([TextBlock(text=5)]),  # type: ignore[arg-type]
    "list-content": lambda: Message(id="m", role="user", content=[TextBlock(text="hi")]),  # type: ignore[arg-type]
    "unknown-role": lambda: Message(id="m", role="boss", content=()),  # type: ignore[arg-type]
    "int-id": lambda: Message(id=7, role="user", content=()),  # type: ignore[arg-type]
    "base-block": lambda: user_message([ContentBlock()]),
    "unknown-block-with-a-known-tag": lambda: user_message(
        [UnknownBlock(type="text", fields={"text": "hi"})]
    ),
    "unknown-block-shadowing-its-tag": lambda: user_message(
        [UnknownBlock(type="x", fields={"type": "y"})]
    ),
    "nan-text": lambda: user_message([TextBlock(text=math.nan)]),  # type: ignore[arg-type]
    "bool-flag-as-str": lambda: user_message(
        [ToolResultBlock(tool_call_id="c", content=(), is_error="yes")]  # type: ignore[arg-type]
    ),
    "source-field": lambda: user_message("hi", source=PluginSource(plugin=3)),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("make", BAD_MESSAGES.values(), ids=BAD_MESSAGES.keys())
async def test_append_refuses_a_core_payload_the_log_cannot_read_back(
    env: Env, make: Callable[[], Message]
) -> None:
    """hardening 11.1, host-core §3: a typed payload that would not read back equal is refused
    at the append (SESSION_EVENT_INVALID / NOT_JSON); later events are stored as usual."""
    session = env.owner.sessions.create("s")
    with pytest.raises(SessionError) as info:
        session.append("user/message", make(), source_event_seqs=())
    assert info.value.code in REFUSALS
    assert session.seq == 0
    session.append("user/message", user_message("fine"), source_event_seqs=())
    await env.owner.sessions.flush(session)
    assert await env.reloaded("s") == session.events
    await env.close()


@pytest.mark.parametrize("store", BACKENDS)
async def test_a_followup_the_log_cannot_hold_is_refused_and_the_agent_goes_on(
    tmp_path: Path, store: Literal["memory", "jsonl"]
) -> None:
    """hardening 11.1, host-core §3/§9: agent.followup(user_message([{...}])) is refused at
    once (SESSION_EVENT_INVALID); the agent's next turn runs and its whole log is stored."""
    async with scripted_host(model=lambda _: "ok", store=store, store_root=tmp_path) as host:
        handle = await host.create_agent()
        agent = handle.agent
        with pytest.raises(SessionError) as info:
            agent.followup(user_message([{"type": "text", "text": "hi"}]))  # type: ignore[list-item]
        assert info.value.code == "SESSION_EVENT_INVALID"
        agent.followup(user_message("fine"))
        async with asyncio.timeout(10):
            await agent.when_idle()
        assert agent.session.events[-1].type == "turn/end"
        await host.ctx.sessions.flush(agent.session)
        _, stored = await host.ctx.session_persistence.inspect(agent.session.id)
        assert stored == agent.session.events
        await handle.dispose()


async def test_append_refuses_a_wrong_field_type_in_a_nested_core_payload(env: Env) -> None:
    """hardening 11.1, host-core §3: the check reaches nested payloads (an inbox splice's
    inserted messages) and scalar fields (an int turn)."""
    session = env.owner.sessions.create("s")
    bad = InboxSplicedData(target="next-turn", start=0, inserted=(user_message(["hi"]),))  # type: ignore[list-item]
    for type_, data in (("agent/inbox/spliced", bad), ("turn/start", TurnStartData(turn="1"))):  # type: ignore[arg-type]
        with pytest.raises(SessionError) as info:
            session.append(type_, data)
        assert info.value.code == "SESSION_EVENT_INVALID"
    assert session.seq == 0
    await env.close()


async def test_append_refuses_an_int_the_writer_cannot_print(env: Env) -> None:
    """hardening 11.1, host-core §3: an int of more than MAX_INT_DIGITS digits is refused
    (SESSION_EVENT_NOT_JSON); one of exactly that many round-trips."""
    session = env.owner.sessions.create("s")
    for huge in (10**5000, -(10**MAX_INT_DIGITS)):
        with pytest.raises(SessionError) as info:
            session.append("x/n", {"n": huge}, ignorable=True)
        assert info.value.code == "SESSION_EVENT_NOT_JSON"
    session.append("x/n", {"n": 10**MAX_INT_DIGITS - 1}, ignorable=True)
    await env.owner.sessions.flush(session)
    assert await env.reloaded("s") == session.events
    await env.close()


async def test_an_event_the_writer_cannot_encode_is_reported_and_does_not_block_the_rest(
    tmp_path: Path,
) -> None:
    """hardening 11.1, host-core §5: an encode failure is SESSION_IO naming the event (type
    and seq), written as a session/unwritable stand-in; later flushes store later events."""
    env = Env("jsonl", tmp_path)
    session = env.owner.sessions.create("s")
    session.append("x/n", {"n": 10**700}, ignorable=True)  # fine when appended
    session.append("x/n", {"n": 1}, ignorable=True)
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)  # the process changed under the log: now unprintable
    try:
        with pytest.raises(SessionError) as info:
            await env.owner.sessions.flush(session)
    finally:
        sys.set_int_max_str_digits(limit)
    assert info.value.code == "SESSION_IO"
    assert "x/n" in str(info.value) and "seq 0" in str(info.value)
    session.append("x/n", {"n": 2}, ignorable=True)
    await env.owner.sessions.flush(session)  # no retry of the bad batch, no error
    stored = await env.reloaded("s")
    assert stored[1:] == session.events[1:]
    assert stored[0].type == "session/unwritable" and stored[0].ignorable
    assert stored[0].data["type"] == "x/n" and stored[0].seq == 0
    await env.close()


async def test_an_unencodable_event_at_disposal_is_logged_and_stood_in_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """hardening 11.1, host-core §5: the last drain at disposal stores the stand-in too and
    logs what it could not encode (nothing left pending, nothing retried)."""
    env = Env("jsonl", tmp_path)
    session = env.owner.sessions.create("s")
    session.append("x/n", {"n": 10**700}, ignorable=True)
    session.append("x/n", {"n": 1}, ignorable=True)
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        with caplog.at_level(logging.ERROR, logger="dsh.sessions"):
            await env.owner.dispose()
            _, stored = await env.persistence.load("s")  # waits for the last drain
    finally:
        sys.set_int_max_str_digits(limit)
    assert [e.type for e in stored] == ["session/unwritable", "x/n"]
    assert stored[1] == session.events[1]
    assert "could not encode x/n at seq 0" in caplog.text
    await env.close()


async def test_seeds_and_cold_appends_are_held_to_the_same_rule(env: Env) -> None:
    """hardening 11.1, host-core §4/§5: a seed or a cold persistence.append carrying a typed
    payload the log cannot read back is refused like a live append."""
    bad = make_event("user/message", 0, 1, user_message(["hi"]), (), "append")  # type: ignore[list-item]
    with pytest.raises(SessionError) as info:
        env.ctx.sessions.create("seeded", seed=[bad])
    assert info.value.code == "SESSION_EVENT_INVALID"
    await env.persistence.create(SessionHeader(id="cold", created_at=1))
    with pytest.raises(SessionError) as info:
        await env.persistence.append("cold", [bad])
    assert info.value.code == "SESSION_APPEND_INVALID"
    assert await env.reloaded("cold") == ()
    await env.close()


# -- 11.2: depth ----------------------------------------------------------------------------------


async def test_append_takes_data_nested_to_the_limit_and_refuses_deeper(env: Env) -> None:
    """hardening 11.2, host-core §3: free-form data nests at most MAX_NESTING levels; deeper
    (even far deeper) is SESSION_EVENT_NOT_JSON, never a RecursionError."""
    session = env.owner.sessions.create("s")
    for depth in (MAX_NESTING + 1, 5_000, 100_000):
        with pytest.raises(SessionError) as info:
            session.append("x/deep", nested(depth), ignorable=True)
        assert info.value.code == "SESSION_EVENT_NOT_JSON"
    session.append("x/deep", nested(MAX_NESTING), ignorable=True)
    session.append("x/deep", {"a": nested(MAX_NESTING - 1)}, ignorable=True)
    await env.owner.sessions.flush(session)
    assert await env.reloaded("s") == session.events
    await env.close()


async def test_append_refuses_a_core_payload_nested_too_deep(env: Env) -> None:
    """hardening 11.2, host-core §3: the limit counts the whole payload, typed levels
    included (tool-result blocks inside tool-result blocks)."""
    session = env.owner.sessions.create("s")
    for depth in (MAX_NESTING // 2, 2_000):
        with pytest.raises(SessionError) as info:
            session.append("user/message", user_message([block_chain(depth)]), source_event_seqs=())
        assert info.value.code == "SESSION_EVENT_NOT_JSON"
    # message object, content array, then an object and an array per block: 2 + 2 * depth
    session.append(
        "user/message", user_message([block_chain(MAX_NESTING // 2 - 1)]), source_event_seqs=()
    )
    await env.owner.sessions.flush(session)
    assert await env.reloaded("s") == session.events
    await env.close()


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 100_000])
async def test_a_line_nested_deeper_than_the_limit_is_corrupt(tmp_path: Path, depth: int) -> None:
    """hardening 11.2, host-core §5: a stored line nesting deeper than the limit allows is
    SESSION_CORRUPT naming file and line, never a RecursionError (inspect and load)."""
    env = Env("jsonl", tmp_path)
    session = env.owner.sessions.create("s")
    session.append("x/deep", nested(MAX_NESTING), ignorable=True)
    await env.owner.sessions.flush(session)
    await env.owner.dispose()
    path = tmp_path / "s.jsonl"
    data = "[" * depth + "0" + "]" * depth
    line = f'{{"type":"x/deep","seq":1,"time":1,"data":{data},"ignorable":true}}\n'
    path.write_bytes(path.read_bytes() + line.encode())
    for call in (env.persistence.inspect, env.persistence.load):
        with pytest.raises(SessionError) as info:
            await call("s")
        assert info.value.code == "SESSION_CORRUPT"
        assert f"{path} line 3" in str(info.value)
    await env.close()


# -- the property: refused with a documented error, or read back equal ----------------------------

_surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
_strings = st.text(max_size=4) | st.text(_surrogates, max_size=2)
_anything_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    # around the digit limit, built by a function: hypothesis cannot print such ints
    st.builds(
        lambda digits, less, sign: sign * (10**digits - less),
        st.integers(MAX_INT_DIGITS - 1, MAX_INT_DIGITS + 1) | st.just(5000),
        st.integers(0, 1),
        st.sampled_from([1, -1]),
    ),
    st.floats(),
    _strings,
    st.binary(max_size=2),
)
_json_ish = st.recursive(
    _anything_scalar,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(_strings | st.integers(), inner, max_size=3)
        | st.frozensets(st.integers(), max_size=2)
    ),
    max_leaves=8,
) | st.integers(0, 3 * MAX_NESTING).map(nested)
_field = _anything_scalar | st.lists(_anything_scalar, max_size=2)


def _unknown_block(type_: str, fields: dict[str, Any]) -> Any:
    """An UnknownBlock, or a plain block when its constructor refuses ``fields`` (NOT_JSON)."""
    try:
        return UnknownBlock(type=type_, fields=fields)
    except NotJsonError:
        return TextBlock(text="refused when built")


def _blocks() -> st.SearchStrategy[Any]:
    leaf = st.one_of(
        st.builds(TextBlock, text=_strings | _field),
        st.builds(ToolCallBlock, id=_strings, name=_strings, arguments=_strings | _field),
        st.builds(_unknown_block, _strings, st.dictionaries(_strings, _json_ish, max_size=2)),
        _strings,
        st.dictionaries(_strings, _strings, max_size=2),
    )
    return st.recursive(
        leaf,
        lambda inner: st.builds(
            ToolResultBlock,
            tool_call_id=_strings,
            content=st.lists(inner, max_size=2).map(tuple) | st.lists(inner, max_size=2),
            is_error=st.booleans() | _field,
        ),
        max_leaves=4,
    )


_sources = st.one_of(
    st.just(UserSource()),
    st.builds(PluginSource, plugin=_strings | _field, form=st.none() | _strings | _field),
)
_messages = st.builds(
    Message,
    id=_strings | _field,
    role=st.sampled_from(["user", "assistant", "tool", "system", "boss"]),
    content=st.lists(_blocks(), max_size=3).map(tuple) | st.lists(_blocks(), max_size=2),
    source=_sources,
)


def _appends() -> st.SearchStrategy[tuple[str, Any, dict[str, Any]]]:
    """(type, thunk building the data, append keywords): core payloads with arbitrary field
    values and plugin payloads with arbitrary JSON-ish values."""
    surface = {"source_event_seqs": ()}
    return st.one_of(
        st.tuples(st.just("user/message"), _messages, st.just(surface)),
        st.tuples(
            st.just("agent/inbox/spliced"),
            st.builds(
                InboxSplicedData,
                target=st.sampled_from(["next-turn", "next-step"]),
                start=st.integers(0, 3) | _field,
                inserted=st.lists(_messages, max_size=2).map(tuple),
            ),
            st.just({}),
        ),
        st.tuples(st.just("x/plugin"), _json_ish, st.just({"ignorable": True})),
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(appends=st.lists(_appends(), max_size=6))
async def test_every_append_is_refused_with_a_documented_code_or_read_back_equal(
    store: Path, appends: list[tuple[str, Any, dict[str, Any]]]
) -> None:
    """hardening 11.1/11.2, host-core §3/§5: through either store, an append is refused with a
    documented code, or flushed, reloaded and read back equal; never anything else."""
    for kind in BACKENDS:  # each drawn list through both stores: drawing is most of the time
        env = Env(kind, store)
        id = next(_ids)
        session = env.owner.sessions.create(id)
        for type_, data, keywords in appends:
            try:
                session.append(type_, data, **keywords)
                outcome = "accepted"
            except SessionError as exc:
                outcome = exc.code
            assert outcome == "accepted" or outcome in REFUSALS
            event(f"{type_}: {outcome}")
        await env.owner.sessions.flush(session)
        assert await env.reloaded(id) == session.events, kind
        await env.close()


def test_constructors_of_json_fields_refuse_what_the_log_cannot_hold() -> None:
    """hardening 11.1/11.2, host-core §3: JSON fields (UnknownBlock.fields) are frozen when
    built, so a huge int or a too deep value fails there (NOT_JSON)."""
    for bad in ({"n": 10**5000}, {"deep": nested(MAX_NESTING + 1)}):
        with pytest.raises(NotJsonError):
            UnknownBlock(type="x", fields=bad)


# -- the header: ids and SessionMeta, the same in every store -----------------------------------


@pytest.mark.parametrize("bad", ["a/b", "a\\b", ".", "..", "x\0y", 5, ""])
async def test_every_store_refuses_the_same_ids(env: Env, bad: Any) -> None:
    """hardening 11.5, host-core §4: an id that cannot name a session file is refused
    (SESSION_INVALID_ID) by the live store itself, whichever backend is mounted."""
    with pytest.raises(SessionError) as info:
        env.owner.sessions.create(bad)
    assert info.value.code == "SESSION_INVALID_ID"
    assert env.owner.sessions.list() == []
    await env.close()


META_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.just("subagent"),
    st.just("/abs/path"),
    st.lists(st.integers(), max_size=2),
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fields=st.fixed_dictionaries(
        {},
        optional=dict.fromkeys(
            ("cwd", "parent_session", "seed_length", "origin", "delegation_depth"), META_VALUES
        ),
    )
)
async def test_a_header_is_refused_or_read_back_equal(store: Path, fields: dict[str, Any]) -> None:
    """hardening 11.1, host-core §4: SessionMeta fields the header line could not hold (a
    wrong type, a negative depth, an unknown origin) are refused at creation
    (SESSION_META_INVALID, or SESSION_INVALID_CWD for a relative cwd); whatever is accepted is
    listed back equal from the JSONL store."""
    id = next(_ids)
    env = Env("jsonl", store / f"headers-{id}")  # a folder of its own: listed alone
    try:
        meta = SessionMeta(**fields)
        refused: SessionError | None = None
        try:
            session = env.owner.sessions.create(id, meta=meta)
        except SessionError as exc:
            refused = exc
        if refused is not None:
            assert refused.code in {"SESSION_META_INVALID", "SESSION_INVALID_CWD"}
            assert env.owner.sessions.list() == []
            return
        await env.owner.sessions.flush(session)
        listed = await env.persistence.list()
        assert listed == [session.header]
    finally:
        await env.close()


# -- the inbox checks the message it takes, the append the splice around it -----------------------


def _hashable(value: object) -> bool:
    """Whether ``value`` can be an inbox's pending id at all (an unhashable one fails first)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=_messages.filter(lambda m: _hashable(m.id)), plain=st.booleans())
async def test_an_inbox_takes_a_message_exactly_when_the_append_would(
    store: Path, message: Message, plain: bool
) -> None:
    """hardening 11.1, host-core §3/§9: ``Inbox.insert`` checks the message alone (or not at
    all for the one ``user_message`` just built from a plain string) and the append the rest;
    it refuses exactly what the append's full check refuses, with the same code, and what it
    takes is stored and read back equal (in either store)."""
    if plain:
        user_message("just built")  # another message is the one just built: no shortcut
    for kind in BACKENDS:  # each drawn message through both stores: drawing is most of the time
        env = Env(kind, store)
        id = next(_ids)
        inbox = Inbox(env.owner.sessions.create(id), lambda name, m: None)
        reference = env.owner.sessions.create(next(_ids))
        data = InboxSplicedData(target="next-turn", start=0, inserted=(message,))
        codes = []
        for insert in (
            lambda: inbox.insert("next-turn", message),  # noqa: B023
            lambda: reference.append("agent/inbox/spliced", data),  # noqa: B023
        ):
            try:
                insert()
                codes.append("accepted")
            except SessionError as exc:
                codes.append(exc.code)
        assert codes[0] == codes[1], kind
        event(codes[0])
        session = inbox._session
        await env.owner.sessions.flush(session)
        assert await env.reloaded(id) == session.events, kind
        await env.close()


class Text(str):
    """A ``str`` subclass: equal to a plain string, not one."""


def test_only_a_plain_text_user_message_is_known_loggable_by_construction() -> None:
    """hardening 11.1, host-core §9: ``user_message`` marks the message it builds from a plain
    ``str`` (or from the blocks ``text_blocks`` just built from one) with a fresh id and the
    user source, and nothing else, as the one an inbox need not check (a ``str`` subclass, an
    id, a source or other blocks keep the check)."""
    plain = user_message("hi")
    assert _content.plain_user_message is plain
    for other in (
        user_message(Text("hi")),
        user_message("hi", id="m-1"),
        user_message("hi", source=PluginSource(plugin="p")),
        user_message([TextBlock(text="hi")]),
        user_message(text_blocks(Text("hi"))),
        user_message([*text_blocks("hi")]),  # equal blocks, not the tuple built
    ):
        assert _content.plain_user_message is plain
        assert other is not plain
    blocks = text_blocks("hi")
    assert _content.plain_text_blocks is blocks
    assert user_message(blocks) is _content.plain_user_message


def test_the_loops_own_turn_end_reasons_are_loggable() -> None:
    """hardening 11.1, host-core §9: the turn-end reasons the loop logs without a check (its
    constants: completed, blocked, max-tokens) pass the payload's compiled check."""
    check = class_checker(TurnEndData)
    assert check is not None
    for reason in (_agent._COMPLETED, _agent._BLOCKED, _agent._MAX_TOKENS):
        check(TurnEndData(turn=1, reason=reason), MAX_NESTING)
