"""Continuable children through ``SubagentService``: start, residency, follow-ups, cold resume,
settlement notices and the manager-wide drain (CONT-1..17, SET-1..4, DRN-1, DSC-5).

The set-up: a host with ``subagent``, a test provider that can create continuable children
(``seeded`` gives them the parent's completed turns), a root parent agent, and a recorder of
the seam's events.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

import dsh_subagent.plugin
from dsh_core import (
    AbortController,
    AbortedError,
    Agent,
    AgentHandle,
    AgentOptions,
    ConsumedWork,
    Context,
    LlmFailure,
    Message,
    PreStep,
    PreStepDecision,
    SessionError,
    SessionMeta,
    ToolDefinition,
    ToolRestriction,
    ToolRunContext,
    TurnEndData,
    TurnEndReason,
    blocks_text,
    text_blocks,
    thaw_json,
    user_message,
)
from dsh_core.testing import (
    ScriptedReply,
    ScriptedRequest,
    TestHost,
    default_options,
    scripted_host,
)
from dsh_subagent import (
    DESCRIPTOR_EVENT,
    SUBAGENT_DEPTH_KEY,
    SUBAGENTS,
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ContinuableStart,
    ContinuableStartSpec,
    CoordinatorMessageSource,
    DescriptorError,
    InvalidMaxDepthError,
    ResolvedSubagentStartRequest,
    SubagentCapabilities,
    SubagentDepthError,
    SubagentError,
    SubagentFollowupOptions,
    SubagentReportOptions,
    SubagentRun,
    SubagentService,
    SubagentStartRequest,
    UserInterruptAuthority,
    delegation_depth_of,
    descriptor_payload,
    fold_descriptor,
    snapshot_continuable_descriptor,
)
from dsh_subagent._continuation import ContinuationManager, residency
from dsh_subagent._output import continuable_stop_reason
from dsh_subagent.in_process import (
    DELEGATION_STATEMENT,
    completed_turn_prefix,
    start_in_process_run,
)

Script = Callable[[ScriptedRequest], "ScriptedReply | str | Awaitable[ScriptedReply | str]"]
ALL = SubagentCapabilities(output_schema=True, depth_limit=True, tool_filter=True, persona=True)
WATCHED = (
    "session/created",
    "agent/created",
    "agent/disposed",
    "agent/status",
    "agent/inbox/inserted",
    "agent/inbox/claimed",
    "subagent/start",
    "subagent/end",
)


@attrs.frozen
class LocalProvider:
    """A test provider: ``seeded`` gives continuable children the parent's completed turns."""

    name: str = "local"
    capabilities: SubagentCapabilities = ALL
    inherits_parent_context: bool = False
    seeded: bool = False
    prepared: list[ContinuableCreateRequest] = attrs.field(factory=list, eq=False)

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        seed = completed_turn_prefix(request.parent) if self.seeded else None
        return await start_in_process_run(request, seed=seed)

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        self.prepared.append(request)
        seed = completed_turn_prefix(request.parent) if self.seeded else None
        return ContinuableCreateSpec(seed=seed)


def echo(request: ScriptedRequest) -> str:
    return "answer: " + request.last_user_text


class Model:
    """The scripted model of these tests: ``hold ...`` prompts wait for their gate (opened by
    ``release``), ``fail ...`` prompts fail the request, anything else is echoed. Every
    request sets ``changed`` (so ``Booted.until`` re-checks)."""

    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self.gates: dict[str, asyncio.Event] = {}
        self.requests: list[ScriptedRequest] = []

    def release(self, text: str) -> None:
        self.gates.setdefault(text, asyncio.Event()).set()

    def held(self, session_id: str) -> bool:
        return any(
            r.session_id == session_id and r.last_user_text.startswith("hold")
            for r in self.requests
        )

    def __call__(self, request: ScriptedRequest) -> ScriptedReply | str:
        self.requests.append(request)
        self.changed.set()
        text = request.last_user_text
        if text.startswith("hold"):
            gate = self.gates.setdefault(text, asyncio.Event())
            return ScriptedReply(text="held: " + text, wait=gate.wait)
        if text.startswith("fail"):
            return ScriptedReply(failure=LlmFailure(message="model failed", code="BOOM"))
        return "answer: " + text


@attrs.define
class Booted:
    host: TestHost
    parent: Agent
    provider_owner: Context
    events: list[tuple[str, Any]]
    changed: asyncio.Event

    @property
    def svc(self) -> SubagentService:
        return self.parent.ctx[SUBAGENTS]

    @property
    def manager(self) -> ContinuationManager:
        manager: ContinuationManager = self.host.ctx[SUBAGENTS]._state.continuation
        return manager

    def spec(self, prompt: str = "child: hello", **changes: Any) -> ContinuableStartSpec:
        fields: dict[str, Any] = {
            "provider": "local",
            "label": "helper",
            "prompt": text_blocks(prompt),
            "parent": self.parent,
            "signal": AbortController().signal,
        }
        fields.update(changes)
        return ContinuableStartSpec(**fields)

    async def start(self, prompt: str = "child: hello", **changes: Any) -> ContinuableStart:
        return await self.svc.start_continuable(self.spec(prompt, **changes))

    async def send(
        self, child_id: str, text: str, *, parent: Agent | None = None, **changes: Any
    ) -> str:
        sender = parent or self.parent
        options = SubagentFollowupOptions(
            source=CoordinatorMessageSource(sender_session_id=sender.id), **changes
        )
        return await self.svc.followup(sender, child_id, text_blocks(text), options)

    def named(self, *names: str) -> list[tuple[str, Any]]:
        return [e for e in self.events if e[0] in names]

    async def until(self, check: Callable[[], bool]) -> None:
        """Wait (bounded) until ``check()`` holds; re-checked whenever a watched event fires
        or a task finishes its step."""
        async with asyncio.timeout(5):
            while not check():
                self.changed.clear()
                waiter = asyncio.ensure_future(self.changed.wait())
                try:
                    await asyncio.wait(
                        [waiter, *[t for t in self.host.ctx.host.tasks if not t.done()]],
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    waiter.cancel()

    async def settled(self, child_id: str) -> None:
        """Wait until ``child_id`` has no Activation and its epoch ended."""
        manager = self.manager
        await self.until(
            lambda: child_id not in manager.activations and child_id not in manager.retiring
        )

    def ends(self) -> list[Any]:
        return [args[0] for _, args in self.named("subagent/end")]

    def inbox_of(self, agent: Agent) -> list[Message]:
        return [*agent.inbox.next_step, *agent.inbox.next_turn]


@contextlib.asynccontextmanager
async def boot(
    model: Script = echo,
    *,
    seeded: bool = False,
    store: Any = "memory",
    store_root: Path | None = None,
    parent_options: AgentOptions | None = None,
    parent_id: str | None = None,
    tree_cap: int | None = None,
) -> AsyncIterator[Booted]:
    """A host with ``subagent`` (``tree_cap``: its ``max_running_children_per_tree``), the
    local provider and a root parent agent."""
    config = {} if tree_cap is None else {"subagent": {"max_running_children_per_tree": tree_cap}}
    async with scripted_host(
        "subagent",
        model=model,
        modules={"subagent": dsh_subagent.plugin},
        store=store,
        store_root=store_root,
        config=config,
    ) as host:
        owner = host.ctx.plugin("local-provider")
        owner[SUBAGENTS].register_provider(LocalProvider(seeded=seeded))
        parent = (
            await host.create_agent(
                options=parent_options or default_options(), session_id=parent_id
            )
        ).agent
        events: list[tuple[str, Any]] = []
        changed = model.changed if isinstance(model, Model) else asyncio.Event()

        def record(name: str) -> Callable[..., None]:
            def on(*args: Any) -> None:
                events.append((name, args))
                changed.set()

            return on

        for name in WATCHED:
            host.ctx.on(name, record(name))
        yield Booted(host=host, parent=parent, provider_owner=owner, events=events, changed=changed)


def _turn_start(seq: int, *, turn: int) -> Any:
    from dsh_core import SessionEvent, TurnStartData

    return SessionEvent(type="turn/start", seq=seq, time=0, data=TurnStartData(turn=turn))


def look_tool(name: str = "look") -> ToolDefinition:
    async def run(arguments: Any, ctx: ToolRunContext) -> str:
        return "looked"

    return ToolDefinition(name=name, description="Look around.", execute=run)


def texts(message: Message) -> list[str]:
    return [getattr(b, "text", "") for b in message.content]


# -- CONT-1, CONT-2: start ----------------------------------------------------------------------


async def test_start_resolves_at_inbox_acceptance() -> None:
    """CONT-2: start_continuable resolves with {child_id, message_id} once the prompt is
    accepted into the child's inbox, before any model request for it."""
    async with boot() as b:
        requests_before = len(b.host.model.requests)
        started = await b.start()
        manager = b.manager
        act = manager.activations[started.child_id]
        child = act.agent
        assert b.host.ctx.agents.get(started.child_id) is child
        inserted = [args for name, args in b.named("agent/inbox/inserted") if args[0] is child]
        assert [m.id for _, m in inserted] == [started.message_id]
        assert len(b.host.model.requests) == requests_before
        assert child.session.header.parent_session == b.parent.id
        await b.settled(started.child_id)
        assert b.host.ctx.agents.get(started.child_id) is None


async def test_settled_child_notifies_parent_and_cold_resumes() -> None:
    """SET-1, SET-2, CONT-10: a settled child notifies its idle parent with one follow-up turn
    and a later follow-up cold-resumes it as a new epoch."""
    async with boot() as b:
        started = await b.start()
        await b.settled(started.child_id)
        await b.parent.when_idle()
        notices = [
            m
            for m in b.parent.session.derive_messages()
            if getattr(m.source, "kind", None) == "subagent-settled"
        ]
        assert len(notices) == 1
        assert texts(notices[0]) == [
            f"Background subagent {started.child_id} finished and will do no further work "
            "unless you send it more.",
            "Its closing message:",
            "answer: child: hello",
        ]
        message_id = await b.send(started.child_id, "again")
        assert message_id
        await b.settled(started.child_id)
        ends = b.ends()
        assert [e.stop_reason for e in ends] == ["completed", "completed"]
        assert ends[0].run_id != ends[1].run_id


def notices_of(agent: Agent) -> list[Message]:
    """The settlement notices ``agent``'s model has seen."""
    return [
        m
        for m in agent.session.derive_messages()
        if getattr(m.source, "kind", None) == "subagent-settled"
    ]


def live(b: Booted, child_id: str) -> bool:
    """Whether anything of ``child_id`` is live: agent, session, Activation or ownership."""
    manager = b.manager
    return (
        b.host.ctx.agents.get(child_id) is not None
        or b.host.ctx.sessions.get(child_id) is not None
        or child_id in manager.activations
        or child_id in manager.retiring
        or any(child_id in a.owned_children for a in manager.activations.values())
    )


@attrs.frozen
class OneShotOnly:
    """A provider without ``prepare_continuable``."""

    name: str = "oneshot"
    capabilities: SubagentCapabilities = ALL
    inherits_parent_context: bool = False

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        return await start_in_process_run(request)


async def test_start_checks_run_in_order_before_the_provider() -> None:
    """CONT-1: DRAINING, then max_depth (TypeError), then the child id (DUPLICATE_CHILD for the
    parent's own id or a live agent), then depth (SubagentDepthError), then the provider
    (NO_PROVIDER, UNSUPPORTED_CAPABILITY); none of them reaches prepare_continuable."""
    async with boot() as b:
        provider = b.svc.get_provider("local")
        assert isinstance(provider, LocalProvider)
        b.provider_owner[SUBAGENTS].register_provider(OneShotOnly())
        with pytest.raises(InvalidMaxDepthError):
            await b.start(max_depth=-1, child_id=b.parent.id)
        with pytest.raises(SubagentError) as caught:
            await b.start(child_id=b.parent.id, max_depth=0)
        assert caught.value.code == "DUPLICATE_CHILD"
        with pytest.raises(SubagentDepthError):
            await b.start(max_depth=0, provider="nope")
        with pytest.raises(SubagentError) as caught:
            await b.start(provider="nope")
        assert caught.value.code == "NO_PROVIDER"
        with pytest.raises(SubagentError, match="provided by dsh-subagent-spawn") as caught:
            await b.start(provider="spawn")
        assert 'registered providers: "local", "oneshot"' in str(caught.value)
        with pytest.raises(SubagentError) as caught:
            await b.start(provider="oneshot")
        assert caught.value.code == "UNSUPPORTED_CAPABILITY"
        b.manager.closed = True
        with pytest.raises(SubagentError) as caught:
            await b.start(max_depth=-1)
        assert caught.value.code == "DRAINING"
        b.manager.closed = False
        assert provider.prepared == []
        assert b.host.ctx.agents.list() == [b.parent]


async def test_start_without_persistence_is_refused() -> None:
    """CONT-1: without session persistence start_continuable fails PERSISTENCE_UNAVAILABLE
    before the depth check."""
    async with boot(store=None) as b:
        with pytest.raises(SubagentError) as caught:
            await b.start(max_depth=-1)
        assert caught.value.code == "PERSISTENCE_UNAVAILABLE"


async def test_reserved_child_id_is_used_and_refused_when_taken() -> None:
    """CONT-1 [M]: a reserved child_id names the child; it is DUPLICATE_CHILD while live and
    afterwards while stored, and for any live agent's id."""
    async with boot() as b:
        started = await b.start(child_id="session-reserved")
        assert started.child_id == "session-reserved"
        with pytest.raises(SubagentError) as caught:
            await b.start(child_id="session-reserved")
        assert caught.value.code == "DUPLICATE_CHILD"
        await b.settled("session-reserved")
        with pytest.raises(SubagentError) as caught:
            await b.start(child_id="session-reserved")
        assert caught.value.code == "DUPLICATE_CHILD"
        other = (await b.host.create_agent()).agent
        with pytest.raises(SubagentError) as caught:
            await b.start(child_id=other.id)
        assert caught.value.code == "DUPLICATE_CHILD"


async def test_a_reserved_id_is_checked_without_reading_a_stored_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONT-1 step 10, issue 13: a reserved child_id is DUPLICATE_CHILD for a stored log whose
    events are damaged, and free when no file is there; neither check reads a log."""
    from dsh_core._persistence import JsonlSessionPersistence

    async with boot(store="jsonl", store_root=tmp_path) as b:
        await (await b.host.create_agent(session_id="session-taken")).dispose()
        path = tmp_path / "session-taken.jsonl"
        path.write_bytes(path.read_bytes() + b"{not json\n" * 2)
        read: list[str] = []
        original = JsonlSessionPersistence._read

        def spy(self: JsonlSessionPersistence, id: str, handle: Any) -> Any:
            read.append(id)
            return original(self, id, handle)

        monkeypatch.setattr(JsonlSessionPersistence, "_read", spy)
        with pytest.raises(SubagentError) as caught:
            await b.start(child_id="session-taken")
        assert caught.value.code == "DUPLICATE_CHILD"
        started = await b.start(child_id="session-free")
        assert started.child_id == "session-free"
        assert read == []
        await b.settled("session-free")


# -- CONT-3: rollback before acceptance -----------------------------------------------------------


async def test_abort_before_start_rejects_with_the_reason() -> None:
    """CONT-3, CONT-9: an already-aborted signal rejects with its own reason; nothing exists."""
    async with boot() as b:
        controller = AbortController()
        controller.abort("stop")
        with pytest.raises(AbortedError) as caught:
            await b.start(signal=controller.signal, child_id="session-x")
        assert caught.value.reason == "stop"
        assert not live(b, "session-x")


async def test_abort_inside_creation_setup_rolls_back() -> None:
    """CONT-3: an abort inside the creation window rolls everything back: no session, agent,
    Activation or ownership edge, and no subagent/start."""
    async with boot() as b:
        controller = AbortController()

        def on_created(session: Any) -> None:
            if session.id == "session-x":
                controller.abort("late")

        b.host.ctx.on("session/created", on_created)
        with pytest.raises(AbortedError):
            await b.start(signal=controller.signal, child_id="session-x")
        assert not live(b, "session-x")
        assert b.named("subagent/start") == []


async def test_abort_from_a_start_listener_rolls_back() -> None:
    """CONT-3: aborted between publication and acceptance (from a subagent/start listener):
    rejected, no ids, nothing left, the prompt never entered the inbox."""
    async with boot() as b:
        controller = AbortController()
        b.host.ctx.on("subagent/start", lambda info: controller.abort("listener"))
        with pytest.raises(AbortedError):
            await b.start(signal=controller.signal, child_id="session-x")
        assert not live(b, "session-x")
        assert b.named("agent/inbox/inserted") == []


async def test_throwing_start_listener_rolls_back_without_end() -> None:
    """CONT-3: a subagent/start dispatch that throws rolls back with no subagent/end, and a
    later drain still succeeds."""
    async with boot() as b:

        def veto(info: Any) -> None:
            raise RuntimeError("no")

        remove = b.host.ctx.on("subagent/start", veto)
        with pytest.raises(RuntimeError):
            await b.start(child_id="session-x")
        remove()
        assert not live(b, "session-x")
        assert b.named("subagent/end") == []
        await b.manager.drain()


async def test_drain_after_materialization_rejects_draining() -> None:
    """CONT-3, DRN-1: a drain that starts after the child was created rejects the start with
    DRAINING before anything entered the inbox, and the child is rolled back."""
    async with boot() as b:
        drains: list[asyncio.Task[None]] = []

        def on_created(agent: Agent) -> None:
            if agent.id == "session-x":
                drains.append(asyncio.ensure_future(b.manager.drain()))
                b.manager.closed = True

        b.host.ctx.on("agent/created", on_created)
        with pytest.raises(SubagentError) as caught:
            await b.start(child_id="session-x")
        assert caught.value.code == "DRAINING"
        async with asyncio.timeout(5):
            await drains[0]
        assert not live(b, "session-x")
        assert b.named("agent/inbox/inserted") == []


# -- DSC-5, CONT-4: the child's log and composition -----------------------------------------------


async def test_descriptor_follows_the_provider_seed_and_turns_continue() -> None:
    """DSC-5: the continuable descriptor is appended after the provider seed and before the
    prompt; seed_length counts only the provider seed; with one inherited turn the child's
    first turn is turn 2."""
    async with boot(seeded=True) as b:
        await b.host.run(b.parent, "first parent turn")
        prefix = completed_turn_prefix(b.parent)
        assert prefix is not None
        started = await b.start(persona="Be terse.")
        child = b.manager.activations[started.child_id].agent
        header = child.session.header
        assert header.seed_length == len(prefix)
        own = list(child.session.events_since(len(prefix)))
        descriptors = [e for e in own if e.type == DESCRIPTOR_EVENT]
        assert len(descriptors) == 1
        assert thaw_json(descriptors[0].data) == {
            "version": 2,
            "mode": "continuable",
            "provider": "local",
            "label": "helper",
            "agent_provider": "scripted",
            "agent_model": "scripted-1",
            "persona": "Be terse.",
        }
        types = [e.type for e in own]
        assert types.index(DESCRIPTOR_EVENT) < types.index("agent/inbox/spliced")
        assert descriptors[0].surface_op is None
        turns = [e.data.turn for e in own if e.type == "turn/start"]
        assert turns == [2]
        fold = fold_descriptor(child.session.events, header.seed_length)
        assert fold.status == "ok"
        assert fold.seq == descriptors[0].seq
        await b.settled(started.child_id)


async def test_child_is_composed_by_the_manager() -> None:
    """CONT-4, DEP-5: the manager applies persona, tool filter and the delegation statement
    and records depth in header and options; the child is created through its private owner
    scope (the parent owns it in the registry, its disposal does not bypass the manager)."""
    model = Model()
    async with boot(model) as b:
        b.host.ctx.tools.register(look_tool())
        b.host.ctx.tools.register(look_tool("peek"))
        started = await b.start(
            "hold compose", persona="Be terse.", tool_filter=ToolRestriction(deny=("peek",))
        )
        child = b.manager.activations[started.child_id].agent
        await b.until(lambda: model.held(child.id))
        request = next(r for r in model.requests if r.session_id == child.id)
        assert "Be terse." in request.system
        assert DELEGATION_STATEMENT in [m.text for m in request.messages]
        names = [t.name for t in request.tools or ()]
        assert "look" in names and "peek" not in names
        assert child.session.header.delegation_depth == 1
        assert child.options.extensions[SUBAGENT_DEPTH_KEY] == 1
        assert b.host.ctx.agents.owner_of(child.id) is b.parent
        model.release("hold compose")
        await b.settled(started.child_id)


# -- CONT-5..9, CONT-13: residency, routing, authority --------------------------------------------


async def test_followup_to_a_running_child_joins_its_inbox() -> None:
    """CONT-5, CONT-6, CONT-7: a follow-up to a running child is accepted into the same
    Activation's inbox FIFO (same agent, accounted in accepted until claimed); the child runs
    both turns in order within one epoch."""
    model = Model()
    async with boot(model) as b:
        started = await b.start("hold first")
        act = b.manager.activations[started.child_id]
        child = act.agent
        await b.until(lambda: model.held(child.id))
        assert residency(act) == "running"
        second = await b.send(started.child_id, "second")
        assert b.manager.activations[started.child_id] is act
        assert act.accepted == {second}
        assert [m.id for m in child.inbox.next_turn] == [second]
        model.release("hold first")
        await b.settled(started.child_id)
        answers = [m.text for m in child.session.derive_messages() if m.role == "assistant"]
        assert answers == ["held: hold first", "answer: second"]
        assert len(b.ends()) == 1
        assert act.accepted == set()


async def test_waiting_child_is_woken_not_resumed() -> None:
    """CONT-6, CONT-7, CONT-13: a child whose turn ended but which owns a resident grandchild
    is waiting (same Agent retained); a follow-up wakes that same agent; it settles only
    after the grandchild was disposed."""
    model = Model()
    async with boot(model) as b:
        started = await b.start("hold child")
        act = b.manager.activations[started.child_id]
        child = act.agent
        grand = await b.svc.start_continuable(b.spec("hold grand", parent=child))
        assert act.owned_children == {grand.child_id}
        model.release("hold child")
        await b.until(lambda: child.status == "idle")
        assert residency(act) == "waiting"
        await b.send(started.child_id, "wake up")
        assert b.manager.activations[started.child_id] is act
        await b.until(lambda: child.status == "idle" and not act.accepted)
        assert residency(act) == "waiting"
        assert b.manager.activations.get(started.child_id) is act
        model.release("hold grand")
        await b.settled(started.child_id)
        disposed = [args[0].id for name, args in b.named("agent/disposed")]
        assert disposed.index(grand.child_id) < disposed.index(started.child_id)
        assert b.host.ctx.agents.get(b.parent.id) is b.parent


async def test_followup_needs_the_exact_live_direct_parent() -> None:
    """CONT-8: a follow-up from an agent that is not the live registered object is
    UNAUTHORIZED (exact live parent), and from a live agent that is not the durable parent
    too (another parent session); nothing is delivered."""
    model = Model()
    async with boot(model) as b:
        started = await b.start("hold x")
        other_handle = await b.host.create_agent()
        other = other_handle.agent
        with pytest.raises(SubagentError, match="belongs to another parent session") as caught:
            await b.send(started.child_id, "from a stranger", parent=other)
        assert caught.value.code == "UNAUTHORIZED"
        await other_handle.dispose()
        with pytest.raises(SubagentError, match="exact live parent agent") as caught:
            await b.send(started.child_id, "from a ghost", parent=other)
        assert caught.value.code == "UNAUTHORIZED"
        child = b.manager.activations[started.child_id].agent
        assert child.inbox.next_turn == []
        model.release("hold x")
        await b.settled(started.child_id)
        with pytest.raises(SubagentError, match="belongs to another parent session"):
            await b.send(
                started.child_id, "cold from a stranger", parent=(await b.host.create_agent()).agent
            )


async def test_caller_signal_owns_only_the_span_before_acceptance() -> None:
    """CONT-9: an aborted signal rejects a follow-up with its reason and delivers nothing;
    aborting after acceptance cancels neither the turn nor the child."""
    model = Model()
    async with boot(model) as b:
        controller = AbortController()
        started = await b.start("hold run", signal=controller.signal)
        controller.abort("too late")
        act = b.manager.activations[started.child_id]
        stopped = AbortController()
        stopped.abort("no")
        with pytest.raises(AbortedError) as caught:
            await b.send(started.child_id, "never", signal=stopped.signal)
        assert caught.value.reason == "no"
        assert act.agent.inbox.next_turn == []
        model.release("hold run")
        await b.settled(started.child_id)
        assert [e.stop_reason for e in b.ends()] == ["completed"]


# -- CONT-10..12: cold resume ---------------------------------------------------------------------


async def test_cold_resume_works_without_the_provider() -> None:
    """CONT-10: after the provider unregisters, a follow-up cold-resumes the settled child
    from its descriptor: persona and route reapplied, no second descriptor, a new epoch that
    still reports the original provider, and turn numbering continues."""
    model = Model()
    async with boot(model) as b:
        started = await b.start("first", persona="Be terse.")
        await b.settled(started.child_id)
        await b.provider_owner.dispose()
        assert b.svc.get_provider("local") is None
        await b.send(started.child_id, "hold second")
        act = b.manager.activations[started.child_id]
        child = act.agent
        await b.until(lambda: model.held(child.id))
        request = [r for r in model.requests if r.session_id == child.id][-1]
        assert "Be terse." in request.system
        assert (request.provider, request.model) == ("scripted", "scripted-1")
        assert child.options.max_tokens is None
        model.release("hold second")
        await b.settled(started.child_id)
        handle = await b.host.resume_agent(started.child_id)
        events = handle.agent.session.events
        assert [e.type for e in events].count(DESCRIPTOR_EVENT) == 1
        assert [e.data.turn for e in events if e.type == "turn/start"] == [1, 2]
        await handle.dispose()
        starts = [args[0] for _, args in b.named("subagent/start")]
        assert [s.provider for s in starts] == ["local", "local"]
        assert starts[0].run_id != starts[1].run_id


async def test_cold_resume_after_a_restart_on_the_jsonl_store(tmp_path: Path) -> None:
    """CONT-10: a child settled in one process is resumed by a follow-up in a fresh host on
    the same JSONL store, with its descriptor's persona, by a parent recreated under the same
    id; the epoch's answer reaches that parent as a settlement notice."""
    async with boot(store="jsonl", store_root=tmp_path, parent_id="session-root") as b:
        started = await b.start("first", persona="Be terse.")
        await b.settled(started.child_id)
    model = Model()
    async with boot(model, store="jsonl", store_root=tmp_path, parent_id="session-root2") as b:
        persistence = b.host.ctx.session_persistence
        header, _ = await persistence.inspect(started.child_id)
        assert header.parent_session == "session-root"
        with pytest.raises(SubagentError, match="another parent session"):
            await b.send(started.child_id, "hello again")
    # The parent's own session is stored too: resume it in a fresh host and follow up.
    async with scripted_host(
        "subagent",
        model=model,
        modules={"subagent": dsh_subagent.plugin},
        store="jsonl",
        store_root=tmp_path,
    ) as host:
        parent = (await host.resume_agent("session-root")).agent
        svc = parent.ctx[SUBAGENTS]
        options = SubagentFollowupOptions(
            source=CoordinatorMessageSource(sender_session_id=parent.id)
        )
        await svc.followup(parent, started.child_id, text_blocks("second"), options)
        manager = svc._state.continuation
        child = manager.activations[started.child_id].agent
        async with asyncio.timeout(5):
            await child.when_idle()
            while started.child_id in manager.activations or started.child_id in manager.retiring:
                await asyncio.wait([t for t in host.ctx.host.tasks if not t.done()])
            await parent.when_idle()
        request = [r for r in model.requests if r.session_id == started.child_id][-1]
        assert "Be terse." in request.system
        assert texts(notices_of(parent)[-1])[-1] == "answer: second"


async def test_cold_resume_refuses_what_has_no_continuation_state() -> None:
    """CONT-10: an unknown id is NOT_RESUMABLE (unavailable); a one-shot child of the parent is
    NOT_RESUMABLE with the do-not-retry wording."""
    async with boot() as b:
        with pytest.raises(SubagentError, match="is unavailable") as caught:
            await b.send("session-nobody", "hi")
        assert caught.value.code == "NOT_RESUMABLE"
        run = await b.svc.start(
            "local", SubagentStartRequest(prompt=text_blocks("one shot"), parent=b.parent)
        )
        await run.result
        await run.dispose()
        with pytest.raises(SubagentError) as caught:
            await b.send(run.id, "hi")
        assert caught.value.code == "NOT_RESUMABLE"
        assert str(caught.value) == (
            f"subagent {run.id} has no supported continuation state and cannot be resumed; "
            "do not retry send_message with this id"
        )


async def test_parent_replaced_during_resume_is_unauthorized() -> None:
    """CONT-11: a parent disposed and recreated under the same id while its child is being
    cold-resumed fails the final admission check UNAUTHORIZED; the resumed child is rolled
    back and the message is never logged."""
    async with boot(parent_id="session-root") as b:
        started = await b.start("first")
        await b.settled(started.child_id)
        persistence = b.host.ctx.session_persistence
        prepare = persistence.prepare
        replaced: list[Agent] = []

        async def swap_then_prepare(id: str, signal: Any = None, **kwargs: Any) -> Any:
            found = await prepare(id, signal, **kwargs)
            if id != started.child_id:
                return found  # the parent's own resume below
            await b.host.ctx.agents._svc.agents[b.parent.id].handle.dispose()
            replaced.append((await b.host.resume_agent("session-root")).agent)
            return found

        persistence.prepare = swap_then_prepare
        with pytest.raises(SubagentError, match="exact live parent agent") as caught:
            await b.send(started.child_id, "never logged")
        assert caught.value.code == "UNAUTHORIZED"
        assert replaced[0].id == b.parent.id and replaced[0] is not b.parent
        assert [args[0].id for name, args in b.named("agent/created")].count(started.child_id) == 2
        assert not live(b, started.child_id)
        del persistence.prepare
        _, events = await persistence.inspect(started.child_id)
        assert "never logged" not in str([e.data for e in events])


async def test_live_agent_without_activation_is_never_adopted() -> None:
    """CONT-12: a child id held by a live agent that has no Activation is not adopted: the
    resume collides, the call fails with a SubagentError and the live agent is untouched."""
    async with boot() as b:
        handle = await b.host.create_agent(
            session_id="session-squatter",
            meta=SessionMeta(cwd=str(Path.cwd()), parent_session=b.parent.id),
        )
        squatter = handle.agent
        payload = descriptor_payload(
            snapshot_continuable_descriptor(provider="local", label="squatter")
        )
        squatter.session.append(DESCRIPTOR_EVENT, payload, ignorable=True)
        await squatter.ctx.sessions.flush(squatter.session)
        with pytest.raises(SubagentError):
            await b.send("session-squatter", "adopt me")
        assert b.host.ctx.agents.get("session-squatter") is squatter
        assert "session-squatter" not in b.manager.activations
        assert squatter.inbox.next_turn == [] and squatter.status == "idle"
        await handle.dispose()


# -- CONT-14, CONT-15: disposal and the epoch's end -----------------------------------------------


async def test_final_flush_failure_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    """CONT-14: a failing final flush is logged and ignored: the Activation still settles
    completed, its handle is disposed and the parent is notified."""
    async with boot() as b:

        def failing(session: Any) -> None:
            if session.header.parent_session == b.parent.id:
                raise RuntimeError("disk on fire")

        b.host.ctx.on("session/flush", failing)
        started = await b.start()
        await b.settled(started.child_id)
        assert [e.stop_reason for e in b.ends()] == ["completed"]
        assert "final flush of continuable subagent" in caplog.text
        assert b.host.ctx.agents.get(started.child_id) is None


async def test_teardown_failure_forces_error_and_aggregates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CONT-14, CONT-15: a failing handle disposal of a child that has a closing message (a
    waiting child whose turn answered) still releases it, forces the stop reason error and
    drops that output (no last_assistant_message, the notice says it left none), and the
    drain rejects ACTIVATION_TEARDOWN_FAILED naming the cause."""
    model = Model()
    async with boot(model) as b:
        started = await b.start("hold child")
        act = b.manager.activations[started.child_id]
        child = act.agent
        grand = await b.svc.start_continuable(b.spec("hold grand", parent=child))
        model.release("hold child")
        await b.until(lambda: child.status == "idle")
        assert residency(act) == "waiting"
        assert [m.text for m in child.session.derive_messages() if m.role == "assistant"] == [
            "held: hold child"
        ]
        original = AgentHandle.dispose

        async def failing(self: AgentHandle) -> None:
            await original(self)
            if self.agent.id == started.child_id:
                raise RuntimeError("handle broke")

        monkeypatch.setattr(AgentHandle, "dispose", failing)
        with pytest.raises(SubagentError, match="handle broke") as caught:
            await b.manager.drain()
        assert caught.value.code == "ACTIVATION_TEARDOWN_FAILED"
        ends = {e.id: e for e in b.ends()}
        end = ends[started.child_id]
        assert (end.stop_reason, end.last_assistant_message) == ("error", None)
        assert ends[grand.child_id].stop_reason == "aborted"
        assert texts(b.parent.inbox.next_step[0])[:2] == [
            f"Background subagent {started.child_id} failed before it finished.",
            "It left no closing message.",
        ]
        assert len(b.parent.inbox.next_step[0].content) == 2
        assert not live(b, started.child_id)


@pytest.mark.parametrize(
    ("kind", "dropped", "stop"),
    [
        (None, False, "completed"),
        (None, True, "aborted"),
        ("completed", False, "completed"),
        ("completed", True, "aborted"),
        ("max-tokens", False, "max-tokens"),
        ("aborted", False, "aborted"),
        ("interrupted", False, "aborted"),
        ("error", False, "error"),
        ("blocked", False, "refusal"),
        ("strange", False, "error"),
    ],
)
def test_epoch_stop_reason_fold(kind: str | None, dropped: bool, stop: str) -> None:
    """CONT-15: the epoch's stop reason from its last consumed-work end and droppedUnrun."""
    end = (
        None if kind is None else TurnEndData(turn=1, reason=TurnEndReason(kind=kind))  # type: ignore[arg-type]
    )
    work = ConsumedWork(end=end, end_seq=None if end is None else 3, dropped_unrun=dropped)
    assert continuable_stop_reason(work) == stop


async def test_epoch_end_reads_only_its_own_suffix() -> None:
    """CONT-15, SET-2: a resumed epoch whose only turn is refused ends refusal with no
    last_assistant_message (never the previous epoch's answer); its notice says it declined
    and left no closing message."""
    async with boot() as b:

        async def refuse(
            pre: PreStep, next_: Callable[..., Awaitable[PreStepDecision]]
        ) -> PreStepDecision:
            if any(m.text == "refuse" for m in pre.messages):
                return PreStepDecision(kind="reject", reason="policy")
            return await next_()

        b.host.ctx.on("agent/pre-step", refuse)
        started = await b.start("first")
        await b.settled(started.child_id)
        await b.send(started.child_id, "refuse")
        await b.settled(started.child_id)
        await b.parent.when_idle()
        first, second = b.ends()
        assert first.stop_reason == "completed"
        assert blocks_text(first.last_assistant_message) == "answer: first"
        assert (second.stop_reason, second.last_assistant_message) == ("refusal", None)
        assert texts(notices_of(b.parent)[-1]) == [
            f"Background subagent {started.child_id} declined the task.",
            "It left no closing message.",
        ]


async def test_failed_turn_notice() -> None:
    """CONT-15, SET-2: a child whose turn fails ends error; the notice says it failed before
    it finished."""
    async with boot(Model()) as b:
        started = await b.start("fail now")
        await b.settled(started.child_id)
        await b.parent.when_idle()
        assert [e.stop_reason for e in b.ends()] == ["error"]
        assert texts(notices_of(b.parent)[0])[0] == (
            f"Background subagent {started.child_id} failed before it finished."
        )


# -- SET-1..4: settlement notices -----------------------------------------------------------------


def kinds(messages: list[Message]) -> list[str]:
    return [getattr(m.source, "kind", "?") for m in messages]


async def test_busy_parent_gets_the_notice_at_its_next_step() -> None:
    """SET-3, BUG-2: children settling while their parent is in a model request are steered
    into the parent's next-step batch (no next-turn item, no new parent turn): both notices
    enter the parent's next step together."""
    model = Model()
    async with boot(model) as b:
        b.parent.followup(user_message("hold parent"))
        await b.until(lambda: model.held(b.parent.id))
        one = await b.start("quick one")
        two = await b.start("quick two")
        await b.settled(one.child_id)
        await b.settled(two.child_id)
        assert kinds(b.parent.inbox.next_step) == ["subagent-settled", "subagent-settled"]
        assert b.parent.inbox.next_turn == []
        model.release("hold parent")
        await b.until(lambda: b.parent.status == "idle")
        assert [e.data.turn for e in b.parent.session.events if e.type == "turn/start"] == [1]
        steps: list[int] = []
        step = 0
        for e in b.parent.session.events:
            if e.type == "step/start":
                step = e.data.step
            elif e.type == "user/message" and kinds([e.data]) == ["subagent-settled"]:
                steps.append(step)
        assert steps == [2, 2]


async def test_notice_is_sent_while_the_parent_still_owns_the_child() -> None:
    """SET-1: the notice reaches a continuable parent before ownership is released: at its
    insertion the parent's Activation still lists the child, and the waking send is accounted
    so the parent stays resident until it read the notice."""
    model = Model()
    async with boot(model) as b:
        mid = await b.start("hold mid")
        mid_act = b.manager.activations[mid.child_id]
        leaf = await b.svc.start_continuable(b.spec("hold leaf", parent=mid_act.agent))
        owned_at_notice: list[tuple[set[str], bool]] = []

        def on_inserted(agent: Agent, message: Message) -> None:
            if agent is mid_act.agent and kinds([message]) == ["subagent-settled"]:
                owned_at_notice.append(
                    (set(mid_act.owned_children), message.id in mid_act.accepted)
                )

        b.host.ctx.on("agent/inbox/inserted", on_inserted)
        model.release("hold mid")
        await b.until(lambda: mid_act.agent.status == "idle")
        model.release("hold leaf")
        await b.settled(mid.child_id)
        assert owned_at_notice == [({leaf.child_id}, True)]
        assert kinds(notices_of(mid_act.agent)) == ["subagent-settled"]
        await b.parent.when_idle()
        assert len(notices_of(b.parent)) == 1


async def test_notice_to_a_gone_parent_is_dropped() -> None:
    """SET-1: when the stored parent is no longer registered the notice is dropped silently
    and the child still ends normally."""
    model = Model()
    async with boot(model) as b:
        started = await b.start("hold orphan")
        await b.host.ctx.agents._svc.agents[b.parent.id].handle.dispose()
        model.release("hold orphan")
        await b.settled(started.child_id)
        assert [e.stop_reason for e in b.ends()] == ["completed"]


async def test_failing_notice_send_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """SET-4: a notice whose send throws is logged as not delivered and the teardown still
    succeeds."""
    async with boot() as b:

        def refuse_notices(session: Any, event: Any) -> None:
            if event.type == "agent/inbox/spliced" and "subagent-settled" in str(event.data):
                raise RuntimeError("no notices here")

        b.parent.session.add_validator(refuse_notices)
        started = await b.start()
        await b.settled(started.child_id)
        assert "was not delivered to its parent" in caplog.text
        assert [e.stop_reason for e in b.ends()] == ["completed"]
        assert not live(b, started.child_id)


# -- DRN-1: the manager-wide drain ----------------------------------------------------------------


async def test_drain_releases_every_forest_child_first() -> None:
    """DRN-1, CONT-14, SET-3, SET-4: the drain closes admission, disposes every Activation
    child-first (the grandchild's agent/disposed first); notices during the drain are
    injected without waking, and one a disposed parent never claimed is spliced out again;
    afterwards starts and follow-ups fail DRAINING and nothing is left."""
    model = Model()
    async with boot(model) as b:
        mid = await b.start("hold mid")
        mid_agent = b.manager.activations[mid.child_id].agent
        leaf = await b.svc.start_continuable(b.spec("hold leaf", parent=mid_agent))
        await b.until(lambda: model.held(leaf.child_id) and model.held(mid.child_id))
        async with asyncio.timeout(5):
            await b.manager.drain()
        disposed = [args[0].id for name, args in b.named("agent/disposed")]
        assert disposed == [leaf.child_id, mid.child_id]
        assert b.manager.activations == {} and b.manager.retiring == {}
        assert {e.stop_reason for e in b.ends()} == {"aborted"}
        # The leaf's notice went into mid's inbox and was removed with mid's disposal.
        mid_splices = [e.data for e in mid_agent.session.events if e.type == "agent/inbox/spliced"]
        inserted = [d for d in mid_splices if "subagent-settled" in str(d.inserted)]
        assert len(inserted) == 1
        assert mid_splices[-1].outcome == "canceled"
        # The root parent recorded its notice without starting a turn.
        assert b.parent.status == "idle"
        assert kinds(b.parent.inbox.next_step) == ["subagent-settled"]
        for attempt in (b.start(), b.send(mid.child_id, "more")):
            with pytest.raises(SubagentError) as caught:
                await attempt
            assert caught.value.code == "DRAINING"
        assert b.host.ctx.agents.list() == [b.parent]


async def test_unloading_the_service_drains_it() -> None:
    """DRN-1: disposing the service's owning context (plugin unload) runs the drain: every
    resident child ends and is released before the service is gone."""
    model = Model()
    async with boot(model) as b:
        started = await b.start("hold until unload")
        state = b.host.ctx[SUBAGENTS]._state
        async with asyncio.timeout(5):
            await state.ctx.dispose()
        assert [e.stop_reason for e in b.ends()] == ["aborted"]
        assert b.host.ctx.agents.get(started.child_id) is None
        assert state.continuation.activations == {}


async def test_start_under_a_closing_parent_activation_rolls_back() -> None:
    """CONT-3, CONT-13: a start under a continuable parent whose Activation begins disposal
    during the child's creation fails ACTIVATION_CLOSING and leaves no child behind."""
    model = Model()
    async with boot(model) as b:
        mid = await b.start("hold mid")
        mid_act = b.manager.activations[mid.child_id]
        disposals: list[asyncio.Task[None]] = []

        def on_created(agent: Agent) -> None:
            if agent.id == "session-grand":
                disposals.append(asyncio.ensure_future(mid_act.dispose()))

        b.host.ctx.on("agent/created", on_created)
        with pytest.raises(SubagentError) as caught:
            await b.svc.start_continuable(
                b.spec("grand", parent=mid_act.agent, child_id="session-grand")
            )
        assert caught.value.code == "ACTIVATION_CLOSING"
        async with asyncio.timeout(5):
            await disposals[0]
        assert not live(b, "session-grand")
        assert not live(b, mid.child_id)


async def test_accepted_is_forgotten_when_the_send_throws(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CONT-5: a follow-up whose inbox send throws leaves no id in accepted, so the child is
    not pinned as running and still settles."""
    model = Model()
    async with boot(model) as b:
        started = await b.start("hold on")
        act = b.manager.activations[started.child_id]
        original = Agent.followup

        def refusing(self: Agent, message: Message) -> None:
            if self is act.agent and message.text == "refused":
                raise RuntimeError("no")
            original(self, message)

        monkeypatch.setattr(Agent, "followup", refusing)
        with pytest.raises(RuntimeError):
            await b.send(started.child_id, "refused")
        assert act.accepted == set()
        model.release("hold on")
        await b.settled(started.child_id)


async def test_delivery_racing_disposal_waits_then_resumes() -> None:
    """CONT-7, hardening 11.8: follow-ups arriving while the settled child is being disposed
    (held in its final flush) wait for that disposal; one whose task is cancelled meanwhile
    cancels nothing of it, the other lands in a new epoch (a new agent)."""
    async with boot() as b:
        gate = asyncio.Event()
        flushing: list[str] = []

        async def slow_flush(session: Any) -> None:
            if session.header.parent_session == b.parent.id and not flushing:
                flushing.append(session.id)
                b.changed.set()
                await gate.wait()

        b.host.ctx.on("session/flush", slow_flush)
        started = await b.start("first")
        await b.until(lambda: bool(flushing))
        act = b.manager.activations[started.child_id]
        assert act.closing
        cancelled = asyncio.ensure_future(b.send(started.child_id, "cancelled"))
        second = asyncio.ensure_future(b.send(started.child_id, "second"))
        cancelled.cancel()
        gate.set()
        async with asyncio.timeout(5):
            message_id = await second
        assert cancelled.cancelled()
        assert b.manager.activations[started.child_id] is not act
        await b.settled(started.child_id)
        first, later = b.ends()
        assert first.stop_reason == later.stop_reason == "completed"
        assert blocks_text(later.last_assistant_message) == "answer: second"
        handle = await b.host.resume_agent(started.child_id)
        users = [m.id for m in handle.agent.session.derive_messages() if m.role == "user"]
        assert message_id in users
        await handle.dispose()


@pytest.mark.parametrize("when", ["during", "after"])
@pytest.mark.parametrize("store", ["memory", "jsonl"])
async def test_abort_during_cold_read_rejects_with_the_reason(
    store: str, when: str, tmp_path: Path
) -> None:
    """CONT-9: the caller's signal is forwarded to the cold read of the log (the store's
    prepare); aborted during it or right after it, the follow-up rejects with the abort reason
    itself, nothing is resumed or delivered, and the log is let go (a later follow-up resumes
    it)."""
    async with boot(store=store, store_root=tmp_path) as b:
        started = await b.start("first")
        await b.settled(started.child_id)
        persistence = b.host.ctx.session_persistence
        prepare = persistence.prepare
        controller = AbortController()
        seen: list[Any] = []

        async def aborting_prepare(id: str, signal: Any = None, **kwargs: Any) -> Any:
            seen.append(signal)
            if when == "during":
                controller.abort("changed my mind")
            prepared = await prepare(id, signal, **kwargs)
            controller.abort("changed my mind")
            return prepared

        persistence.prepare = aborting_prepare
        with pytest.raises(AbortedError) as caught:
            await b.send(started.child_id, "never", signal=controller.signal)
        del persistence.prepare
        assert caught.value.reason == "changed my mind"
        assert seen == [controller.signal]
        assert not live(b, started.child_id)
        assert len(b.ends()) == 1
        await b.send(started.child_id, "later")
        await b.settled(started.child_id)
        assert len(b.ends()) == 2


@pytest.mark.parametrize("store", ["memory", "jsonl"])
async def test_cold_resume_reads_the_log_once(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONT-10, issue 13 performance: a cold-resume follow-up reads the child's stored log
    once (the read that authorizes and folds the descriptor becomes the resumed session);
    here the store keeps no warm log, as after a restart."""
    async with boot(store=store, store_root=tmp_path) as b:
        persistence = b.host.ctx.session_persistence
        persistence.warm_sessions = 0
        started = await b.start("first")
        await b.settled(started.child_id)
        read = persistence._read
        reads: list[str] = []

        def counting_read(id: str, handle: Any) -> Any:
            reads.append(id)
            return read(id, handle)

        monkeypatch.setattr(persistence, "_read", counting_read)
        await b.send(started.child_id, "again")
        await b.settled(started.child_id)
        assert reads == [started.child_id]
        assert len(b.ends()) == 2


@pytest.mark.parametrize("store", ["memory", "jsonl"])
async def test_a_follow_up_after_200_turns_reads_and_decodes_nothing(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-59: a follow-up to a settled continuable child whose log this host wrote and
    closed resumes it from the warm log: after 200 turns it reads no log and decodes no
    event, and the store still holds what the resumed session holds."""
    async with boot(store=store, store_root=tmp_path) as b:
        persistence = b.host.ctx.session_persistence
        started = await b.start("first")
        child = started.child_id
        await b.settled(child)
        reads: list[str] = []
        decoded: list[int] = []
        read, decode = persistence._read, persistence.types.decode

        def counting_read(id: str, handle: Any) -> Any:
            reads.append(id)
            return read(id, handle)

        def counting_decode(value: Any) -> Any:
            decoded.append(1)
            return decode(value)

        monkeypatch.setattr(persistence, "_read", counting_read)
        monkeypatch.setattr(persistence.types, "decode", counting_decode)
        for i in range(200):
            await b.send(child, f"again {i}")
            await b.settled(child)
        assert (reads, decoded) == ([], [])
        assert len(b.ends()) == 201
        kept = tuple(persistence._warm[child].events)
        monkeypatch.undo()
        persistence._warm.clear()
        _, stored = await persistence.inspect(child)
        assert stored == kept and len(stored) > 200 * 8


async def test_a_foreign_cold_resume_leaves_the_log_untouched(tmp_path: Path) -> None:
    """CONT-10, CONT-8: a follow-up from another parent to a child whose stored log ended
    inside a turn fails UNAUTHORIZED before the log's crash repair is written, and the log
    is let go at once (a later read sees it unrepaired, unlocked)."""
    async with boot(store="jsonl", store_root=tmp_path) as b:
        started = await b.start("first")
        await b.settled(started.child_id)
        persistence = b.host.ctx.session_persistence
        await persistence.append(
            started.child_id,
            [_turn_start(len((await persistence.inspect(started.child_id))[1]), turn=2)],
        )
        path = persistence.path_of(started.child_id)
        before = path.read_bytes()
        other = (await b.host.create_agent(session_id="session-other")).agent
        with pytest.raises(SubagentError, match="another parent session") as caught:
            await b.send(started.child_id, "hello", parent=other)
        assert caught.value.code == "UNAUTHORIZED"
        assert path.read_bytes() == before
        prepared = await persistence.prepare(started.child_id)  # not held: no SESSION_LOCKED
        prepared.dispose()


@pytest.mark.parametrize("store", ["memory", "jsonl"])
async def test_reserved_id_no_store_can_hold_is_refused_as_such(store: str, tmp_path: Path) -> None:
    """CONT-1, hardening 11.5: a reserved child_id that cannot name a session fails
    SESSION_INVALID_ID on every store (not DUPLICATE_CHILD) and leaves nothing behind."""
    async with boot(store=store, store_root=tmp_path) as b:
        for bad in ("", "a/b", ".."):
            with pytest.raises(SessionError) as caught:
                await b.start(child_id=bad)
            assert caught.value.code == "SESSION_INVALID_ID"
        assert b.host.ctx.agents.list() == [b.parent]
        assert b.manager.activations == {}


async def test_cold_resume_of_unsupported_or_malformed_descriptors() -> None:
    """CONT-10, DSC-2: a child whose own descriptor has another version is NOT_RESUMABLE; a
    malformed current-version descriptor surfaces as the parser's DescriptorError; neither
    leaves a live agent."""
    async with boot() as b:
        for child_id, payload in (
            ("session-future", {"version": 3, "mode": "continuable"}),
            ("session-broken", {"version": 2, "mode": "continuable", "provider": "local"}),
        ):
            handle = await b.host.create_agent(
                session_id=child_id,
                meta=SessionMeta(cwd=str(Path.cwd()), parent_session=b.parent.id),
            )
            handle.agent.session.append(DESCRIPTOR_EVENT, payload, ignorable=True)
            await handle.dispose()
        with pytest.raises(SubagentError, match="no supported continuation state") as caught:
            await b.send("session-future", "hi")
        assert caught.value.code == "NOT_RESUMABLE"
        with pytest.raises(DescriptorError):
            await b.send("session-broken", "hi")
        assert b.host.ctx.agents.list() == [b.parent]


async def test_drain_on_the_jsonl_store_leaves_nothing_open(tmp_path: Path) -> None:
    """DRN-1: after the drain on the JSONL store no child agent, Activation, settlement task
    or held log is left, and the children's logs stay stored."""
    model = Model()
    async with boot(model, store="jsonl", store_root=tmp_path) as b:
        mid = await b.start("hold mid")
        mid_agent = b.manager.activations[mid.child_id].agent
        leaf = await b.svc.start_continuable(b.spec("hold leaf", parent=mid_agent))
        async with asyncio.timeout(5):
            await b.manager.drain()
            await b.host.ctx.host.drain_tasks()
        persistence = b.host.ctx.session_persistence
        assert b.host.ctx.agents.list() == [b.parent]
        assert b.manager.activations == {} and b.manager.materializations == set()
        assert b.host.ctx.host.tasks == set()
        held = {*persistence._tracked, *persistence._prepared, *persistence._closing}
        assert held == {b.parent.id}
        stored = {h.id for h in await persistence.list()}
        assert {mid.child_id, leaf.child_id} <= stored


# -- issue 28: cold resume, teardown, drain and event scope gaps ---------------------------------


async def test_cold_resume_takes_the_depth_from_the_header() -> None:
    """CONT-10, DEP-2: a cold-resumed child's depth is its header's (its parent's plus one),
    never more: it counts depth 1 and its own child is created at depth 2 under max_depth 2."""
    model = Model()
    async with boot(model) as b:
        started = await b.start("first")
        await b.settled(started.child_id)
        await b.send(started.child_id, "hold again")
        child = b.manager.activations[started.child_id].agent
        assert child.session.header.delegation_depth == 1
        assert delegation_depth_of(child) == 1
        grand = await b.svc.start_continuable(b.spec("grand", parent=child, max_depth=2))
        grand_agent = b.host.ctx.agents.get(grand.child_id)
        assert grand_agent is not None
        assert grand_agent.session.header.delegation_depth == 2
        assert delegation_depth_of(grand_agent) == 2
        model.release("hold again")
        await b.settled(started.child_id)


async def test_cold_resume_reapplies_the_tool_filter() -> None:
    """CONT-10: a cold-resumed child gets its descriptor's tool filter again: the denied tool
    stays out of its model requests."""
    model = Model()
    async with boot(model) as b:
        b.host.ctx.tools.register(look_tool())
        b.host.ctx.tools.register(look_tool("peek"))
        started = await b.start("first", tool_filter=ToolRestriction(deny=("peek",)))
        await b.settled(started.child_id)
        await b.send(started.child_id, "hold again")
        child = b.manager.activations[started.child_id].agent
        await b.until(lambda: model.held(child.id))
        requests = [r for r in model.requests if r.session_id == child.id]
        assert len(requests) == 2
        for request in requests:
            names = [t.name for t in request.tools or ()]
            assert "look" in names and "peek" not in names
        model.release("hold again")
        await b.settled(started.child_id)


async def test_cold_resume_of_a_fork_seeded_child_uses_its_own_descriptor() -> None:
    """DSC-3, CONT-10: a grandchild seeded with its continuable parent's turns (whose seed
    holds the parent's descriptor) is cold-resumed with its own persona, never the parent's:
    the fold starts at the child's own suffix."""
    model = Model()
    async with boot(model, seeded=True) as b:
        mid = await b.start("first", persona="Mid persona.")
        await b.send(mid.child_id, "hold mid")
        mid_agent = b.manager.activations[mid.child_id].agent
        await b.until(lambda: model.held(mid_agent.id))
        grand = await b.svc.start_continuable(
            b.spec("grand first", parent=mid_agent, persona="Grand persona.")
        )
        grand_agent = b.host.ctx.agents.get(grand.child_id)
        assert grand_agent is not None
        header = grand_agent.session.header
        seed = grand_agent.session.events[: header.seed_length]
        assert [e.type for e in seed].count(DESCRIPTOR_EVENT) == 1  # the parent's
        await b.settled(grand.child_id)
        await b.send(grand.child_id, "hold grand", parent=mid_agent)
        await b.until(lambda: model.held(grand.child_id))
        request = [r for r in model.requests if r.session_id == grand.child_id][-1]
        assert "Grand persona." in request.system
        assert "Mid persona." not in request.system
        model.release("hold grand")
        await b.settled(grand.child_id)
        model.release("hold mid")
        await b.settled(mid.child_id)


async def test_a_drained_waiting_child_holding_a_quiet_report_ends_aborted() -> None:
    """CONT-14 step 1, CONT-15: the teardown cancel drops the inbox: a waiting child (its turn
    answered, its own child still resident) holding an unclaimed quiet report ends aborted
    (work dropped unrun), not completed."""
    model = Model()
    async with boot(model) as b:
        started = await b.start("hold child")
        act = b.manager.activations[started.child_id]
        child = act.agent
        grand = await b.svc.start_continuable(b.spec("hold grand", parent=child))
        model.release("hold child")
        await b.until(lambda: child.status == "idle")
        grand_agent = b.host.ctx.agents.get(grand.child_id)
        assert grand_agent is not None
        await b.svc.report_from(
            grand_agent, text_blocks("progress"), SubagentReportOptions(delivery="quiet")
        )
        assert kinds(child.inbox.next_step) == ["subagent-report"]
        assert residency(act) == "waiting"
        async with asyncio.timeout(5):
            await b.manager.drain()
        ends = {e.id: e.stop_reason for e in b.ends()}
        assert ends == {grand.child_id: "aborted", started.child_id: "aborted"}
        canceled = [
            e.seq
            for e in child.session.events
            if e.type == "agent/inbox/spliced" and e.data.outcome == "canceled"
        ]
        assert canceled, "the teardown cancel dropped the unclaimed report"


async def test_the_drain_waits_for_a_creation_in_flight() -> None:
    """DRN-1: the manager-wide drain awaits a creation admitted before it began (held in its
    reserved-id check): that start is rejected DRAINING and its child is disposed before the
    drain resolves."""
    async with boot() as b:
        persistence = b.host.ctx.session_persistence
        stored = persistence.stored
        entered = asyncio.Event()
        gate = asyncio.Event()

        async def held_stored(id: str, signal: Any = None) -> bool:
            entered.set()
            await gate.wait()
            return await stored(id, signal)

        persistence.stored = held_stored
        order: list[str] = []
        for name in ("agent/created", "agent/disposed"):
            b.host.ctx.on(
                name, lambda agent, name=name: order.append(f"{name.split('/')[1]} {agent.id}")
            )

        async def draining() -> None:
            await b.manager.drain()
            order.append("drained")

        start = asyncio.ensure_future(b.start(child_id="session-x"))
        async with asyncio.timeout(5):
            await entered.wait()
        assert len(b.manager.materializations) == 1
        drain = asyncio.ensure_future(draining())  # runs before the creation goes on
        gate.set()
        async with asyncio.timeout(5):
            with pytest.raises(SubagentError) as caught:
                await start
            await drain
        del persistence.stored
        assert caught.value.code == "DRAINING"
        assert order == ["created session-x", "disposed session-x", "drained"]
        assert not live(b, "session-x")


async def test_discarding_an_interrupted_childs_parked_message_settles_it() -> None:
    """CONT-5, CONT-6: an interrupted idle child whose only parked follow-up is discarded
    leaves running (accepted is empty) and settles at once, with no further status change."""
    model = Model()
    async with boot(model) as b:
        started = await b.start("hold first")
        act = b.manager.activations[started.child_id]
        child = act.agent
        await b.until(lambda: model.held(child.id))
        parked = await b.send(started.child_id, "parked")
        b.svc.interrupt(started.child_id, UserInterruptAuthority(parent_session_id=b.parent.id))
        await b.until(lambda: child.status == "idle")
        assert act.accepted == {parked} and residency(act) == "running"
        assert b.manager.activations.get(started.child_id) is act
        assert child.inbox.remove(parked) is not None
        await b.settled(started.child_id)
        assert [e.stop_reason for e in b.ends()] == ["aborted"]
        assert not live(b, started.child_id)


async def test_continuable_epochs_are_dispatched_on_the_parents_scope() -> None:
    """CONT-4, CONT-15: subagent/start and subagent/end of every continuable epoch (fresh and
    cold-resumed) are dispatched scoped to the delegating parent: a listener registered from
    the parent's context hears them, one from another agent's context does not."""
    async with boot() as b:
        heard: list[tuple[str, str]] = []
        elsewhere: list[str] = []
        other = (await b.host.create_agent()).agent
        for name in ("subagent/start", "subagent/end"):
            b.parent.ctx.on(name, lambda info, name=name: heard.append((name, info.id)))
            other.ctx.on(name, lambda info: elsewhere.append(info.id))
        started = await b.start()
        await b.settled(started.child_id)
        await b.send(started.child_id, "again")
        await b.settled(started.child_id)
        child = started.child_id
        assert heard == [("subagent/start", child), ("subagent/end", child)] * 2
        assert elsewhere == []


_NO_SUCH_OPERATION = ("residency", "cancel", "kill", "steer", "resume", "result")


def _public(obj: object) -> list[str]:
    return [n for n in dir(obj) if not n.startswith("_")]


async def test_the_service_offers_no_residency_cancel_steer_resume_or_result() -> None:
    """CONT-17: the service has no public residency query, cancel, kill, steer, resume or
    report-as-result operation (its only report is report_from, a message to the parent); a
    continuable start hands out only ids; a one-shot run has no steer."""
    async with boot() as b:
        names = _public(b.svc)
        assert [n for n in names if any(w in n for w in _NO_SUCH_OPERATION)] == []
        assert [n for n in names if "report" in n] == ["report_from"]
        started = await b.start()
        assert _public(started) == ["child_id", "message_id"]
        await b.settled(started.child_id)
        run = await b.svc.start(
            "local", SubagentStartRequest(prompt=text_blocks("one shot"), parent=b.parent)
        )
        assert not hasattr(run, "steer")
        assert [n for n in _public(run) if n not in ("result",)] == ["dispose", "id", "local_agent"]
        await run.result
        await run.dispose()


# -- the slow tier (nox -s thorough) --------------------------------------------------------------

SOAK_CHILDREN = int(os.environ.get("DSH_SOAK_CHILDREN", "120"))
SOAK_ROUNDS = int(os.environ.get("DSH_SOAK_ROUNDS", "4"))


@pytest.mark.thorough
@pytest.mark.parametrize("store", ["memory", "jsonl"])
async def test_soak_many_continuable_children_through_many_epochs(
    store: str, tmp_path: Path
) -> None:
    """CONT-4..7, CONT-10, CONT-14, SET-1, DRN-1 (soak): many continuable children of one
    parent, started together and followed up round after round, each round mixing follow-ups
    that join a running epoch with ones that cold-resume a settled child: every epoch ends
    completed with its own answer, the parent gets one notice per epoch, and at the end (after
    a drain) no child agent, Activation, lock, materialization or host task is left. The run
    tree's cap is raised to hold them all (the cap has its own tests, test_limits.py)."""
    model = Model()
    async with boot(model, store=store, store_root=tmp_path, tree_cap=SOAK_CHILDREN) as b:
        manager = b.manager
        async with asyncio.timeout(60):
            started = await asyncio.gather(
                *(b.start(f"hold c{i} r0") for i in range(SOAK_CHILDREN))
            )
        ids = [s.child_id for s in started]
        await b.until(lambda: all(model.held(i) for i in ids))
        for round_ in range(1, SOAK_ROUNDS + 1):
            # Half join their running epoch, then every held request is let go.
            joining = ids[round_ % 2 :: 2]
            async with asyncio.timeout(60):
                await asyncio.gather(*(b.send(i, f"join {i} r{round_}") for i in joining))
            for i in range(SOAK_CHILDREN):
                model.release(f"hold c{i} r{round_ - 1}")
            async with asyncio.timeout(60):
                for child_id in ids:
                    await b.settled(child_id)
            # Then every settled child is cold-resumed into a new held epoch.
            async with asyncio.timeout(60):
                await asyncio.gather(
                    *(b.send(child_id, f"hold c{i} r{round_}") for i, child_id in enumerate(ids))
                )
            await b.until(lambda: all(i in manager.activations for i in ids))
        for i in range(SOAK_CHILDREN):
            model.release(f"hold c{i} r{SOAK_ROUNDS}")
        async with asyncio.timeout(60):
            for child_id in ids:
                await b.settled(child_id)
            await b.parent.when_idle()
        ends = b.ends()
        assert len(ends) == SOAK_CHILDREN * (SOAK_ROUNDS + 1)
        assert {e.stop_reason for e in ends} == {"completed"}
        assert len({e.run_id for e in ends}) == len(ends)
        per_child = {i: [e for e in ends if e.id == i] for i in ids}
        for n, child_id in enumerate(ids):
            last = [blocks_text(e.last_assistant_message) for e in per_child[child_id]]
            assert last[-1] == f"held: hold c{n} r{SOAK_ROUNDS}"
        assert len(notices_of(b.parent)) == len(ends)
        async with asyncio.timeout(60):
            await manager.drain()
            await b.host.ctx.host.drain_tasks()
        assert manager.activations == {} and manager.retiring == {}
        assert manager.materializations == set() and manager._locks == {}
        assert b.host.ctx.agents.list() == [b.parent]
        assert b.host.ctx.host.tasks == set()
