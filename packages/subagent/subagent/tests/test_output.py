"""Output selection, stop reasons and run settlement (OUT-1..3, DRV-6)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core import (
    AgentCancelCause,
    AssistantChunkData,
    AssistantMessageData,
    ContentBlock,
    Finish,
    LlmFailure,
    Message,
    ModelSource,
    ReasoningBlock,
    ReasoningDelta,
    SessionEvent,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallDelta,
    ToolResultBlock,
    ToolResultData,
    TurnEndReason,
)
from dsh_subagent import (
    DIAGNOSTIC_LIMIT,
    NO_START_CAPABILITIES,
    SubagentCapabilities,
    SubagentResult,
    SubagentRun,
    one_shot_stop_reason,
    select_output,
    settle_run,
    settle_run_result,
    truncate_diagnostic,
)

_SOURCE = ModelSource(provider="scripted", model="m")


class Log:
    """Builds a child log, one event at a time."""

    def __init__(self) -> None:
        self.events: list[SessionEvent] = []

    def _add(self, type: str, data: object) -> Log:
        self.events.append(SessionEvent(type=type, seq=len(self.events), time=0, data=data))
        return self

    def message(self, *content: ContentBlock) -> Log:
        return self._add(
            "assistant/message",
            AssistantMessageData(
                turn=1,
                step=1,
                message=Message(id=f"m{len(self.events)}", role="assistant", content=content),
            ),
        )

    def chunk(self, chunk: Any) -> Log:
        return self._add("assistant/chunk", AssistantChunkData(turn=1, step=1, chunk=chunk))

    def tool_result(self, text: str) -> Log:
        block = ToolResultBlock(tool_call_id="c1", content=(TextBlock(text=text),))
        return self._add(
            "tool/result",
            ToolResultData(turn=1, step=1, message=Message(id="r", role="tool", content=(block,))),
        )


TEXT = TextBlock(text="partial one")
CALL = ToolCallBlock(id="c1", name="look", arguments="{}")


# -- OUT-1 -----------------------------------------------------------------------------------------


def test_last_non_empty_message_wins() -> None:
    """OUT-1: the output is the last assistant message with non-empty content."""
    log = Log().message(TextBlock(text="first")).message(TEXT, CALL)
    assert select_output(log.events) == (TEXT, CALL)


def test_usage_only_message_never_replaces_text() -> None:
    """OUT-1, BUG-1: an empty (usage-only) message after earlier text does not replace it."""
    log = Log().message(TEXT, CALL).tool_result("looked").message()
    assert select_output(log.events) == (TEXT, CALL)


def test_reasoning_only_message_counts() -> None:
    """OUT-1: textless but non-empty content (reasoning only) counts as the output."""
    thinking = ReasoningBlock(text="hmm")
    log = Log().message(TEXT).message(thinking)
    assert select_output(log.events) == (thinking,)


def test_streamed_text_is_the_fallback() -> None:
    """OUT-1: with no non-empty message the output is the concatenated text deltas, as one
    block; reasoning, tool-call deltas and tool results are excluded."""
    log = (
        Log()
        .chunk(ReasoningDelta(index=0, text="thinking"))
        .chunk(TextDelta(index=1, text="par"))
        .chunk(ToolCallDelta(index=2, id="c", name="look", arguments_delta="{}"))
        .tool_result("tool says")
        .chunk(TextDelta(index=0, text="tial"))
        .chunk(Finish(reason="error", failure=LlmFailure(message="x", code="X")))
        .message()
    )
    assert select_output(log.events) == (TextBlock(text="partial"),)


def test_complete_message_wins_over_later_stream() -> None:
    """OUT-1: a complete message wins over text streamed after it."""
    log = Log().message(TextBlock(text="complete")).chunk(TextDelta(index=0, text="later"))
    assert select_output(log.events) == (TextBlock(text="complete"),)


def test_no_output_is_none() -> None:
    """OUT-1: nothing produced -> None (results use (), lifecycle events omit it)."""
    assert select_output([]) is None
    only_empty = Log().message().chunk(ReasoningDelta(index=0, text="x")).tool_result("r")
    assert select_output(only_empty.events) is None
    blank = Log().chunk(TextDelta(index=0, text=""))
    assert select_output(blank.events) is None


# -- DRV-6 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("completed", "completed"),
        ("max-tokens", "max-tokens"),
        ("aborted", "aborted"),
        ("blocked", "refusal"),
        ("error", "error"),
        ("interrupted", "error"),
        ("disposed", "error"),
        ("something-new", "error"),
        (None, "error"),
    ],
)
def test_one_shot_stop_reason_table(kind: str | None, expected: str) -> None:
    """DRV-6: the one-shot mapping from the last turn end to a stop reason."""
    reason = None if kind is None else TurnEndReason(kind=kind)
    assert one_shot_stop_reason(reason, cancelled=False) == expected


@pytest.mark.parametrize("kind", ["max-tokens", "blocked", "error", "interrupted", "x", None])
def test_cancelled_non_completed_is_aborted(kind: str | None) -> None:
    """DRV-6: a cancelled run whose recorded reason is not completed is aborted; a completed
    turn stays completed."""
    reason = None if kind is None else TurnEndReason(kind=kind)
    assert one_shot_stop_reason(reason, cancelled=True) == "aborted"
    done = TurnEndReason(kind="completed")
    assert one_shot_stop_reason(done, cancelled=True) == "completed"
    aborted = TurnEndReason(kind="aborted", cause=AgentCancelCause(kind="parent"))
    assert one_shot_stop_reason(aborted, cancelled=True) == "aborted"


# -- OUT-3: diagnostics --------------------------------------------------------------------------

MARK = "\n[diagnostic truncated]"


def test_short_diagnostics_pass_through() -> None:
    """OUT-3: a diagnostic of at most 4096 UTF-8 bytes is unchanged; None stays None."""
    assert DIAGNOSTIC_LIMIT == 4096
    exact = "é" * 2048
    assert truncate_diagnostic(exact) == exact
    assert truncate_diagnostic("") == ""
    assert truncate_diagnostic(None) is None


#: Texts of 1,000 to 5,000 characters of 1 to 4 UTF-8 bytes each: a random pattern of up to 64
#: characters repeated to a random length, so the 4096-byte limit falls at any offset of it
#: (drawing each of thousands of characters was most of this test's time, for no more cases).
long_texts = st.builds(
    lambda unit, size: (unit * (size // len(unit) + 1))[:size],
    st.text(alphabet=st.sampled_from(["a", "é", "€", "𝄞", "\n"]), min_size=1, max_size=64),
    st.integers(1000, 5000),
)


@given(long_texts)
def test_long_diagnostics_cut_at_a_utf8_boundary(text: str) -> None:
    """OUT-3: longer diagnostics are cut at a UTF-8 character boundary to at most 4096 bytes
    and end with the truncation mark."""
    cut = truncate_diagnostic(text)
    assert cut is not None
    if len(text.encode()) <= DIAGNOSTIC_LIMIT:
        assert cut == text
        return
    assert cut.endswith(MARK)
    assert len(cut.encode("utf-8")) <= DIAGNOSTIC_LIMIT
    kept = cut[: -len(MARK)]
    assert text.startswith(kept)
    # the cut is as late as possible: one more character would not fit
    room = DIAGNOSTIC_LIMIT - len(MARK.encode())
    assert len(kept.encode()) + len(text[len(kept)].encode()) > room


def test_multibyte_character_is_never_split() -> None:
    """OUT-3: a 4-byte character straddling the limit is dropped whole."""
    room = DIAGNOSTIC_LIMIT - len(MARK.encode())
    text = "a" * (room - 2) + "𝄞" + "tail" * 100
    cut = truncate_diagnostic(text)
    assert cut == "a" * (room - 2) + MARK


def test_no_start_capabilities() -> None:
    """OUT-3: NO_START_CAPABILITIES is all false and frozen."""
    expected = SubagentCapabilities(
        output_schema=False, depth_limit=False, tool_filter=False, persona=False
    )
    assert expected == NO_START_CAPABILITIES
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        NO_START_CAPABILITIES.persona = True  # type: ignore[misc]


# -- OUT-2 / OUT-3: settling a run -------------------------------------------------------------


def _run(
    outcome: SubagentResult | BaseException,
    *,
    dispose_error: BaseException | None = None,
) -> tuple[SubagentRun, list[str]]:
    calls: list[str] = []
    future: asyncio.Future[SubagentResult] = asyncio.get_running_loop().create_future()
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)

    async def dispose() -> None:
        calls.append("dispose")
        if dispose_error is not None:
            raise dispose_error

    return SubagentRun(id="c", local_agent=None, result=future, dispose=dispose), calls


def _result(stop: str, text: str = "", diagnostic: str | None = None) -> SubagentResult:
    output: Sequence[ContentBlock] = (
        (TextBlock(text=text), CALL, TextBlock(text="!")) if text else ()
    )
    return SubagentResult(output=tuple(output), stop_reason=stop, diagnostic=diagnostic)


async def test_settle_completed() -> None:
    """OUT-2: completed -> the job completes with the joined text output; the run is disposed."""
    run, calls = _run(_result("completed", "answer"))
    settled = await settle_run(run)
    assert (settled.status, settled.output, settled.detail) == ("completed", "answer!", None)
    assert calls == ["dispose"]


async def test_settle_aborted_is_killed() -> None:
    """OUT-2: aborted -> killed."""
    run, calls = _run(_result("aborted", "half"))
    settled = await settle_run(run)
    assert settled.status == "killed"
    assert calls == ["dispose"]


@pytest.mark.parametrize("stop", ["error", "max-tokens", "refusal", "brand-new"])
async def test_settle_other_reasons_fail_with_detail(stop: str) -> None:
    """OUT-2: error, max-tokens, refusal and unknown reasons -> failed with the reason as
    detail, or "<reason>; diagnostic: <d>" when a diagnostic exists."""
    run, _ = _run(_result(stop, "part"))
    settled = await settle_run(run)
    assert (settled.status, settled.detail) == ("failed", stop)
    run, calls = _run(_result(stop, "part", diagnostic="model said no"))
    settled = await settle_run(run)
    assert (settled.status, settled.detail) == ("failed", f"{stop}; diagnostic: model said no")
    assert calls == ["dispose"]


async def test_settle_rejected_result() -> None:
    """OUT-2: a rejected result -> failed with the error's text; the run is still disposed."""
    run, calls = _run(OSError("socket closed"))
    settled = await settle_run(run)
    assert (settled.status, settled.detail) == ("failed", "socket closed")
    assert calls == ["dispose"]


@pytest.mark.parametrize(
    ("outcome", "before"),
    [
        (_result("completed", "ok"), "completed"),
        (_result("error", diagnostic="d"), "error; diagnostic: d"),
        (OSError("broken"), "broken"),
    ],
)
async def test_dispose_failure_keeps_both_details(
    outcome: SubagentResult | BaseException, before: str
) -> None:
    """OUT-2: a disposal failure -> failed with "<prev>; dispose failed: <err>", keeping both."""
    run, calls = _run(outcome, dispose_error=RuntimeError("stuck child"))
    settled = await settle_run(run)
    assert settled.status == "failed"
    assert settled.detail == f"{before}; dispose failed: stuck child"
    assert calls == ["dispose"]


async def test_settle_run_result_passes_results_through() -> None:
    """OUT-3: settle_run_result returns the run's own result when it resolves."""
    result = _result("max-tokens", "x")
    run, _ = _run(result)
    assert await settle_run_result(run) is result


async def test_settle_run_result_never_raises() -> None:
    """OUT-3: a rejection becomes error with a bounded diagnostic and a contained on_error; after
    a local cancel it becomes aborted with no on_error."""
    seen: list[BaseException] = []
    fault = ValueError("x" * 10_000)
    run, _ = _run(fault)
    settled = await settle_run_result(run, on_error=seen.append)
    assert settled.stop_reason == "error"
    assert settled.output == ()
    assert seen == [fault]
    assert settled.diagnostic is not None and settled.diagnostic.endswith(MARK)
    assert len(settled.diagnostic.encode()) <= DIAGNOSTIC_LIMIT

    def explode(exc: BaseException) -> None:
        raise RuntimeError("on_error failed")

    run, _ = _run(OSError("y"))
    assert (await settle_run_result(run, on_error=explode)).stop_reason == "error"

    seen.clear()
    run, _ = _run(OSError("after cancel"))
    cancelled: Callable[[], bool] = lambda: True  # noqa: E731
    settled = await settle_run_result(run, cancelled=cancelled, on_error=seen.append)
    assert settled.stop_reason == "aborted"
    assert seen == []


async def test_settle_run_disposes_when_cancelled() -> None:
    """OUT-2, hardening 11.8: a settle_run whose wait is cancelled (here by a timeout) still
    disposes the run before the cancellation propagates, and leaves the result uncancelled."""
    calls: list[str] = []
    future: asyncio.Future[SubagentResult] = asyncio.get_running_loop().create_future()

    async def dispose() -> None:
        calls.append("dispose")

    run = SubagentRun(id="c", local_agent=None, result=future, dispose=dispose)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(settle_run(run), 0.01)
    assert calls == ["dispose"]
    assert not future.cancelled()
