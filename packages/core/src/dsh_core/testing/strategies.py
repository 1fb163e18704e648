"""Hypothesis strategies for session logs, and the builder they use (public test API).

``session_logs()`` draws *valid* logs: numbered turns with steps, user and assistant messages,
streamed chunks, tool calls with their results, request headers, inbox splices and a free-form
ignorable plugin event. ``LogBuilder`` writes such logs by hand, one event per call, keeping
``seq`` equal to the index and every turn, step and call correctly numbered and cited.

Import it as ``dsh_core.testing.strategies``; it needs ``hypothesis`` (``dsh-core[testing]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from hypothesis import strategies as st

from .._content import (
    LlmFailure,
    Message,
    MessageSource,
    ModelSource,
    PluginSource,
    ReasoningBlock,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolResultBlock,
    ToolSource,
    UserSource,
    text_blocks,
)
from .._events import (
    AgentCancelCause,
    AssistantChunkData,
    AssistantMessageData,
    EndSeedData,
    EpochHeader,
    InboxSplicedData,
    LlmCallConfig,
    RequestHeaderData,
    SessionEvent,
    StepData,
    ToolCallData,
    ToolResultData,
    ToolResultError,
    ToolSchema,
    TurnEndData,
    TurnEndReason,
    TurnStartData,
)
from .._json import JsonValue, freeze_json

__all__ = [
    "PLUGIN_EVENT_TYPE",
    "LogBuilder",
    "json_values",
    "session_logs",
    "turn_end_reasons",
    "unbalanced_session_logs",
]

#: The type of the free-form plugin event the strategies draw (appended as ignorable).
PLUGIN_EVENT_TYPE = "example-plugin/note"

_MODEL = ModelSource(provider="test", model="test-1")


class LogBuilder:
    """Writes a valid session log by hand (``seq`` = index, times strictly increasing).

    Methods append one event and return it; ``events`` is the log so far. The builder tracks
    the open turn and step, so ``step_start()`` inside turn 3 names turn 3 and the next step.
    """

    def __init__(self, *, start_time: int = 1_700_000_000_000) -> None:
        self._events: list[SessionEvent] = []
        self._time = start_time
        self.turn = 0
        self.step = 0
        self.turn_open = False
        self.step_open = False
        self._calls: dict[str, int] = {}
        self._ids = 0

    @property
    def events(self) -> tuple[SessionEvent, ...]:
        """The log so far."""
        return tuple(self._events)

    def _id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}-{self._ids}"

    def add(
        self,
        type: str,
        data: Any,
        *,
        source_event_seqs: Sequence[int] | None = None,
        ignorable: bool = False,
    ) -> SessionEvent:
        """Append any event (``source_event_seqs`` marks it as a surface event)."""
        self._time += 1
        event = SessionEvent(
            type=type,
            seq=len(self._events),
            time=self._time,
            data=data,
            source_event_seqs=tuple(source_event_seqs) if source_event_seqs is not None else None,
            surface_op="append" if source_event_seqs is not None else None,
            ignorable=ignorable,
        )
        self._events.append(event)
        return event

    def turn_start(self) -> SessionEvent:
        """Open the next turn."""
        self.turn += 1
        self.step = 0
        self.turn_open = True
        return self.add("turn/start", TurnStartData(turn=self.turn))

    def turn_end(self, reason: TurnEndReason | None = None) -> SessionEvent:
        """Close the open turn (``completed`` unless told otherwise)."""
        self.turn_open = False
        reason = reason or TurnEndReason(kind="completed")
        return self.add("turn/end", TurnEndData(turn=self.turn, reason=reason))

    def step_start(self) -> SessionEvent:
        """Open the next step of the open turn."""
        self.step += 1
        self.step_open = True
        self._calls = {}
        return self.add("step/start", StepData(turn=self.turn, step=self.step))

    def step_end(self) -> SessionEvent:
        """Close the open step."""
        self.step_open = False
        return self.add("step/end", StepData(turn=self.turn, step=self.step))

    def user(self, text: str = "hello", *, source: MessageSource | None = None) -> SessionEvent:
        """A ``user/message`` (surface, citing nothing)."""
        message = Message(
            id=self._id("user"),
            role="user",
            content=text_blocks(text),
            source=source or UserSource(),
        )
        return self.add("user/message", message, source_event_seqs=())

    def chunk(self, text: str = "tok") -> SessionEvent:
        """An ``assistant/chunk`` carrying a text delta."""
        data = AssistantChunkData(
            turn=self.turn, step=self.step, chunk=TextDelta(index=0, text=text)
        )
        return self.add("assistant/chunk", data)

    def assistant(
        self,
        text: str = "",
        *,
        calls: Sequence[tuple[str, str]] = (),
        reasoning: str | None = None,
        cites: Sequence[int] = (),
        usage: TokenUsage | None = None,
        interrupted: bool = False,
    ) -> SessionEvent:
        """An ``assistant/message``: optional reasoning, text, then ``calls`` as
        ``(call id, tool name)`` tool-call blocks (arguments ``{}``)."""
        blocks: list[Any] = []
        if reasoning is not None:
            blocks.append(ReasoningBlock(text=reasoning))
        if text:
            blocks.append(TextBlock(text=text))
        blocks.extend(ToolCallBlock(id=i, name=n, arguments="{}") for i, n in calls)
        message = Message(
            id=self._id("assistant"), role="assistant", content=tuple(blocks), source=_MODEL
        )
        data = AssistantMessageData(
            turn=self.turn, step=self.step, message=message, usage=usage, interrupted=interrupted
        )
        return self.add("assistant/message", data, source_event_seqs=cites)

    def tool_call(self, call_id: str, name: str = "tool", arguments: str = "{}") -> SessionEvent:
        """A ``tool/call`` in the open step."""
        event = self.add(
            "tool/call",
            ToolCallData(
                turn=self.turn, step=self.step, call_id=call_id, name=name, arguments=arguments
            ),
        )
        self._calls[call_id] = event.seq
        return event

    def tool_result(
        self,
        call_id: str,
        text: str = "ok",
        *,
        error: ToolResultError | None = None,
        meta: JsonValue = None,
    ) -> SessionEvent:
        """The ``tool/result`` of ``call_id``, citing its ``tool/call``."""
        message = Message(
            id=self._id("result"),
            role="tool",
            content=(
                ToolResultBlock(
                    tool_call_id=call_id, content=text_blocks(text), is_error=error is not None
                ),
            ),
            source=ToolSource(call_id=call_id),
        )
        data = ToolResultData(
            turn=self.turn, step=self.step, message=message, error=error, meta=meta
        )
        return self.add("tool/result", data, source_event_seqs=(self._calls[call_id],))

    def request_header(
        self,
        header: EpochHeader | None = None,
        reason: Literal["initial", "resume", "change"] = "initial",
    ) -> SessionEvent:
        """A ``request/header`` (inside the open turn)."""
        header = header or EpochHeader(config=LlmCallConfig(provider="test", model="test-1"))
        return self.add("request/header", RequestHeaderData(header=header, reason=reason))

    def splice(
        self, *texts: str, target: Literal["next-turn", "next-step"] = "next-turn"
    ) -> SessionEvent:
        """An ``agent/inbox/spliced`` inserting one user message per text."""
        inserted = tuple(
            Message(id=self._id("queued"), role="user", content=text_blocks(t)) for t in texts
        )
        return self.add(
            "agent/inbox/spliced", InboxSplicedData(target=target, start=0, inserted=inserted)
        )

    def end_seed(self) -> SessionEvent:
        """A ``session/end-seed``."""
        return self.add("session/end-seed", EndSeedData())

    def plugin_event(self, data: JsonValue, type: str = PLUGIN_EVENT_TYPE) -> SessionEvent:
        """A free-form event of a type no host registers, marked ignorable."""
        return self.add(type, freeze_json(data), ignorable=True)


# -- strategies ----------------------------------------------------------------------------------

_texts = st.text(max_size=12)
_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
_finite = st.floats(allow_nan=False, allow_infinity=False).map(lambda f: f + 0.0)


def json_values(max_leaves: int = 8) -> st.SearchStrategy[JsonValue]:
    """Lossless JSON values (no NaN, infinities or ``-0.0``), frozen as the log stores them."""
    scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _finite | _texts
    tree = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_texts, inner, max_size=3),
        max_leaves=max_leaves,
    )
    return tree.map(freeze_json)


def turn_end_reasons(*, ran_step: bool = True) -> st.SearchStrategy[TurnEndReason]:
    """The reasons a live turn ends with (``interrupted`` is left to crash repair)."""
    failure = st.builds(
        LlmFailure,
        message=_texts,
        code=_names,
        status=st.none() | st.integers(100, 599),
    )
    cause = st.builds(
        AgentCancelCause,
        kind=st.sampled_from(["user", "parent", "hook", "disposed"]),
        reason=st.none() | _texts,
    )
    options = [
        st.just(TurnEndReason(kind="completed")),
        cause.map(lambda c: TurnEndReason(kind="aborted", cause=c)),
        failure.map(lambda f: TurnEndReason(kind="error", error=f)),
    ]
    if ran_step:
        options.append(st.just(TurnEndReason(kind="max-tokens")))
    else:
        options.append(st.just(TurnEndReason(kind="blocked")))
    return st.one_of(options)


_headers = st.builds(
    EpochHeader,
    config=st.builds(
        LlmCallConfig,
        provider=_names,
        model=_names,
        max_tokens=st.none() | st.integers(1, 10_000),
        temperature=st.none() | st.floats(0, 2).map(lambda f: f + 0.0),
        stop=st.none() | st.lists(_texts, max_size=2).map(tuple),
    ),
    system=st.none() | _texts,
    tools=st.none()
    | st.lists(
        st.builds(
            ToolSchema,
            name=_names,
            description=_texts,
            parameters=st.just({"type": "object"}),
        ),
        max_size=2,
    ).map(tuple),
)

_usage = st.builds(TokenUsage, input_tokens=st.integers(0, 999), output_tokens=st.integers(0, 999))
_json = json_values()
_small_json = json_values(4)
_reasons = {ran: turn_end_reasons(ran_step=ran) for ran in (True, False)}
_user_sources = st.one_of(
    st.just(UserSource()),
    st.builds(PluginSource, plugin=_names, form=st.none() | st.just("snapshot")),
)


def _step(draw: st.DrawFn, log: LogBuilder) -> None:
    log.step_start()
    for text in draw(st.lists(_texts, max_size=2)):
        log.user(text, source=draw(_user_sources))
    if draw(st.booleans()):
        log.request_header(draw(_headers), draw(st.sampled_from(["initial", "resume", "change"])))
    chunks = [log.chunk(t).seq for t in draw(st.lists(_texts, max_size=3))]
    names = draw(st.lists(_names, max_size=2))
    calls = [(f"call-{log.turn}-{log.step}-{i}", name) for i, name in enumerate(names)]
    usage = draw(st.none() | _usage)
    log.assistant(
        draw(_texts),
        calls=calls,
        reasoning=draw(st.none() | _texts),
        cites=chunks,
        usage=usage,
    )
    for call_id, name in calls:
        log.tool_call(call_id, name, draw(st.sampled_from(["{}", '{"path":"a.txt"}'])))
        failed = draw(st.booleans())
        log.tool_result(
            call_id,
            draw(_texts),
            error=ToolResultError(name=name, code="TOOL_FAILED") if failed else None,
            meta=draw(st.none() | _small_json),
        )
    if draw(st.booleans()):
        log.plugin_event(draw(_json))
    log.step_end()


@st.composite
def session_logs(
    draw: st.DrawFn,
    *,
    min_turns: int = 0,
    max_turns: int = 3,
    max_steps: int = 2,
    open_end: bool = False,
) -> tuple[SessionEvent, ...]:
    """A valid session log of ``min_turns`` to ``max_turns`` closed turns.

    Balanced unless ``open_end``: then one more turn may be left open anywhere a crash could
    leave it (after ``turn/start``, inside a step, between a call and its result, or after an
    assistant message announcing calls that never started).
    """
    log = LogBuilder()
    if draw(st.booleans()):
        log.splice(draw(_texts))
    for _ in range(draw(st.integers(min_turns, max_turns))):
        log.turn_start()
        if draw(st.booleans()):
            log.splice(draw(_texts), target=draw(st.sampled_from(["next-turn", "next-step"])))
        steps = draw(st.integers(0, max_steps))
        for _ in range(steps):
            _step(draw, log)
        log.turn_end(draw(_reasons[steps > 0]))
        if draw(st.booleans()):
            log.plugin_event(draw(_json))
    if open_end and draw(st.booleans()):
        _open_turn(draw, log)
    return log.events


def _open_turn(draw: st.DrawFn, log: LogBuilder) -> None:
    log.turn_start()
    for _ in range(draw(st.integers(0, 1))):
        _step(draw, log)
    where = draw(st.sampled_from(["turn", "step", "announced", "called"]))
    if where == "turn":
        return
    log.step_start()
    if where == "step":
        if draw(st.booleans()):
            log.chunk(draw(_texts))
        return
    names = draw(st.lists(_names, min_size=1, max_size=3))
    calls = [(f"open-{i}", n) for i, n in enumerate(names)]
    log.assistant(draw(_texts), calls=calls)
    if where == "called":
        done = draw(st.integers(0, len(calls) - 1))
        for call_id, name in calls[:done]:
            log.tool_call(call_id, name)
            log.tool_result(call_id)
        log.tool_call(*calls[done])


@st.composite
def unbalanced_session_logs(draw: st.DrawFn, *, max_turns: int = 2) -> tuple[SessionEvent, ...]:
    """A valid log that is *not* balanced: an open turn, an open step, or a call without
    its result."""
    log = LogBuilder()
    for _ in range(draw(st.integers(0, max_turns))):
        log.turn_start()
        for _ in range(draw(st.integers(0, 2))):
            _step(draw, log)
        log.turn_end()
    where = draw(st.sampled_from(["turn", "step", "call"]))
    log.turn_start()
    if where == "turn":
        if draw(st.booleans()):
            _step(draw, log)
        return log.events
    log.step_start()
    if where == "call":
        log.assistant(calls=[("pending", "tool")])
        log.tool_call("pending", "tool")
    return log.events
