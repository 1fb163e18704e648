"""The continuation manager under random operations (a hypothesis state machine).

One root parent on a JSONL store starts continuable children (and children start
grandchildren); the test follows up with them, makes them report, interrupts them, drains some,
lets their held model requests complete one child at a time, starts and disposes one-shot runs
(which may parent continuable children too), disposes and resumes the root, and restarts the
whole host on the same folder (cold resume from disk). After every step the
manager's residency bookkeeping must match the live agents, no accepted message may vanish
(only a release may discard one), and each settled epoch sends its parent one notice while the
parent still owns it; after every host unload nothing may be left: no agent, task, Activation or
open file (CONT-4..16, SET-1, RPT-S1..3, INT-1/2, DRN-1, DRN-3; issue 13 "Tests").

Each step ends once the host is quiet: every host task done, and every live agent idle or held
in a model request the test has not released. The state a step leaves is then the same however
the persistence threads were scheduled, so hypothesis replays an example exactly.

What it reads of the manager's private state (by name): ``SubagentState.continuation``, the
``ContinuationManager``; its ``activations`` (child id -> resident Activation) and ``retiring``;
of each Activation ``handle`` (its ``agent``), ``owned_children`` (ids), ``accepted`` (ids),
``closing`` (disposal began) and ``in_ancestry(agent)``, and ``residency()`` of
``dsh_subagent._continuation``. Of the host: ``Host.tasks``.

Run it longer with ``nox -s continuable_machine``; ``DSH_CONTINUABLE_EXAMPLES`` and
``DSH_CONTINUABLE_STEPS`` set the size (by default 200 examples of up to 16 steps).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections import Counter
from collections.abc import Awaitable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import dsh_subagent.plugin
from dsh_core import Agent, AgentHandle, Context, Message, PluginSpec, text_blocks
from dsh_core.testing import ScriptedReply, ScriptedRequest, TestHost
from dsh_subagent import (
    SUBAGENTS,
    AncestorInterruptAuthority,
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ContinuableStartSpec,
    CoordinatorMessageSource,
    SubagentError,
    SubagentFollowupOptions,
    SubagentReportOptions,
    SubagentRun,
    SubagentRunEndInfo,
    SubagentSettledMessageSource,
    SubagentStartRequest,
    UserInterruptAuthority,
)
from dsh_subagent._continuation import residency
from dsh_subagent.in_process import (
    IN_PROCESS_CAPABILITIES,
    completed_turn_prefix,
    start_in_process_run,
)

T = TypeVar("T")


ROOT = "machine-root"
#: Every await of the machine is bounded by this (seconds); nothing here should take long.
BOUND = 10
EXAMPLES = int(os.environ.get("DSH_CONTINUABLE_EXAMPLES", "200"))
STEPS = int(os.environ.get("DSH_CONTINUABLE_STEPS", "16"))
#: Room in the run tree for every child a run of the machine can start (its cap is tested
#: on its own, in test_limits.py).
MACHINE_TREE_CAP = 10_000
#: The stores live in memory-backed files where there are some: every flush ends in an fsync.
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
#: Refusals a step may meet by the documented rules (CONT-1, CONT-13, DRN-1..3, RPT-S1).
DOCUMENTED = frozenset({"ACTIVATION_CLOSING", "DRAINING", "PARENT_UNAVAILABLE", "DUPLICATE_CHILD"})

pytestmark = pytest.mark.skipif(
    not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc/self/fd"
)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class FreshProvider:
    """A provider of fresh in-process children (what ``spawn`` is; this distribution's tests
    do not depend on it)."""

    name = "fresh"
    capabilities = IN_PROCESS_CAPABILITIES
    inherits_parent_context = False
    start = staticmethod(start_in_process_run)

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        return ContinuableCreateSpec()


class SeededProvider(FreshProvider):
    """A provider of children seeded with their parent's completed turns (what ``fork`` is):
    a grandchild's seed holds its parent's descriptor, which its own must win over (DSC-3)."""

    name = "seeded"
    inherits_parent_context = True

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        return ContinuableCreateSpec(seed=completed_turn_prefix(request.parent))


def _register(ctx: Context, _: None) -> None:
    ctx.subagents.register_provider(FreshProvider())
    ctx.subagents.register_provider(SeededProvider())


PROVIDERS = PluginSpec(name="subagent-machine", apply=_register, requires=("subagents",))


async def _first(*waits: Awaitable[Any]) -> None:
    """Wait until the first of ``waits`` is done; cancel the others."""
    futures = {asyncio.ensure_future(w) for w in waits}
    _, pending = await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    for f in pending:
        f.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


class ContinuableMachine(RuleBasedStateMachine):
    """start_continuable / followup / report_from / interrupt / drain_continuable_children /
    a child turn completing / one-shot runs / root disposal / process restart, with invariants
    after each."""

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.tmp = tempfile.TemporaryDirectory(prefix="dsh-machine-", dir=SCRATCH)
        self.folder = Path(self.tmp.name)
        # every child ever started, in start order, and its durable parent's id
        self.children: list[str] = []
        self.parents: dict[str, str] = {}
        self.providers: dict[str, str] = {}
        # one-shot runs started under the root, live until the test disposes them
        self.runs: dict[str, SubagentRun] = {}
        # the model requests the test holds, by session id: gates to open, and the waits on
        # them still running (an aborted request cancels its wait: it ends a turn later)
        self.gates: dict[str, list[asyncio.Event]] = {}
        self.waiting: dict[str, dict[asyncio.Task[Any], tuple[asyncio.Event, Any]]] = {}
        self.asked: dict[str, asyncio.Event] = {}
        # every message id that entered an inbox (and whose), and what became of it
        self.inserted: dict[str, str] = {}
        self.claimed: set[str] = set()
        self.discarded: set[str] = set()
        # settlement notices (SET-1): by sender; epochs ended, and those whose parent was live
        self.noticed: Counter[str] = Counter()
        self.ended: Counter[str] = Counter()
        self.live_ends: Counter[str] = Counter()
        # what the listeners saw that no rule allows (asserted by the invariants)
        self.violations: list[str] = []
        self.refusals = 0
        # a step that releases agents (a drain, the root's disposal, the host's unload) may
        # discard their pending input (CONT-14 step 1, SET-4); no other step may
        self.releasing = False
        self.undocumented: list[str] = []
        self.sent = 0
        self.runner.get_loop()  # the loop's own files (selector, self-pipe) are the baseline
        self.baseline_fds = _open_fds()
        self.host: TestHost | None = None
        self.root: Agent | None = None
        self.root_handle: AgentHandle | None = None
        self.boot()

    # -- plumbing --------------------------------------------------------------------------------

    def run(self, aw: Coroutine[Any, Any, T]) -> T:
        """Run ``aw`` on this example's loop, then until the host is quiet; all bounded."""

        async def bounded() -> T:
            async with asyncio.timeout(BOUND):
                try:
                    return await aw
                finally:
                    await self.quiesce()

        return self.runner.run(bounded())

    async def quiesce(self) -> None:
        """Until nothing moves: every host task done (settlements, disposals), every live
        agent idle or held in a model request the test holds."""
        host = self.host
        while host is not None:
            moved = False
            tasks = [t for t in host.ctx.host.tasks if not t.done()]
            for session_id in self.waiting:
                tasks += self.ending(session_id)
            if tasks:
                await asyncio.wait(tasks)
                moved = True
            for agent in host.ctx.agents.list():
                if agent.status == "running" and not self.holds(agent.id):
                    asked = self.asked[agent.id] = asyncio.Event()
                    await _first(agent.when_idle(), asked.wait())
                    moved = True
            if not moved:
                return

    def held(self, task: asyncio.Task[Any], session_id: str) -> bool:
        """Whether this wait holds a model request: its gate closed, its request not aborted
        (an abort cancels the wait a loop turn later), its agent still running."""
        assert self.host is not None
        agent = self.host.ctx.agents.get(session_id)
        if agent is None or agent.status != "running":
            return False
        gate, signal = self.waiting[session_id][task]
        aborted = signal is not None and signal.aborted
        return not (task.done() or task.cancelling() or gate.is_set() or aborted)

    def holds(self, session_id: str) -> int:
        """How many of ``session_id``'s model requests are held."""
        waits = self.waiting.get(session_id, {})
        return sum(1 for task in waits if self.held(task, session_id))

    def ending(self, session_id: str) -> list[asyncio.Task[Any]]:
        """``session_id``'s waits that are released or aborted but not yet finished."""
        waits = self.waiting.get(session_id, {})
        return [task for task in waits if not self.held(task, session_id)]

    def boot(self) -> None:
        """A host on the JSONL folder; the root parent created (first boot) or resumed."""

        async def start() -> None:
            host = self.host = await TestHost.start(
                "subagent",
                "subagent-machine",
                model=self.script,
                store="jsonl",
                store_root=self.folder,
                modules={"subagent": dsh_subagent.plugin},
                extra=[PROVIDERS],
                # The machine is about continuation, not the run tree's cap (test_limits.py):
                # a long run may hold more children at once than the default 32.
                config={"subagent": {"max_running_children_per_tree": MACHINE_TREE_CAP}},
            )
            host.ctx.on("agent/inbox/inserted", self.on_inserted)
            host.ctx.on("agent/inbox/claimed", self.on_claimed)
            host.ctx.on("agent/inbox/discarded", self.on_discarded)
            host.ctx.on("subagent/end", self.on_end)
            self.manager = host.ctx[SUBAGENTS]._state.continuation
            self.agents = host.ctx.agents
            await self.open_root()

        self.run(start())

    async def open_root(self) -> None:
        host = self.host
        assert host is not None
        if self.root_handle is None:
            self.root_handle = await host.create_agent(session_id=ROOT)
        else:
            self.root_handle = await host.resume_agent(ROOT)
        self.root = self.root_handle.agent

    def on_inserted(self, agent: Agent, message: Message) -> None:
        self.inserted[message.id] = agent.id
        source = message.source
        if isinstance(source, SubagentSettledMessageSource):
            sender = source.sender_session_id
            self.noticed[sender] += 1
            owner = self.manager.activations.get(agent.id)
            if owner is not None and sender not in owner.owned_children:
                self.violations.append(f"{sender}'s notice reached {agent.id} after release")

    def on_end(self, info: SubagentRunEndInfo) -> None:
        self.ended[info.id] += 1
        provider = self.providers.get(info.id)
        if provider is not None and info.provider != provider:  # CONT-10, DSC-3
            self.violations.append(f"{info.id}'s epoch names {info.provider}, not {provider}")
        parent_id = self.parents.get(info.id)
        if parent_id is not None and self.agents.get(parent_id) is not None:
            self.live_ends[info.id] += 1

    def on_claimed(self, agent: Agent, message: Message, turn: int) -> None:
        self.claimed.add(message.id)

    def on_discarded(self, agent: Agent, message: Message) -> None:
        self.discarded.add(message.id)
        if not self.releasing:  # CONT-14 step 1: only a release clears an inbox
            self.undocumented.append(f"{message.id} discarded from {agent.id}")

    def script(self, request: ScriptedRequest) -> ScriptedReply | str:
        """The root answers at once; a child's request is held until the test releases it."""
        session_id = request.session_id
        if session_id == ROOT:
            return "noted"
        gate = asyncio.Event()
        self.gates.setdefault(session_id, []).append(gate)

        async def hold() -> None:
            task = asyncio.current_task()
            assert task is not None
            waits = self.waiting.setdefault(session_id, {})
            waits[task] = (gate, request.options.signal)
            asked = self.asked.get(session_id)
            if asked is not None:
                asked.set()
            try:
                await gate.wait()
            finally:
                del waits[task]

        return ScriptedReply(text=f"answer {request.index}", wait=hold)

    def activations(self) -> dict[str, Any]:
        assert self.host is not None
        return dict(self.host.ctx[SUBAGENTS]._state.continuation.activations)

    def live(self, agent_id: str) -> Agent | None:
        assert self.host is not None
        agent: Agent | None = self.host.ctx.agents.get(agent_id)
        return agent

    def resident(self) -> list[str]:
        """Children with an Activation that is not closing, in start order."""
        activations = self.activations()
        return [c for c in self.children if c in activations and not activations[c].closing]

    def parent_of(self, child_id: str) -> Agent | None:
        return self.live(self.parents[child_id])

    def accepted(self, message_id: str, target: str) -> None:
        """A returned message id was accepted into ``target``'s inbox (CONT-2, CONT-5)."""
        assert self.inserted.get(message_id) == target, (message_id, target)

    def refused(self, error: SubagentError, *, duplicate: bool = False) -> None:
        """A refusal is one the contract documents (a taken id: DUPLICATE_CHILD, CONT-1)."""
        event(f"refused {error.code}")
        self.refusals += 1  # a call refused after publication rolls back: no notice (SET-1)
        assert error.code in DOCUMENTED, error
        if duplicate:  # CONT-1: only admission (step 1) is checked before the id (step 4)
            assert error.code in {"DUPLICATE_CHILD", "DRAINING"}, error

    # -- rules -----------------------------------------------------------------------------------

    @precondition(lambda self: self.root is not None)
    @rule(
        pick=st.integers(0, 7),
        reserve=st.sampled_from(["fresh", "named", "fresh", "taken"]),
        provider=st.sampled_from(["fresh", "seeded"]),
    )
    def start(self, pick: int, reserve: str, provider: str) -> None:
        """CONT-1/2/13: start a child under the root or a resident child."""
        assert self.root is not None
        candidates = [self.root, *filter(None, map(self.live, self.resident()))]
        candidates += [run.local_agent for run in self.runs.values() if run.local_agent]
        parent = candidates[pick % len(candidates)]
        self.sent += 1
        child_id: str | None = None
        if reserve == "named":
            child_id = f"child-{self.sent}"
        elif reserve == "taken":  # a known child (live or stored), else the parent's own id
            child_id = self.children[pick % len(self.children)] if self.children else parent.id
        spec = ContinuableStartSpec(
            provider=provider,
            label=f"job {self.sent}",
            prompt=text_blocks(f"task {self.sent}"),
            parent=parent,
            child_id=child_id,
        )
        try:
            started = self.run(parent.ctx[SUBAGENTS].start_continuable(spec))
        except SubagentError as error:
            self.refused(error, duplicate=reserve == "taken")
            return
        assert reserve != "taken", "a live, stored or the parent's own id must be refused"
        assert child_id in {None, started.child_id}
        assert started.child_id not in self.parents
        event("started under a child" if parent is not self.root else "started under the root")
        self.children.append(started.child_id)
        self.parents[started.child_id] = parent.id
        self.providers[started.child_id] = provider
        self.accepted(started.message_id, started.child_id)

    @precondition(lambda self: self.children)
    @rule(pick=st.integers(0, 63))
    def followup(self, pick: int) -> None:
        """CONT-7/8/10: follow up with any child ever started: resident, settled or on disk."""
        child_id = self.children[pick % len(self.children)]
        parent = self.parent_of(child_id)
        if parent is None:
            event("followup: parent not live")
            return
        self.sent += 1
        activation = self.activations().get(child_id)
        event("followup: cold" if activation is None else f"followup: {residency(activation)}")
        options = SubagentFollowupOptions(
            source=CoordinatorMessageSource(sender_session_id=parent.id)
        )
        content = text_blocks(f"more {self.sent}")
        try:
            message_id = self.run(
                parent.ctx[SUBAGENTS].followup(parent, child_id, content, options)
            )
        except SubagentError as error:
            self.refused(error)
            return
        self.accepted(message_id, child_id)

    @precondition(lambda self: self.children)
    @rule(pick=st.integers(0, 63))
    def followup_as_it_settles(self, pick: int) -> None:
        """CONT-7: a child's held requests complete and, the moment it goes idle (its
        disposal just opened), its parent follows up: the message waits for the disposal and
        lands in a new epoch, never in the handle being torn down."""
        held = [c for c in self.children if self.holds(c)]
        if not held:
            return
        child_id = held[pick % len(held)]
        child, parent = self.live(child_id), self.parent_of(child_id)
        if child is None or parent is None:
            return
        gates, self.gates[child_id] = self.gates.get(child_id, []), []
        self.sent += 1
        options = SubagentFollowupOptions(
            source=CoordinatorMessageSource(sender_session_id=parent.id)
        )
        content = text_blocks(f"right after {self.sent}")
        asked = self.asked[child_id] = asyncio.Event()

        async def race() -> str:
            for gate in gates:
                gate.set()
            await _first(child.when_idle(), asked.wait())
            activation = self.activations().get(child_id)
            closing = activation is not None and activation.closing
            event("followup as it settles: " + ("closing" if closing else "not settling"))
            message_id: str = await parent.ctx[SUBAGENTS].followup(
                parent, child_id, content, options
            )
            return message_id

        try:
            message_id = self.run(race())
        except SubagentError as error:
            self.refused(error)
            return
        self.accepted(message_id, child_id)

    @precondition(lambda self: self.children and self.root is not None)
    @rule(pick=st.integers(0, 63))
    def followup_from_a_stranger(self, pick: int) -> None:
        """CONT-8: only the exact live direct parent may follow up; nothing is delivered."""
        assert self.root is not None
        grandchildren = [c for c in self.children if self.parents[c] != ROOT]
        if not grandchildren:
            return
        child_id = grandchildren[pick % len(grandchildren)]
        before = sum(1 for target in self.inserted.values() if target == child_id)
        options = SubagentFollowupOptions(source=CoordinatorMessageSource(sender_session_id=ROOT))
        service = self.root.ctx[SUBAGENTS]
        with pytest.raises(SubagentError) as caught:
            self.run(service.followup(self.root, child_id, text_blocks("not yours"), options))
        assert caught.value.code == "UNAUTHORIZED"
        assert sum(1 for target in self.inserted.values() if target == child_id) == before

    @precondition(lambda self: self.children)
    @rule(pick=st.integers(0, 63), delivery=st.sampled_from(["quiet", "wakeup", "next-step"]))
    def report(self, pick: int, delivery: Any) -> None:
        """RPT-S1..3: a resident child reports one edge up; the id lands in the parent's inbox."""
        resident = self.resident()
        if not resident:
            return
        child_id = resident[pick % len(resident)]
        child = self.live(child_id)
        assert child is not None
        self.sent += 1
        content = text_blocks(f"progress {self.sent}")
        options = SubagentReportOptions(delivery=delivery)
        try:
            message_id = self.run(child.ctx[SUBAGENTS].report_from(child, content, options))
        except SubagentError as error:
            self.refused(error)
            return
        event(f"reported ({delivery})")
        self.accepted(message_id, self.parents[child_id])

    @precondition(lambda self: self.children)
    @rule(pick=st.integers(0, 63), by=st.sampled_from(["user", "ancestor"]))
    def interrupt(self, pick: int, by: str) -> None:
        """INT-1/2: interrupting a child (resident or not) by its direct parent is synchronous
        and refused only for an ancestor the child was not materialized under."""
        child_id = self.children[pick % len(self.children)]
        parent = self.parent_of(child_id)
        if parent is None:
            return
        authority: Any
        if by == "user":
            authority = UserInterruptAuthority(parent_session_id=parent.id)
        else:
            authority = AncestorInterruptAuthority(agent=parent)

        activation = self.activations().get(child_id)
        # INT-1: an ancestor must be in the target's materialization-time ancestry (a root
        # resumed since is another object); an absent target is a no-op for anyone
        stranger = by == "ancestor" and activation is not None
        stranger = stranger and not activation.in_ancestry(parent)

        async def inside() -> None:
            parent.ctx[SUBAGENTS].interrupt(child_id, authority)

        if stranger:
            with pytest.raises(SubagentError) as caught:
                self.run(inside())
            assert caught.value.code == "UNAUTHORIZED"
            event("interrupt: ancestor replaced since materialization")
            return
        event("interrupt: absent (a no-op)" if activation is None else "interrupt: resident")
        self.run(inside())

    @precondition(lambda self: self.children)
    @rule(pick=st.integers(0, 63), how_many=st.integers(1, 3))
    def drain_children(self, pick: int, how_many: int) -> None:
        """DRN-3: a parent releases some of its resident children (and their descendants)."""
        resident = self.resident()
        if not resident:
            return
        parent = self.parent_of(resident[pick % len(resident)])
        if parent is None:
            return
        mine = [c for c in resident if self.parents[c] == parent.id]
        chosen = [mine[(pick + i) % len(mine)] for i in range(how_many)]
        activations = self.activations()
        # DRN-3: the parent must be in each target's materialization-time ancestry; a root
        # resumed since (a new object under the same id) is not
        stranger = not all(activations[c].in_ancestry(parent) for c in chosen)
        try:
            self.releasing = True
            self.run(parent.ctx[SUBAGENTS].drain_continuable_children(parent, chosen))
        except SubagentError as error:
            if stranger and error.code == "UNAUTHORIZED":
                event("drain: parent replaced since materialization")
                return
            self.refused(error)
            return
        finally:
            self.releasing = False
        assert not stranger, "DRN-3: a parent not in the target's ancestry must be refused"
        activations = self.activations()
        assert not any(c in activations for c in chosen)
        event("drained children")

    @precondition(lambda self: self.children)
    @rule(pick=st.integers(0, 63), owner=st.booleans())
    def release(self, pick: int, owner: bool) -> None:
        """A child's held model requests complete (its turn goes on or ends); ``owner`` picks
        among children that own resident children, which then wait (CONT-6, CONT-13)."""
        held = [c for c in self.children if self.holds(c)]
        if owner:
            activations = self.activations()
            held = [c for c in held if c in activations and activations[c].owned_children]
        if not held:
            return
        child_id = held[pick % len(held)]
        gates, self.gates[child_id] = self.gates.get(child_id, []), []

        async def release() -> None:
            for gate in gates:
                gate.set()

        self.run(release())

    @precondition(lambda self: self.root is not None)
    @rule()
    def one_shot(self) -> None:
        """A one-shot run under the root (a live child agent with a run, no Activation); it
        can parent continuable children of its own (DRN-2's intermediate one-shot agent)."""
        assert self.root is not None
        self.sent += 1
        request = SubagentStartRequest(
            prompt=text_blocks(f"one-shot {self.sent}"), parent=self.root, label="one-shot"
        )
        run = self.run(self.root.ctx[SUBAGENTS].start("fresh", request))
        self.runs[run.id] = run

    @precondition(lambda self: self.runs)
    @rule(pick=st.integers(0, 63))
    def dispose_run(self, pick: int) -> None:
        """A one-shot run is disposed (its continuable children keep going, parentless)."""
        run_id = list(self.runs)[pick % len(self.runs)]
        run = self.runs.pop(run_id)
        self.releasing = True
        try:
            self.run(run.dispose())
        finally:
            self.releasing = False
        assert self.live(run_id) is None

    @precondition(lambda self: self.root is not None)
    @rule()
    def dispose_root(self) -> None:
        """The root parent goes away: its children's notices are dropped (SET-1)."""
        assert self.root_handle is not None
        self.releasing = True
        try:
            self.run(self.root_handle.dispose())
        finally:
            self.releasing = False
        self.root = None

    @precondition(lambda self: self.root is None)
    @rule()
    def resume_root(self) -> None:
        """The root comes back from the store under the same id."""
        self.run(self.open_root())

    @rule()
    def restart(self) -> None:
        """The process restarts: the host unloads (manager-wide drain, DRN-1) and a new one
        opens the same JSONL folder; follow-ups then cold-resume children (CONT-10)."""
        self.close_host()
        self.boot()

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def every_activation_has_a_live_handle(self) -> None:
        """CONT-4/14: an Activation holds the live agent of its child (none is mid-disposal
        once the host is quiet), and none is left retiring."""
        assert self.host is not None
        manager = self.host.ctx[SUBAGENTS]._state.continuation
        assert not manager.retiring
        for child_id, activation in manager.activations.items():
            assert not activation.closing, child_id
            assert activation.handle.agent is self.live(child_id), child_id

    @invariant()
    def every_live_child_has_an_activation(self) -> None:
        """CONT-4/12: no live child agent without an Activation or a run."""
        assert self.host is not None
        activations = self.activations()
        for agent in self.host.ctx.agents.list():
            if agent.id != ROOT and agent.id not in self.runs:
                assert agent.id in activations, agent.id

    @invariant()
    def every_owned_child_is_resident(self) -> None:
        """CONT-13/14: a parent's owned children are resident children of that parent."""
        assert self.host is not None
        activations = self.activations()
        for parent_id, activation in activations.items():
            for child_id in activation.owned_children:
                assert child_id in activations, (parent_id, child_id)
                assert self.parents[child_id] == parent_id

    @invariant()
    def settled_children_are_not_resident(self) -> None:
        """CONT-5/6: once the host is quiet an Activation is running (its agent runs or holds
        unclaimed accepted messages, each still pending in its inbox) or waiting on owned
        children; never settled."""
        for child_id, activation in self.activations().items():
            assert residency(activation) != "settled", child_id
            inbox = activation.handle.agent.inbox
            assert all(map(inbox.contains, activation.accepted)), child_id  # CONT-5

    @invariant()
    def one_notice_per_settled_epoch(self) -> None:
        """SET-1: at most one settlement notice per epoch, each delivered while the parent
        still owns the child; every epoch that ended with its parent live sent one (but for
        materializations rolled back by a refused call). CONT-10, DSC-3: every epoch, resumed
        ones too, names the provider its child was started with."""
        assert not self.violations, self.violations
        for child_id, count in self.noticed.items():
            assert count <= self.ended[child_id], child_id
        missing = sum(max(0, n - self.noticed[c]) for c, n in self.live_ends.items())
        assert missing <= self.refusals, (dict(self.live_ends), dict(self.noticed))

    @invariant()
    def no_accepted_message_is_lost(self) -> None:
        """CONT-5/7/16, INT-2: every accepted id is claimed, discarded by a release (a drain,
        a disposal, an unload), or still pending in the inbox of its live agent: a settlement
        or an interrupt never drops queued input."""
        assert not self.undocumented, self.undocumented
        for message_id, agent_id in self.inserted.items():
            if message_id in self.claimed or message_id in self.discarded:
                continue
            agent = self.live(agent_id) if self.host is not None else None
            assert agent is not None, f"{message_id} to {agent_id} vanished"
            assert agent.inbox.contains(message_id), f"{message_id} vanished from {agent_id}"

    # -- unloading the host ----------------------------------------------------------------------

    def close_host(self) -> None:
        """Unload the host (the manager drains, DRN-1) and prove nothing is left behind."""
        host, self.host = self.host, None
        self.root = None
        self.runs.clear()  # the registry disposes their agents with the host
        assert host is not None
        manager = host.ctx[SUBAGENTS]._state.continuation
        agents = host.ctx.agents  # the registry's view outlives the service's withdrawal
        self.releasing = True
        try:
            self.run(host.aclose())
        finally:
            self.releasing = False
        assert not manager.activations
        assert not manager.retiring
        assert not agents.list()

        async def others() -> set[asyncio.Task[Any]]:
            return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]

        assert not self.run(others())
        assert _open_fds() == self.baseline_fds
        self.no_accepted_message_is_lost()
        self.gates.clear()
        self.waiting.clear()

    def teardown(self) -> None:
        try:
            if self.host is not None:
                self.close_host()
        finally:
            self.runner.close()
            self.tmp.cleanup()


ContinuableMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None
)
TestContinuableMachine = ContinuableMachine.TestCase

#: The slow tier's size (``nox -s thorough``): many more and longer runs of the same machine.
THOROUGH_EXAMPLES = int(os.environ.get("DSH_CONTINUABLE_THOROUGH_EXAMPLES", "1000"))
THOROUGH_STEPS = int(os.environ.get("DSH_CONTINUABLE_THOROUGH_STEPS", "40"))


@pytest.mark.thorough
class TestContinuableMachineLonger(ContinuableMachine.TestCase):  # type: ignore[misc,valid-type]
    """CONT-4..16, SET-1, RPT-S1..3, INT-1/2, DRN-1, DRN-3 (slow tier): the same state
    machine, ``THOROUGH_EXAMPLES`` runs of up to ``THOROUGH_STEPS`` steps."""

    settings = settings(
        max_examples=THOROUGH_EXAMPLES, stateful_step_count=THOROUGH_STEPS, deadline=None
    )
