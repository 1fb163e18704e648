"""What a run produced: output selection, stop reasons, settlement (OUT-1..3, DRV-6).

One selection rule serves results, lifecycle events and settlement notices (fixing BUG-1): the
last ``assistant/message`` with non-empty content wins; an empty, usage-only message never
replaces earlier text; with no such message the streamed ``text-delta`` chunks are the output.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from dsh_core import (
    AssistantChunkData,
    AssistantMessageData,
    ConsumedWork,
    ContentBlock,
    JobSettlement,
    SessionEvent,
    TextBlock,
    TextDelta,
    TurnEndReason,
    blocks_text,
)

from ._types import SubagentResult, SubagentRun, SubagentStopReason

__all__ = [
    "DIAGNOSTIC_LIMIT",
    "continuable_stop_reason",
    "one_shot_stop_reason",
    "select_output",
    "settle_run",
    "settle_run_result",
    "truncate_diagnostic",
]

DIAGNOSTIC_LIMIT = 4096
_TRUNCATED = "\n[diagnostic truncated]"
_log = logging.getLogger("dsh.subagent")


def select_output(events: Iterable[SessionEvent]) -> tuple[ContentBlock, ...] | None:
    """The run's final output from its own events, or ``None`` when it produced none.

    Callers give only the child's own events (after its seed), so an inherited answer is never
    reported (DRV-7). Results use ``select_output(...) or ()``; lifecycle events omit it.
    """
    message: tuple[ContentBlock, ...] | None = None
    streamed: list[str] = []
    for event in events:
        if event.type == "assistant/message":
            data: AssistantMessageData = event.data
            if data.message.content:
                message = data.message.content
        elif event.type == "assistant/chunk" and message is None:
            chunk = event.data.chunk if isinstance(event.data, AssistantChunkData) else None
            if isinstance(chunk, TextDelta):
                streamed.append(chunk.text)
    if message is not None:
        return message
    text = "".join(streamed)
    return (TextBlock(text=text),) if text else None


def one_shot_stop_reason(reason: TurnEndReason | None, *, cancelled: bool) -> SubagentStopReason:
    """DRV-6: the stop reason of a one-shot run from its last consumed-work turn end."""
    kind = reason.kind if reason is not None else None
    mapped: SubagentStopReason
    if kind == "completed":
        mapped = "completed"
    elif kind == "max-tokens":
        mapped = "max-tokens"
    elif kind == "max-steps":
        mapped = "max-steps"
    elif kind == "aborted":
        mapped = "aborted"
    elif kind == "blocked":
        mapped = "refusal"
    else:
        mapped = "error"
    if cancelled and mapped != "completed":
        return "aborted"
    return mapped


_EPOCH_REASONS = {
    "max-tokens": "max-tokens",
    "max-steps": "max-steps",
    "aborted": "aborted",
    "interrupted": "aborted",
    "error": "error",
    "blocked": "refusal",
}


def continuable_stop_reason(work: ConsumedWork) -> SubagentStopReason:
    """CONT-15: the stop reason of one residency epoch from the fold of its own log suffix.

    ``completed`` (or no consumed-work end at all) is ``aborted`` when accepted work was
    cancelled unrun after it, else ``completed``; an unknown turn-end kind is ``error``.
    """
    end = work.end
    kind = end.reason.kind if end is not None else "completed"
    if kind == "completed":
        return "aborted" if work.dropped_unrun else "completed"
    return _EPOCH_REASONS.get(kind, "error")


def truncate_diagnostic(text: str | None) -> str | None:
    """Cut a diagnostic to at most 4096 UTF-8 bytes at a character boundary (OUT-3)."""
    if text is None:
        return None
    raw = text.encode("utf-8")
    if len(raw) <= DIAGNOSTIC_LIMIT:
        return text
    room = DIAGNOSTIC_LIMIT - len(_TRUNCATED.encode("utf-8"))
    return raw[:room].decode("utf-8", errors="ignore") + _TRUNCATED


async def settle_run_result(
    run: SubagentRun,
    *,
    cancelled: Callable[[], bool] = lambda: False,
    on_error: Callable[[BaseException], object] | None = None,
) -> SubagentResult:
    """``run.result`` that never raises (OUT-3): a rejection after a local cancel is
    ``aborted``; any other becomes ``error`` and is reported to ``on_error`` (contained)."""
    try:
        return await run.result
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if cancelled():
            return SubagentResult(output=(), stop_reason="aborted")
        if on_error is not None:
            try:
                on_error(exc)
            except Exception:
                _log.exception("on_error of a subagent run failed")
        return SubagentResult(
            output=(),
            stop_reason="error",
            diagnostic=truncate_diagnostic(f"{type(exc).__name__}: {exc}"),
        )


def _detail(result: SubagentResult) -> str:
    if result.diagnostic:
        return f"{result.stop_reason}; diagnostic: {result.diagnostic}"
    return result.stop_reason


async def settle_run(run: SubagentRun) -> JobSettlement:
    """Settle a one-shot run as a background job (OUT-2); the run is always disposed.

    completed -> ``completed`` with the text output; aborted -> ``killed``; any other reason
    -> ``failed`` with the reason (and diagnostic) as detail; a rejected result -> ``failed``
    with the error. A disposal failure is appended to the detail, keeping both. Cancelled
    while waiting, it still disposes the run before the cancellation propagates.
    """
    try:
        result = await run.result
    except asyncio.CancelledError:
        try:
            await run.dispose()
        except Exception:
            _log.exception("disposing a subagent run whose settlement was cancelled failed")
        raise
    except Exception as exc:
        settled = JobSettlement(status="failed", detail=str(exc) or type(exc).__name__)
    else:
        text = blocks_text(result.output)
        if result.stop_reason == "completed":
            settled = JobSettlement(status="completed", output=text)
        elif result.stop_reason == "aborted":
            settled = JobSettlement(status="killed", output=text)
        else:
            settled = JobSettlement(status="failed", output=text, detail=_detail(result))
    try:
        await run.dispose()
    except Exception as exc:
        prev = settled.detail or settled.status
        settled = JobSettlement(
            status="failed", output=settled.output, detail=f"{prev}; dispose failed: {exc}"
        )
    return settled
