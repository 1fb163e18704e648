"""Validation and crash repair: replaying a stored log through the log invariant, and the
events that close a turn a crashed process left open (never truncating)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from .._content import Message, ToolCallBlock, ToolResultBlock, ToolSource, text_blocks
from .._events import (
    EventTypeRegistry,
    SessionError,
    SessionEvent,
    StepData,
    ToolResultData,
    ToolResultError,
    TurnEndData,
    TurnEndReason,
)
from .._frozen import attrs_repr
from .._json import NotJsonError
from .._log_checker import LogInvariantError, SessionLogChecker
from .._sessions import now_ms

# -- validation and crash repair --------------------------------------------------------------


@attrs.define(eq=False)
class _Scan:
    """What a replay of a log leaves open (for repair)."""

    __repr__ = attrs_repr

    checker: SessionLogChecker
    announced: dict[str, tuple[str, int]]  # call id -> (tool name, assistant/message seq)
    calls: dict[str, tuple[str, int]]  # call id -> (tool name, tool/call seq)
    answered: set[str]


def _result_call_id(data: ToolResultData) -> str:
    for block in data.message.content:
        if isinstance(block, ToolResultBlock):
            return block.tool_call_id
    return ""


def _scan(
    events: Sequence[SessionEvent],
    locate: Callable[[int], str],
    *,
    resume: _Scan | None = None,
    start: int = 0,
) -> _Scan:
    """Replay ``events`` through the log invariant, remembering the open step's tool calls.

    A violation raises ``SESSION_CORRUPT`` with a message that starts with ``locate(index)``.
    With ``resume`` (a scan of ``events[:start]``, taken over and updated in place) only
    ``events[start:]`` are replayed: the verdict and the state are those of a whole replay.
    """
    if resume is None:
        checker = SessionLogChecker()
        announced: dict[str, tuple[str, int]] = {}
        calls: dict[str, tuple[str, int]] = {}
        answered: set[str] = set()
    else:
        checker = resume.checker
        announced, calls, answered = resume.announced, resume.calls, resume.answered
    check, apply = checker.check, checker.apply
    # A slice of the events after ``start``: an islice would step over the first ``start``
    # to get there, which made each warm resume cost the whole log again (PERF-22).
    for i, event in enumerate(events[start:] if start else events, start):
        try:
            check(event)
        except LogInvariantError as exc:
            raise SessionError(f"{locate(i)}: {exc}", code="SESSION_CORRUPT") from exc
        seqs = event.source_event_seqs
        if seqs and (min(seqs) < 0 or max(seqs) >= event.seq):
            raise SessionError(
                f"{locate(i)}: cites events that do not precede it", code="SESSION_CORRUPT"
            )
        apply(event)
        t = event.type
        if t == "assistant/chunk":
            continue
        if t == "step/start" or t == "step/end":
            announced = {}
            calls = {}
            answered = set()
        elif t == "assistant/message":
            announced = {
                b.id: (b.name, event.seq)
                for b in event.data.message.content
                if isinstance(b, ToolCallBlock)
            }
        elif t == "tool/call":
            calls[event.data.call_id] = (event.data.name, event.seq)
        elif t == "tool/result":
            answered.add(_result_call_id(event.data))
    if resume is None:
        return _Scan(checker=checker, announced=announced, calls=calls, answered=answered)
    resume.announced, resume.calls, resume.answered = announced, calls, answered
    return resume


_NOT_STARTED = "Error: the session ended before this tool call started; it never ran."
_OUTCOME_UNKNOWN = (
    "Error: the session ended while this tool call was running (tool/call at seq {seq}); "
    "its outcome is unknown. Check its effects before running it again."
)


def _tool_error(
    session_id: str, seq: int, time: int, where: tuple[int, int], call: tuple[str, str, str, int]
) -> SessionEvent:
    """A synthetic error ``tool/result`` for ``call = (call id, tool name, code, cited seq)``."""
    call_id, name, code, cite = call
    text = _NOT_STARTED if code == "TOOL_NOT_STARTED" else _OUTCOME_UNKNOWN.format(seq=cite)
    message = Message(
        id=f"{session_id}:repair:{seq}",
        role="tool",
        content=(ToolResultBlock(tool_call_id=call_id, content=text_blocks(text), is_error=True),),
        source=ToolSource(call_id=call_id),
    )
    data = ToolResultData(
        turn=where[0], step=where[1], message=message, error=ToolResultError(name=name, code=code)
    )
    return SessionEvent(
        type="tool/result",
        seq=seq,
        time=time,
        data=data,
        source_event_seqs=(cite,),
        surface_op="append",
    )


def _closers(session_id: str, scan: _Scan, next_seq: int) -> list[SessionEvent]:
    checker = scan.checker
    turn = checker.open_turn
    if turn is None:
        return []
    out: list[SessionEvent] = []
    time = now_ms()
    step = checker.open_step
    if step is not None:
        pending: list[tuple[str, str, str, int]] = []
        for call_id, (name, announced_at) in scan.announced.items():
            if call_id in scan.answered:
                continue
            logged = scan.calls.get(call_id)
            if logged is None:
                pending.append((call_id, name, "TOOL_NOT_STARTED", announced_at))
            else:
                pending.append((call_id, logged[0], "TOOL_OUTCOME_UNKNOWN", logged[1]))
        for call_id, (name, call_seq) in scan.calls.items():
            if call_id not in scan.answered and call_id not in scan.announced:
                pending.append((call_id, name, "TOOL_OUTCOME_UNKNOWN", call_seq))
        for call in pending:
            out.append(_tool_error(session_id, next_seq + len(out), time, (turn, step), call))
        out.append(
            SessionEvent(
                type="step/end",
                seq=next_seq + len(out),
                time=time,
                data=StepData(turn=turn, step=step),
            )
        )
    out.append(
        SessionEvent(
            type="turn/end",
            seq=next_seq + len(out),
            time=time,
            data=TurnEndData(turn=turn, reason=TurnEndReason(kind="interrupted")),
        )
    )
    return out


def repair_closers(session_id: str, events: Sequence[SessionEvent]) -> list[SessionEvent]:
    """The events that close ``events``' open final turn (empty when no turn is open).

    Per pending call of the open step an error ``tool/result``: ``TOOL_NOT_STARTED`` (citing
    the ``assistant/message``) when the call was announced but no ``tool/call`` was logged,
    ``TOOL_OUTCOME_UNKNOWN`` (citing the ``tool/call``) otherwise; then ``step/end`` if a step
    is open and ``turn/end`` with reason ``interrupted``. ``events`` must satisfy the log
    invariant (``SESSION_CORRUPT`` otherwise).
    """
    scan = _scan(events, lambda i: f"session {session_id!r} event {i}")
    return _closers(session_id, scan, len(events))


def _validate_appended(types: EventTypeRegistry, event: SessionEvent) -> None:
    """Refuse an event that a live session would have refused (type, JSON, surface)."""
    spec = types.get(event.type)
    if spec is None and not event.ignorable:
        raise SessionError(
            f"event {event.seq} has unknown required type {event.type!r}",
            code="SESSION_FORMAT_UNSUPPORTED",
        )
    try:
        types.snapshot(spec, event.type, event.data)
    except NotJsonError as exc:  # pragma: no cover - snapshot converts it already
        raise SessionError(str(exc), code="SESSION_EVENT_NOT_JSON") from exc
    surface = spec.surface if spec is not None else event.source_event_seqs is not None
    if surface != (event.surface_op == "append" and event.source_event_seqs is not None):
        raise SessionError(
            f"event {event.seq} ({event.type}) has wrong surface metadata", code="SESSION_SURFACE"
        )
