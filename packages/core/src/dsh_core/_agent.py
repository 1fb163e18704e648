"""Agents (``ctx.agents``): the turn loop over a durable session, handles, the registry.

An :class:`Agent` drives one session. Input arrives only through its :class:`Inbox`:
``followup`` queues a next turn and wakes, ``steer`` joins the nearest step and wakes,
``inject`` joins the next step without waking. A wake from idle runs the turn's *synchronous
prefix* inline (``turn/start``, claim, ``agent/inbox/claimed``) before the rest runs as a task,
so a ``cancel()`` right after ``followup()`` aborts a claimed turn instead of dropping its
prompt. The log shapes follow host-core §9 exactly.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import contextvars
import functools
import inspect
import logging
import weakref
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import attrs

from . import _tools
from ._abort import AbortController, AbortedError, AbortSignal, fuse, race_abort
from ._codec import Unfit, _check_json, checked_builder, class_checker, type_checker
from ._content import (
    ContentBlock,
    Finish,
    LlmError,
    LlmFailure,
    Message,
    ModelSource,
    PluginSource,
    ReasoningDelta,
    StreamChunk,
    TextDelta,
    ToolCallBlock,
    ToolCallDelta,
    new_id,
    user_message,
)
from ._context import Context, Fiber, Registration, Scope
from ._disposal import SharedDisposal
from ._errors import DshError
from ._events import (
    AgentCancelCause,
    AssistantChunkData,
    AssistantMessageData,
    EpochHeader,
    LlmCallConfig,
    RequestHeaderData,
    SessionError,
    SessionEvent,
    SessionMeta,
    StepData,
    ToolCallData,
    ToolResultData,
    ToolResultError,
    ToolSchema,
    TurnEndData,
    TurnEndReason,
    TurnStartData,
)
from ._frozen import attrs_eq, attrs_hash, attrs_repr, builder, speed_up_inits
from ._inbox import Inbox, InboxTarget
from ._json import MAX_NESTING, JsonValue, NotJsonError, freeze_json
from ._llm import BlockAssembler, GenerateOptions, failure_of
from ._prompt import AssembleContext, PromptAssembly
from ._sessions import is_snapshot
from ._tools import ToolExecutionInput, ToolExecutionResult, ToolRegistry, failure
from ._words import check_positive_int, not_json_text

if TYPE_CHECKING:
    from ._persistence import SessionPreparation
    from ._sessions import Session

__all__ = [
    "DEFAULT_MAX_STEPS",
    "Agent",
    "AgentError",
    "AgentHandle",
    "AgentOptions",
    "AgentRegistry",
    "AgentRegistryService",
    "AgentStatus",
    "CreateAgentOptions",
    "PreStep",
    "PreStepDecision",
    "RequestContext",
    "RequestErrorContext",
    "ResumeAgentOptions",
    "current_initiator",
    "require_initiator",
]

T = TypeVar("T")
AgentStatus = Literal["idle", "running"]
SetupCommit = Callable[[], None]
Setup = Callable[[Context], "SetupCommit | Awaitable[SetupCommit | None] | None"]

_log = logging.getLogger("dsh.agent")

_INITIATOR: contextvars.ContextVar[Agent | None] = contextvars.ContextVar(
    "dsh_initiator", default=None
)

# Payloads built every turn: plain-function builders (see dsh_core._frozen.builder).
_turn_start = builder(TurnStartData)
_turn_end = builder(TurnEndData)
_step_data = builder(StepData)
_assemble_context = builder(AssembleContext)
_generate_options = builder(GenerateOptions)
_message = builder(Message)
_assistant_message = builder(AssistantMessageData)
_chunk_data = builder(AssistantChunkData)
#: How many levels a chunk may nest: two less than a payload (its event's data, and the spare
#: level a ``BlockEnd``'s block needs inside the assembled ``assistant/message``).
_CHUNK_LEVELS = MAX_NESTING - 2


def _unchecked(turn: int, step: int, chunk: StreamChunk) -> AssistantChunkData:
    raise Unfit


def _first_checked_chunk_data(turn: int, step: int, chunk: StreamChunk) -> AssistantChunkData:
    """Compile the checked chunk builder at the first chunk, not at import (nothing before a
    run's first request streams one: PERF-16), put it in this stand-in's place and use it."""
    global _checked_chunk_data
    _checked_chunk_data = (
        checked_builder(
            AssistantChunkData,
            "chunk",
            _CHUNK_LEVELS,
            (TextDelta, ReasoningDelta, ToolCallDelta, Finish),
        )
        or _unchecked
    )
    return _checked_chunk_data(turn, step, chunk)


#: The chunk payload's builder that first checks an adapter's chunk (see Agent._stream), the
#: most frequent chunk classes tested first; called with positions (turn, step, chunk).
_checked_chunk_data: Callable[[int, int, StreamChunk], AssistantChunkData] = (
    _first_checked_chunk_data
)
_tool_call = builder(ToolCallData)
_tool_result = builder(ToolResultData)
#: A turn lets the event loop run before every this-many-th further step, whatever its model
#: and tools do (a real model suspends at every request anyway). Not before every step: one
#: more loop pass in every tool-using turn cost 4 % of a two-step turn's instructions.
YIELD_EVERY_STEPS = 4

#: The check of a tool's content blocks where a ``tool/result`` holds them: inside the payload,
#: its message, the message's content, the result block and that block's content.
_check_blocks = type_checker(tuple[ContentBlock, ...])
_RESULT_BLOCK_LEVELS = MAX_NESTING - 4
_check_config = class_checker(LlmCallConfig)  # a request header's route (see _loggable_header)
_execution_input = builder(ToolExecutionInput)


class AgentError(DshError):
    """An agent operation was refused (see ``code``)."""

    code = "AGENT_ERROR"


#: The step limit of a turn when neither the agent nor the ``agents`` plugin sets one: far above
#: what a real task takes, low enough that a model calling tools for ever stops within seconds.
DEFAULT_MAX_STEPS = 100


def _positive(attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        check_positive_int(attribute.name, value)


# -- values ---------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class AgentOptions:
    """Model route and limits of one agent; ``extensions`` hold keys owned by other seams
    (e.g. ``subagent_depth``) that the loop never reads.

    ``max_steps``: the most steps (model requests) one turn may take; ``None`` takes the
    ``agents`` plugin's ``max_steps`` (default :data:`DEFAULT_MAX_STEPS`). A turn that would
    need one more ends ``max-steps``."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    provider: str | None = None
    model: str | None = None
    max_tokens: int | None = None
    max_steps: int | None = attrs.field(default=None, validator=lambda _, a, v: _positive(a, v))
    extensions: Mapping[str, JsonValue] = attrs.field(factory=dict, converter=freeze_json)


@attrs.frozen(kw_only=True)
class CreateAgentOptions:
    """``ctx.agents.create``: the session to create and how to compose the agent.

    ``setup(agent_ctx)`` runs inside the unpublished creation window (register scoped tools,
    sections, restrictions, listeners); it may return a ``commit`` called synchronously right
    before publication. ``signal`` aborts creation.
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    session_id: str | None = None
    meta: SessionMeta | None = None
    seed: Sequence[SessionEvent] | None = None
    agent_options: AgentOptions = AgentOptions()
    signal: AbortSignal | None = attrs.field(default=None, eq=False)
    setup: Setup | None = attrs.field(default=None, eq=False)


@attrs.frozen(kw_only=True)
class ResumeAgentOptions:
    """``ctx.agents.resume``: a persisted session to bring back as a live agent.

    ``preparation``: the session already read by ``session_persistence.prepare`` (a caller that
    judged the stored log first, see its ``check``); the resume takes it over instead of reading
    the log again, and disposes it if the resume fails. It must be of ``resume_session_id``.
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    resume_session_id: str
    agent_options: AgentOptions = AgentOptions()
    signal: AbortSignal | None = attrs.field(default=None, eq=False)
    setup: Setup | None = attrs.field(default=None, eq=False)
    preparation: SessionPreparation | None = attrs.field(default=None, eq=False)


@attrs.frozen(kw_only=True)
class PreStepDecision:
    """What ``agent/pre-step`` decided: enter ``messages`` into the step, or reject the turn."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    kind: Literal["enter", "reject"]
    messages: tuple[Message, ...] = ()
    reason: str | None = None


@attrs.frozen(kw_only=True)
class PreStep:
    """The ``agent/pre-step`` waterfall argument."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    agent: Agent = attrs.field(eq=False)
    messages: tuple[Message, ...]
    turn: int
    step: int
    signal: AbortSignal = attrs.field(eq=False)


@attrs.frozen(kw_only=True)
class RequestContext:
    """The ``agent/request`` waterfall argument; listeners may return another config."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    agent: Agent = attrs.field(eq=False)
    config: LlmCallConfig | None
    turn: int
    step: int


@attrs.frozen(kw_only=True)
class RequestErrorContext:
    """The ``agent/request-error`` waterfall argument; a listener may return ``"retry"``."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    agent: Agent = attrs.field(eq=False)
    failure: LlmFailure
    attempt: int
    turn: int
    step: int


def current_initiator() -> Agent | None:
    """The agent on whose behalf the current task runs, if any (attribution, not authority)."""
    return _INITIATOR.get()


def require_initiator() -> Agent:
    """The current initiator, or ``NO_INITIATOR``."""
    agent = _INITIATOR.get()
    if agent is None:
        raise AgentError("no agent is initiating this work", code="NO_INITIATOR")
    return agent


def _unwritten_calls(session: Session) -> ToolExecutionResult | None:
    """Checkpoint the logged ``tool/call``s of a group; the error result each call gets
    instead of running when that fails (``None``: written)."""
    try:
        session.checkpoint()
    except SessionError as exc:
        return failure(f"the tool call was not run: its log could not be written ({exc})", exc.code)
    return None


class _TurnAborted(Exception):
    """Internal: the turn's signal fired."""


# -- the agent ------------------------------------------------------------------------------------


class _Notifier:
    """The inbox's callback into its agent, through a weak link: a bound method would make
    agent and inbox a cycle that only the cyclic collector frees (with the live log). One
    slotted object rather than a closure (a function, its cell tuple and a cell): each is an
    object the cyclic collector walks while the agent lives (PERF-6)."""

    __slots__ = ("_ref",)

    def __init__(self, ref: weakref.ReferenceType[Agent]) -> None:
        self._ref = ref

    def __call__(self, name: str, message: Message) -> None:
        agent = self._ref()
        if agent is not None:
            agent._notify(name, message)


class Agent:
    """A live driver over one session (see the module docstring for its input verbs)."""

    __slots__ = (
        "__weakref__",
        "_controller",
        "_disposed",
        "_driver",
        "_header_written",
        "_idle",
        "_latch",
        "_listeners",
        "_route",
        "_route_ok",
        "_scope",
        "_service",
        "_snapshot",
        "_turn",
        "ctx",
        "id",
        "inbox",
        "options",
        "session",
        "status",
    )

    def __init__(
        self,
        session: Session,
        options: AgentOptions,
        service: AgentRegistryService,
        fiber: Fiber,
        host_ctx: Context,
    ) -> None:
        self.id = session.header.id
        self.session = session
        self.options = options
        self.status: AgentStatus = "idle"
        self._service = service
        self.ctx = Context(host_ctx.host, fiber, Scope(self.id), self)
        # Read on every step: kept here, not looked up through the context each time.
        self._scope = self.ctx.scope
        self._listeners = host_ctx.host.listeners
        self.inbox = Inbox(session, _Notifier(weakref.ref(self)), heard=self._listeners)
        self._controller: AbortController | None = None
        self._driver: asyncio.Task[None] | None = None
        self._idle: list[asyncio.Future[None]] | None = None
        self._latch = False
        self._disposed = False
        self._header_written = False
        self._route: LlmCallConfig | None = None
        self._route_ok = False  # whether the log can hold ``_route`` (see _route_of)
        self._turn = _last_turn(session)
        self._snapshot = _last_snapshot(session)

    def __repr__(self) -> str:
        return f"Agent({self.id!r}, {self.status})"

    def _notify(self, name: str, message: Message) -> None:
        if name in self._listeners:
            self.ctx.emit(name, self, message)

    def _set_status(self, status: AgentStatus) -> None:
        if self.status != status:
            self.status = status
            if "agent/status" in self._listeners:
                self.ctx.emit("agent/status", self, status)

    # -- input ---------------------------------------------------------------------------------

    def send(self, message: Message, target: InboxTarget, wakeup: bool) -> None:
        """Queue ``message`` on ``target``; wake the agent if asked.

        A waking send while the active turn's signal has already fired is forced to the next
        turn and latched: it runs once the aborted turn has unwound (unless the agent is being
        disposed). While disposal runs and the agent is still registered, a send is queued
        without waking (durably: its session is still attached, and a resume finds it, so a
        child's report to a parent going away is kept, RPT-4); once the agent is unregistered
        it fails ``AGENT_DISPOSED``.
        """
        if self._disposed:
            self._send_while_disposing(message, target)
            return
        ctl = self._controller
        unwinding = ctl is not None and ctl.signal.aborted
        if wakeup and unwinding:
            target = "next-turn"
        self.inbox.insert(target, message)
        if not wakeup:
            return
        if self._driver is not None:
            if unwinding:
                self._latch = True
            return  # a running driver claims queued work at its next step or turn boundary
        self._start()

    def _send_while_disposing(self, message: Message, target: InboxTarget) -> None:
        """A send after disposal started: queued unwoken while still registered, else refused."""
        entry = self._service.agents.get(self.id)
        if entry is None or entry.agent is not self:
            raise AgentError(f"agent {self.id!r} is disposed", code="AGENT_DISPOSED")
        self.inbox.insert(target, message)

    def followup(self, message: Message) -> None:
        """Queue a next turn and wake."""
        self.send(message, "next-turn", True)

    async def run_followup(self, message: Message) -> None:
        """:meth:`followup`, then wait until the agent is idle; from idle, the turn it wakes
        runs in the calling task rather than in a driver task of its own.

        For a caller that waits for the turn anyway (dsh-acp-agent's prompt): a turn that
        never suspends then costs no task and no event-loop pass. The turn runs as a driver
        task runs it: an abort or a dispose stops it, a waking send while it runs joins it,
        the calling task's cancellation ends it ``error`` (``turn task cancelled``) and
        propagates, and latched work after it runs in a driver task, waited for too.
        """
        task = asyncio.current_task()
        if self._disposed or self._driver is not None or task is None:
            self.followup(message)
        else:
            self.inbox.insert("next-turn", message)
            claimed = self._open_turn()
            self._driver = task
            token = _INITIATOR.set(self)
            try:
                await self._drive(claimed)
            finally:
                _INITIATOR.reset(token)
        await self.when_idle()

    def steer(self, message: Message) -> None:
        """Join the nearest step boundary and wake."""
        self.send(message, "next-step", True)

    def inject(self, message: Message) -> None:
        """Join the next step without waking."""
        self.send(message, "next-step", False)

    def cancel(self, cause: AgentCancelCause, *, keep_inbox: bool = False) -> None:
        """Abort the active turn with ``cause`` (first cause wins).

        Unless ``keep_inbox``, pending input is durably discarded and any wake latch dropped;
        with ``keep_inbox`` queued input stays parked until the next waking send. With nothing
        active this only (optionally) clears the inbox.
        """
        if not keep_inbox:
            self._latch = False
            if len(self.inbox):
                self.inbox.clear()
        ctl = self._controller
        if ctl is not None and not ctl.signal.aborted:
            ctl.abort(cause)

    async def when_idle(self) -> None:
        """Wait until no driver runs (following replacement work); not "my message finished".

        The driver wakes waiters itself as it goes idle, so they resume one loop iteration
        after the turn ends rather than after the task's done callbacks. Each waiter has its
        own future: cancelling one waiter never cancels another.
        """
        while self._driver is not None:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if self._idle is None:
                self._idle = [waiter]
            else:
                self._idle.append(waiter)
            await waiter

    def _went_idle(self) -> None:
        waiters, self._idle = self._idle, None
        if waiters is not None:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _driver_done(self, driver: asyncio.Task[None]) -> None:
        # Only for a driver cancelled before it ever ran (its coroutine's cleanup never ran);
        # one that ran takes this callback off itself (one loop pass less per turn).
        if self._driver is driver:  # cancelled before it ever ran: it cleared nothing
            self._driver = None
            self._set_status("idle")
            self._went_idle()

    # -- the driver ------------------------------------------------------------------------------

    def _start(self) -> None:
        """Synchronous wake prefix from idle, then the driver task."""
        claimed = self._open_turn()
        ctx = contextvars.copy_context()
        ctx.run(_INITIATOR.set, self)
        driver = self._driver = asyncio.get_running_loop().create_task(
            self._drive(claimed), name=f"agent:{self.id}", context=ctx
        )
        driver.add_done_callback(self._driver_done)

    def _open_turn(self) -> tuple[Message, ...]:
        self._controller = AbortController()
        self._set_status("running")
        self._turn += 1
        self.session._append_vouched("turn/start", _turn_start(turn=self._turn))
        # A tuple: the turn's first batch as is, one object the driver's and the turn's frames
        # share (not a list and a copy of it) while the turn runs (PERF-5).
        claimed = tuple(self.inbox.claim(turn_boundary=True))
        if claimed and "agent/inbox/claimed" in self._listeners:  # tested here: once a turn
            self._emit_claimed(claimed)
        return claimed

    def _emit_claimed(self, claimed: Sequence[Message]) -> None:
        for m in claimed:
            self.ctx.emit("agent/inbox/claimed", self, m, self._turn)

    async def _drive(self, claimed: tuple[Message, ...]) -> None:
        try:
            while True:
                await self._run_turn(claimed)
                ctl = self._controller
                if ctl is None or ctl.signal.aborted or self._disposed or not self.inbox.next_turn:
                    break
                claimed = self._open_turn()
        finally:
            driver = self._driver
            if driver is not None:  # it ran, and cleans up here: the callback is not needed
                driver.remove_done_callback(self._driver_done)
            cause = self._controller.signal.reason if self._controller else None
            self._controller = None
            self._driver = None
            latch, self._latch = self._latch, False
            disposing = self._disposed or (
                isinstance(cause, AgentCancelCause) and cause.kind == "disposed"
            )
            if latch and not disposing and self.inbox.next_turn:
                self._start()
            else:
                self._set_status("idle")
                if self._driver is None:
                    self._went_idle()

    async def _run_turn(self, claimed: tuple[Message, ...]) -> None:
        turn = self._turn
        assert self._controller is not None
        signal = self._controller.signal
        session = self.session
        reason = _COMPLETED
        max_tokens = False
        step = 0
        open_step = False
        batch = claimed
        limit = self.options.max_steps or self._service.max_steps
        try:
            while True:
                if signal.aborted:
                    raise _TurnAborted
                step_no = step + 1
                prompt = self.ctx.system_prompt
                assembly = prompt.cached() or prompt.assemble(
                    _assemble_context(scope=self._scope, signal=signal, agent=self)
                )
                entered = self._with_snapshot(batch, assembly)
                # The entered messages are not checked again when logged (hardening 11.1): the
                # inbox's were checked when they entered it (Inbox.insert), and a snapshot is
                # built here around the context text (a plain string, or all are checked).
                trusted = assembly.context.__class__ is str
                if "agent/pre-step" in self._listeners:
                    decision: PreStepDecision = await self.ctx.waterfall(
                        "agent/pre-step",
                        PreStep(agent=self, messages=batch, turn=turn, step=step_no, signal=signal),
                        default=_enter_default(entered),
                    )
                    if signal.aborted:
                        raise _TurnAborted
                    if decision.kind == "reject":
                        reason = _BLOCKED
                        break
                    if decision.messages is not entered:
                        entered = decision.messages
                        trusted = False  # a listener's messages enter here: checked at the append
                    del decision  # not kept by this frame while the step runs (PERF-5)
                if not entered and step_no == 1:
                    break
                step = step_no
                step_data = _step_data(turn=turn, step=step)
                session._append_vouched("step/start", step_data)
                open_step = True
                for m in entered:
                    if trusted:
                        session._append_vouched("user/message", m, ())
                    else:
                        session.append("user/message", m, source_event_seqs=())
                    source = m.source
                    if isinstance(source, PluginSource) and source.form == "snapshot":
                        self._snapshot = m.text
                outcome = await self._step(turn, step, signal, assembly)
                open_step = False
                session._append_vouched("step/end", step_data)
                if outcome == "max-tokens":
                    max_tokens = True
                if signal.aborted:
                    raise _TurnAborted
                if outcome == "concluded":
                    break  # a tool concluded the turn: no further request (conclude_turn)
                inbox = self.inbox
                if outcome != "tools":
                    if not inbox.next_step and "agent/turn-stopping" in self._listeners:
                        await self.ctx.serial("agent/turn-stopping", self, turn)
                    if signal.aborted:
                        raise _TurnAborted
                    if not inbox.next_step:
                        break
                if step >= limit:  # another step would pass the turn's step limit
                    reason = _max_steps(limit)
                    break
                if not step % YIELD_EVERY_STEPS:
                    # Let the event loop run: a model and tools that never suspend (the
                    # scripted model, a tool failing at once) would otherwise keep it to this
                    # turn, out of reach of Ctrl-C, timeouts and aborts.
                    await asyncio.sleep(0)
                batch = tuple(inbox.claim(turn_boundary=False))
                if batch and "agent/inbox/claimed" in self._listeners:
                    self._emit_claimed(batch)
        except (_TurnAborted, AbortedError):
            reason = _aborted_reason(signal)
        except asyncio.CancelledError:
            reason = (
                _aborted_reason(signal)
                if signal.aborted
                else TurnEndReason(
                    kind="error", error=LlmFailure(message="turn task cancelled", code="CANCELLED")
                )
            )
            self._close_turn(turn, step if open_step else None, reason)
            raise
        except Exception as exc:
            fail = failure_of(exc)
            reason = TurnEndReason(kind="error", error=fail)
            self.ctx.emit("agent/error", self, exc)
        else:
            if max_tokens and reason.kind == "completed":
                reason = _MAX_TOKENS
        self._close_turn(turn, step if open_step else None, reason)

    def _close_turn(self, turn: int, open_step: int | None, reason: TurnEndReason) -> None:
        if open_step is not None:
            self.session._append_vouched("step/end", _step_data(turn=turn, step=open_step))
        # The loop's own reasons are constants of plain strings; any other (an error's, a
        # cancel cause's) is checked at the append.
        data = _turn_end(turn=turn, reason=reason)
        session = self.session
        if reason is _COMPLETED or reason is _BLOCKED or reason is _MAX_TOKENS:
            session._append_vouched("turn/end", data)
        else:
            session.append("turn/end", data)
        if session._checkpointer is not None:  # every turn end is written (DUR-4)
            try:
                session.checkpoint()
            except SessionError as exc:  # the turn is over: nobody left to refuse
                self.ctx.emit("agent/error", self, exc)

    def _with_snapshot(
        self, batch: tuple[Message, ...], assembly: PromptAssembly
    ) -> tuple[Message, ...]:
        text = assembly.context
        if not text or text == self._snapshot:
            return batch
        snap = user_message(text, source=PluginSource(plugin="system-prompt", form="snapshot"))
        return (*batch, snap)

    async def _step(
        self, turn: int, step: int, signal: AbortSignal, assembly: PromptAssembly
    ) -> Literal["done", "tools", "max-tokens", "concluded"]:
        """One model request (with retries) and its tool calls; returns what should follow."""
        ctx = self.ctx
        session = self.session
        registry = ctx.tools
        tools = registry.schemas()
        attempt = 0
        while True:
            attempt += 1
            config = self._config()
            if "agent/request" in self._listeners:
                config = await ctx.waterfall(
                    "agent/request",
                    RequestContext(agent=self, config=config, turn=turn, step=step),
                    default=_identity_config,
                )
            if config is None:
                raise AgentError(
                    f"agent {self.id!r} has no model route (provider and model are unset)",
                    code="NO_MODEL_ROUTE",
                )
            header = _epoch_header(session, config, assembly.system or None, tools or None)
            self._write_header(header)
            if session._checkpointer is not None:
                session.checkpoint()  # the request is on disk before the model sees it (DUR-2)
            options = _generate_options(
                provider=config.provider,
                model=config.model,
                messages=session.derive_messages(),
                system=header.system,
                tools=header.tools,
                max_tokens=config.max_tokens,
                temperature=config.temperature,
                stop=config.stop,
                signal=signal,
                session_id=self.id,
                loop_request=True,
            )
            assembler, chunk_seqs, vouched = await self._stream(options, turn, step, signal)
            finish = assembler.finish
            if signal.aborted:
                blocks = assembler.interrupted_blocks()
                if blocks:
                    self._log_answer(
                        turn, step, config, blocks, assembler, chunk_seqs, True, vouched
                    )
                raise _TurnAborted
            assert finish is not None
            if finish.reason in ("error", "aborted"):
                fail = finish.failure or LlmFailure(message="model request failed", code="UNKNOWN")
                if "agent/request-error" in self._listeners:
                    verdict = await ctx.waterfall(
                        "agent/request-error",
                        RequestErrorContext(
                            agent=self, failure=fail, attempt=attempt, turn=turn, step=step
                        ),
                        default=_terminal_verdict,
                    )
                    if verdict == "retry" and not signal.aborted:
                        continue
                raise _RequestFailed(fail)
            break
        blocks = assembler.blocks()
        self._log_answer(turn, step, config, blocks, assembler, chunk_seqs, False, vouched)
        # Logged: the request and the response's parts are not needed while the tools run
        # (a parent's may run a long time), so this frame stops keeping them (PERF-5).
        del assembler, chunk_seqs, options
        if finish.reason == "max-tokens":
            return "max-tokens"
        calls = [b for b in blocks if isinstance(b, ToolCallBlock)]
        if not calls:
            return "done"
        concluded = await self._run_calls(calls, turn, step, signal, registry)
        if signal.aborted:
            raise _TurnAborted
        return "concluded" if concluded else "tools"

    def _log_answer(
        self,
        turn: int,
        step: int,
        config: LlmCallConfig,
        blocks: tuple[ContentBlock, ...],
        assembler: BlockAssembler,
        chunk_seqs: list[int],
        interrupted: bool,
        vouched: bool,
    ) -> None:
        """Append the step's ``assistant/message`` (citing its chunks).

        ``vouched``: every chunk passed the loop's check (see :meth:`_stream`), so the message
        built from them holds only checked values, unless the route's names are not plain
        strings (a listener's ``agent/request`` config): then the append checks it.
        """
        provider, model = config.provider, config.model
        data = _assistant_message(
            turn=turn,
            step=step,
            message=_message(
                id=new_id(), role="assistant", content=blocks, source=_model_source(provider, model)
            ),
            usage=assembler.usage,
            interrupted=interrupted,
        )
        if vouched and provider.__class__ is str and model.__class__ is str:
            self.session._append_vouched("assistant/message", data, tuple(chunk_seqs))
        else:
            self.session.append("assistant/message", data, source_event_seqs=chunk_seqs)

    def _config(self) -> LlmCallConfig | None:
        cached = self._route
        if cached is None:
            o = self.options
            if not o.provider or not o.model:
                return None
            cached, self._route_ok = _route_of(o.provider, o.model, o.max_tokens)
            self._route = cached
        return cached

    def _write_header(self, header: EpochHeader) -> None:
        session = self.session
        current = session._request_header  # request_header() without the call
        if not self._header_written:
            self._header_written = True
            reason: Literal["initial", "resume", "change"] = (
                "resume" if current is not None else "initial"
            )
        elif current is not header and current != header:  # the same object when unchanged
            reason = "change"
        else:
            return
        data = RequestHeaderData(header=header, reason=reason)
        if _loggable_header(header, self._route if self._route_ok else None):
            session._append_vouched("request/header", data)
        else:
            session.append("request/header", data)

    async def _stream(
        self, options: GenerateOptions, turn: int, step: int, signal: AbortSignal
    ) -> tuple[BlockAssembler, list[int], bool]:
        """Consume one response, logging every chunk, without ever outliving the signal;
        also returns whether the loop's own check vouched for every chunk.

        The stream runs inline (no extra task). If the signal fires while this task waits on
        the adapter, the abort listener cancels that wait, so an adapter that ignores the
        signal cannot wedge the turn.

        Chunks are the adapter's (plugin code): each is checked here, where it enters the
        loop, as a member of the chunk union the log can hold (hardening 11.1), so neither its
        ``assistant/chunk`` nor the ``assistant/message`` assembled from the checked chunks
        is checked again at the append. One level is kept spare: a ``BlockEnd``'s block sits
        a level deeper in the message than in its chunk. A chunk the check cannot vouch for
        takes the append's full check, which refuses it (``SESSION_EVENT_INVALID`` /
        ``SESSION_EVENT_NOT_JSON``) and so fails the request like an adapter error (an
        ``error`` finish, host-core §3); should it accept, the message is checked too.
        """
        # The task running this turn (_stream runs only inside _drive).
        sink = _Sink(self.session, turn, step, signal, self._driver)
        assembler = sink.assembler
        task = sink.task
        remove = signal.add_listener(sink.on_abort)
        try:
            await self.ctx.llm.consume(options, sink.chunk)
        except asyncio.CancelledError:
            if not sink.interrupted or task is None:
                raise
            task.uncancel()
        except Exception as exc:
            if not signal.aborted:
                assembler.add(Finish(reason="error", failure=failure_of(exc)))
        finally:
            remove()
        return assembler, sink.seqs, sink.vouched

    async def _run_calls(
        self,
        calls: list[ToolCallBlock],
        turn: int,
        step: int,
        signal: AbortSignal,
        tools: ToolRegistry,
    ) -> bool:
        """Execute one response's calls; concurrency-safe neighbours run together, results are
        committed in model order. Returns whether a successful call concluded the turn.

        Every call gets exactly one ``tool/result``, whatever happens: should anything end
        the calls early (the turn task cancelled, an exception the registry does not contain),
        the calls left are answered (``ABORTED`` once logged, ``ABORTED_BEFORE_DISPATCH``
        before) before it propagates, so no later request carries an unanswered call.

        One coroutine with two counters, not a wrapper around a second one sharing a list: a
        parent waiting on its tool keeps one frame and no list less for the cyclic collector
        to walk (PERF-6).
        """
        # calls[:answered] have their tool/result, calls[:logged] their tool/call.
        answered = logged = 0
        session = self.session
        concluded = False
        i = 0
        try:
            while i < len(calls):
                group = [calls[i]]
                definition = tools.get(calls[i].name)
                if definition is not None and definition.concurrency_safe:
                    while i + len(group) < len(calls):
                        nxt = tools.get(calls[i + len(group)].name)
                        if nxt is None or not nxt.concurrency_safe:
                            break
                        group.append(calls[i + len(group)])
                i += len(group)
                # Each call's id, name and arguments are those of a block of the
                # assistant/message the log just took (checked or vouched for), so its
                # tool/call needs no check. Loops, not comprehensions: a comprehension over
                # these locals would turn each into a cell the parked coroutine keeps for the
                # collector to walk (PERF-6).
                call_seqs = []
                for c in group:
                    call = _tool_call(
                        turn=turn, step=step, call_id=c.id, name=c.name, arguments=c.arguments
                    )
                    call_seqs.append(session._append_vouched("tool/call", call).seq)
                logged = i
                # The calls are on disk before they run (DUR-3).
                unwritten = _unwritten_calls(session) if session._checkpointer is not None else None
                if signal.aborted:
                    aborted = failure(
                        "tool call aborted before dispatch", "ABORTED_BEFORE_DISPATCH"
                    )
                    results = [aborted] * len(group)
                elif unwritten is not None:
                    results = [unwritten] * len(group)
                elif len(group) == 1:
                    results = [await tools.execute(self._call_input(group[0], signal))]
                else:
                    runs = []
                    for c in group:
                        runs.append(tools.execute(self._call_input(c, signal)))  # noqa: PERF401
                    results = list(await asyncio.gather(*runs))
                for c, seq, result in zip(group, call_seqs, results, strict=True):
                    self._log_result(turn, step, c, seq, result)
                    answered += 1
                    for extra in result.additional_contexts:
                        self.inbox.insert("next-step", extra)
                    if result.ok and result.concludes_turn:
                        concluded = True
        except BaseException:
            self._answer_rest(calls, answered, logged, turn, step)
            raise
        return concluded

    def _log_result(
        self, turn: int, step: int, call: ToolCallBlock, seq: int, result: ToolExecutionResult
    ) -> None:
        """Append ``result`` as the ``tool/result`` of ``call`` (its ``tool/call`` at ``seq``);
        a result the log refuses (a listener's or renderer's value it cannot hold) is replaced
        by an ``INVALID_TOOL_OUTPUT`` error result saying so."""
        session = self.session
        try:
            data = _tool_result(
                turn=turn,
                step=step,
                message=result.message(call.id),
                error=ToolResultError(name=call.name, code=result.error.code)
                if result.error is not None
                else None,
                meta=result.meta,
            )
            if result is _tools.plain_result or _result_vouched(result, data):
                session._append_vouched("tool/result", data, (seq,))
            else:
                session.append("tool/result", data, source_event_seqs=(seq,))
        except (SessionError, NotJsonError, TypeError, ValueError) as exc:
            why = not_json_text(exc, "the result") if isinstance(exc, NotJsonError) else exc
            refused = failure(
                f"the tool's result could not be logged: {why}", "INVALID_TOOL_OUTPUT"
            )
            session._append_vouched(
                "tool/result",
                _tool_result(
                    turn=turn,
                    step=step,
                    message=refused.message(call.id),
                    error=ToolResultError(name=call.name, code="INVALID_TOOL_OUTPUT"),
                    meta=None,
                ),
                (seq,),
            )

    def _answer_rest(
        self, calls: list[ToolCallBlock], done: int, logged: int, turn: int, step: int
    ) -> None:
        """Answer the calls of a response that have no ``tool/result`` yet (see _run_calls):
        a logged call ``ABORTED``, one not yet logged its ``tool/call`` then
        ``ABORTED_BEFORE_DISPATCH``. Best effort: if the log refuses, the original exception
        propagates (a crash repair answers them on the next load)."""
        try:
            for n, c in enumerate(calls[done:], start=done):
                if n < logged:
                    seq = next(
                        e.seq
                        for e in reversed(self.session.events)
                        if e.type == "tool/call" and e.data.call_id == c.id
                    )
                    result = failure("tool call aborted", "ABORTED")
                else:
                    seq = self.session._append_vouched(
                        "tool/call",
                        _tool_call(
                            turn=turn, step=step, call_id=c.id, name=c.name, arguments=c.arguments
                        ),
                    ).seq
                    result = failure("tool call aborted before dispatch", "ABORTED_BEFORE_DISPATCH")
                self._log_result(turn, step, c, seq, result)
        except Exception:
            _log.warning("answering the unanswered tool calls of %s failed", self.id, exc_info=True)

    def _call_input(self, call: ToolCallBlock, signal: AbortSignal) -> ToolExecutionInput:
        return _execution_input(
            call_id=call.id, name=call.name, arguments=call.arguments, signal=signal, agent=self
        )


_COMPLETED = TurnEndReason(kind="completed")
_BLOCKED = TurnEndReason(kind="blocked")
_MAX_TOKENS = TurnEndReason(kind="max-tokens")


@functools.lru_cache(maxsize=16)
def _max_steps(limit: int) -> TurnEndReason:
    """The end of a turn that reached its step limit; ``error`` carries the diagnostic."""
    diagnostic = f"the turn reached its step limit ({limit} steps)"
    return TurnEndReason(kind="max-steps", error=LlmFailure(message=diagnostic, code="MAX_STEPS"))


@functools.lru_cache(maxsize=64)
def _model_source(provider: str, model: str) -> ModelSource:
    """The (immutable) source of an answer from ``provider``/``model``, shared by answers."""
    return ModelSource(provider=provider, model=model)


class _Sink:
    """What :meth:`Agent._stream` keeps while a response streams: the chunk sink and the abort
    listener, as two methods of one slotted object rather than two closures over ten cells (a
    parked request keeps them all, each an object the cyclic collector walks; PERF-6)."""

    __slots__ = (
        "assembler",
        "interrupted",
        "seqs",
        "session",
        "signal",
        "step",
        "task",
        "turn",
        "vouched",
    )

    def __init__(
        self,
        session: Session,
        turn: int,
        step: int,
        signal: AbortSignal,
        task: asyncio.Task[None] | None,
    ) -> None:
        self.assembler = BlockAssembler()
        self.seqs: list[int] = []
        self.session = session
        self.turn = turn
        self.step = step
        self.signal = signal
        self.task = task
        self.interrupted = False
        self.vouched = True

    def on_abort(self, _: object) -> None:
        task = self.task
        if task is not None and asyncio.current_task() is not task and not task.done():
            self.interrupted = True
            task.cancel()

    def chunk(self, chunk: StreamChunk) -> bool:
        try:
            data = _checked_chunk_data(self.turn, self.step, chunk)
        except Unfit:
            self.vouched = False
            data = _chunk_data(turn=self.turn, step=self.step, chunk=chunk)
            # the verdict, or raises
            self.seqs.append(self.session.append("assistant/chunk", data).seq)
        else:
            self.seqs.append(self.session._append_vouched("assistant/chunk", data).seq)
        self.assembler.add(chunk)
        return self.signal.aborted


class _RequestFailed(LlmError):
    """Internal: the model request failed terminally (after any retries)."""


def _epoch_header(
    session: Session,
    config: LlmCallConfig,
    system: str | None,
    tools: tuple[ToolSchema, ...] | None,
) -> EpochHeader:
    """The request envelope; the session's current header object when nothing changed."""
    current = session._request_header  # request_header() without the call: once per request
    if (
        current is not None
        and current.config is config
        and current.system == system
        and current.tools is tools
    ):
        return current
    return EpochHeader(config=config, system=system, tools=tools)


def _result_vouched(result: ToolExecutionResult, data: ToolResultData) -> bool:
    """Whether the loop vouches for the ``tool/result`` it built around ``result`` (hardening
    11.1): a plain ``ToolExecutionResult`` builds its message from the call's id (a block of
    the logged answer) and literals, so only what the tool (or a listener) supplied is checked
    here: the content blocks, the error code and the meta. Anything else takes the append's
    check. (The result the registry just built from a plain string, ``_tools.plain_result``,
    needs not even that: the caller tests it first.)"""
    if result.__class__ is not ToolExecutionResult or _check_blocks is None:
        return False
    error = data.error
    if error is not None and error.code.__class__ is not str:
        return False
    meta = data.meta
    try:
        _check_blocks(result.content, _RESULT_BLOCK_LEVELS)
        if meta is not None:
            _check_json(meta, MAX_NESTING - 1)
    except Unfit:
        return False
    return True


def _route_of(provider: str, model: str, max_tokens: int | None) -> tuple[LlmCallConfig, bool]:
    """An agent's own route, and whether the log can hold it (hardening 11.1): one immutable
    value per route, shared by the agents on it and checked once (typed: ``1`` and ``True``,
    a ``str`` and a subclass are different routes)."""
    try:
        return _cached_route(provider, model, max_tokens)
    except TypeError:  # an unhashable field: no cache, and the append will check it
        return LlmCallConfig(provider=provider, model=model, max_tokens=max_tokens), False


@functools.lru_cache(maxsize=64, typed=True)
def _cached_route(provider: str, model: str, max_tokens: int | None) -> tuple[LlmCallConfig, bool]:
    config = LlmCallConfig(provider=provider, model=model, max_tokens=max_tokens)
    try:
        if _check_config is None:
            raise Unfit
        _check_config(config, MAX_NESTING - 2)  # inside the payload and the header
    except Unfit:
        return config, False
    return config, True


def _loggable_header(header: EpochHeader, checked: LlmCallConfig | None) -> bool:
    """Whether the loop vouches for its own header (hardening 11.1): its tools come from the
    registry, which checked each schema at registration; its route (an ``agent/request``
    listener may replace it) and system prompt (a section's text) are checked here."""
    system = header.system
    if (system is not None and system.__class__ is not str) or _check_config is None:
        return False
    if header.config is checked:  # the agent's own route, checked once (see _route_of)
        return True
    try:
        _check_config(header.config, MAX_NESTING - 2)  # inside the payload and the header
    except Unfit:
        return False
    return True


def _aborted_reason(signal: AbortSignal) -> TurnEndReason:
    cause = signal.reason
    if not isinstance(cause, AgentCancelCause):
        cause = AgentCancelCause(kind="hook", reason=None if cause is None else str(cause))
    return TurnEndReason(kind="aborted", cause=cause)


def _enter_default(entered: tuple[Message, ...]) -> Callable[[PreStep], Awaitable[PreStepDecision]]:
    async def default(pre: PreStep) -> PreStepDecision:
        return PreStepDecision(kind="enter", messages=entered)

    return default


async def _identity_config(request: RequestContext) -> LlmCallConfig | None:
    return request.config


async def _terminal_verdict(error: RequestErrorContext) -> str:
    return "fail"


def _last_turn(session: Session) -> int:
    # The list itself, from its end: not a snapshot of the whole log (PERF-22).
    for event in reversed(session._events):
        if event.type == "turn/start":
            n: int = event.data.turn
            return n
    return 0


def _last_snapshot(session: Session) -> str | None:
    messages = session.derive_messages()
    fold = session._seed_fold  # a warm log's: only the messages after it are looked at
    if fold is not None:
        messages = messages[len(fold.messages) :]
    for m in reversed(messages):
        if is_snapshot(m):
            return m.text
    return fold.snapshot if fold is not None else None


def _check_commit(produced: object) -> None:
    """A setup's return value must be a commit: a ``Registration`` is the *undo* of what the
    setup registered (``lambda c: c.tools.register(t)`` returns one), and calling it would
    remove the tool again before the agent starts."""
    if isinstance(produced, Registration) or not callable(produced):
        raise AgentError(
            f"setup returned {type(produced).__name__}, not a commit callable: return None "
            "(write `def setup(ctx): ctx.tools.register(...)`), or a function to run right "
            "before publication",
            code="AGENT_SETUP_INVALID",
        )


# -- handles and the registry ---------------------------------------------------------------------


class AgentHandle:
    """Ownership of one live agent. ``dispose()`` is idempotent and shared by racing callers:
    cancel (clearing the inbox) -> wait for idle -> dispose the agent's scope -> unregister
    (``agent/disposed``) -> detach the session (``session/disposed``; stored data untouched)
    -> wait until persistence has stored the rest and released the session's lock."""

    __slots__ = ("_detach_owner", "_detach_session", "_disposal", "_service", "agent")

    def __init__(
        self,
        agent: Agent,
        service: AgentRegistryService,
        detach_session: Callable[[], None],
    ) -> None:
        self.agent = agent
        self._service = service
        self._detach_session = detach_session
        self._detach_owner: Registration | None = None
        self._disposal = SharedDisposal()

    @property
    def disposed(self) -> bool:
        """Whether disposal has started."""
        return self._disposal.started

    def dispose(self, *, keep_inbox: bool = False) -> Coroutine[Any, Any, None]:
        """Release the agent (see the class docstring for the order): ``await
        handle.dispose()``. A caller that stops waiting never stops the release (hardening
        11.8). (The shared disposal's coroutine itself, one coroutine less per disposal.)

        ``keep_inbox`` leaves pending input in the log instead of discarding it, so that a
        later resume finds it pending (a command line that stops a run keeps the notices its
        drained children sent). The first caller's choice holds for racing callers."""
        return self._disposal.run(self._release_keeping_inbox if keep_inbox else self._release)

    def _release(self) -> Coroutine[Any, Any, None]:
        # The teardown's coroutine itself (no coroutine of its own around it).
        return _teardown(
            self.agent, self._service, self._detach_session, announced=True, then=self._forget
        )

    def _release_keeping_inbox(self) -> Coroutine[Any, Any, None]:
        return _teardown(
            self.agent,
            self._service,
            self._detach_session,
            announced=True,
            then=self._forget,
            keep_inbox=True,
        )

    def _forget(self) -> None:
        detach = self._detach_owner
        self._detach_owner = None
        if detach is not None:
            detach.forget()


async def _teardown(
    agent: Agent,
    service: AgentRegistryService,
    detach_session: Callable[[], None] | None,
    *,
    announced: bool,
    then: Callable[[], None] | None = None,
    keep_inbox: bool = False,
) -> None:
    """Cancel, wait for idle, dispose the scope, unregister, detach the session and wait for
    persistence to let go of it; ``then`` runs at the end, whatever happened. Pending input
    is discarded unless ``keep_inbox``."""
    try:
        agent.cancel(AgentCancelCause(kind="disposed"), keep_inbox=keep_inbox)
        agent._disposed = True
        if agent._driver is not None:  # idle already: no coroutine to wait on
            await agent.when_idle()
        await agent.ctx.fiber.dispose()
        entry = service.agents.get(agent.id)
        if entry is not None and entry.agent is agent:
            del service.agents[agent.id]
            if announced:
                agent.ctx.emit("agent/disposed", agent)
        if detach_session is not None:
            detach_session()
            # Persistence drains and unlocks a disposed session in a task of its own: wait for
            # it, so the log is complete and unlocked once dispose returns (hardening 11.10).
            persistence = service.host_ctx.get("session_persistence")
            released = getattr(persistence, "released", None)
            if released is not None:
                await released(agent.id)
        agent.ctx._unbind()  # views refer back to the context: let refcounting free them
    finally:
        if then is not None:
            then()


@attrs.define(eq=False)
class _Registered:
    __repr__ = attrs_repr
    agent: Agent
    owner: Agent | None
    handle: AgentHandle


class AgentRegistryService:
    """The live agents of one host (provided as ``agents``; use the bound view)."""

    def __init__(self, host_ctx: Context, *, max_steps: int = DEFAULT_MAX_STEPS) -> None:
        self.host_ctx = host_ctx
        #: The step limit of a turn for agents whose options set none (``agents`` config).
        self.max_steps = max_steps
        self.agents: dict[str, _Registered] = {}
        self.closing = AbortController()
        self.active_runs = 0

    def __dsh_bind__(self, ctx: Context) -> AgentRegistry:
        return AgentRegistry(self, ctx)

    async def dispose(self) -> None:
        """Abort creations in flight and dispose every live agent (children first)."""
        self.closing.abort(AgentCancelCause(kind="disposed"))
        for entry in reversed(list(self.agents.values())):
            await entry.handle.dispose()


class AgentRegistry:
    """``ctx.agents``: create and resume agents owned by this context; look them up."""

    __slots__ = ("_ctx", "_svc")

    def __init__(self, service: AgentRegistryService, ctx: Context) -> None:
        self._svc = service
        self._ctx = ctx

    # -- lookups ---------------------------------------------------------------------------------

    def get(self, id: str) -> Agent | None:
        """The live agent ``id``, if any."""
        entry = self._svc.agents.get(id)
        return entry.agent if entry is not None else None

    def list(self) -> builtins.list[Agent]:
        """Live agents in creation order."""
        return [e.agent for e in self._svc.agents.values()]

    def roots(self) -> builtins.list[Agent]:
        """Live agents no other agent owns."""
        return [e.agent for e in self._svc.agents.values() if e.owner is None]

    def owner_of(self, id: str) -> Agent | None:
        """The agent that owns ``id`` (``None`` for roots and unknown ids)."""
        entry = self._svc.agents.get(id)
        return entry.owner if entry is not None else None

    def is_owned_by(self, id: str, owner: Agent) -> bool:
        """Whether ``owner`` created (owns) the live agent ``id``."""
        entry = self._svc.agents.get(id)
        return entry is not None and entry.owner is owner

    # -- the initiator ---------------------------------------------------------------------------

    def with_initiator(self, agent: Agent, op: Callable[[], T]) -> T:
        """Run ``op`` with ``agent`` as the initiator (attribution, never authority)."""
        token = _INITIATOR.set(agent)
        try:
            return op()
        finally:
            _INITIATOR.reset(token)

    @contextlib.asynccontextmanager
    async def initiator(self, agent: Agent) -> AsyncIterator[None]:
        """``async with ctx.agents.initiator(agent):`` — tasks created inside inherit it."""
        token = _INITIATOR.set(agent)
        try:
            yield
        finally:
            _INITIATOR.reset(token)

    @staticmethod
    @contextlib.contextmanager
    def without_initiator() -> Iterator[None]:
        """Run a block with no initiator."""
        token = _INITIATOR.set(None)
        try:
            yield
        finally:
            _INITIATOR.reset(token)

    # -- creation --------------------------------------------------------------------------------

    async def create(self, options: CreateAgentOptions) -> AgentHandle:
        """Create, compose and publish an agent owned by this context (a transaction).

        Any failure before publication completes rolls everything back: no agent and no session
        stay published, and ``agent/disposed`` / ``session/disposed`` fire only for what was
        announced.
        """
        self._ctx._require_active()
        session = self._ctx.sessions.prepare(
            options.session_id, seed=options.seed, meta=options.meta
        )
        return await self._materialize(
            session, options.agent_options, options.signal, options.setup, "startup"
        )

    async def resume(self, options: ResumeAgentOptions) -> AgentHandle:
        """Bring a persisted session back as a live agent (same transaction as ``create``).

        With ``options.preparation`` the log is not read again: that session is the one
        resumed (``RESUME_PREPARATION_MISMATCH`` if it is of another id, and then disposed).
        """
        preparation = options.preparation
        if preparation is not None:
            if preparation.session.header.id != options.resume_session_id:
                preparation.dispose()
                raise AgentError(
                    f"the preparation is of session {preparation.session.header.id!r}, not "
                    f"{options.resume_session_id!r}",
                    code="RESUME_PREPARATION_MISMATCH",
                )
            try:
                self._ctx._require_active()
            except BaseException:
                preparation.dispose()
                raise
        else:
            self._ctx._require_active()
            persistence = self._ctx.get("session_persistence")
            if persistence is None:
                raise AgentError(
                    "resuming an agent needs session persistence", code="PERSISTENCE_UNAVAILABLE"
                )
            prepared: SessionPreparation = await race_abort(
                persistence.prepare(options.resume_session_id, options.signal),
                options.signal,
                release=_dispose_preparation,
            )
            preparation = prepared
        try:
            return await self._materialize(
                preparation.session,
                options.agent_options,
                options.signal,
                options.setup,
                "resume",
            )
        except BaseException:
            preparation.dispose()
            raise

    async def _materialize(
        self,
        session: Session,
        agent_options: AgentOptions,
        signal: AbortSignal | None,
        setup: Setup | None,
        source: Literal["startup", "resume"],
    ) -> AgentHandle:
        svc = self._svc
        owner_ctx = self._ctx
        closing = svc.closing.signal
        if owner_ctx.fiber.state != "active":
            owner_ctx.fiber.add(_noop)  # raises INACTIVE_EFFECT, as registering would
        # What stops the creation: the caller's signal, the owner's disposal, the registry
        # closing. Until the setup awaits, nothing can dispose the owner (a disposal runs only
        # when awaited), so the inputs are checked directly; the fused signal and the watch on
        # the owner, which cost more than the rest of a creation's checks, are built only for
        # a setup that awaits (PERF-6).
        watch: _CreationWatch | None = None
        fiber = Fiber(f"agent:{session.header.id}")
        agent = Agent(session, agent_options, svc, fiber, svc.host_ctx)
        detach_session: Callable[[], None] | None = None
        announced = False
        try:
            _stop_if_aborted(signal, closing)
            if setup is not None:
                produced = setup(agent.ctx)
                if inspect.isawaitable(produced):
                    watch = _CreationWatch(owner_ctx, signal, closing)
                    produced = await race_abort(produced, watch.creation)
                    watch.creation.throw_if_aborted()
                else:
                    _stop_if_aborted(signal, closing)
                if produced is not None:
                    _check_commit(produced)
                    produced()
            if watch is not None:
                watch.creation.throw_if_aborted()
            else:
                _stop_if_aborted(signal, closing)
            detach_session = agent.ctx.sessions.enter(session)
            if session.header.id in svc.agents:
                raise AgentError(
                    f"agent {session.header.id!r} is already live", code="DUPLICATE_AGENT"
                )
            handle = AgentHandle(agent, svc, detach_session)
            svc.agents[agent.id] = _Registered(agent, owner_ctx.agent, handle)
            agent.ctx.sessions.announce(session)
            announced = True
            agent.ctx.emit_veto("agent/created", agent)
            if watch is not None:
                watch.creation.throw_if_aborted()
            else:
                _stop_if_aborted(signal, closing)
        except BaseException:
            if watch is not None:
                watch.close()
            # The same teardown as a handle's (it unregisters only this agent, if registered).
            await _teardown(agent, svc, detach_session, announced=announced)
            raise
        if watch is not None:
            watch.close()
        agent.ctx.emit("agent/session-start", agent, source)
        handle._detach_owner = owner_ctx.fiber.add(handle.dispose)
        return handle


def _noop() -> None:
    return None


def _stop_if_aborted(signal: AbortSignal | None, closing: AbortSignal) -> None:
    """Raise :class:`AbortedError` if the caller's signal or the registry's closing fired
    (in that order, as the fused signal of :class:`_CreationWatch` reports them)."""
    if signal is not None and signal.aborted:
        raise AbortedError(signal.reason)
    if closing.aborted:
        raise AbortedError(closing.reason)


class _CreationWatch:
    """A creation's fused stop signal, for a setup that awaits: the caller's signal, the
    owner's disposal (watched on the owner's fiber) and the registry closing."""

    __slots__ = ("_detach", "_stop_watch", "creation")

    def __init__(
        self, owner_ctx: Context, signal: AbortSignal | None, closing: AbortSignal
    ) -> None:
        owner_gone = AbortController()
        self._stop_watch: Registration = owner_ctx.fiber.add(
            lambda: owner_gone.abort(AgentCancelCause(kind="disposed", reason="owner disposed"))
        )
        self.creation, self._detach = fuse((signal, owner_gone.signal, closing))

    def close(self) -> None:
        self._stop_watch.forget()
        self._detach()


def _dispose_preparation(preparation: SessionPreparation) -> None:
    preparation.dispose()


speed_up_inits(globals())
