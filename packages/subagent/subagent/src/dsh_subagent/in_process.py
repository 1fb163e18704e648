"""The in-process one-shot driver shared by the ``spawn`` and ``fork`` providers (DRV-1..9).

``start_in_process_run(request, seed=...)`` creates an ordinary child agent through
``request.parent.ctx.agents.create`` (so the parent owns it and its disposal takes the child
along), composes it inside the unpublished creation window (persona, tool filter, structured
output, the delegation statement, and the descriptor hook), and returns the published
:class:`SubagentRun` before the child's turn is over. The result is read from the child's own
log (after its seed): the stop reason from the last consumed-work turn end (DRV-6), the
output by OUT-1.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dsh_core import (
    PERSONA_SECTION,
    AbortedError,
    AbortSignal,
    Agent,
    AgentCancelCause,
    AgentHandle,
    AgentOptions,
    AgentRegistry,
    Context,
    CreateAgentOptions,
    PreStep,
    PreStepDecision,
    PromptContext,
    PromptSection,
    ServiceKey,
    SessionEvent,
    SessionMeta,
    SystemPromptRegistry,
    ToolRestriction,
    fold_consumed_work,
    user_message,
)

from ._depth import SUBAGENT_DEPTH_KEY, resolve_child_depth
from ._descriptor import DESCRIPTOR_EVENT, descriptor_payload
from ._output import one_shot_stop_reason, select_output, truncate_diagnostic
from ._structured import StructuredCapture
from ._types import (
    ResolvedSubagentStartRequest,
    ResultFuture,
    SubagentCapabilities,
    SubagentResult,
    SubagentRun,
)

__all__ = [
    "DELEGATION_CONTEXT",
    "DELEGATION_STATEMENT",
    "IN_PROCESS_CAPABILITIES",
    "child_agent_options",
    "completed_turn_prefix",
    "compose_child",
    "start_in_process_run",
]

#: What this driver honours at start: every capability (output schema, depth limit, tool
#: filter, persona). Providers built on it declare these.
IN_PROCESS_CAPABILITIES = SubagentCapabilities(
    output_schema=True, depth_limit=True, tool_filter=True, persona=True
)
ABORTED_BEFORE_PUBLICATION = "subagent request was aborted before child publication"
DELEGATION_CONTEXT = "subagent:delegation"
DELEGATION_STATEMENT = (
    "You are a subagent: another agent delegated this task to you and receives your final "
    "answer. Your tools and permissions are fixed for this task. If you cannot do something "
    "with what you have, say so in your answer instead of retrying."
)
_log = logging.getLogger("dsh.subagent")
# Keyed lookups of the host services the driver uses on fresh contexts (no attribute fallback).
_AGENTS: ServiceKey[AgentRegistry] = ServiceKey("agents")
_SYSTEM_PROMPT: ServiceKey[SystemPromptRegistry] = ServiceKey("system_prompt")
_DELEGATION = PromptContext(name=DELEGATION_CONTEXT, order=120, text=DELEGATION_STATEMENT)
NO_CAPTURE = (
    "the child ended its turn without calling structured_output, so no structured result "
    "was recorded (the run is not re-prompted)"
)


def child_agent_options(parent: Agent, requested: AgentOptions | None, depth: int) -> AgentOptions:
    """DEP-4: the parent's route, ``max_tokens`` and ``max_steps`` overlaid with the request's
    declared fields, plus the runtime ``subagent_depth``. Nothing undeclared is invented."""
    base = parent.options
    req = requested if requested is not None else _NO_OPTIONS
    return AgentOptions(
        provider=req.provider if req.provider is not None else base.provider,
        model=req.model if req.model is not None else base.model,
        max_tokens=req.max_tokens if req.max_tokens is not None else base.max_tokens,
        max_steps=req.max_steps if req.max_steps is not None else base.max_steps,
        extensions={**req.extensions, SUBAGENT_DEPTH_KEY: depth},
    )


_NO_OPTIONS = AgentOptions()  # a request that declares nothing (an immutable value)


def completed_turn_prefix(parent: Agent) -> tuple[SessionEvent, ...] | None:
    """FORK-1: the parent's events from seq 0 through its last ``turn/end`` (a balanced
    prefix; the in-flight turn and anything after the last turn end are cut off), or ``None``
    when no turn has completed."""
    events = parent.session.events
    for i in range(len(events) - 1, -1, -1):
        if events[i].type == "turn/end":
            return events[: i + 1]
    return None


def compose_child(
    ctx: Context,
    persona: str | None,
    tool_filter: ToolRestriction | None,
    *,
    install: Callable[[Context], object] | None = None,
) -> None:
    """DEP-5's composition of a delegated child, in its unpublished creation window: the
    persona section, the delegation statement, ``install`` (the child's own scoped
    registrations, e.g. structured capture), then the tool filter over inherited tools.

    Shared by the one-shot driver and the continuation manager (fresh and resumed children).
    """
    system_prompt = ctx[_SYSTEM_PROMPT]
    if persona is not None:
        system_prompt.section(PromptSection(name=PERSONA_SECTION, order=0, text=persona))
    system_prompt.context(_DELEGATION)
    if install is not None:
        install(ctx)
    if tool_filter is not None:
        ctx.tools.restrict(tool_filter)


def _compose(
    request: ResolvedSubagentStartRequest,
    capture: StructuredCapture | None,
    descriptor: dict[str, Any],
) -> Callable[[Context], None]:
    """The creation-window set-up (DEP-5, DSC-4, STR-1): nothing is visible until publish."""

    def setup(ctx: Context) -> None:
        compose_child(
            ctx,
            request.persona,
            request.tool_filter,
            install=capture.install if capture is not None else None,
        )
        appended = False
        stop_listening: Callable[[], object] = _nothing

        async def on_pre_step(
            pre: PreStep, next_: Callable[..., Awaitable[PreStepDecision]]
        ) -> PreStepDecision:
            nonlocal appended, stop_listening
            decision = await next_()
            if not appended and decision.kind == "enter":
                appended = True
                # Once placed, the hook would only pass decisions through: drop it, so later
                # steps (this child's and every other agent's) skip it.
                stop_listening()
                stop_listening = _nothing
                pre.agent.session.append(DESCRIPTOR_EVENT, descriptor, ignorable=True)
            return decision

        stop_listening = ctx.on("agent/pre-step", on_pre_step)

    return setup


def _refuse_if_aborted(signal: AbortSignal) -> None:
    if signal.aborted:
        raise AbortedError(signal.reason, ABORTED_BEFORE_PUBLICATION)


async def start_in_process_run(
    request: ResolvedSubagentStartRequest,
    *,
    seed: Sequence[SessionEvent] | None = None,
) -> SubagentRun:
    """Create, publish and prompt a one-shot in-process child; see the module docstring.

    Before publication the caller's signal aborts creation (nothing is left behind, DRV-2);
    afterwards it cancels the child's remaining work (DRV-5).
    """
    parent = request.parent
    signal = request.signal
    _refuse_if_aborted(signal)
    depth = resolve_child_depth(parent, request.max_depth)
    header = parent.session.header
    meta = SessionMeta(
        cwd=header.cwd,
        parent_session=parent.id,
        seed_length=len(seed) if seed else None,
        origin="subagent",
        delegation_depth=depth,
    )
    capture = (
        StructuredCapture(request.output_schema) if request.output_schema is not None else None
    )
    try:
        handle = await parent.ctx[_AGENTS].create(
            CreateAgentOptions(
                meta=meta,
                seed=seed or None,
                agent_options=child_agent_options(parent, request.agent_options, depth),
                signal=signal,
                setup=_compose(request, capture, descriptor_payload(request.descriptor)),
            )
        )
    except AbortedError as exc:
        raise AbortedError(exc.reason, ABORTED_BEFORE_PUBLICATION) from exc
    try:
        return _publish(request, handle, capture)
    except BaseException:
        # Published but not handed out: nobody else can dispose it (DRV-3, hardening 11.6).
        try:
            await handle.dispose()
        except Exception:
            _log.exception("disposing a child whose start failed also failed")
        raise


def _publish(
    request: ResolvedSubagentStartRequest, handle: AgentHandle, capture: StructuredCapture | None
) -> SubagentRun:
    """Wire a published child's result, cancellation and disposal, then prompt it."""
    child = handle.agent
    signal = request.signal
    result = ResultFuture(loop=asyncio.get_running_loop())
    run = _ChildRun(child, handle, capture, result)

    if signal.aborted:  # DRV-4: aborted between publication and listener installation
        run.cancelled = True
        if capture is not None:
            capture.remove()
        result.set_result(SubagentResult(output=(), stop_reason="aborted"))
    else:
        message = user_message(request.prompt)
        remove = run.remove = signal.add_listener(run.cancel)
        try:
            child.ctx.on("agent/status", run.on_status)
            child.followup(message)
        except BaseException:
            remove()
            raise
        if request.signal.aborted:  # read again: ``followup`` ran listeners
            # Aborted re-entrantly while the prompt was queued (a listener of the insertion):
            # that cancel found no turn to stop, and the one followup then opened would run
            # unprompted and unbounded. Stop it now (DRV-5).
            run.cancel()

    return SubagentRun(id=child.id, local_agent=child, result=result, dispose=run.dispose)


class _ChildRun:
    """A published child's result, cancellation and disposal. One slotted object instead of
    four closures over shared cells: a delegation in flight holds it, and each of those
    objects is one more the cyclic collector walks while it runs (PERF-5)."""

    __slots__ = ("cancelled", "capture", "child", "handle", "remove", "result")

    def __init__(
        self,
        child: Agent,
        handle: AgentHandle,
        capture: StructuredCapture | None,
        result: ResultFuture,
    ) -> None:
        self.child = child
        self.handle = handle
        self.capture = capture
        self.result = result
        self.cancelled = False
        self.remove: Callable[[], None] = _nothing

    def cancel(self, _: object = None) -> None:
        if not self.result.done():
            self.cancelled = True
            self.child.cancel(AgentCancelCause(kind="parent"))

    def settle(self) -> None:
        result = self.result
        if result.done():
            return
        capture = self.capture
        if capture is not None:
            capture.remove()  # the run is over: so is its capture tool (DRV-9, STR-1)
        try:
            outcome = _result_of(self.child, capture, self.cancelled)
        except Exception as exc:  # an infrastructure fault no stop reason can express
            result.set_exception(exc)
        else:
            result.set_result(outcome)

    def on_status(self, agent: Agent, status: str) -> None:
        if status == "idle":
            self.settle()

    async def dispose(self) -> None:
        # Whatever state ``result`` is in, a running child is stopped (hardening 11.8).
        self.remove()
        if not self.result.done():
            self.cancelled = True
        child = self.child
        child.cancel(AgentCancelCause(kind="parent"))
        await child.when_idle()
        self.settle()
        await self.handle.dispose()


#: The stop reasons whose turn end's ``error`` is the result's diagnostic (max-steps: ROB-10).
_DIAGNOSED = frozenset({"error", "max-steps"})


def _nothing() -> None:
    return None


def _result_of(child: Agent, capture: StructuredCapture | None, cancelled: bool) -> SubagentResult:
    """Read a settled child's result from its own log (DRV-6, DRV-7, OUT-1, STR-3)."""
    session = child.session
    events = session.events_since(session.first_live_seq)
    end = fold_consumed_work(events).end
    stop = one_shot_stop_reason(end.reason if end is not None else None, cancelled=cancelled)
    diagnostic = None
    if end is not None and end.reason.error is not None and stop in _DIAGNOSED:
        diagnostic = truncate_diagnostic(end.reason.error.message)
    structured = None
    if capture is not None and stop == "completed":
        if capture.captured:
            structured = capture.value
        elif cancelled:  # STR-3: cancelled after a clean turn that captured nothing
            stop = "aborted"
        else:
            stop, diagnostic = "error", NO_CAPTURE
    return SubagentResult(
        output=select_output(events) or (),
        stop_reason=stop,
        structured=structured,
        diagnostic=diagnostic,
    )
