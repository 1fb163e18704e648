"""The session-log invariant: turn/step nesting and numbering, tool call/result pairing.

One :class:`SessionLogChecker` follows one log. ``check(event)`` raises
:class:`LogInvariantError` *before* a bad event is committed; ``apply`` folds a good one in.
The same rules define a *balanced* prefix (no open turn, no open step, no call without its
result), the contract of every seed (host-core §4, §10).
"""

from __future__ import annotations

from collections.abc import Iterable

from ._content import Message, ToolCallBlock, ToolResultBlock
from ._errors import DshError
from ._events import (
    AssistantMessageData,
    SessionEvent,
    StepData,
    ToolCallData,
    ToolResultData,
    TurnEndData,
    TurnStartData,
)

__all__ = ["LogInvariantError", "SessionLogChecker", "check_balanced", "unanswered_calls"]

_NEEDS_STEP = frozenset({"step/end", "assistant/chunk", "assistant/message", "tool/call"})
_SYNTHETIC_CODES = frozenset({"TOOL_NOT_STARTED"})


class LogInvariantError(DshError):
    """An event would break the session-log invariant; nothing was written."""

    code = "INVARIANT"

    def __init__(self, message: str, *, seq: int) -> None:
        super().__init__(f"session log invariant at seq {seq}: {message}")
        self.seq = seq


class SessionLogChecker:
    """Follows one log; rejects events that break nesting, numbering or call pairing.

    It also keeps :attr:`unanswered`: the calls a closed step announced (in its
    ``assistant/message``) or logged (``tool/call``) without a ``tool/result``. A log holding
    them is read as it is (an older runtime could write one), but every later model request
    would carry a call without its result, which real endpoints refuse: the invariant
    companion refuses a request while any is left (:meth:`request_problem`).
    """

    __slots__ = (
        "announced",
        "last_seq",
        "last_step",
        "last_turn",
        "open_step",
        "open_turn",
        "pending",
        "unanswered",
    )

    def __init__(self) -> None:
        self.last_seq = -1
        self.last_turn = 0
        self.open_turn: int | None = None
        self.last_step = 0
        self.open_step: int | None = None
        self.pending: set[str] = set()
        #: The open step's calls without a result, announced or logged.
        self.announced: set[str] = set()
        #: Calls of closed steps that never got a result (see the class docstring).
        self.unanswered: set[str] = set()

    def request_problem(self) -> str | None:
        """Why a model request may not be made now (calls without results), or ``None``."""
        if self.unanswered:
            return f"a request would carry tool calls without a result: {sorted(self.unanswered)}"
        return None

    def replay(self, events: Iterable[SessionEvent]) -> None:
        """Check and apply every event in order."""
        for event in events:
            self.check(event)
            self.apply(event)

    @property
    def balanced(self) -> bool:
        """No open turn, no open step, no call waiting for its result."""
        return self.open_turn is None and self.open_step is None and not self.pending

    def check(self, event: SessionEvent) -> None:
        """Raise :class:`LogInvariantError` if ``event`` may not follow the log so far."""
        seq = event.seq
        if seq != self.last_seq + 1:
            raise LogInvariantError(f"seq {seq} does not follow {self.last_seq}", seq=seq)
        t = event.type
        d = event.data
        if t in _NEEDS_STEP:  # the most common events (chunks) first
            turn, step = d.turn, d.step
            if turn != self.open_turn or step != self.open_step or self.open_step is None:
                raise LogInvariantError(
                    f"{t} names turn {turn} step {step}, open is {self.open_turn}/{self.open_step}",
                    seq=seq,
                )
            if t == "tool/call":
                assert isinstance(d, ToolCallData)
                if d.call_id in self.pending:
                    raise LogInvariantError(f"tool call {d.call_id!r} repeated", seq=seq)
        elif t == "turn/start":
            assert isinstance(d, TurnStartData)
            if self.open_turn is not None:
                raise LogInvariantError(f"turn {self.open_turn} is still open", seq=seq)
            if d.turn != self.last_turn + 1:
                raise LogInvariantError(f"turn {d.turn} does not follow {self.last_turn}", seq=seq)
        elif t == "turn/end":
            assert isinstance(d, TurnEndData)
            if self.open_turn is None or d.turn != self.open_turn:
                raise LogInvariantError(f"turn/end {d.turn} but open is {self.open_turn}", seq=seq)
            if self.open_step is not None:
                raise LogInvariantError(f"step {self.open_step} is still open", seq=seq)
        elif t == "step/start":
            assert isinstance(d, StepData)
            if self.open_turn is None or d.turn != self.open_turn:
                raise LogInvariantError(f"step outside turn {d.turn}", seq=seq)
            if self.open_step is not None:
                raise LogInvariantError(f"step {self.open_step} is still open", seq=seq)
            if d.step != self.last_step + 1:
                raise LogInvariantError(f"step {d.step} does not follow {self.last_step}", seq=seq)
        elif t == "tool/result":
            assert isinstance(d, ToolResultData)
            if d.turn != self.open_turn or d.step != self.open_step or self.open_step is None:
                raise LogInvariantError("tool/result outside its step", seq=seq)
            call_id = _result_call_id(d)
            synthetic = d.error is not None and d.error.code in _SYNTHETIC_CODES
            if call_id not in self.pending and not synthetic:
                raise LogInvariantError(f"tool/result for unknown call {call_id!r}", seq=seq)
        elif t == "request/header" and self.open_turn is None:
            raise LogInvariantError("request/header outside a turn", seq=seq)

    def apply(self, event: SessionEvent) -> None:
        """Fold an accepted event into the state."""
        self.last_seq = event.seq
        t = event.type
        if t == "assistant/chunk":
            return  # the most common event changes nothing else
        d = event.data
        if t == "turn/start":
            self.open_turn = self.last_turn = d.turn
            self.last_step = 0
        elif t == "turn/end":
            self.open_turn = None
        elif t == "step/start":
            self.open_step = self.last_step = d.step
        elif t == "step/end":
            self.open_step = None
            self.pending.clear()
            if self.announced:
                self.unanswered |= self.announced
                self.announced = set()
        elif t == "tool/call":
            self.pending.add(d.call_id)
            self.announced.add(d.call_id)
        elif t == "tool/result":
            call_id = _result_call_id(d)
            self.pending.discard(call_id)
            self.announced.discard(call_id)
            if self.unanswered:
                self.unanswered.discard(call_id)
        elif t == "assistant/message":
            assert isinstance(d, AssistantMessageData)
            for block in d.message.content:
                if isinstance(block, ToolCallBlock):
                    self.announced.add(block.id)


def _result_call_id(d: ToolResultData) -> str:
    for block in d.message.content:
        if isinstance(block, ToolResultBlock):
            return block.tool_call_id
    return ""


def check_balanced(events: Iterable[SessionEvent]) -> None:
    """Raise :class:`LogInvariantError` unless ``events`` is a valid, balanced prefix."""
    checker = SessionLogChecker()
    checker.replay(events)
    if not checker.balanced:
        what = (
            f"turn {checker.open_turn} is open"
            if checker.open_turn is not None
            else f"calls {sorted(checker.pending)} have no result"
        )
        raise LogInvariantError(f"the prefix is not balanced: {what}", seq=checker.last_seq)


def unanswered_calls(messages: Iterable[Message]) -> list[str]:
    """The ids of the tool calls in ``messages`` (a model request's history) that no tool
    result answers, in order: a request carrying one is refused by real endpoints. Only an
    assistant message makes calls (a user message quoting a child's closing call does not)."""
    open_calls: dict[str, None] = {}
    for m in messages:
        role = m.role
        for block in m.content:
            if isinstance(block, ToolCallBlock):
                if role == "assistant":
                    open_calls[block.id] = None
            elif isinstance(block, ToolResultBlock):
                open_calls.pop(block.tool_call_id, None)
    return list(open_calls)
