"""The continuation manager: continuable background children (CONT-1..17, SET-1..4, DRN-1).

A continuable child is a durable session with at most one live :class:`Activation`, one
residency epoch of a rebuilt child agent. The Activation holds the child's one
``AgentHandle``; the agent's inbox is the only queue (every message is an ``Agent.followup``
turn); residency (``running`` / ``waiting`` / ``settled``) is derived from the agent's status,
the accepted-but-unclaimed message ids and the owned children (CONT-6), never stored. When an
Activation settles it is disposed child-first (CONT-14), the direct parent hears a settlement
notice (SET-1..4), and a later follow-up cold-resumes the child from its durable descriptor
without the provider (CONT-10). No continuable path creates a task per child or a wrapper
holding results; the one task a settlement needs is the disposal itself.

Names other modules build on (kept stable):

- :class:`ContinuationManager` (``SubagentState.continuation``): ``activations`` (child id ->
  resident :class:`Activation`), ``retiring`` (child id -> Activation past step 8 of its
  disposal, until its ownership is released), ``drain_roots`` (live agents under which
  admission is closed; the scoped drains fill it), ``closed`` (the manager-wide drain began),
  ``materializations`` (admitted creations and resumes still in flight, each with its
  ``lineage``), ``check_admission(lineage)`` (``DRAINING``), ``lineage_of(agent)``,
  ``activation_of(agent)``, ``lineage_closing(agent)``, ``submit(activation, message)``,
  ``send_waking(agent, message, target)``, ``cancel_tree(activation)`` (close and cancel an
  Activation and its resident descendants top-down, synchronously), ``drain()``.
- :class:`Activation`: ``child_id``, ``parent_session``, ``provider``, ``handle``,
  ``ancestry``, ``owned_children``, ``accepted``, ``announced``, ``closing``, ``owner`` (the
  parent's Activation holding this child in its ``owned_children``), ``agent``,
  ``in_ancestry(agent)``, ``dispose()``.
- :func:`residency`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Literal

import attrs

from dsh_core import (
    AbortedError,
    AbortSignal,
    Agent,
    AgentCancelCause,
    AgentHandle,
    AgentOptions,
    AgentRegistry,
    ContentBlock,
    Context,
    CreateAgentOptions,
    Message,
    ResumeAgentOptions,
    ServiceKey,
    SessionEvent,
    SessionHeader,
    SessionMeta,
    SharedDisposal,
    TextBlock,
    ToolRestriction,
    UserSource,
    fold_consumed_work,
    new_id,
    quote_name,
    race_abort,
    shown_id,
    user_message,
)

from ._control import queued_report
from ._depth import assert_subagent_max_depth, resolve_child_depth
from ._descriptor import (
    DESCRIPTOR_EVENT,
    ContinuableDescriptor,
    descriptor_payload,
    fold_descriptor,
    snapshot_continuable_descriptor,
)
from ._errors import SubagentError, no_provider
from ._limits import NO_SLOT, TreeSlot
from ._output import continuable_stop_reason, select_output
from ._types import (
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ContinuableStart,
    ContinuableStartSpec,
    SubagentFollowupOptions,
    SubagentRunEndInfo,
    SubagentRunInfo,
    SubagentSettledMessageSource,
    SubagentStopReason,
)
from .in_process import child_agent_options, compose_child

if TYPE_CHECKING:
    from dsh_core import Scope, SessionPersistence

    from ._service import SubagentState

__all__ = [
    "NOTICE_ENDINGS",
    "Activation",
    "ContinuationManager",
    "Materialization",
    "Residency",
    "residency",
    "settlement_summary",
]

_log = logging.getLogger("dsh.subagent")
_AGENTS: ServiceKey[AgentRegistry] = ServiceKey("agents")
_PERSISTENCE: ServiceKey[SessionPersistence] = ServiceKey("session_persistence")
_USER = UserSource()
_PARENT_CANCEL = AgentCancelCause(kind="parent")

Residency = Literal["running", "waiting", "settled"]

#: SET-2: how a settlement summary ends, by stop reason.
NOTICE_ENDINGS = {
    "completed": "finished and will do no further work unless you send it more.",
    "aborted": "was stopped before it finished.",
    "max-tokens": "ran out of room before it finished.",
    "max-steps": "reached its step limit before it finished.",
    "refusal": "declined the task.",
    "error": "failed before it finished.",
}
_CLOSING_MESSAGE = "Its closing message:"
_NO_CLOSING_MESSAGE = "It left no closing message."
_REASON_LIMIT = 64  # an unknown reason is provider text: bounded inside the summary


def settlement_summary(child_id: str, stop_reason: SubagentStopReason) -> str:
    """SET-2's one-line summary: ``Background subagent <id> <ending>``."""
    ending = NOTICE_ENDINGS.get(stop_reason)
    if ending is None:
        ending = f"ended abnormally ({stop_reason[:_REASON_LIMIT]}) before it finished."
    return f"Background subagent {child_id} {ending}"


def _error(message: str, code: str) -> SubagentError:
    return SubagentError(message, code=code)


class Activation:
    """One residency epoch of a continuable child (CONT-4).

    ``ancestry`` holds weak links to the child and its live lineage at materialization,
    nearest first (the child, its parent, the parent's ancestors), so a descendant is found
    even after an intermediate one-shot agent left the registry. ``owned_children`` are the
    ids of continuable children whose Activations this one waits for; ``accepted`` the ids of
    messages accepted into the child's inbox and not yet claimed or discarded; ``announced``
    turns true once a message of this epoch was accepted (only then does settling notify the
    parent); ``closing`` once disposal began (admission to this Activation is then refused).
    """

    __slots__ = (
        "__weakref__",
        "_disposal",
        "_end_emitted",
        "_ended",
        "_noticed",
        "accepted",
        "ancestry",
        "announced",
        "child_id",
        "closing",
        "drained",
        "handle",
        "manager",
        "owned_children",
        "owner",
        "parent_scope",
        "parent_session",
        "provider",
        "run_id",
        "slot",
        "start_seq",
    )

    def __init__(
        self,
        manager: ContinuationManager,
        handle: AgentHandle,
        *,
        parent_session: str,
        provider: str,
        ancestry: tuple[weakref.ReferenceType[Agent], ...],
        parent_scope: Scope | None,
        start_seq: int,
    ) -> None:
        self.manager = manager
        self.handle = handle
        self.child_id = handle.agent.id
        self.parent_session = parent_session
        self.provider = provider
        self.ancestry = ancestry
        self.parent_scope = parent_scope
        self.start_seq = start_seq
        self.owned_children: set[str] = set()
        self.accepted: set[str] = set()
        self.announced = False
        self.closing = False
        #: A drain is releasing this epoch (not a settlement): see ``SubagentService.drained``.
        self.drained = False
        self.owner: Activation | None = None
        self.run_id: str | None = None
        #: The run tree's slot this epoch holds (ROB-62), given back when it stops being resident.
        self.slot: TreeSlot = NO_SLOT
        self._disposal = SharedDisposal()
        self._ended: asyncio.Future[None] | None = None
        self._noticed = False
        self._end_emitted = False

    @property
    def agent(self) -> Agent:
        """The child agent of this epoch."""
        return self.handle.agent

    def in_ancestry(self, agent: Agent) -> bool:
        """Whether ``agent`` (the exact object) is this child or one of its captured
        ancestors."""
        return any(ref() is agent for ref in self.ancestry)

    def ancestors(self) -> list[Agent]:
        """The captured ancestors still alive, nearest first (the child excluded)."""
        out = []
        for ref in self.ancestry[1:]:
            agent = ref()
            if agent is not None:
                out.append(agent)
        return out

    def dispose(self) -> Awaitable[None]:
        """Dispose this Activation in CONT-14's order (memoized: every caller shares one
        teardown, and no caller's cancellation stops it, hardening 11.8). Raises
        ``ACTIVATION_TEARDOWN_FAILED`` when any step failed; the child is released anyway.

        ``closing`` is set by the call itself, before the returned awaitable runs, so
        admission to this Activation is refused from that moment on.
        """
        self.closing = True
        return self._disposal.run(self._teardown)

    async def ended(self) -> None:
        """Wait until this Activation's disposal finished, whatever its outcome."""
        if self._ended is None:
            self._ended = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._ended)

    async def _teardown(self) -> None:
        try:
            await self.manager._teardown(self)
        finally:
            self.slot.release()
            if self._ended is None:
                self._ended = asyncio.get_running_loop().create_future()
            if not self._ended.done():
                self._ended.set_result(None)

    def __repr__(self) -> str:
        return f"Activation({self.child_id!r}, {residency(self)})"


def residency(activation: Activation) -> Residency:
    """CONT-6: ``running`` while the agent runs or accepted messages are unclaimed,
    ``waiting`` while it owns a child Activation not yet disposed, else ``settled``."""
    if activation.handle.agent.status == "running" or activation.accepted:
        return "running"
    if activation.owned_children:
        return "waiting"
    return "settled"


class Materialization:
    """An admitted creation or cold resume still in flight; ``lineage`` is the live lineage
    it was admitted under (nearest first), ``done`` settles when it published or rolled back,
    ``slot`` is the run tree's slot it holds until its Activation takes it over (ROB-62)."""

    __slots__ = ("done", "lineage", "slot")

    def __init__(self, lineage: tuple[Agent, ...], slot: TreeSlot) -> None:
        self.lineage = lineage
        self.slot = slot
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class ContinuationManager:
    """Activation admission, direct-parent authority, the live ownership graph, cold resume
    and child-first release, for one subagent service (see the module docstring)."""

    def __init__(self, state: SubagentState) -> None:
        self.state = state
        #: The private activation-owner scope every continuable child is created through: its
        #: fiber owns the handles, so unloading the service releases whatever a drain left.
        self.owner_ctx: Context = state.ctx.plugin("subagent:activations")
        self.activations: dict[str, Activation] = {}
        self.retiring: dict[str, Activation] = {}
        self.drain_roots: set[Agent] = set()
        self.closed = False
        self.materializations: set[Materialization] = set()
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    # -- lookups and admission ------------------------------------------------------------------

    def agents(self) -> AgentRegistry:
        """The host's agent registry (``CONTINUATION_UNAVAILABLE`` when there is none)."""
        registry = self.state.ctx.get(_AGENTS)
        if registry is None:
            raise _error(
                "continuable subagents need the agents service", "CONTINUATION_UNAVAILABLE"
            )
        return registry

    def activation_of(self, agent: Agent) -> Activation | None:
        """The resident Activation whose child is exactly ``agent``, if any."""
        act = self.activations.get(agent.id)
        if act is not None and act.handle.agent is agent:
            return act
        return None

    def lineage_of(self, agent: Agent) -> tuple[Agent, ...]:
        """``agent`` and its live ancestors, nearest first: an Activation's captured ancestry,
        else the registry's ownership chain."""
        act = self.activation_of(agent)
        if act is not None:
            return (agent, *act.ancestors())
        out = [agent]
        registry = self.state.ctx.get(_AGENTS)
        if registry is not None:
            current = agent
            while True:
                owner = registry.owner_of(current.id)
                if owner is None or owner in out:
                    break
                inner = self.activation_of(owner)
                if inner is not None:
                    out.append(owner)
                    out.extend(a for a in inner.ancestors() if a not in out)
                    break
                out.append(owner)
                current = owner
        return tuple(out)

    def check_admission(self, lineage: Iterable[Agent]) -> None:
        """``DRAINING`` when the manager drains or any agent of ``lineage`` is a drain root."""
        if self.closed:
            raise _error("continuable subagent admission is closed: draining", "DRAINING")
        roots = self.drain_roots
        if roots:
            for agent in lineage:
                if agent in roots:
                    raise _error(
                        f"continuable subagent admission is closed under agent {agent.id}",
                        "DRAINING",
                    )

    def lineage_closing(self, agent: Agent) -> bool:
        """Whether ``agent``'s lineage is closing (SET-3): a drain, or its own Activation is
        being disposed."""
        if self.closed:
            return True
        act = self.activation_of(agent)
        if act is not None and act.closing:
            return True
        roots = self.drain_roots
        return bool(roots) and any(a in roots for a in self.lineage_of(agent))

    @contextlib.asynccontextmanager
    async def _child_lock(self, child_id: str) -> AsyncIterator[None]:
        """The per-child lock: one materialization decision per child id at a time."""
        entry = self._locks.get(child_id)
        if entry is None:
            entry = self._locks[child_id] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[child_id]

    @contextlib.contextmanager
    def _admitted(
        self, lineage: tuple[Agent, ...], refused: str = "no subagent was started"
    ) -> Iterator[Materialization]:
        """Track an admitted materialization until it published or rolled back (DRN-1).

        It first takes a slot of the run tree (the end of ``lineage``): ``SUBAGENT_LIMIT``
        when the tree is full (ROB-62), before anything is tracked or made. The slot is given
        back on the way out unless the published Activation took it over.
        """
        record = Materialization(lineage, self.state.limits.acquire(lineage[-1].id, refused))
        self.materializations.add(record)
        try:
            yield record
        finally:
            self.materializations.discard(record)
            record.done.set_result(None)
            record.slot.release()

    # -- message admission (CONT-5, CONT-13) ----------------------------------------------------

    def submit(self, act: Activation, message: Message) -> str:
        """Accept ``message`` as a next turn of ``act``'s child (``Agent.followup``): its id is
        accounted in ``accepted`` before the send and forgotten if the send throws."""
        message_id = message.id
        act.accepted.add(message_id)
        try:
            act.handle.agent.followup(message)
        except BaseException:
            act.accepted.discard(message_id)
            raise
        act.announced = True
        return message_id

    def send_waking(self, agent: Agent, message: Message, target: Literal["turn", "step"]) -> None:
        """A waking send to ``agent`` with waking-admission accounting when it is a resident
        continuable child (SET-3, RPT-S2): its Activation stays ``running`` until the message
        is claimed or discarded."""
        act = self.activation_of(agent)
        if act is not None:
            act.accepted.add(message.id)
        try:
            if target == "turn":
                agent.followup(message)
            else:
                agent.steer(message)
        except BaseException:
            if act is not None:
                act.accepted.discard(message.id)
            raise

    def _own(self, parent: Agent, act: Activation) -> None:
        """CONT-13: register ``act``'s child in the parent's Activation (if the parent has
        one) before the child can run; ``ACTIVATION_CLOSING`` if that Activation is closing."""
        owner = self.activation_of(parent)
        if owner is None:
            return
        if owner.closing:
            raise _error(f"the Activation of agent {parent.id} is closing", "ACTIVATION_CLOSING")
        owner.owned_children.add(act.child_id)
        act.owner = owner

    # -- settling (CONT-6) ----------------------------------------------------------------------

    def _watch(self, act: Activation) -> None:
        """Follow the child's inbox and status: accepted ids leave on claim or discard; an
        idle child is checked for settling."""
        agent = act.handle.agent
        ctx = agent.ctx
        accepted = act.accepted
        ref = weakref.ref(act)

        def on_claimed(who: Agent, message: Message, turn: int) -> None:
            accepted.discard(message.id)

        def on_discarded(who: Agent, message: Message) -> None:
            if message.id in accepted:
                accepted.discard(message.id)
                target = ref()
                if target is not None and not accepted:
                    self._maybe_settle(target)

        def on_status(who: Agent, status: str) -> None:
            if status == "idle":
                target = ref()
                if target is not None:
                    self._maybe_settle(target)

        ctx.on("agent/inbox/claimed", on_claimed)
        ctx.on("agent/inbox/discarded", on_discarded)
        ctx.on("agent/status", on_status)

    def _maybe_settle(self, act: Activation) -> None:
        """If ``act`` is settled, open its disposal now (the check and the opening happen in
        one synchronous span, so no admission can slip between them)."""
        if act.closing or not act.announced or residency(act) != "settled":
            return
        if self.activations.get(act.child_id) is not act:
            return
        act.closing = True
        self.state.ctx.host.spawn(self._settle(act), name=f"settle subagent {act.child_id}")

    async def _settle(self, act: Activation) -> None:
        try:
            await act.dispose()
        except Exception:
            _log.exception("settling continuable subagent %s failed", act.child_id)

    # -- disposal (CONT-14) ---------------------------------------------------------------------

    def cancel_tree(self, act: Activation, *, drain: bool = False) -> None:
        """Top-down, in one synchronous span: close and cancel ``act`` and every resident
        descendant (inboxes cleared); ``drain`` marks them released by a drain."""
        act.closing = True
        if drain:
            act.drained = True
        act.handle.agent.cancel(_PARENT_CANCEL)
        for child_id in tuple(act.owned_children):
            child = self.activations.get(child_id)
            if child is not None and not child.closing:
                self.cancel_tree(child, drain=drain)

    async def _teardown(self, act: Activation) -> None:
        failures: list[BaseException] = []
        agent = act.handle.agent
        stop: SubagentStopReason = "error"
        output: tuple[ContentBlock, ...] | None = None
        try:
            # 1-2. cancel without keeping the inbox, the whole subtree top-down, at once.
            self.cancel_tree(act)
            # 3. dispose owned children (each its own memoized teardown), collecting failures.
            children = [
                c
                for c in (
                    self.activations.get(cid) or self.retiring.get(cid)
                    for cid in tuple(act.owned_children)
                )
                if c is not None
            ]
            if children:
                outcomes = await asyncio.gather(
                    *(c.dispose() for c in children), return_exceptions=True
                )
                failures.extend(o for o in outcomes if isinstance(o, BaseException))
            # 4. quiescence.
            await agent.when_idle()
            # 5. best-effort final flush: the participation boolean proves nothing.
            try:
                await agent.ctx.sessions.flush(agent.session)
            except Exception:
                _log.warning(
                    "final flush of continuable subagent %s failed; its stored state may be "
                    "missing or stale",
                    act.child_id,
                    exc_info=True,
                )
            # 6. the end facts, from this epoch's own suffix.
            events = agent.session.events_since(act.start_seq)
            stop = continuable_stop_reason(fold_consumed_work(events))
            output = select_output(events)
        except Exception as exc:
            failures.append(exc)
        # 7. release the handle.
        try:
            await act.handle.dispose()
        except Exception as exc:
            failures.append(exc)
        # 8. no longer resident.
        if self.activations.get(act.child_id) is act:
            del self.activations[act.child_id]
            self.retiring[act.child_id] = act
        act.slot.release()
        if failures:
            stop, output = "error", None
        # 9. the settlement notice, while the parent still owns the child.
        if act.announced and not act._noticed:
            act._noticed = True
            self._notify_parent(act, stop, output)
        # 10. release ownership in the parent.
        owner = act.owner
        if owner is not None:
            act.owner = None
            if act.child_id not in self.activations:
                owner.owned_children.discard(act.child_id)
            self._maybe_settle(owner)
        if self.retiring.get(act.child_id) is act:
            del self.retiring[act.child_id]
        # 11. the epoch's end.
        if not act._end_emitted:
            act._end_emitted = True
            self._emit_end(act, stop, output)
        # 12. one aggregated failure.
        if failures:
            raise _teardown_failed(act.child_id, failures)

    def _notify_parent(
        self, act: Activation, stop: SubagentStopReason, output: tuple[ContentBlock, ...] | None
    ) -> None:
        """SET-1..4: one notice to the live direct parent; dropped silently when it is gone;
        a failed send is logged and never fails the teardown."""
        registry = self.state.ctx.get(_AGENTS)
        parent = registry.get(act.parent_session) if registry is not None else None
        if parent is None:
            return
        summary = settlement_summary(act.child_id, stop)
        head = TextBlock(text=summary)
        blocks: tuple[ContentBlock, ...]
        if output:
            blocks = (head, TextBlock(text=_CLOSING_MESSAGE), *output)
        else:
            blocks = (head, TextBlock(text=_NO_CLOSING_MESSAGE))
        message = user_message(
            blocks,
            source=SubagentSettledMessageSource(sender_session_id=act.child_id, summary=summary),
        )
        try:
            # BUG-2: never ahead of a report of this child still queued for a next turn.
            behind = queued_report(parent, act.child_id)
            if self.lineage_closing(parent):
                if behind:
                    parent.send(message, "next-turn", False)
                else:
                    parent.inject(message)
            else:
                turn = behind or parent.status == "idle"
                self.send_waking(parent, message, "turn" if turn else "step")
        except Exception:
            _log.warning(
                "the settlement notice of subagent %s was not delivered to its parent %s",
                act.child_id,
                parent.id,
                exc_info=True,
            )

    def _emit_start(self, act: Activation) -> None:
        """``subagent/start`` for a new residency epoch (a fresh run id); a listener that
        raises vetoes the epoch (CONT-3)."""
        emitter = self.state.ctx
        if not emitter.has_listeners("subagent/start"):
            return
        act.run_id = run_id = str(uuid.uuid4())
        info = SubagentRunInfo(run_id=run_id, provider=act.provider, id=act.child_id, local=True)
        emitter.emit_veto("subagent/start", info, scope=act.parent_scope)

    def _emit_end(
        self, act: Activation, stop: SubagentStopReason, output: tuple[ContentBlock, ...] | None
    ) -> None:
        emitter = self.state.ctx
        if not emitter.has_listeners("subagent/end"):
            return
        run_id = act.run_id or str(uuid.uuid4())
        emitter.emit(
            "subagent/end",
            SubagentRunEndInfo(
                run_id=run_id,
                provider=act.provider,
                id=act.child_id,
                local=True,
                stop_reason=stop,
                last_assistant_message=output or None,
            ),
            scope=act.parent_scope,
        )

    async def _rollback(self, act: Activation, *, started: bool) -> None:
        """Undo a materialization that never accepted its message (CONT-3): no Activation,
        no ownership edge, no agent; ``subagent/end`` only for an epoch that was announced
        by ``subagent/start``."""
        act.closing = True
        act.slot.release()
        if self.activations.get(act.child_id) is act:
            del self.activations[act.child_id]
        owner = act.owner
        if owner is not None:
            act.owner = None
            owner.owned_children.discard(act.child_id)
            self._maybe_settle(owner)
        try:
            await act.handle.dispose()
        except Exception:
            _log.exception("disposing a continuable subagent whose admission failed also failed")
        if started and act.run_id is not None:
            act._end_emitted = True
            self._emit_end(act, "aborted", None)

    # -- materialization (CONT-4) ---------------------------------------------------------------

    def _setup(
        self,
        *,
        descriptor: ContinuableDescriptor | None,
        persona: str | None,
        tool_filter: ToolRestriction | None,
    ) -> Callable[[Context], Callable[[], None]]:
        """The child's creation window: the descriptor (fresh children only, DSC-5), the
        composition, then the setup registry's installations (committed right before
        publication, released with the child's scope)."""
        setups = self.state.setups

        def setup(ctx: Context) -> Callable[[], None]:
            if descriptor is not None:
                agent = ctx.agent
                assert agent is not None
                agent.session.append(
                    DESCRIPTOR_EVENT, descriptor_payload(descriptor), ignorable=True
                )
            compose_child(ctx, persona, tool_filter)
            installation = setups.install(ctx)
            ctx.fiber.add(installation.release)
            return installation.commit

        return setup

    def _install(
        self, handle: AgentHandle, parent: Agent, *, provider: str, start_seq: int
    ) -> Activation:
        """Install the Activation of a just-published child (CONT-4)."""
        child = handle.agent
        lineage = self.lineage_of(parent)
        act = Activation(
            self,
            handle,
            parent_session=child.session.header.parent_session or parent.id,
            provider=provider,
            ancestry=(weakref.ref(child), *(weakref.ref(a) for a in lineage)),
            parent_scope=parent.ctx.scope,
            start_seq=start_seq,
        )
        self.activations[act.child_id] = act
        return act

    async def _admit(
        self,
        act: Activation,
        parent: Agent,
        message: Message,
        signal: AbortSignal,
        final_check: Callable[[], None],
    ) -> str:
        """Publish-to-acceptance (CONT-4, CONT-5): recheck, own, watch, announce the epoch,
        submit (the inbox writes the acceptance through, and with it the child's log so far);
        anything failing before acceptance rolls the Activation back (CONT-3)."""
        started = False
        try:
            _throw_if_aborted(signal)
            final_check()
            self._own(parent, act)
            self._watch(act)
            self._emit_start(act)
            started = True
            _throw_if_aborted(signal)
            final_check()
            # DUR-31: the child's header and descriptor (and a resume's repair) reach the OS
            # before its id can be named anywhere; a failed write (SESSION_IO) rolls it back.
            # The acceptance's checkpoint (the inbox insert, DUR-1) writes them, in the same
            # write as the acceptance (DUR-60): nothing between here and there names the id.
            return self.submit(act, message)
        except BaseException:
            await self._rollback(act, started=started)
            raise

    # -- start_continuable (CONT-1..3) ----------------------------------------------------------

    async def start(self, spec: ContinuableStartSpec) -> ContinuableStart:
        """``SubagentService.start_continuable``: see its docstring."""
        registry = self.agents()
        parent = spec.parent
        signal = spec.signal
        # 1. admission.
        self.check_admission(self.lineage_of(parent))
        # 2. persistence.
        persistence = self.state.ctx.get(_PERSISTENCE)
        if persistence is None:
            raise _error(
                "continuable subagents need session persistence", "PERSISTENCE_UNAVAILABLE"
            )
        # 3. max_depth.
        if spec.max_depth is not None:
            assert_subagent_max_depth(spec.max_depth)
        # 4. the child id.
        reserved = spec.child_id
        child_id = reserved if reserved is not None else f"session-{new_id()}"
        self._refuse_live_id(registry, child_id, parent)
        # 5. depth.
        depth = resolve_child_depth(parent, spec.max_depth)
        # 6. the descriptor (route defaults to the parent's).
        options = child_agent_options(parent, spec.agent_options, depth)
        descriptor = snapshot_continuable_descriptor(
            provider=spec.provider,
            label=spec.label,
            agent_provider=options.provider,
            agent_model=options.model,
            persona=spec.persona,
            tool_filter=spec.tool_filter,
        )
        # 7. policy: no sandbox or approval service exists to capture (see docs/subagent.md).
        # 8. the provider's detached creation input (and its own route, when it serves the
        # child's turns itself: the descriptor then keeps that route).
        created = await self._prepare(spec.provider, child_id, parent, signal)
        if created.agent_provider is not None:
            options = attrs.evolve(
                options, provider=created.agent_provider, model=created.agent_model
            )
            descriptor = snapshot_continuable_descriptor(
                provider=spec.provider,
                label=spec.label,
                agent_provider=options.provider,
                agent_model=options.model,
                persona=spec.persona,
                tool_filter=spec.tool_filter,
            )
        lineage = self.lineage_of(parent)
        with self._admitted(lineage) as admitted:
            # 9. signal and admission again.
            _throw_if_aborted(signal)
            self.check_admission(lineage)
            async with self._child_lock(child_id):
                # 10. everything again, under the child's lock.
                _throw_if_aborted(signal)
                self.check_admission(self.lineage_of(parent))
                self._refuse_live_id(registry, child_id, parent)
                if reserved is not None:
                    await self._refuse_stored_id(persistence, child_id, signal)
                # 11. materialize.
                seed = created.seed
                meta = SessionMeta(
                    cwd=parent.session.header.cwd,
                    parent_session=parent.id,
                    seed_length=len(seed) if seed else None,
                    origin="subagent",
                    delegation_depth=depth,
                )
                owner = self.owner_ctx.extend(agent=parent)
                handle = await owner[_AGENTS].create(
                    CreateAgentOptions(
                        session_id=child_id,
                        meta=meta,
                        seed=seed or None,
                        agent_options=options,
                        signal=signal,
                        setup=self._setup(
                            descriptor=descriptor,
                            persona=spec.persona,
                            tool_filter=spec.tool_filter,
                        ),
                    )
                )
                act = self._install(
                    handle,
                    parent,
                    provider=spec.provider,
                    start_seq=handle.agent.session.first_live_seq,
                )
                act.slot = admitted.slot.transfer()

                def final_check() -> None:
                    self.check_admission(self.lineage_of(parent))

                # 12. the prompt, as the user's.
                message_id = await self._admit(
                    act, parent, user_message(spec.prompt, source=_USER), signal, final_check
                )
        return ContinuableStart(child_id=child_id, message_id=message_id)

    def _refuse_live_id(self, registry: AgentRegistry, child_id: str, parent: Agent) -> None:
        if (
            child_id == parent.id
            or registry.get(child_id) is not None
            or self.state.ctx.sessions.get(child_id) is not None
            or child_id in self.activations
            or child_id in self.retiring
        ):
            raise _error(f"child id {child_id} is already in use", "DUPLICATE_CHILD")

    async def _refuse_stored_id(
        self, persistence: SessionPersistence, child_id: str, signal: AbortSignal
    ) -> None:
        """A reserved id must name no stored session (CONT-1 step 10). An id no store can
        hold (``SESSION_INVALID_ID``) or a store that cannot be read (``SESSION_IO``) fails as
        such; any other stored entry, readable or damaged, is ``DUPLICATE_CHILD``. The store
        is asked whether the id is taken: its log is never read."""
        if await persistence.stored(child_id, signal):
            raise _error(f"child id {child_id} is already in use", "DUPLICATE_CHILD")

    async def _prepare(
        self, name: str, child_id: str, parent: Agent, signal: AbortSignal
    ) -> ContinuableCreateSpec:
        provider = self.state.providers.get(name)
        if provider is None:
            raise _error(no_provider(name, self.state.providers), "NO_PROVIDER")
        prepare = getattr(provider, "prepare_continuable", None)
        if prepare is None:
            raise _error(
                f"subagent provider {quote_name(name)} cannot create continuable children",
                "UNSUPPORTED_CAPABILITY",
            )
        _throw_if_aborted(signal)
        created: ContinuableCreateSpec = await prepare(
            ContinuableCreateRequest(session_id=child_id, parent=parent, signal=signal)
        )
        return created

    # -- followup (CONT-7..12) ------------------------------------------------------------------

    async def followup(
        self,
        parent: Agent,
        child_id: str,
        content: Sequence[ContentBlock],
        options: SubagentFollowupOptions,
    ) -> str:
        """``SubagentService.followup``: see its docstring."""
        registry = self.agents()
        signal = options.signal
        _throw_if_aborted(signal)
        self._authorize_parent(registry, parent, child_id)
        message = user_message(content, source=options.source)
        while True:
            act = self.activations.get(child_id) or self.retiring.get(child_id)
            if act is not None and act.closing:
                # CONT-7: a delivery racing disposal waits for it, then cold-resumes.
                await _wait(act.ended(), signal)
                continue
            if act is not None:
                if act.parent_session != parent.id:
                    raise _foreign(child_id)
                self.check_admission((act.handle.agent, *self.lineage_of(parent)))
                self._own(parent, act)
                return self.submit(act, message)
            resumed = await self._cold_resume(registry, parent, child_id, message, signal)
            if resumed is not None:
                return resumed

    def _authorize_parent(self, registry: AgentRegistry, parent: Agent, child_id: str) -> None:
        if registry.get(parent.id) is not parent:
            raise _error(
                f"follow-up to subagent {shown_id(child_id)} requires the exact live parent agent",
                "UNAUTHORIZED",
            )

    async def _cold_resume(
        self,
        registry: AgentRegistry,
        parent: Agent,
        child_id: str,
        message: Message,
        signal: AbortSignal,
    ) -> str | None:
        """CONT-10: a new Activation from the durable descriptor, without the provider.
        ``None`` when another caller made the child resident meanwhile (route again)."""
        persistence = self.state.ctx.get(_PERSISTENCE)
        if persistence is None:
            raise _error(
                "continuable subagents need session persistence", "PERSISTENCE_UNAVAILABLE"
            )
        lineage = self.lineage_of(parent)
        self.check_admission((*lineage,))
        with self._admitted(lineage, f"subagent {shown_id(child_id)} was not resumed") as admitted:
            async with self._child_lock(child_id):
                if child_id in self.activations or child_id in self.retiring:
                    return None
                found: list[ContinuableDescriptor] = []
                refused: list[BaseException] = []

                def judge(header: SessionHeader, events: Sequence[SessionEvent]) -> None:
                    try:
                        judged(header, events)
                    except BaseException as exc:
                        refused.append(exc)
                        raise

                def judged(header: SessionHeader, events: Sequence[SessionEvent]) -> None:
                    # Before anything is written or built: the stored parent, then the state.
                    if header.parent_session != parent.id:
                        raise _foreign(child_id)
                    descriptor = fold_descriptor(events, header.seed_length).descriptor
                    if not isinstance(descriptor, ContinuableDescriptor):
                        raise _error(
                            f"subagent {shown_id(child_id)} has no supported continuation state "
                            "and cannot be resumed; do not retry send_message with this id",
                            "NOT_RESUMABLE",
                        )
                    found.append(descriptor)

                # The log is read once: ``judge`` sees it as ``inspect`` would, and the same
                # read becomes the resumed session.
                try:
                    preparation = await persistence.prepare(child_id, signal, check=judge)
                except AbortedError:
                    raise
                except Exception as exc:
                    if refused and exc is refused[0]:  # the judgement's own error, as it is
                        raise
                    raise _error(
                        f"subagent {shown_id(child_id)} is unavailable", "NOT_RESUMABLE"
                    ) from exc
                try:  # until agents.resume owns the preparation, it is disposed here
                    _throw_if_aborted(signal)
                    self.check_admission(self.lineage_of(parent))
                    descriptor = found[0]
                    owner = self.owner_ctx.extend(agent=parent)
                except BaseException:
                    preparation.dispose()
                    raise
                try:
                    handle = await owner[_AGENTS].resume(
                        ResumeAgentOptions(
                            resume_session_id=child_id,
                            preparation=preparation,
                            agent_options=AgentOptions(
                                provider=descriptor.agent_provider,
                                model=descriptor.agent_model,
                                max_steps=parent.options.max_steps,  # inherited (ROB-12)
                            ),
                            # Not the caller's signal: the resume then runs inline, so a
                            # caller cancelled meanwhile unwinds its hold on the stored log
                            # before this child's lock is let go (the signal is checked
                            # again right after, at admission).
                            signal=None,
                            setup=self._setup(
                                descriptor=None,
                                persona=descriptor.persona,
                                tool_filter=descriptor.tool_filter,
                            ),
                        )
                    )
                except (SubagentError, AbortedError):
                    raise
                except Exception as exc:
                    raise _error(
                        f"subagent {shown_id(child_id)} could not be resumed: {exc}",
                        "NOT_RESUMABLE",
                    ) from exc
                act = self._install(
                    handle,
                    parent,
                    provider=descriptor.provider,
                    start_seq=handle.agent.session.seq,
                )
                act.slot = admitted.slot.transfer()

                def final_check() -> None:
                    # CONT-8/CONT-11: authority again at the final synchronous step.
                    self._authorize_parent(registry, parent, child_id)
                    if act.parent_session != parent.id:
                        raise _foreign(child_id)
                    self.check_admission((act.handle.agent, *self.lineage_of(parent)))

                return await self._admit(act, parent, message, signal, final_check)

    # -- the manager-wide drain (DRN-1) ---------------------------------------------------------

    async def drain(self) -> None:
        """Close admission, await admitted materializations, dispose every root Activation
        child-first; ``ACTIVATION_TEARDOWN_FAILED`` only after every branch settled."""
        self.closed = True
        while self.materializations:
            pending = [m.done for m in self.materializations]
            await asyncio.gather(*pending, return_exceptions=True)
        failures: list[BaseException] = []
        left: set[Activation] = set()
        while self.activations or self.retiring:
            now = {*self.activations.values(), *self.retiring.values()}
            if now == left:  # nothing moved: a teardown failed before letting go
                break
            left = now
            branches = [
                a
                for a in (*self.activations.values(), *self.retiring.values())
                if a.owner is None
                or (
                    self.activations.get(a.owner.child_id) is not a.owner
                    and self.retiring.get(a.owner.child_id) is not a.owner
                )
            ]
            if not branches:  # an ownership cycle cannot form; release whatever is left
                branches = [*self.activations.values(), *self.retiring.values()]
            for branch in branches:
                self.cancel_tree(branch, drain=True)
            outcomes = await asyncio.gather(
                *(b.dispose() for b in branches), return_exceptions=True
            )
            failures.extend(o for o in outcomes if isinstance(o, BaseException))
        if failures:
            raise _teardown_failed("the continuation manager", failures)


def _foreign(child_id: str) -> SubagentError:
    return _error(
        f"subagent {shown_id(child_id)} belongs to another parent session", "UNAUTHORIZED"
    )


def _teardown_failed(what: str, failures: Sequence[BaseException]) -> SubagentError:
    causes = "; ".join(f"{type(f).__name__}: {f}" for f in failures)
    error = _error(f"teardown of {what} failed: {causes}", "ACTIVATION_TEARDOWN_FAILED")
    error.__cause__ = failures[0]
    return error


def _throw_if_aborted(signal: AbortSignal) -> None:
    """A caller-signal abort rejects with the signal's own reason (never wrapped)."""
    if signal.aborted:
        raise AbortedError(signal.reason)


async def _wait(aw: Awaitable[None], signal: AbortSignal) -> None:
    """Await ``aw`` unless ``signal`` fires first (then raise its reason, CONT-9)."""
    try:
        await race_abort(aw, signal)
    except AbortedError:
        raise AbortedError(signal.reason) from None
