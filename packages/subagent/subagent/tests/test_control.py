"""Reports, interrupts and scoped drains of continuable children (seam-continuable 13.3/13.4).

Parent and children run on one scripted model that answers each agent from its own queue of
replies; a reply held on an :class:`asyncio.Event` keeps an agent "in its model request" so a
test can order what happens meanwhile. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsh_subagent.plugin
from dsh_core import (
    AbortController,
    AbortedError,
    Agent,
    AgentCancelCause,
    AgentHandle,
    AgentRegistry,
    CreateAgentOptions,
    Message,
    SessionMeta,
    TextBlock,
    boot_host,
    make_plugin_manager,
    replay_inbox,
    text_blocks,
    user_message,
)
from dsh_core import plugin as core_plugin
from dsh_core.testing import ScriptedReply, ScriptedRequest, TestHost, held_reply, scripted_host
from dsh_subagent import (
    NO_START_CAPABILITIES,
    SUBAGENTS,
    AncestorInterruptAuthority,
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ContinuableStartSpec,
    CoordinatorMessageSource,
    SubagentError,
    SubagentFollowupOptions,
    SubagentReportMessageSource,
    SubagentReportOptions,
    SubagentRunEndInfo,
    SubagentService,
    SubagentSettledMessageSource,
    UserInterruptAuthority,
)

BOUND = 5  # seconds: every wait in this file gives up after this long


# -- the harness ----------------------------------------------------------------------------------


class Models:
    """One scripted model for every agent: each agent id has its own queue of replies (an
    empty queue answers ``"ok"``), and every request is recorded per agent."""

    def __init__(self) -> None:
        self.queues: defaultdict[str, deque[ScriptedReply | str]] = defaultdict(deque)
        self.requests: defaultdict[str, list[ScriptedRequest]] = defaultdict(list)
        self._arrived = asyncio.Event()

    def __call__(self, request: ScriptedRequest) -> ScriptedReply | str:
        sid = request.options.session_id or ""
        self.requests[sid].append(request)
        self._arrived.set()
        self._arrived = asyncio.Event()
        queue = self.queues[sid]
        return queue.popleft() if queue else "ok"

    def say(self, agent_id: str, *replies: ScriptedReply | str) -> None:
        """Queue ``replies`` for ``agent_id``'s next requests."""
        self.queues[agent_id].extend(replies)

    def hold(self, agent_id: str, text: str = "") -> asyncio.Event:
        """Queue a reply that stays in its request until the returned event is set."""
        gate = asyncio.Event()
        self.queues[agent_id].append(held_reply(gate, text))
        return gate

    async def requested(self, agent_id: str, count: int = 1) -> ScriptedRequest:
        """Wait (bounded) until ``agent_id`` made ``count`` requests; the last one."""
        async with asyncio.timeout(BOUND):
            while len(self.requests[agent_id]) < count:
                await self._arrived.wait()
        return self.requests[agent_id][count - 1]


class Provider:
    """A continuable-capable provider; ``gate`` (when set) holds ``prepare_continuable``."""

    name = "fake"
    capabilities = NO_START_CAPABILITIES
    inherits_parent_context = False

    def __init__(self) -> None:
        self.gate: asyncio.Event | None = None
        self.preparing = asyncio.Event()

    async def start(self, request: Any) -> Any:
        raise AssertionError("one-shot start is not used here")

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        self.preparing.set()
        if self.gate is not None:
            await self.gate.wait()
        return ContinuableCreateSpec()


@attrs.define
class World:
    host: TestHost
    models: Models
    provider: Provider
    root: Agent
    ends: list[SubagentRunEndInfo]
    _end: asyncio.Event = attrs.field(factory=asyncio.Event)

    @property
    def svc(self) -> SubagentService:
        return self.host.ctx[SUBAGENTS]

    async def start(
        self, parent: Agent, child_id: str, prompt: str = "work", *, hold: bool = False
    ) -> tuple[Agent, asyncio.Event | None]:
        """Start continuable ``child_id`` under ``parent``; with ``hold`` its first request is
        held (the returned gate releases it) and this waits until it is in that request."""
        gate = self.models.hold(child_id, "partial") if hold else None
        started = await self.svc.start_continuable(
            ContinuableStartSpec(
                provider="fake",
                label=f"task {child_id}",
                prompt=text_blocks(prompt),
                parent=parent,
                child_id=child_id,
            )
        )
        assert started.child_id == child_id
        child = self.host.ctx.agents.get(child_id)
        assert child is not None
        if hold:
            await self.models.requested(child_id)
        return child, gate

    async def followup(self, parent: Agent, child_id: str, text: str) -> str:
        """``followup`` from ``parent`` to ``child_id``; the accepted message id."""
        return await self.svc.followup(
            parent,
            child_id,
            text_blocks(text),
            SubagentFollowupOptions(source=CoordinatorMessageSource(sender_session_id=parent.id)),
        )

    async def ended(self, child_id: str) -> SubagentRunEndInfo:
        """Wait (bounded) for ``child_id``'s ``subagent/end``."""
        async with asyncio.timeout(BOUND):
            while True:
                for end in self.ends:
                    if end.id == child_id:
                        return end
                await self._end.wait()

    def on_end(self, info: SubagentRunEndInfo) -> None:
        self.ends.append(info)
        self._end.set()
        self._end = asyncio.Event()


@contextlib.asynccontextmanager
async def world(*, agents: bool = True) -> AsyncIterator[World]:
    """A host with ``subagent``, the fake provider, a root agent and every end recorded."""
    models = Models()
    async with scripted_host(
        "subagent", model=models, modules={"subagent": dsh_subagent.plugin}
    ) as host:
        provider = Provider()
        host.ctx[SUBAGENTS].register_provider(provider)
        root = (await host.create_agent(session_id="root")).agent
        w = World(host=host, models=models, provider=provider, root=root, ends=[])
        host.ctx.on("subagent/end", w.on_end)
        yield w


async def idle(*agents: Agent) -> None:
    """Wait (bounded) until every agent is idle."""
    async with asyncio.timeout(BOUND):
        for agent in agents:
            await agent.when_idle()


def report(text: str) -> tuple[TextBlock, ...]:
    return text_blocks(text)


def opts(delivery: str = "next-step", signal: Any = None) -> SubagentReportOptions:
    if signal is None:
        return SubagentReportOptions(delivery=delivery)  # type: ignore[arg-type]
    return SubagentReportOptions(delivery=delivery, signal=signal)  # type: ignore[arg-type]


def _snapshot(message: Message) -> bool:
    return getattr(message.source, "form", None) == "snapshot"


def user_messages(agent: Agent) -> list[Message]:
    """The user messages of ``agent``'s log (system-prompt snapshots left out), in the order
    its model was shown them."""
    return [
        e.data for e in agent.session.events if e.type == "user/message" and not _snapshot(e.data)
    ]


def last_input(request: ScriptedRequest) -> Message:
    """The newest message of a request that is not a system-prompt snapshot."""
    return [m for m in request.options.messages if not _snapshot(m)][-1]


def kinds(messages: list[Message]) -> list[str]:
    return [m.source.kind for m in messages]


REPORTED = "Background subagent kid reported:"


# -- report_from: the message and its deliveries (RPT-S2) -----------------------------------------


async def test_report_message_shape_and_quiet_delivery() -> None:
    """RPT-S2, seam-continuable 13.3: the report is one user message [text "Background subagent
    <id> reported:", ...content] with a relay subagent-report source naming the child; quiet
    delivery injects it into the parent's next step without waking it, and returns its id."""
    async with world() as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        message_id = await w.svc.report_from(kid, report("found it"), opts("quiet"))
        (pending,) = w.root.inbox.next_step
        assert pending.id == message_id
        assert pending.content == (TextBlock(text=REPORTED), TextBlock(text="found it"))
        assert pending.source == SubagentReportMessageSource(sender_session_id="kid")
        assert pending.source.form == "relay"
        assert w.root.inbox.next_turn == []
        assert w.root.status == "idle"
        assert w.models.requests["root"] == []
        assert gate is not None
        gate.set()


async def test_next_step_delivery_wakes_an_idle_parent() -> None:
    """RPT-S2 [M]: next-step delivery steers: an idle parent wakes and its model sees the
    report."""
    async with world() as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        await w.svc.report_from(kid, report("found it"), opts("next-step"))
        request = await w.models.requested("root")
        assert last_input(request).source.kind == "subagent-report"
        assert gate is not None
        gate.set()


async def test_next_step_is_the_default_delivery() -> None:
    """RPT-S2, seam-continuable 13.3: without options (and with default options) a report is
    delivered next-step: an idle parent wakes."""
    async with world() as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        assert SubagentReportOptions().delivery == "next-step"
        await w.svc.report_from(kid, report("found it"))
        request = await w.models.requested("root")
        assert last_input(request).source.kind == "subagent-report"
        assert gate is not None
        gate.set()


async def test_wakeup_delivery_opens_a_new_parent_turn() -> None:
    """RPT-S2 [S]: wakeup delivery is a followup: the parent's next-turn queue, and an idle
    parent starts a turn for it."""
    async with world() as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        await w.svc.report_from(kid, report("found it"), opts("wakeup"))
        request = await w.models.requested("root")
        assert last_input(request).source.kind == "subagent-report"
        assert [e.type for e in w.root.session.events].count("turn/start") == 1
        assert gate is not None
        gate.set()


@pytest.mark.parametrize(
    ("delivery", "queue"),
    [("quiet", "next_step"), ("next-step", "next_step"), ("wakeup", "next_turn")],
)
async def test_delivery_to_a_busy_parent_picks_its_queue(delivery: str, queue: str) -> None:
    """RPT-S2: to a parent in a model request, quiet and next-step join its next step and
    wakeup its next turn."""
    async with world() as w:
        held = w.models.hold("root")
        w.root.followup(user_message("go"))
        await w.models.requested("root")
        kid, gate = await w.start(w.root, "kid", hold=True)
        message_id = await w.svc.report_from(kid, report("found it"), opts(delivery))
        assert [m.id for m in getattr(w.root.inbox, queue)] == [message_id]
        assert gate is not None
        gate.set()
        held.set()


async def test_an_unknown_delivery_is_refused_before_anything_is_sent() -> None:
    """RPT-S2: a delivery other than quiet, next-step or wakeup raises ValueError and delivers
    nothing."""
    async with world() as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        with pytest.raises(ValueError, match="unknown report delivery 'loud'"):
            await w.svc.report_from(kid, report("x"), opts("loud"))
        assert len(w.root.inbox) == 0
        assert gate is not None
        gate.set()


# -- report_from: its checks, in order (RPT-S1, RPT-S3) -------------------------------------------


async def test_an_aborted_signal_is_checked_first() -> None:
    """RPT-S1: an aborted signal rejects with its own reason, unwrapped, before any other check
    (here the caller is not even a continuable child)."""
    async with world() as w:
        controller = AbortController()
        controller.abort("caller gave up")
        with pytest.raises(AbortedError) as caught:
            await w.svc.report_from(w.root, report("x"), opts(signal=controller.signal))
        assert caught.value.reason == "caller gave up"


async def test_a_draining_lineage_is_checked_before_authority() -> None:
    """RPT-S1, DRN-2: under a draining root a report fails DRAINING, checked before the
    caller's authority (the drained child is no longer resident)."""
    async with world() as w:
        kid, _ = await w.start(w.root, "kid", hold=True)
        await asyncio.wait_for(w.svc.drain_continuable_descendants([w.root]), BOUND)
        with pytest.raises(SubagentError) as caught:
            await w.svc.report_from(kid, report("x"))
        assert caught.value.code == "DRAINING"
        assert str(caught.value) == "continuable subagent admission is closed under agent root"


async def test_only_the_live_activation_agent_may_report() -> None:
    """RPT-S1: a root agent, or a stale copy of a child from an earlier epoch, gets
    UNAUTHORIZED; there is no recipient to name."""
    async with world() as w:
        with pytest.raises(SubagentError) as caught:
            await w.svc.report_from(w.root, report("x"))
        assert caught.value.code == "UNAUTHORIZED"
        assert str(caught.value) == (
            "agent root is not a live continuable subagent and cannot report"
        )
        first, _ = await w.start(w.root, "kid")
        await w.ended("kid")
        w.models.hold("kid")
        await w.followup(w.root, "kid", "again")  # cold resume: a new Agent object
        await w.models.requested("kid", 2)
        live = w.host.ctx.agents.get("kid")
        assert live is not None and live is not first
        with pytest.raises(SubagentError) as stale:
            await w.svc.report_from(first, report("x"))
        assert stale.value.code == "UNAUTHORIZED"


async def test_a_disposing_child_cannot_report() -> None:
    """RPT-S1: once the child's Activation is being disposed a report fails
    ACTIVATION_CLOSING."""
    async with world() as w:
        kid, _ = await w.start(w.root, "kid", hold=True)
        release = w.svc.drain_continuable_children(w.root, ["kid"])
        with pytest.raises(SubagentError) as caught:
            await w.svc.report_from(kid, report("x"))
        assert caught.value.code == "ACTIVATION_CLOSING"
        assert str(caught.value) == (
            "subagent kid activation is being disposed; the report was not delivered"
        )
        await asyncio.wait_for(release, BOUND)


async def test_a_report_needs_a_live_direct_parent() -> None:
    """RPT-S1: when the parent recorded in the child's header is not live the report fails
    PARENT_UNAVAILABLE, "direct parent is not live; report was not delivered"."""
    async with world() as w:
        parent_handle = await w.host.create_agent(session_id="mid")
        kid, gate = await w.start(parent_handle.agent, "kid", hold=True)
        await asyncio.wait_for(parent_handle.dispose(), BOUND)
        with pytest.raises(SubagentError) as caught:
            await w.svc.report_from(kid, report("x"))
        assert caught.value.code == "PARENT_UNAVAILABLE"
        assert str(caught.value) == "direct parent is not live; report was not delivered"
        assert gate is not None
        gate.set()


@pytest.mark.parametrize("delivery", ["quiet", "next-step", "wakeup"])
async def test_a_parent_whose_disposal_started_still_accepts_a_report(delivery: str) -> None:
    """RPT-4 (tools 15.3): a parent whose disposal has started but which is still registered
    accepts the report (kept in its log, no new request); once its disposal completed the
    next report fails PARENT_UNAVAILABLE."""
    async with world() as w:
        parent_handle = await w.host.create_agent(session_id="mid")
        parent = parent_handle.agent
        kid, gate = await w.start(parent, "kid", hold=True)
        accepted: list[str] = []

        async def report_while_disposing() -> None:
            assert w.host.ctx.agents.get("mid") is parent
            accepted.append(await w.svc.report_from(kid, report("late news"), opts(delivery)))

        parent.ctx.fiber.add(report_while_disposing)
        await asyncio.wait_for(parent_handle.dispose(), BOUND)
        (message_id,) = accepted
        next_turn, next_step = replay_inbox(parent.session.events)
        (kept,) = next_turn if delivery == "wakeup" else next_step
        assert kept.id == message_id
        assert kept.content == (TextBlock(text=REPORTED), TextBlock(text="late news"))
        assert w.models.requests["mid"] == []  # kept, not woken
        with pytest.raises(SubagentError) as caught:
            await w.svc.report_from(kid, report("later"), opts(delivery))
        assert caught.value.code == "PARENT_UNAVAILABLE"
        assert gate is not None
        gate.set()


@pytest.mark.parametrize(
    ("delivery", "verb"), [("quiet", "inject"), ("next-step", "steer"), ("wakeup", "followup")]
)
async def test_a_send_that_raises_is_parent_unavailable(
    delivery: str, verb: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RPT-S2: a parent send that raises becomes PARENT_UNAVAILABLE with the error as its
    cause, and nothing is delivered."""
    async with world() as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        fault = RuntimeError("inbox refused")
        original = getattr(Agent, verb)

        def refuse(agent: Agent, message: Message) -> None:
            if agent.id == "root":
                raise fault
            original(agent, message)

        monkeypatch.setattr(Agent, verb, refuse)
        with pytest.raises(SubagentError) as caught:
            await w.svc.report_from(kid, report("x"), opts(delivery))
        monkeypatch.undo()
        assert caught.value.code == "PARENT_UNAVAILABLE"
        assert caught.value.__cause__ is fault
        assert len(w.root.inbox) == 0
        assert gate is not None
        gate.set()


async def test_reporting_never_ends_the_child_and_the_report_outlives_it() -> None:
    """RPT-S3: a report leaves the child's turn running; once the child settled, the accepted
    report is still the parent's, ahead of the settlement notice."""
    async with world() as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        request = w.models.requests["kid"][0]
        await w.svc.report_from(kid, report("halfway"), opts("quiet"))
        assert kid.status == "running"
        assert request.options.signal is not None and not request.options.signal.aborted
        assert gate is not None
        gate.set()
        end = await w.ended("kid")
        assert end.stop_reason == "completed"
        await idle(w.root)
        assert kinds(user_messages(w.root)) == ["subagent-report", "subagent-settled"]


# -- BUG-2: a report accepted before a settlement reaches the parent's model first ----------------


@pytest.mark.parametrize("delivery", ["quiet", "next-step", "wakeup"])
async def test_reports_reach_a_busy_parent_before_the_settlement_notice(delivery: str) -> None:
    """BUG-2, RPT-S2, SET-3, seam-continuable 13.3: with the parent held in a model request,
    two reports and then the child's settlement: whatever the delivery, the parent's model
    reads both reports (FIFO) before the notice, and the notice is queued behind them."""
    async with world() as w:
        held = w.models.hold("root")
        w.root.followup(user_message("go"))
        await w.models.requested("root")
        kid, gate = await w.start(w.root, "kid", hold=True)
        first = await w.svc.report_from(kid, report("one"), opts(delivery))
        second = await w.svc.report_from(kid, report("two"), opts(delivery))
        assert gate is not None
        gate.set()
        await w.ended("kid")
        pending = [*w.root.inbox.next_step, *w.root.inbox.next_turn]
        assert kinds(pending) == ["subagent-report", "subagent-report", "subagent-settled"]
        assert [m.id for m in pending[:2]] == [first, second]
        if delivery == "wakeup":
            assert w.root.inbox.next_step == []  # nothing may overtake the next-turn reports
        else:
            assert w.root.inbox.next_turn == []  # one batch: no new turn is needed
        held.set()
        await idle(w.root)
        shown = user_messages(w.root)
        assert kinds(shown) == ["user", "subagent-report", "subagent-report", "subagent-settled"]
        assert [m.content[-1].text for m in shown[1:3]] == ["one", "two"]


@pytest.mark.parametrize("delivery", ["quiet", "next-step", "wakeup"])
async def test_a_notice_injected_during_a_drain_stays_behind_the_reports(delivery: str) -> None:
    """BUG-2, SET-3: when the parent's lineage is closing the notice is injected without a wake;
    it still reaches the (kept) parent's model after the reports the child made before."""
    async with world() as w:
        held = w.models.hold("root")
        w.root.followup(user_message("go"))
        await w.models.requested("root")
        kid, _ = await w.start(w.root, "kid", hold=True)
        await w.svc.report_from(kid, report("one"), opts(delivery))
        await asyncio.wait_for(w.svc.drain_continuable_descendants([w.root]), BOUND)
        held.set()
        await idle(w.root)
        shown = user_messages(w.root)
        assert kinds(shown) == ["user", "subagent-report", "subagent-settled"]
        notice = shown[-1]
        assert notice.content[0].text == "Background subagent kid was stopped before it finished."


@settings(max_examples=25)
@given(
    deliveries=st.lists(st.sampled_from(["quiet", "next-step", "wakeup"]), min_size=1, max_size=4),
    parent=st.sampled_from(["idle", "busy", "draining"]),
)
async def test_no_mix_of_deliveries_lets_a_notice_overtake_a_report(
    deliveries: list[str], parent: str
) -> None:
    """BUG-2, RPT-S2, SET-3, seam-continuable 13.3: for any mix of deliveries, to a parent that
    is idle, held in a model request, or held while its lineage drains, the parent's model
    reads every report of the child before the child's settlement notice, and reports of one
    delivery in the order they were made."""
    async with world() as w:
        held = None
        if parent != "idle":
            held = w.models.hold("root")
            w.root.followup(user_message("go"))
            await w.models.requested("root")
        kid, gate = await w.start(w.root, "kid", hold=True)
        made = [
            await w.svc.report_from(kid, report(f"{i} {d}"), opts(d))
            for i, d in enumerate(deliveries)
        ]
        if parent == "draining":
            await asyncio.wait_for(w.svc.drain_continuable_descendants([w.root]), BOUND)
        else:
            assert gate is not None
            gate.set()
            await w.ended("kid")
        if held is not None:
            held.set()
        await idle(w.root)
        shown = [m for m in user_messages(w.root) if m.source.kind != "user"]
        assert kinds(shown)[-1] == "subagent-settled"
        reports = [m.id for m in shown[:-1]]
        assert sorted(reports) == sorted(made)
        for delivery in set(deliveries):
            mine = [i for i, d in zip(made, deliveries, strict=True) if d == delivery]
            assert [i for i in reports if i in mine] == mine


# -- interrupt (INT-1, INT-2, BUG-6) --------------------------------------------------------------


def turn_ends(agent: Agent) -> list[Any]:
    return [e.data.reason for e in agent.session.events if e.type == "turn/end"]


@contextlib.contextmanager
def counting_cancels(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, Any, bool]]]:
    """Record every ``Agent.cancel`` as ``(agent id, cause, keep_inbox)``."""
    calls: list[tuple[str, Any, bool]] = []
    original = Agent.cancel

    def cancel(agent: Agent, cause: AgentCancelCause, *, keep_inbox: bool = False) -> None:
        calls.append((agent.id, cause, keep_inbox))
        original(agent, cause, keep_inbox=keep_inbox)

    monkeypatch.setattr(Agent, "cancel", cancel)
    yield calls
    monkeypatch.undo()


async def test_a_stale_ancestor_is_refused_even_for_an_absent_target() -> None:
    """INT-1: an ancestor authority must be the exact live registered agent, checked before the
    target is looked up (here no such target exists)."""
    async with world() as w:
        handle = await w.host.create_agent(session_id="gone")
        stale = handle.agent
        await asyncio.wait_for(handle.dispose(), BOUND)
        with pytest.raises(SubagentError) as caught:
            w.svc.interrupt("nobody", AncestorInterruptAuthority(agent=stale))
        assert caught.value.code == "UNAUTHORIZED"
        assert str(caught.value) == "interrupting nobody requires the exact live ancestor agent"


async def test_an_agent_cannot_interrupt_itself() -> None:
    """INT-1: an ancestor naming itself as the target is UNAUTHORIZED."""
    async with world() as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        with pytest.raises(SubagentError) as caught:
            w.svc.interrupt("kid", AncestorInterruptAuthority(agent=kid))
        assert caught.value.code == "UNAUTHORIZED"
        assert str(caught.value) == "agent kid cannot interrupt itself"
        assert kid.status == "running"
        assert gate is not None
        gate.set()


async def test_an_absent_target_is_an_accepted_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """INT-1: an unknown id, or a child that already settled, is an accepted no-op for either
    authority."""
    async with world() as w:
        await w.start(w.root, "kid")
        await w.ended("kid")
        with counting_cancels(monkeypatch) as calls:
            for target in ("nobody", "kid"):
                assert (
                    w.svc.interrupt(target, UserInterruptAuthority(parent_session_id="x")) is None
                )
                w.svc.interrupt(target, AncestorInterruptAuthority(agent=w.root))
        assert calls == []


async def test_user_authority_must_name_the_direct_parent() -> None:
    """INT-1: with user authority the target's recorded parent session must be the one named;
    otherwise UNAUTHORIZED "... belongs to another parent session"."""
    async with world() as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        with pytest.raises(SubagentError) as caught:
            w.svc.interrupt("kid", UserInterruptAuthority(parent_session_id="someone-else"))
        assert caught.value.code == "UNAUTHORIZED"
        assert str(caught.value) == "subagent kid belongs to another parent session"
        assert kid.status == "running"
        assert gate is not None
        gate.set()


async def test_ancestor_authority_must_be_in_the_target_ancestry() -> None:
    """INT-1: an ancestor authority must be in the target's materialization-time ancestry: the
    direct parent and a grandparent may interrupt, a sibling or a stranger may not."""
    async with world() as w:
        mid, _ = await w.start(w.root, "mid", hold=True)
        sibling, _ = await w.start(w.root, "sibling", hold=True)
        stranger = (await w.host.create_agent(session_id="stranger")).agent
        grandkid, _ = await w.start(mid, "grandkid", hold=True)
        for caller in (sibling, stranger):
            with pytest.raises(SubagentError) as caught:
                w.svc.interrupt("grandkid", AncestorInterruptAuthority(agent=caller))
            assert caught.value.code == "UNAUTHORIZED"
            assert str(caught.value) == (
                f"subagent grandkid is not a live descendant of agent {caller.id}"
            )
        assert grandkid.status == "running"
        w.svc.interrupt("grandkid", AncestorInterruptAuthority(agent=w.root))  # grandparent
        await idle(grandkid)
        assert turn_ends(grandkid)[-1].kind == "aborted"


@pytest.mark.parametrize(
    ("authority", "kind"),
    [("user", "user"), ("ancestor", "parent")],
)
async def test_interrupt_cancels_the_turn_keeping_the_inbox(
    authority: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """INT-1: interrupt is synchronous: the target's turn signal has fired when it returns, with
    cause user (user authority) or parent (ancestor authority), and keep_inbox set."""
    async with world() as w:
        kid, _ = await w.start(w.root, "kid", hold=True)
        request = w.models.requests["kid"][0]
        who: Any = (
            UserInterruptAuthority(parent_session_id="root")
            if authority == "user"
            else AncestorInterruptAuthority(agent=w.root)
        )
        with counting_cancels(monkeypatch) as calls:
            w.svc.interrupt("kid", who)
            assert request.options.signal is not None and request.options.signal.aborted
        assert calls == [("kid", AgentCancelCause(kind=kind), True)]  # type: ignore[arg-type]
        end = await w.ended("kid")
        assert end.stop_reason == "aborted"
        assert turn_ends(kid)[-1].cause == AgentCancelCause(kind=kind)  # type: ignore[arg-type]


async def test_a_disposing_target_is_not_cancelled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """INT-1: a target whose Activation is already being disposed is a no-op: no second
    cancel."""
    async with world() as w:
        await w.start(w.root, "kid", hold=True)
        with counting_cancels(monkeypatch) as calls:
            release = w.svc.drain_continuable_children(w.root, ["kid"])
            before = list(calls)
            w.svc.interrupt("kid", UserInterruptAuthority(parent_session_id="root"))
            assert calls == before
            await asyncio.wait_for(release, BOUND)
        assert all(cause.kind != "user" for _, cause, _ in calls)


async def test_interrupt_parks_queued_followups_until_the_next_waking_send() -> None:
    """INT-2: after an interrupt the turn ends aborted; queued follow-ups stay parked (no model
    request, the same Agent stays resident and idle); the next followup runs them first, in
    FIFO order, then itself."""
    async with world() as w:
        kid, _ = await w.start(w.root, "kid", "first", hold=True)
        await w.followup(w.root, "kid", "second")
        await w.followup(w.root, "kid", "third")
        w.svc.interrupt("kid", UserInterruptAuthority(parent_session_id="root"))
        await idle(kid)
        assert turn_ends(kid)[-1].kind == "aborted"
        assert [m.text for m in kid.inbox.next_turn] == ["second", "third"]
        assert len(w.models.requests["kid"]) == 1
        assert w.host.ctx.agents.get("kid") is kid
        assert [e.id for e in w.ends] == []  # still resident: no subagent/end
        await w.followup(w.root, "kid", "fourth")
        await w.models.requested("kid", 4)
        await w.ended("kid")
        firsts = [last_input(r).text for r in w.models.requests["kid"]]
        assert firsts == ["first", "second", "third", "fourth"]
        assert w.host.ctx.agents.get("kid") is None


async def test_work_claimed_by_the_interrupted_turn_is_not_requeued() -> None:
    """INT-2: the message the aborted turn had claimed is not run again."""
    async with world() as w:
        kid, _ = await w.start(w.root, "kid", "first", hold=True)
        w.svc.interrupt("kid", AncestorInterruptAuthority(agent=w.root))
        await w.ended("kid")
        assert len(w.models.requests["kid"]) == 1
        assert [m.text for m in user_messages(kid)] == ["first"]


async def test_interrupt_never_signals_descendants() -> None:
    """INT-2: interrupting a child leaves its own children running; they finish normally."""
    async with world() as w:
        mid, _ = await w.start(w.root, "mid", hold=True)
        grandkid, gate = await w.start(mid, "grandkid", hold=True)
        grand_request = w.models.requests["grandkid"][0]
        w.svc.interrupt("mid", UserInterruptAuthority(parent_session_id="root"))
        await idle(mid)
        assert grand_request.options.signal is not None
        assert not grand_request.options.signal.aborted
        assert grandkid.status == "running"
        assert gate is not None
        gate.set()
        end = await w.ended("grandkid")
        assert end.stop_reason == "completed"


async def test_interrupt_before_the_first_step_notifies_a_stop() -> None:
    """INT-2, SET-2: a child interrupted before its first step settles with the notice "was
    stopped before it finished." and no closing message."""
    async with world() as w:
        stepped = asyncio.Event()

        async def hold_pre_step(pre: Any, proceed: Callable[[], Awaitable[Any]]) -> Any:
            if pre.agent.id == "kid":
                stepped.set()
                await pre.signal.wait()
            return await proceed()

        w.host.ctx.on("agent/pre-step", hold_pre_step)
        w.models.hold("root")  # keep the parent busy: the notice lands in its inbox
        w.root.followup(user_message("go"))
        await w.models.requested("root")
        await w.svc.start_continuable(
            ContinuableStartSpec(
                provider="fake",
                label="task kid",
                prompt=text_blocks("work"),
                parent=w.root,
                child_id="kid",
            )
        )
        await asyncio.wait_for(stepped.wait(), BOUND)
        w.svc.interrupt("kid", UserInterruptAuthority(parent_session_id="root"))
        end = await w.ended("kid")
        assert end.stop_reason == "aborted"
        (notice,) = [*w.root.inbox.next_step, *w.root.inbox.next_turn]
        assert notice.source == SubagentSettledMessageSource(
            sender_session_id="kid",
            summary="Background subagent kid was stopped before it finished.",
        )
        assert [b.text for b in notice.content] == [  # type: ignore[attr-defined]
            "Background subagent kid was stopped before it finished.",
            "It left no closing message.",
        ]
        assert w.models.requests["kid"] == []


async def test_a_send_right_after_an_interrupt_runs_after_convergence() -> None:
    """BUG-6, INT-2: a followup sent while the interrupted turn is still unwinding is not parked
    forever: it runs once the aborted turn has ended, in the same Activation."""
    async with world() as w:
        kid, _ = await w.start(w.root, "kid", "first", hold=True)
        w.svc.interrupt("kid", UserInterruptAuthority(parent_session_id="root"))
        assert kid.status == "running"  # still unwinding
        await w.followup(w.root, "kid", "after")
        request = await w.models.requested("kid", 2)
        assert last_input(request).text == "after"
        await w.ended("kid")
        assert [r.kind for r in turn_ends(kid)] == ["aborted", "completed"]
        assert len([e for e in w.ends if e.id == "kid"]) == 1


# -- drain_continuable_descendants (DRN-2) --------------------------------------------------------


async def test_a_scoped_drain_cancels_descendants_at_once_and_keeps_the_root() -> None:
    """DRN-2, seam-continuable 13.4: the call cancels every strict continuable descendant
    before it returns; awaiting it releases them child-first; a continuable root is kept."""
    async with world() as w:
        mid, _ = await w.start(w.root, "mid", hold=True)
        await w.start(mid, "grandkid", hold=True)
        signals = [w.models.requests[i][0].options.signal for i in ("mid", "grandkid")]
        order: list[str] = []
        w.host.ctx.on("agent/disposed", lambda agent: order.append(agent.id))
        drained = w.svc.drain_continuable_descendants([mid])
        assert [s is not None and s.aborted for s in signals] == [False, True]
        await asyncio.wait_for(drained, BOUND)
        assert order == ["grandkid"]
        assert w.host.ctx.agents.get("mid") is mid
        drained = w.svc.drain_continuable_descendants([w.root])
        assert [s is not None and s.aborted for s in signals] == [True, True]
        await asyncio.wait_for(drained, BOUND)
        assert order == ["grandkid", "mid"]
        assert w.host.ctx.agents.get("root") is w.root


async def test_a_root_below_another_root_is_released_with_it() -> None:
    """DRN-2: a continuable root is kept only as a root of its own: named together with an
    ancestor root, it is that root's strict descendant and is released."""
    async with world() as w:
        mid, _ = await w.start(w.root, "mid", hold=True)
        await w.start(mid, "grandkid", hold=True)
        await asyncio.wait_for(w.svc.drain_continuable_descendants([mid, w.root]), BOUND)
        assert sorted(e.id for e in w.ends) == ["grandkid", "mid"]
        assert w.host.ctx.agents.get("root") is w.root


async def test_a_drained_root_admits_nothing_until_it_is_disposed() -> None:
    """DRN-2: after a scoped drain a follow-up from the root and a new start under it fail
    DRAINING, even with no descendant left; once the root agent is disposed a new agent with
    its id starts children again."""
    async with world() as w:
        handle = await w.host.create_agent(session_id="boss")
        boss = handle.agent
        await w.start(boss, "kid", hold=True)
        await asyncio.wait_for(w.svc.drain_continuable_descendants([boss]), BOUND)
        with pytest.raises(SubagentError) as start:
            await w.start(boss, "kid2")
        assert start.value.code == "DRAINING"
        with pytest.raises(SubagentError) as followup:
            await w.followup(boss, "kid", "more")
        assert followup.value.code == "DRAINING"
        await asyncio.wait_for(handle.dispose(), BOUND)
        again = (await w.host.resume_agent("boss")).agent
        await w.start(again, "kid3")
        await w.ended("kid3")


async def test_only_exact_live_roots_count() -> None:
    """DRN-2: a stale copy of a root is ignored: nothing is drained and the live agent with the
    same id keeps admitting work."""
    async with world() as w:
        handle = await w.host.create_agent(session_id="boss")
        stale = handle.agent
        await asyncio.wait_for(handle.dispose(), BOUND)
        boss = (await w.host.resume_agent("boss")).agent
        kid, gate = await w.start(boss, "kid", hold=True)
        await asyncio.wait_for(w.svc.drain_continuable_descendants([stale]), BOUND)
        assert kid.status == "running"
        await w.start(boss, "kid2")
        await w.ended("kid2")
        assert gate is not None
        gate.set()
        await w.ended("kid")


async def test_unrelated_forests_keep_running() -> None:
    """DRN-2: draining one root leaves another root's children running and accepting work."""
    async with world() as w:
        other = (await w.host.create_agent(session_id="other")).agent
        await w.start(w.root, "kid", hold=True)
        theirs, gate = await w.start(other, "theirs", hold=True)
        await asyncio.wait_for(w.svc.drain_continuable_descendants([w.root]), BOUND)
        assert theirs.status == "running"
        await w.followup(other, "theirs", "more")
        assert gate is not None
        gate.set()
        await w.models.requested("theirs", 2)
        end = await w.ended("theirs")
        assert end.stop_reason == "completed"


async def test_a_start_caught_mid_create_is_rolled_back() -> None:
    """DRN-2, CONT-3: a start under the root still preparing when the drain begins fails
    DRAINING and leaves no agent; the drain resolves."""
    async with world() as w:
        w.provider.gate = asyncio.Event()
        starting = asyncio.ensure_future(w.start(w.root, "kid"))
        await asyncio.wait_for(w.provider.preparing.wait(), BOUND)
        drained = w.svc.drain_continuable_descendants([w.root])
        w.provider.gate.set()
        with pytest.raises(SubagentError) as caught:
            await asyncio.wait_for(starting, BOUND)
        assert caught.value.code == "DRAINING"
        await asyncio.wait_for(drained, BOUND)
        assert w.host.ctx.agents.get("kid") is None
        assert w.ends == []


async def test_a_drain_waits_for_a_materialization_under_the_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DRN-2, CONT-3: a start admitted under the root and caught inside the child's creation
    when the drain begins is awaited by the drain: it publishes, fails its final admission
    check with DRAINING and is rolled back (no subagent/end) before the drain resolves."""
    async with world() as w:
        creating, release = asyncio.Event(), asyncio.Event()
        original = AgentRegistry.create

        async def gated(registry: AgentRegistry, options: CreateAgentOptions) -> AgentHandle:
            if options.session_id == "kid":
                creating.set()
                await release.wait()
            return await original(registry, options)

        monkeypatch.setattr(AgentRegistry, "create", gated)
        order: list[str] = []
        w.host.ctx.on("agent/disposed", lambda agent: order.append(f"disposed {agent.id}"))
        starting = asyncio.ensure_future(w.start(w.root, "kid"))
        await asyncio.wait_for(creating.wait(), BOUND)

        async def drain() -> None:
            await w.svc.drain_continuable_descendants([w.root])
            order.append("drained")

        draining = asyncio.ensure_future(drain())
        with pytest.raises(TimeoutError):  # held while the creation is: never resolves early
            await asyncio.wait_for(asyncio.shield(draining), 0.1)
        release.set()
        with pytest.raises(SubagentError) as caught:
            await asyncio.wait_for(starting, BOUND)
        assert caught.value.code == "DRAINING"
        await asyncio.wait_for(draining, BOUND)
        assert order == ["disposed kid", "drained"]
        assert w.host.ctx.agents.get("kid") is None
        assert w.ends == []


async def test_descendants_below_a_departed_one_shot_agent_are_found() -> None:
    """DRN-2: a continuable child of an intermediate (one-shot) agent that already left the
    registry is still drained with the root, through the ancestry captured when it
    materialized."""
    async with world() as w:
        mid = await w.host.create_agent(
            session_id="oneshot",
            owner=w.root.ctx,
            meta=SessionMeta(cwd=os.getcwd(), parent_session="root", origin="subagent"),
        )
        kid, _ = await w.start(mid.agent, "kid", hold=True)
        await asyncio.wait_for(mid.dispose(), BOUND)
        assert w.host.ctx.agents.get("kid") is kid
        await asyncio.wait_for(w.svc.drain_continuable_descendants([w.root]), BOUND)
        assert w.host.ctx.agents.get("kid") is None
        assert (await w.ended("kid")).stop_reason == "aborted"


async def test_concurrent_drains_of_one_root_converge() -> None:
    """DRN-2: two drains of the same root both resolve once its descendants are released, and
    each child is released once."""
    async with world() as w:
        await w.start(w.root, "a", hold=True)
        await w.start(w.root, "b", hold=True)
        first = w.svc.drain_continuable_descendants([w.root])
        second = w.svc.drain_continuable_descendants([w.root, w.root])
        await asyncio.wait_for(asyncio.gather(first, second), BOUND)
        assert sorted(e.id for e in w.ends) == ["a", "b"]
        assert w.host.ctx.agents.get("a") is None and w.host.ctx.agents.get("b") is None


def failing_handles(monkeypatch: pytest.MonkeyPatch, ids: set[str]) -> list[RuntimeError]:
    """Make the handle disposal of the agents ``ids`` fail (after releasing them)."""
    faults: list[RuntimeError] = []
    original = AgentHandle.dispose

    async def dispose(handle: AgentHandle) -> None:
        await original(handle)
        if handle.agent.id in ids:
            fault = RuntimeError(f"release of {handle.agent.id} failed")
            faults.append(fault)
            raise fault

    monkeypatch.setattr(AgentHandle, "dispose", dispose)
    return faults


async def test_a_scoped_drain_reports_every_failed_branch_after_all_settle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DRN-2, CONT-14: failing branches are aggregated into one ACTIVATION_TEARDOWN_FAILED
    naming every cause, raised only after every branch (the healthy one too) was released."""
    async with world() as w:
        for child in ("a", "b", "c"):
            await w.start(w.root, child, hold=True)
        failing_handles(monkeypatch, {"a", "c"})
        with pytest.raises(SubagentError) as caught:
            await asyncio.wait_for(w.svc.drain_continuable_descendants([w.root]), BOUND)
        assert caught.value.code == "ACTIVATION_TEARDOWN_FAILED"
        message = str(caught.value)
        assert message.startswith("continuable subagent teardown failed for 2 scoped activation(s)")
        assert "release of a failed" in message and "release of c failed" in message
        assert all(w.host.ctx.agents.get(i) is None for i in ("a", "b", "c"))
        assert sorted(e.id for e in w.ends) == ["a", "b", "c"]


# -- drain_continuable_children (DRN-3) -----------------------------------------------------------


async def test_selected_children_are_released_and_siblings_stay() -> None:
    """DRN-3, seam-continuable 13.4: only the selected children (deduplicated, absent ids
    skipped) and their descendants are released; a sibling stays resident and admission stays
    open."""
    async with world() as w:
        a, _ = await w.start(w.root, "a", hold=True)
        await w.start(a, "a-kid", hold=True)
        b, gate = await w.start(w.root, "b", hold=True)
        await asyncio.wait_for(
            w.svc.drain_continuable_children(w.root, ["a", "a", "nobody"]), BOUND
        )
        assert sorted(e.id for e in w.ends) == ["a", "a-kid"]
        assert w.host.ctx.agents.get("b") is b and b.status == "running"
        await w.start(w.root, "c")  # admission is still open
        await w.ended("c")
        assert gate is not None
        gate.set()
        await w.ended("b")


async def test_selected_release_needs_the_exact_live_direct_parent() -> None:
    """DRN-3: the parent must be the exact live agent, and every resident target its direct
    child (a grandchild is not); otherwise UNAUTHORIZED and nothing is released."""
    async with world() as w:
        handle = await w.host.create_agent(session_id="gone")
        stale = handle.agent
        await asyncio.wait_for(handle.dispose(), BOUND)
        with pytest.raises(SubagentError) as caught:
            await w.svc.drain_continuable_children(stale, ["x"])
        assert caught.value.code == "UNAUTHORIZED"
        assert str(caught.value) == "selected child teardown requires the exact live parent agent"
        mid, _ = await w.start(w.root, "mid", hold=True)
        await w.start(mid, "grandkid", hold=True)
        with pytest.raises(SubagentError) as not_direct:
            await w.svc.drain_continuable_children(w.root, ["mid", "grandkid"])
        assert not_direct.value.code == "UNAUTHORIZED"
        assert str(not_direct.value) == "subagent grandkid is not a direct child of agent root"
        assert w.ends == []
        assert w.host.ctx.agents.get("grandkid") is not None


async def test_selected_release_failures_come_after_the_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DRN-3: a failing child teardown is reported as ACTIVATION_TEARDOWN_FAILED once the child
    has been released."""
    async with world() as w:
        await w.start(w.root, "a", hold=True)
        failing_handles(monkeypatch, {"a"})
        with pytest.raises(SubagentError) as caught:
            await asyncio.wait_for(w.svc.drain_continuable_children(w.root, ["a"]), BOUND)
        assert caught.value.code == "ACTIVATION_TEARDOWN_FAILED"
        assert str(caught.value).startswith(
            "continuable subagent teardown failed for 1 selected activation(s)"
        )
        assert w.host.ctx.agents.get("a") is None


# -- without an agents service (SVC-14) -----------------------------------------------------------


async def test_without_an_agents_service_reports_fail_and_the_rest_do_nothing() -> None:
    """SVC-14: with no agents service there is no manager: report_from rejects
    CONTINUATION_UNAVAILABLE, interrupt is a silent no-op (whatever the authority) and both
    drains resolve as no-ops."""
    pm = make_plugin_manager(
        autoload=False, plugins={"core": core_plugin, "subagent": dsh_subagent.plugin}
    )
    async with (
        await boot_host(["sessions", "subagent"], pm=pm) as bare,
        world() as elsewhere,
    ):
        svc = bare.ctx[SUBAGENTS]
        stranger = elsewhere.root  # an agent of another host: nothing here can know it
        with pytest.raises(SubagentError) as caught:
            await svc.report_from(stranger, report("x"))
        assert caught.value.code == "CONTINUATION_UNAVAILABLE"
        assert svc.interrupt("kid", AncestorInterruptAuthority(agent=stranger)) is None
        assert svc.interrupt("kid", UserInterruptAuthority(parent_session_id="root")) is None
        await asyncio.wait_for(svc.drain_continuable_descendants([stranger]), BOUND)
        await asyncio.wait_for(svc.drain_continuable_children(stranger, ["kid"]), BOUND)


# -- hardening 8 and waking accounting ------------------------------------------------------------


async def test_a_caller_that_stops_waiting_never_stops_a_drain() -> None:
    """DRN-2, seam-continuable 13.4, hardening 11.8: cancelling the task awaiting a drain
    cancels only that wait: the release goes on, and awaiting the same result again sees it
    finish."""
    async with world() as w:
        await w.start(w.root, "kid", hold=True)
        release = w.svc.drain_continuable_descendants([w.root])
        inside = asyncio.Event()

        async def wait() -> None:
            inside.set()
            await release  # reached without yielding after the event is set

        waiting = asyncio.ensure_future(wait())
        await asyncio.wait_for(inside.wait(), BOUND)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.wait_for(release, BOUND)
        assert (await w.ended("kid")).stop_reason == "aborted"
        assert w.host.ctx.agents.get("kid") is None


@pytest.mark.parametrize("delivery", ["next-step", "wakeup"])
async def test_a_waking_report_keeps_a_continuable_parent_running_until_claimed(
    delivery: str,
) -> None:
    """RPT-S2, CONT-6: a waking report to a parent that is itself a resident continuable child
    is accounted as accepted work of the parent's Activation until the parent claims it."""
    async with world() as w:
        held = w.models.hold("mid")
        mid, _ = await w.start(w.root, "mid")
        await w.models.requested("mid")
        kid, gate = await w.start(mid, "kid", hold=True)
        message_id = await w.svc.report_from(kid, report("found it"), opts(delivery))
        accepted = w.svc._state.continuation.activations["mid"].accepted
        assert message_id in accepted
        held.set()
        await idle(mid)
        assert message_id not in accepted
        assert message_id in [m.id for m in user_messages(mid)]
        assert w.host.ctx.agents.get("mid") is mid  # still waiting for its child
        assert gate is not None
        gate.set()


async def test_a_scoped_drain_while_the_service_unloads_still_releases(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """DRN-2, DRN-1: a scoped drain called while the subagent service is unloading (from a
    teardown step of the service that runs before the manager's own drain) fails nothing and
    still releases the descendants."""
    with caplog.at_level(logging.WARNING):
        async with world() as w:
            await w.start(w.root, "kid", hold=True)
            root = w.root
            w.svc._state.ctx.fiber.add(lambda: w.svc.drain_continuable_descendants([root]))
        assert [e.id for e in w.ends] == ["kid"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
