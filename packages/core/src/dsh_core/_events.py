"""The session log's vocabulary: header, events, payloads, and the event-type registry.

A session is an append-only list of :class:`SessionEvent`. Event ``seq`` equals its index,
``time`` is epoch milliseconds, and ``data`` is the payload: an instance of the type's
registered attrs class, or frozen lossless JSON for free-form types. Plugins add types through
the ``dsh_session_event_types`` hook before any log is loaded (host-core §3).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Literal, cast

import attrs

from ._codec import Unfit, class_checker, class_decoder
from ._content import LlmFailure, Message, StreamChunk, TokenUsage
from ._converter import converter
from ._errors import DshError
from ._frozen import attrs_eq, attrs_hash, attrs_repr, open_twin, speed_up_inits
from ._json import MAX_NESTING, JsonValue, NotJsonError, dumps, freeze_json

__all__ = [
    "AgentCancelCause",
    "AssistantChunkData",
    "AssistantMessageData",
    "CORE_EVENT_TYPES",
    "EndSeedData",
    "EpochHeader",
    "EventTypeRegistry",
    "EventTypeSpec",
    "InboxSplicedData",
    "LlmCallConfig",
    "RequestHeaderData",
    "SESSION_FORMAT_VERSION",
    "SessionError",
    "SessionEvent",
    "SessionHeader",
    "SessionMeta",
    "StepData",
    "ToolResultData",
    "ToolResultError",
    "ToolCallData",
    "ToolSchema",
    "TurnEndData",
    "TurnEndReason",
    "TurnStartData",
    "encode_header",
    "make_event",
    "structure_header",
]

#: The header ``version`` this runtime writes and reads.
SESSION_FORMAT_VERSION = 1


class SessionError(DshError):
    """A session operation was refused; ``code`` says why (SESSION_EVENT_NOT_JSON, ...)."""

    code = "SESSION_ERROR"


def _finite(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and (
        not math.isfinite(value) or (value == 0.0 and math.copysign(1.0, value) < 0)
    ):
        raise ValueError(f"{attribute.name} must be a finite JSON number, got {value!r}")


# -- header --------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class SessionMeta:
    """The caller-chosen header fields of a new session."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    cwd: str | None = None
    parent_session: str | None = None
    seed_length: int | None = None
    origin: Literal["subagent"] | None = None
    delegation_depth: int | None = None


@attrs.frozen(kw_only=True)
class SessionHeader:
    """The first line of a session: identity, lineage and delegation depth.

    ``origin`` is a navigation hint only; it proves nothing. ``delegation_depth`` absent means 0.
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    version: int = SESSION_FORMAT_VERSION
    id: str
    created_at: int
    cwd: str | None = None
    parent_session: str | None = None
    seed_length: int | None = None
    origin: Literal["subagent"] | None = None
    delegation_depth: int | None = None


# -- events --------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class SessionEvent:
    """One log entry. Surface types (model-visible) carry ``source_event_seqs``/``surface_op``."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: str
    seq: int
    time: int
    data: Any
    source_event_seqs: tuple[int, ...] | None = None
    surface_op: Literal["append"] | None = None
    ignorable: bool = False


_OpenEvent: Any = open_twin(SessionEvent)  # ``_OpenEvent()``: an empty one (see make_event)


def make_event(
    type: str,
    seq: int,
    time: int,
    data: Any,
    source_event_seqs: tuple[int, ...] | None = None,
    surface_op: Literal["append"] | None = None,
    ignorable: bool = False,
) -> SessionEvent:
    """Build a :class:`SessionEvent` from already-validated parts (the hot path of appends
    and loads): it fills an open twin and swaps the class in (see
    :func:`~dsh_core._frozen.open_twin`), about three times as fast as the constructor. The
    result is an ordinary, immutable ``SessionEvent``."""
    event: Any = _OpenEvent()
    event.type = type
    event.seq = seq
    event.time = time
    event.data = data
    event.source_event_seqs = source_event_seqs
    event.surface_op = surface_op
    event.ignorable = ignorable
    event.__class__ = SessionEvent
    result: SessionEvent = event
    return result


# -- payloads of the core types -------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class AgentCancelCause:
    """Why an agent's turn was cancelled (rides in the abort reason)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    kind: Literal["user", "parent", "hook", "disposed"]
    reason: str | None = None


@attrs.frozen(kw_only=True)
class TurnEndReason:
    """Why a turn ended. ``kind`` is open: completed, aborted, blocked, error, max-tokens,
    interrupted (crash repair only); readers treat an unknown kind as a failure."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    kind: str
    cause: AgentCancelCause | None = None
    error: LlmFailure | None = None


@attrs.frozen(kw_only=True)
class TurnStartData:
    """``turn/start``: opens turn ``turn``."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    turn: int


@attrs.frozen(kw_only=True)
class TurnEndData:
    """``turn/end``: closes the open turn."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    turn: int
    reason: TurnEndReason


@attrs.frozen(kw_only=True)
class StepData:
    """``step/start`` and ``step/end``."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    turn: int
    step: int


@attrs.frozen(kw_only=True)
class AssistantChunkData:
    """``assistant/chunk``: one raw stream chunk."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    turn: int
    step: int
    chunk: StreamChunk


@attrs.frozen(kw_only=True)
class AssistantMessageData:
    """``assistant/message``: the assembled response (empty content is logged, never derived)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    turn: int
    step: int
    message: Message
    usage: TokenUsage | None = None
    interrupted: bool = False


@attrs.frozen(kw_only=True)
class ToolCallData:
    """``tool/call``: a call about to be executed."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    turn: int
    step: int
    call_id: str
    name: str
    arguments: str


@attrs.frozen(kw_only=True)
class ToolResultError:
    """What failed in a tool call, by tool name and stable code."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    name: str
    code: str


@attrs.frozen(kw_only=True)
class ToolResultData:
    """``tool/result``: the result message of one call (model-visible)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    turn: int
    step: int
    message: Message
    error: ToolResultError | None = None
    meta: JsonValue = attrs.field(default=None, converter=freeze_json)


@attrs.frozen(kw_only=True)
class LlmCallConfig:
    """The model route and sampling settings of a request."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    provider: str
    model: str
    max_tokens: int | None = None
    temperature: float | None = attrs.field(default=None, validator=_finite)
    stop: tuple[str, ...] | None = None


@attrs.frozen(kw_only=True)
class ToolSchema:
    """A tool as the model sees it: name, description, JSON Schema of its arguments."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    name: str
    description: str
    parameters: Mapping[str, JsonValue] = attrs.field(converter=freeze_json)


@attrs.frozen(kw_only=True)
class EpochHeader:
    """The request envelope the next request is rebuilt from."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    config: LlmCallConfig
    system: str | None = None
    tools: tuple[ToolSchema, ...] | None = None


@attrs.frozen(kw_only=True)
class RequestHeaderData:
    """``request/header``: the envelope in force from this request on."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    header: EpochHeader
    reason: Literal["initial", "resume", "change"]


@attrs.frozen(kw_only=True)
class InboxSplicedData:
    """``agent/inbox/spliced``: one durable mutation of an agent's inbox projection."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    target: Literal["next-turn", "next-step"]
    start: int
    removed_count: int = 0
    inserted: tuple[Message, ...] = ()
    outcome: Literal["canceled"] | None = None


@attrs.frozen(kw_only=True)
class EndSeedData:
    """``session/end-seed``: marks the first live write after a seed."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash


# -- registry ----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class EventTypeSpec:
    """A session event type.

    :param payload: the attrs class of ``data``, or ``None`` for free-form lossless JSON.
    :param surface: model-visible (carries ``source_event_seqs`` and ``surface_op``).
    :param ignorable: a reader that does not know the type may skip its events.
    :param trusted: appends of exactly the payload class take the session's fast path (its
        compiled check, see ``EventTypeRegistry.snapshot``); others go through ``snapshot``.
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    name: str
    payload: type | None = None
    surface: bool = False
    ignorable: bool = False
    trusted: bool = False


CORE_EVENT_TYPES: tuple[EventTypeSpec, ...] = (
    EventTypeSpec(name="turn/start", payload=TurnStartData, trusted=True),
    EventTypeSpec(name="turn/end", payload=TurnEndData, trusted=True),
    EventTypeSpec(name="step/start", payload=StepData, trusted=True),
    EventTypeSpec(name="step/end", payload=StepData, trusted=True),
    EventTypeSpec(name="user/message", payload=Message, surface=True, trusted=True),
    EventTypeSpec(name="assistant/chunk", payload=AssistantChunkData, trusted=True),
    EventTypeSpec(
        name="assistant/message", payload=AssistantMessageData, surface=True, trusted=True
    ),
    EventTypeSpec(name="tool/call", payload=ToolCallData, trusted=True),
    EventTypeSpec(name="tool/result", payload=ToolResultData, surface=True, trusted=True),
    EventTypeSpec(name="request/header", payload=RequestHeaderData, trusted=True),
    EventTypeSpec(name="agent/inbox/spliced", payload=InboxSplicedData, trusted=True),
    EventTypeSpec(name="session/end-seed", payload=EndSeedData, trusted=True),
)


class EventTypeRegistry:
    """The event types one host knows, and the (de)serialization of events by type."""

    def __init__(self, specs: Iterable[EventTypeSpec] = CORE_EVENT_TYPES) -> None:
        self._specs: dict[str, EventTypeSpec] = {}
        self._specs_view = MappingProxyType(self._specs)
        self._hooks: dict[str, Callable[[Any, type], Any]] = {}
        #: By type decoded before: (hook, payload class, surface), for decode's one-go path.
        self._fast: dict[str, tuple[Callable[[Any, type], Any], type, bool]] = {}
        self._unhooks: dict[str, Callable[[Any], Any]] = {}
        for spec in specs:
            self.register(spec)
        #: Whether every core type is registered as core declares it. A registered type's spec
        #: never changes (``register`` refuses another), so the agent loop's own appends may
        #: rely on it for good (see ``Session._append_vouched``).
        self._core = all(self._specs.get(s.name) == s for s in CORE_EVENT_TYPES)

    def register(self, spec: EventTypeSpec) -> None:
        """Add a type; re-registering an equal spec is a no-op, a different one fails."""
        known = self._specs.get(spec.name)
        if known is not None and known != spec:
            raise SessionError(
                f"session event type {spec.name!r} is already registered differently",
                code="DUPLICATE_EVENT_TYPE",
            )
        self._specs[spec.name] = spec

    def get(self, name: str) -> EventTypeSpec | None:
        """The spec of ``name``, if registered."""
        return self._specs.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    @property
    def specs(self) -> Mapping[str, EventTypeSpec]:
        """The registered specs by name (a live, read-only view)."""
        return self._specs_view

    def snapshot(self, spec: EventTypeSpec | None, type_: str, data: object) -> object:
        """Validate ``data`` for appending and return the value to store.

        What is stored, the JSONL log must write and read back equal (docs/sessions.md,
        "Payload limits"). Free-form payloads are deep-copied frozen (``SESSION_EVENT_NOT_JSON``
        past the JSON limits). Typed payloads must be instances of their class and pass its
        compiled check (:func:`~dsh_core._codec.class_checker`); one that does not, or has
        none, is written and read back here: ``SESSION_EVENT_NOT_JSON`` if its JSON breaks the
        limits, ``SESSION_EVENT_INVALID`` if it does not read back as the same value.
        """
        try:
            if spec is None or spec.payload is None:
                return freeze_json(data)
        except NotJsonError as exc:
            raise SessionError(
                f"{type_} data is not losslessly JSON-serializable: {exc}",
                code="SESSION_EVENT_NOT_JSON",
            ) from exc
        payload = spec.payload
        if not isinstance(data, payload):
            raise SessionError(
                f"{type_} data must be {payload.__name__}, not {type(data).__name__}",
                code="SESSION_EVENT_INVALID",
            )
        check = class_checker(data.__class__) if data.__class__ is payload else None
        if check is not None:
            try:
                check(data, MAX_NESTING)
                return data
            except Unfit:
                pass
        _round_trip(payload, type_, data)
        return data

    def encode(self, event: SessionEvent) -> dict[str, Any]:
        """The JSON-ready form of ``event`` (one JSONL line)."""
        out: dict[str, Any] = {"type": event.type, "seq": event.seq, "time": event.time}
        hook = self._unhooks.get(event.type)
        if hook is None:
            spec = self._specs.get(event.type)
            if spec is None or spec.payload is None:
                hook = _identity
            else:
                hook = converter.get_unstructure_hook(spec.payload)
            self._unhooks[event.type] = hook
        out["data"] = hook(event.data)
        if event.source_event_seqs is not None:
            out["source_event_seqs"] = list(event.source_event_seqs)
        if event.surface_op is not None:
            out["surface_op"] = event.surface_op
        if event.ignorable:
            out["ignorable"] = True
        return out

    def decode(self, raw: object) -> SessionEvent:
        """Rebuild an event from its JSON form; an unknown required type is unsupported.

        Persistence is a real boundary, so everything is checked: the event's own keys and
        types, its surface metadata, and its payload (strictly, unknown keys included).
        """
        if type(raw) is dict:
            # The usual shapes in one go: (type, seq, time, data) of a type that is not
            # surface, and those four plus (source_event_seqs, surface_op) of a surface type;
            # neither ignorable. Anything else, or a type not decoded before, takes the full
            # path below.
            n = len(raw)
            type_ = raw.get("type")
            if (n == 4 or n == 6) and type(type_) is str:
                fast = self._fast.get(type_)
                seq = raw.get("seq")
                time_ = raw.get("time")
                if (
                    fast is not None
                    and type(seq) is int
                    and type(time_) is int
                    and "data" in raw
                    and (n == 4) is not fast[2]
                ):
                    decoder, payload, surface = fast
                    seqs = None
                    if surface:
                        # Six keys, five of them named: the sixth is the seqs, if a list.
                        seqs = raw.get("source_event_seqs")
                        if raw.get("surface_op") != "append" or type(seqs) is not list:
                            seqs = False
                        elif seqs:
                            for s in seqs:
                                if s.__class__ is not int:
                                    seqs = False
                                    break
                    if seqs is not False:
                        data = raw["data"]
                        try:
                            data = decoder(data, payload)
                        except Exception:
                            data = _verdict(payload, type_, data)
                        event: Any = _OpenEvent()
                        event.type = type_
                        event.seq = seq
                        event.time = time_
                        event.data = data
                        if surface:
                            event.source_event_seqs = tuple(seqs)  # type: ignore[arg-type]
                            event.surface_op = "append"
                        else:
                            event.source_event_seqs = None
                            event.surface_op = None
                        event.ignorable = False
                        event.__class__ = SessionEvent
                        result: SessionEvent = event
                        return result
        if type(raw) is not dict:
            if not isinstance(raw, Mapping):
                raise SessionError("an event must be a JSON object", code="SESSION_CORRUPT")
            raw = dict(raw)
        if not raw.keys() <= _EVENT_KEYS:
            extra = sorted(set(raw) - _EVENT_KEYS)
            raise SessionError(f"unknown event fields {extra}", code="SESSION_CORRUPT")
        type_ = raw.get("type")
        seq = raw.get("seq")
        time_ = raw.get("time")
        if type(type_) is not str or type(seq) is not int or type(time_) is not int:
            raise SessionError("event type/seq/time are malformed", code="SESSION_CORRUPT")
        ignorable = raw.get("ignorable", False)
        if ignorable is not False and ignorable is not True:
            raise SessionError("event ignorable must be a boolean", code="SESSION_CORRUPT")
        spec = self._specs.get(type_)
        if spec is None and not ignorable:
            raise SessionError(
                f"unknown required event type {type_!r}", code="SESSION_FORMAT_UNSUPPORTED"
            )
        surface = spec.surface if spec is not None else "source_event_seqs" in raw
        seqs = raw.get("source_event_seqs")
        op = raw.get("surface_op")
        if surface:
            if type(seqs) is not list or op != "append" or any(type(s) is not int for s in seqs):
                raise SessionError(f"{type_} lacks surface metadata", code="SESSION_CORRUPT")
        elif seqs is not None or op is not None:
            raise SessionError(f"{type_} must not carry surface metadata", code="SESSION_CORRUPT")
        if spec is None or spec.payload is None:
            try:
                data = freeze_json(raw.get("data"))
            except Exception as exc:
                raise SessionError(
                    f"{type_} data is malformed: {exc}", code="SESSION_CORRUPT"
                ) from exc
        else:
            hook = self._hooks.get(type_)
            if hook is None:
                hook = self._hooks[type_] = _structure_hook(spec.payload)
                # Later events of this type take the one-go path above.
                self._fast[type_] = (hook, spec.payload, spec.surface)
            data = raw.get("data", {})
            try:
                data = hook(data, spec.payload)
            except Exception:
                data = _verdict(spec.payload, type_, data)
        if surface:
            return make_event(
                type_, seq, time_, data, tuple(cast("list[int]", seqs)), "append", ignorable
            )
        return make_event(type_, seq, time_, data, None, None, ignorable)


_EVENT_KEYS = frozenset(
    {"type", "seq", "time", "data", "source_event_seqs", "surface_op", "ignorable"}
)


def _round_trip(cls: type, type_: str, data: object) -> None:
    """Write ``data`` as the JSONL log writes a payload of ``cls``, read it back as the log
    reads it, and raise unless that gives an equal value (the slow route of ``snapshot``)."""
    try:
        raw = converter.get_unstructure_hook(cls)(data)
    except RecursionError:
        raise _too_deep(type_) from None
    except Exception as exc:
        raise SessionError(
            f"{type_} data cannot be written: {exc}", code="SESSION_EVENT_INVALID"
        ) from exc
    try:
        text = dumps(freeze_json(raw))  # the JSON limits, then the text the writer would write
    except NotJsonError as exc:
        raise SessionError(
            f"{type_} data is not losslessly JSON-serializable: {exc}",
            code="SESSION_EVENT_NOT_JSON",
        ) from exc
    except Exception as exc:  # a value the converter wrote that is no JSON at all
        raise SessionError(
            f"{type_} data cannot be written: {exc}", code="SESSION_EVENT_NOT_JSON"
        ) from exc
    parsed = json.loads(text)
    try:
        try:
            again = _structure_hook(cls)(parsed, cls)
        except Exception:
            again = converter.structure(parsed, cls)
    except Exception as exc:
        raise SessionError(
            f"{type_} data would not read back: {exc}", code="SESSION_EVENT_INVALID"
        ) from exc
    if again != data:
        raise SessionError(
            f"{type_} data would read back as {again!r}, not as appended",
            code="SESSION_EVENT_INVALID",
        )


def _too_deep(type_: str) -> SessionError:
    return SessionError(
        f"{type_} data nests deeper than {MAX_NESTING} levels", code="SESSION_EVENT_NOT_JSON"
    )


def _identity(value: Any) -> Any:
    return value


def _structure_hook(cls: type) -> Callable[[Any, type], Any]:
    """How payloads of ``cls`` are structured first: its compiled decoder
    (:mod:`dsh_core._codec`) if it has one, else the converter's hook."""
    fast = class_decoder(cls)
    return fast if fast is not None else converter.get_structure_hook(cls)


def _verdict(cls: type, type_: str, data: Any) -> Any:
    """``data`` structured by the converter, after the first hook failed.

    A compiled decoder gives up on anything unusual without saying why, so the converter
    structures the payload again: it either accepts it or raises the error that is reported.
    """
    try:
        return converter.structure(data, cls)
    except Exception as exc:
        raise SessionError(f"{type_} data is malformed: {exc}", code="SESSION_CORRUPT") from exc


def encode_header(header: SessionHeader) -> dict[str, Any]:
    """The JSON-ready form of a header (``version`` always present): what the durable
    converter gives, each field left out when it equals its default, ``version`` then set.
    Every field is a JSON scalar the converter passes through, so this reads them directly
    instead of generating the converter's function at a start's first session (PERF-21); a
    value of another type than its field's goes to the converter."""
    out: dict[str, Any] = {}
    for name, default, types in _HEADER_FIELDS:
        value = getattr(header, name)
        if type(value) not in types:
            out = converter.unstructure(header)
            break
        if default is attrs.NOTHING or value != default:
            out[name] = value
    out["version"] = header.version
    return out


#: The types the durable converter passes through as they are, by a header field's annotation.
_PASSED: dict[str, frozenset[type]] = {
    "int": frozenset({int}),
    "str": frozenset({str}),
    "int | None": frozenset({int, type(None)}),
    "str | None": frozenset({str, type(None)}),
    "Literal['subagent'] | None": frozenset({str, type(None)}),
}
#: Each header field: its name, its default and the value types passed through; in the
#: converter's order (the fields without a default first, then the others, each in turn).
_HEADER_FIELDS: tuple[tuple[str, Any, frozenset[type]], ...] = tuple(
    sorted(
        ((f.name, f.default, _PASSED[str(f.type)]) for f in attrs.fields(SessionHeader)),
        key=lambda field: field[1] is not attrs.NOTHING,
    )
)


def structure_header(raw: object) -> SessionHeader:
    """Rebuild a header; an unknown version is unsupported, anything else malformed corrupt."""
    if not isinstance(raw, Mapping):
        raise SessionError("the header must be a JSON object", code="SESSION_CORRUPT")
    version = raw.get("version")
    if version != SESSION_FORMAT_VERSION:
        raise SessionError(
            f"session format version {version!r} is not supported (this runtime reads "
            f"{SESSION_FORMAT_VERSION})",
            code="SESSION_FORMAT_UNSUPPORTED",
        )
    decode = _header_decoder or _compile_header_decoder()
    try:
        return decode(raw)  # type: ignore[no-any-return]
    except Exception:  # the compiled decoder gives up without saying why: the converter says
        pass
    try:
        return converter.structure(raw, SessionHeader)
    except Exception as exc:
        raise SessionError(f"the header is malformed: {exc}", code="SESSION_CORRUPT") from exc


#: The compiled decoder of a header (:mod:`dsh_core._codec`, strict as the converter), made on
#: first use: a listing structures one header per stored log.
_header_decoder: Callable[[Any], Any] | None = None


def _compile_header_decoder() -> Callable[[Any], Any]:
    global _header_decoder
    fast = class_decoder(SessionHeader)
    _header_decoder = fast or (lambda raw: converter.structure(raw, SessionHeader))
    return _header_decoder


speed_up_inits(globals())
