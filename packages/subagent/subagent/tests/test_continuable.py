"""Continuable children through ``SubagentService``: start, residency, follow-ups, cold resume,
settlement notices and the manager-wide drain (CONT-1..17, SET-1..4, DRN-1, DSC-5).

The set-up: a host with ``subagent``, a test provider that can create continuable children
(``seeded`` gives them the parent's completed turns), a root parent agent, and a recorder of
the seam's events.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs

import dsh_subagent.plugin
from dsh_core import (
    AbortController,
    Agent,
    AgentOptions,
    Context,
    Message,
    text_blocks,
)
from dsh_core.testing import (
    ScriptedReply,
    ScriptedRequest,
    TestHost,
    default_options,
    scripted_host,
)
from dsh_subagent import (
    SUBAGENTS,
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ContinuableStart,
    ContinuableStartSpec,
    CoordinatorMessageSource,
    ResolvedSubagentStartRequest,
    SubagentCapabilities,
    SubagentFollowupOptions,
    SubagentRun,
    SubagentService,
)
from dsh_subagent._continuation import ContinuationManager
from dsh_subagent.in_process import completed_turn_prefix, start_in_process_run

Script = Callable[[ScriptedRequest], "ScriptedReply | str | Awaitable[ScriptedReply | str]"]
ALL = SubagentCapabilities(output_schema=True, depth_limit=True, tool_filter=True, persona=True)
WATCHED = (
    "session/created",
    "agent/created",
    "agent/disposed",
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
) -> AsyncIterator[Booted]:
    """A host with ``subagent``, the local provider and a root parent agent."""
    async with scripted_host(
        "subagent",
        model=model,
        modules={"subagent": dsh_subagent.plugin},
        store=store,
        store_root=store_root,
    ) as host:
        owner = host.ctx.plugin("local-provider")
        owner[SUBAGENTS].register_provider(LocalProvider(seeded=seeded))
        parent = (
            await host.create_agent(
                options=parent_options or default_options(), session_id=parent_id
            )
        ).agent
        events: list[tuple[str, Any]] = []
        changed = asyncio.Event()

        def record(name: str) -> Callable[..., None]:
            def on(*args: Any) -> None:
                events.append((name, args))
                changed.set()

            return on

        for name in WATCHED:
            host.ctx.on(name, record(name))
        yield Booted(host=host, parent=parent, provider_owner=owner, events=events, changed=changed)


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
