"""The compiled fast paths of the session log codec agree with the converter (host-core §5)."""

from __future__ import annotations

import enum
import functools
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core import (
    AssistantChunkData,
    ContentBlock,
    Context,
    EventTypeRegistry,
    Finish,
    Host,
    Message,
    PluginSource,
    ReasoningDelta,
    SessionError,
    SessionEvent,
    SessionStoreService,
    StepData,
    StreamChunk,
    TextBlock,
    TextDelta,
    ToolCallDelta,
    TurnStartData,
    UnknownBlock,
    UnknownChunk,
    dumps,
)
from dsh_core._codec import (
    Unfit,
    checked_builder,
    class_checker,
    class_decoder,
    class_encoder,
    type_checker,
)
from dsh_core._content import CHUNKS
from dsh_core._converter import converter
from dsh_core._events import CORE_EVENT_TYPES, ToolResultData, make_event
from dsh_core._json import MAX_NESTING, freeze_json
from dsh_core._persistence import JsonlSessionPersistence, install_jsonl_persistence
from dsh_core._persistence._encode import utf8_lines
from dsh_core.testing.strategies import session_logs

TYPES = EventTypeRegistry()
#: Core payloads whose codec compiles (tool/result carries free-form ``meta``: converter only).
COMPILED = {s.name for s in CORE_EVENT_TYPES}
TYPES_BY_CLASS = {s.payload: s.name for s in CORE_EVENT_TYPES if s.name in COMPILED}


def jsonl() -> JsonlSessionPersistence:
    """A JSONL backend that only encodes (never installed, never touches a file)."""
    persistence = JsonlSessionPersistence(Path("unused"))
    persistence._types = TYPES
    return persistence


def generic_line(event: SessionEvent) -> bytes:
    return utf8_lines(dumps(TYPES.encode(event)) + "\n")


def same(a: object, b: object) -> bool:
    """Equal, with the same types throughout (``1 == True``: ``==`` alone is not enough)."""
    return a == b and repr(a) == repr(b)


def outcome(fn: Any, *args: Any) -> tuple[bool, Any]:
    try:
        return True, fn(*args)
    except Exception as exc:
        return False, exc


# -- valid logs -----------------------------------------------------------------------------------


@given(session_logs(open_end=True))
def test_fast_lines_are_the_generic_lines(events: tuple[SessionEvent, ...]) -> None:
    """host-core §5: every JSONL line is exactly dumps(types.encode(event)), fast path or not."""
    writer = jsonl()
    assert writer._lines(events) == b"".join(generic_line(e) for e in events)


@given(session_logs(open_end=True))
def test_fast_paths_cover_and_round_trip_core_payloads(events: tuple[SessionEvent, ...]) -> None:
    """host-core §5: core payloads take the compiled paths, which match the converter exactly."""
    for event in events:
        spec = TYPES.get(event.type)
        raw = json.loads(generic_line(event))
        assert same(TYPES.decode(raw), event)
        if spec is None or spec.name not in COMPILED:
            continue
        assert spec.payload is not None
        encode, decode = class_encoder(spec.payload), class_decoder(spec.payload)
        assert encode is not None and decode is not None
        if isinstance(event.data, ToolResultData) and event.data.meta is not None:
            with pytest.raises(Unfit):  # free-form meta is written by the converter's route
                encode(event.data)
        else:
            assert encode(event.data) == dumps(converter.unstructure(event.data))
        assert same(decode(raw["data"]), converter.structure(raw["data"], spec.payload))


def test_lossless_edge_values_round_trip_through_the_fast_path() -> None:
    """host-core §5: lone surrogates, escapes and ints beyond 64 bits survive a JSONL line."""
    chunk = AssistantChunkData(
        turn=2**70, step=-(2**65), chunk=TextDelta(index=0, text='\ud800"\n')
    )
    event = make_event("assistant/chunk", 7, 2**64, chunk)
    line = jsonl()._lines([event])
    assert line == generic_line(event)
    assert same(TYPES.decode(json.loads(line.decode("utf-8", "surrogatepass"))), event)


# -- odd values: the fast path gives up rather than differ -----------------------------------------


class Small(enum.IntEnum):
    ONE = 1


class Text(str):
    pass


ODD_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    2**80,
    Small.ONE,
    1.5,
    -0.0,
    math.nan,
    "",
    "\ud800",
    Text("sub"),
    (),
    ("a",),
    ["a"],
    (1, "x"),
    {"a": 1},
    MappingProxyType({"a": 1}),
    TextBlock(text="t"),
    UnknownBlock(type="future", fields={"x": 1}),
    UnknownChunk(type="future", fields={"y": [1]}),
    TextDelta(index=0, text="d"),
    PluginSource(plugin="p"),
]


def _replace(value: Any, name: str, new: Any) -> Any:
    """``value`` with field ``name`` set to ``new``, bypassing nothing but validation."""
    copy = object.__new__(type(value))
    for field in attrs.fields(type(value)):
        object.__setattr__(
            copy, field.name, new if field.name == name else getattr(value, field.name)
        )
    return copy


#: A log of one turn: every core payload type a longer log holds (a turn holds every kind of
#: step), for the properties that take one event of it (a log is most of an example's time).
_one_turn_logs = session_logs(min_turns=1, max_turns=1)
#: The ``assistant/chunk`` payloads a generated log holds (``LogBuilder.chunk``), drawn alone.
_chunk_payloads = st.builds(
    AssistantChunkData,
    turn=st.integers(1, 3),
    step=st.integers(1, 2),
    chunk=st.builds(TextDelta, index=st.just(0), text=st.text(max_size=12)),
)


@st.composite
def odd_payloads(draw: st.DrawFn, only: type | None = None) -> tuple[type, Any]:
    """A core payload from a generated log with one field, at any depth, set to an odd value.

    ``only=AssistantChunkData`` draws a chunk payload as a log holds them, without the log.
    """
    if only is AssistantChunkData:
        type_, data = "assistant/chunk", draw(_chunk_payloads)
    else:
        assert only is None
        events = draw(_one_turn_logs)
        event = draw(st.sampled_from([e for e in events if e.type in COMPILED]))
        type_, data = event.type, event.data
    spec = TYPES.get(type_)
    assert spec is not None and spec.payload is not None

    def mutate(value: Any) -> Any:
        if isinstance(value, tuple) and value and draw(st.booleans()):
            i = draw(st.integers(0, len(value) - 1))
            return (*value[:i], mutate(value[i]), *value[i + 1 :])
        if not attrs.has(type(value)) or not attrs.fields(type(value)):
            return draw(st.sampled_from(ODD_VALUES))
        field = draw(st.sampled_from(attrs.fields(type(value))))
        inner = getattr(value, field.name)
        new = mutate(inner) if draw(st.booleans()) else draw(st.sampled_from(ODD_VALUES))
        return _replace(value, field.name, new)

    return spec.payload, mutate(data)


@given(odd_payloads())
def test_fast_encoders_write_what_the_converter_writes_or_give_up(case: tuple[type, Any]) -> None:
    """host-core §5: for any field value, the compiled encoder's text is the converter's text."""
    cls, value = case
    encode = class_encoder(cls)
    assert encode is not None
    fast_ok, fast = outcome(encode, value)
    generic_ok, generic = outcome(lambda: dumps(converter.get_unstructure_hook(cls)(value)))
    if fast_ok:
        assert generic_ok and fast == generic
    event = make_event(TYPES_BY_CLASS[cls], 0, 0, value)
    line_ok, line = outcome(jsonl()._lines, [event])
    assert line_ok == generic_ok
    if line_ok:
        assert line == generic_line(event)


# -- malformed input: the fast path never accepts what the converter refuses ----------------------

_odd_json = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=4),
    st.sampled_from(["text", "text-delta", "tool-call-delta", "plugin", "user", "completed"]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _mutated(draw: st.DrawFn, value: Any) -> Any:
    """``value`` (parsed JSON) with one random change somewhere inside."""
    if isinstance(value, dict) and value:
        key = draw(st.sampled_from(sorted(value)))
        how = draw(st.sampled_from(["recurse", "replace", "delete", "add", "retag"]))
        out = dict(value)
        if how == "recurse":
            out[key] = _mutated(draw, value[key])
        elif how == "replace":
            out[key] = draw(_odd_json)
        elif how == "delete":
            del out[key]
        elif how == "add":
            out[draw(st.sampled_from(["extra", "type", "kind", "index"]))] = draw(_odd_json)
        else:
            tag = "type" if "type" in value else "kind"
            out[tag] = draw(
                st.sampled_from(["text", "reasoning", "text-delta", "finish", "model", "new"])
            )
        return out
    if isinstance(value, list) and value and draw(st.booleans()):
        i = draw(st.integers(0, len(value) - 1))
        return [*value[:i], _mutated(draw, value[i]), *value[i + 1 :]]
    return draw(_odd_json)


@st.composite
def malformed_payloads(draw: st.DrawFn) -> tuple[type, Any]:
    events = draw(_one_turn_logs)
    event = draw(st.sampled_from([e for e in events if e.type in COMPILED]))
    spec = TYPES.get(event.type)
    assert spec is not None and spec.payload is not None
    data = json.loads(dumps(converter.unstructure(event.data)))
    return spec.payload, _mutated(draw, data)


@given(malformed_payloads())
def test_fast_decoders_accept_only_what_the_converter_accepts(case: tuple[type, Any]) -> None:
    """host-core §5: a compiled decoder that accepts a payload builds the converter's value."""
    cls, data = case
    decode = class_decoder(cls)
    assert decode is not None
    fast_ok, fast = outcome(decode, data)
    generic_ok, generic = outcome(converter.structure, data, cls)
    if fast_ok:
        assert generic_ok and same(fast, generic)


_EVENT_KEYS = {"type", "seq", "time", "data", "source_event_seqs", "surface_op", "ignorable"}


def reference_decode(raw: Any) -> SessionEvent:
    """The event decoder without any fast path: envelope checks, then the converter."""
    if not isinstance(raw, Mapping):
        raise SessionError("not an object", code="SESSION_CORRUPT")
    if not raw.keys() <= _EVENT_KEYS:
        raise SessionError("unknown keys", code="SESSION_CORRUPT")
    type_, seq, time_ = raw.get("type"), raw.get("seq"), raw.get("time")
    if type(type_) is not str or type(seq) is not int or type(time_) is not int:
        raise SessionError("malformed", code="SESSION_CORRUPT")
    ignorable = raw.get("ignorable", False)
    if ignorable is not False and ignorable is not True:
        raise SessionError("ignorable", code="SESSION_CORRUPT")
    spec = TYPES.get(type_)
    if spec is None and not ignorable:
        raise SessionError("unknown", code="SESSION_FORMAT_UNSUPPORTED")
    surface = spec.surface if spec is not None else "source_event_seqs" in raw
    seqs, op = raw.get("source_event_seqs"), raw.get("surface_op")
    if surface:
        if type(seqs) is not list or op != "append" or any(type(s) is not int for s in seqs):
            raise SessionError("surface", code="SESSION_CORRUPT")
    elif seqs is not None or op is not None:
        raise SessionError("surface", code="SESSION_CORRUPT")
    try:
        if spec is None or spec.payload is None:
            data = freeze_json(raw.get("data"))
        else:
            data = converter.structure(raw.get("data", {}), spec.payload)
    except Exception as exc:
        raise SessionError(str(exc), code="SESSION_CORRUPT") from exc
    return SessionEvent(
        type=type_,
        seq=seq,
        time=time_,
        data=data,
        source_event_seqs=tuple(seqs) if surface else None,
        surface_op="append" if surface else None,
        ignorable=ignorable,
    )


@st.composite
def malformed_events(draw: st.DrawFn) -> Any:
    events = draw(_one_turn_logs)
    raw = json.loads(generic_line(draw(st.sampled_from(events))))
    return _mutated(draw, raw) if draw(st.integers(0, 4)) else raw


@given(malformed_events())
def test_event_decode_agrees_with_the_converter_path(raw: Any) -> None:
    """host-core §5: decode accepts and refuses what the converter-only path does, alike."""
    expected_ok, expected = outcome(reference_decode, raw)
    for _ in range(2):  # the first decode of a type may take the full path, the next the fast one
        got_ok, got = outcome(TYPES.decode, raw)
        assert got_ok == expected_ok
        if got_ok:
            assert same(got, expected)
        else:
            assert isinstance(got, SessionError) and got.code == expected.code


# -- the converter's own strictness, and variants added later -------------------------------------


def test_tuples_load_only_from_arrays(tmp_path: Path) -> None:
    """host-core §5: a string or object where an array belongs is corrupt, not split up."""
    good = {"plugin": "p", "sections": ["a"], "kind": "plugin"}
    assert converter.structure(good, PluginSource).sections == ("a",)
    for bad in ("ab", {"a": 1}):
        with pytest.raises(TypeError):
            converter.structure({**good, "sections": bad}, PluginSource)
    raw = {"type": "user/message", "seq": 0, "time": 1, "source_event_seqs": []}
    raw["surface_op"] = "append"
    raw["data"] = {"id": "m", "role": "user", "content": "hi"}
    with pytest.raises(SessionError) as info:
        TYPES.decode(raw)
    assert info.value.code == "SESSION_CORRUPT"


@attrs.frozen(kw_only=True)
class LaterDelta(StreamChunk):
    """A chunk variant a plugin registers after the codecs were first used."""

    type: Literal["test-codec-later"] = attrs.field(default="test-codec-later", init=False)
    index: int
    note: str | None = None


def test_variants_registered_later_compile_on_first_sight() -> None:
    """host-core §3/§5: a plugin variant registered after first use takes the fast path too."""
    class_encoder(AssistantChunkData)  # the union's dispatch exists before the variant does
    CHUNKS.register(LaterDelta)
    data = AssistantChunkData(turn=1, step=1, chunk=LaterDelta(index=3, note="n"))
    text = dumps(converter.unstructure(data))
    encode, decode = class_encoder(AssistantChunkData), class_decoder(AssistantChunkData)
    assert encode is not None and decode is not None
    assert encode(data) == text
    assert same(decode(json.loads(text)), data)
    assert class_encoder(LaterDelta) is not None


def test_tool_call_delta_defaults_are_omitted_and_restored() -> None:
    """host-core §5: defaulted fields are left out of a line and come back on load."""
    for chunk in (ToolCallDelta(index=0), ToolCallDelta(index=1, id="c", name="n")):
        data = AssistantChunkData(turn=1, step=1, chunk=chunk)
        encode, decode = class_encoder(AssistantChunkData), class_decoder(AssistantChunkData)
        assert encode is not None and decode is not None
        text = encode(data)
        assert text == dumps(converter.unstructure(data))
        assert same(decode(json.loads(text)), data)


def host() -> Context:
    h = Host()
    ctx = Context(h, h.root)
    ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
    return ctx


async def test_flushed_session_reloads_through_the_fast_paths(tmp_path: Path) -> None:
    """host-core §5: a live session written and read by the compiled paths reloads unchanged."""
    writer = host()
    install_jsonl_persistence(writer, tmp_path)
    session = writer.sessions.create("s")
    session.append("turn/start", TurnStartData(turn=1))
    session.append("step/start", StepData(turn=1, step=1))
    for text in ("a", "\ud83d", "é\n"):
        chunk = TextDelta(index=0, text=text)
        session.append("assistant/chunk", AssistantChunkData(turn=1, step=1, chunk=chunk))
    message = Message(id="m", role="user", content=(TextBlock(text="q"),))
    session.append("user/message", message, source_event_seqs=[0])
    await writer.sessions.flush(session)
    live = session.events
    await writer.dispose()
    reader = host()
    _, stored = await install_jsonl_persistence(reader, tmp_path).inspect("s")
    assert stored[: len(live)] == live
    await reader.dispose()


# -- the append checkers: what they pass, the log writes and reads back ---------------------------


@given(session_logs(open_end=True))
def test_every_valid_core_payload_passes_its_compiled_checker(
    events: tuple[SessionEvent, ...],
) -> None:
    """hardening 11.1, host-core §3: valid core payloads (tool/result included) pass the
    compiled checker, so the append fast path never falls back to the round trip for them."""
    for event in events:
        spec = TYPES.get(event.type)
        if spec is None or spec.payload is None:
            continue
        check = class_checker(spec.payload)
        assert check is not None
        check(event.data, MAX_NESTING)


@given(odd_payloads())
def test_a_checker_passes_only_payloads_that_read_back_equal(case: tuple[type, Any]) -> None:
    """hardening 11.1, host-core §3/§5: for any field value, a payload the compiled checker
    passes is written and read back the same, and snapshot agrees with the round trip."""
    cls, value = case
    check = class_checker(cls)
    assert check is not None
    passed, _ = outcome(check, value, MAX_NESTING)
    type_ = TYPES_BY_CLASS[cls]
    spec = TYPES.get(type_)
    assert spec is not None
    surface: Any = ((), "append") if spec.surface else (None, None)
    event = make_event(type_, 0, 0, value, *surface)
    line_ok, line = outcome(jsonl()._lines, [event])
    read_ok, read = outcome(lambda: TYPES.decode(json.loads(line)).data) if line_ok else (False, 0)
    equal = read_ok and read == value
    if passed:
        assert read_ok and exact(read, value)
    # snapshot takes what reads back equal, and refuses only what does not read back exactly
    # (an IntEnum turn reads back as an equal int: refused, the log holds exact JSON types)
    snapshot_ok, _ = outcome(TYPES.snapshot, spec, type_, value)
    assert equal if snapshot_ok else not (read_ok and exact(read, value))


def exact(a: Any, b: Any) -> bool:
    """Equal with the same types throughout, attrs fields and containers included."""
    if type(a) is not type(b):
        return False
    if attrs.has(type(a)):
        return all(exact(getattr(a, f.name), getattr(b, f.name)) for f in attrs.fields(type(a)))
    if type(a) is tuple:
        return len(a) == len(b) and all(exact(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping):
        return a.keys() == b.keys() and all(exact(a[k], b[k]) for k in a)
    return same(a, b)


@pytest.mark.parametrize("tag", [Text("text"), "other", 5])
def test_a_checker_passes_a_tag_only_as_its_own_plain_string(tag: Any) -> None:
    """hardening 11.1, host-core §5: the checker's identity shortcut for a variant's tag (the
    default string attrs stores) never passes an equal ``str`` subclass or another value."""
    check = class_checker(Message)
    assert check is not None
    block = TextBlock(text="t")
    check(Message(id="m", role="user", content=(block,)), MAX_NESTING)
    with pytest.raises(Unfit):
        check(Message(id="m", role="user", content=(_replace(block, "type", tag),)), MAX_NESTING)


@functools.cache
def _chunk_builder(levels: int) -> Callable[..., Any]:
    """The chunk payload's checked builder for ``levels``, as the loop compiles it: once (a
    compile per example was most of the property's time)."""
    build = checked_builder(
        AssistantChunkData, "chunk", levels, (TextDelta, ReasoningDelta, ToolCallDelta, Finish)
    )
    assert build is not None
    return build


@given(odd_payloads(only=AssistantChunkData))
def test_a_checked_builder_vouches_exactly_as_the_class_checker(case: tuple[type, Any]) -> None:
    """hardening 11.1, host-core §3: the chunk payload's checked builder (one call for the
    build and the check of an adapter's chunk) passes exactly the chunks the payload's class
    checker passes with one level more, and builds the same payload (given its fields by
    keyword or by position)."""
    _, value = case
    check = class_checker(AssistantChunkData)
    assert check is not None
    chunk = getattr(value, "chunk", value)
    expected = AssistantChunkData(turn=1, step=2, chunk=chunk)
    # The levels are compiled in as a literal: the loop's, and the few where they run out.
    for levels in (MAX_NESTING - 2, 2, 1, 0):
        build = _chunk_builder(levels)
        built_ok, built = outcome(lambda: build(turn=1, step=2, chunk=chunk))  # noqa: B023
        checked_ok, _ = outcome(check, expected, levels + 1)
        assert built_ok == checked_ok
        by_position_ok, by_position = outcome(lambda: build(1, 2, chunk))  # noqa: B023
        assert by_position_ok == built_ok  # by position, as the loop calls it
        if built_ok:
            assert exact(built, expected) and exact(by_position, expected)


@given(odd_payloads())
def test_a_type_checker_checks_a_field_value_as_its_class_checker(
    case: tuple[type, Any],
) -> None:
    """hardening 11.1, host-core §3: ``type_checker(tuple[ContentBlock, ...])`` passes a value
    with ``d`` levels left exactly when a message's checker passes it as the content with
    ``d + 1`` levels left (what the loop relies on to check a tool's content alone)."""
    _, value = case
    blocks = getattr(getattr(value, "message", value), "content", value)
    check_blocks = type_checker(tuple[ContentBlock, ...])
    check_message = class_checker(Message)
    assert check_blocks is not None and check_message is not None
    for levels in (3, MAX_NESTING - 4):
        message = _replace(Message(id="m", role="user", content=()), "content", blocks)
        alone, _ = outcome(check_blocks, blocks, levels)
        inside, _ = outcome(check_message, message, levels + 1)
        assert alone == inside


_HEADER_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.sampled_from(["a", "subagent", "other"]),
    st.floats(allow_nan=False),
    st.lists(st.integers(), max_size=1),
)


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "version",
                "id",
                "created_at",
                "cwd",
                "parent_session",
                "seed_length",
                "origin",
                "delegation_depth",
                "extra",
            ]
        ),
        _HEADER_VALUES,
    ),
    st.dictionaries(st.sampled_from(["id", "created_at"]), st.sampled_from(["x", 7])),
)
def test_structure_header_agrees_with_the_converter(
    raw: dict[str, Any], base: dict[str, Any]
) -> None:
    """host-core §6 (listing 14): a header is structured by the compiled decoder exactly as the
    strict converter structures it; what the converter refuses is SESSION_CORRUPT."""
    from dsh_core import SessionError, SessionHeader
    from dsh_core._events import structure_header

    raw = {**base, **raw, "version": 1}
    try:
        expected: SessionHeader | None = converter.structure(raw, SessionHeader)
    except Exception:
        expected = None
    if expected is None:
        with pytest.raises(SessionError) as caught:
            structure_header(raw)
        assert caught.value.code == "SESSION_CORRUPT"
    else:
        assert structure_header(raw) == expected
