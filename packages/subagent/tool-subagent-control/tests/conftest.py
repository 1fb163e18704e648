"""The harness of these tests: a scripted host with ``subagent``, both tool plugins (or one),
an in-process test provider that makes continuable children, and a root parent agent.

The provider is the in-process driver of ``dsh-subagent`` itself (what ``spawn`` is), so the
tests need no distribution beyond this one's declared dependencies.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest

import dsh_subagent.plugin
import dsh_tool_subagent_control.list_agents_plugin
import dsh_tool_subagent_control.plugin
from dsh_core import (
    AbortController,
    AbortSignal,
    Agent,
    ToolExecutionInput,
    ToolExecutionResult,
    blocks_text,
    text_blocks,
)
from dsh_core.testing import ScriptedReply, ScriptedRequest, TestHost, scripted_host
from dsh_subagent import (
    NO_START_CAPABILITIES,
    SUBAGENTS,
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ContinuableStartSpec,
    ResolvedSubagentStartRequest,
    SubagentCapabilities,
    SubagentRun,
    SubagentRunEndInfo,
    SubagentService,
    SubagentStartRequest,
)
from dsh_subagent.in_process import DELEGATION_STATEMENT, start_in_process_run

MODULES = {
    "subagent": dsh_subagent.plugin,
    "tool-subagent-control": dsh_tool_subagent_control.plugin,
    "tool-subagent-list-agents": dsh_tool_subagent_control.list_agents_plugin,
}
BOTH = ("tool-subagent-control", "tool-subagent-list-agents")
BOUND = 10


@attrs.frozen
class LocalProvider:
    """A provider making fresh in-process children, one-shot or continuable."""

    name: str = "local"
    capabilities: SubagentCapabilities = NO_START_CAPABILITIES
    inherits_parent_context: bool = False

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        return await start_in_process_run(request)

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        return ContinuableCreateSpec()


class Model:
    """Prompts starting ``hold`` stream, then wait for their gate (``release``) or an abort;
    a parent's requests answer from ``parent_replies`` while any are left; anything else is
    answered ``answer: <prompt>``."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.parent_id: str | None = None
        self.parent_replies: list[ScriptedReply | str] = []
        self.requests: list[ScriptedRequest] = []
        self.changed: asyncio.Event | None = None

    def release(self, text: str) -> None:
        self.gates.setdefault(text, asyncio.Event()).set()

    def __call__(self, request: ScriptedRequest) -> ScriptedReply | str:
        self.requests.append(request)
        if self.changed is not None:
            self.changed.set()
        if request.session_id == self.parent_id and self.parent_replies:
            return self.parent_replies.pop(0)
        text = request.last_user_text
        if text.startswith("hold"):
            gate = self.gates.setdefault(text, asyncio.Event())
            return ScriptedReply(text="held: " + text, wait=gate.wait)
        return "answer: " + text


@attrs.define
class Booted:
    """A booted host, its model, a root parent agent, and what the seam announced."""

    host: TestHost
    model: Model
    parent: Agent
    ends: list[SubagentRunEndInfo]
    changed: asyncio.Event

    @property
    def svc(self) -> SubagentService:
        return self.parent.ctx[SUBAGENTS]

    async def start(
        self, prompt: str, *, label: str = "helper", parent: Agent | None = None
    ) -> str:
        """Start a continuable child of ``parent`` (default: the root); its id."""
        started = await self.svc.start_continuable(
            ContinuableStartSpec(
                provider="local",
                label=label,
                prompt=text_blocks(prompt),
                parent=parent or self.parent,
            )
        )
        return started.child_id

    async def start_one_shot(self, prompt: str, *, parent: Agent | None = None) -> SubagentRun:
        """Start a one-shot child of ``parent`` (default: the root)."""
        return await self.svc.start(
            "local",
            SubagentStartRequest(prompt=text_blocks(prompt), parent=parent or self.parent),
        )

    def agent(self, agent_id: str) -> Agent:
        found = self.host.ctx.agents.get(agent_id)
        assert found is not None, f"{agent_id} is not live"
        return found

    async def call(
        self,
        name: str,
        arguments: Any,
        *,
        agent: Agent | None = ...,  # type: ignore[assignment]
        signal: AbortSignal | None = None,
    ) -> ToolExecutionResult:
        """Execute tool ``name`` through the real registry as ``agent`` (default: the root)."""
        caller = self.parent if agent is ... else agent
        tools = caller.ctx.tools if caller is not None else self.host.ctx.tools
        return await tools.execute(
            ToolExecutionInput(
                call_id="call-1",
                name=name,
                arguments=arguments,
                signal=signal or AbortController().signal,
                agent=caller,
            )
        )

    async def until(self, check: Callable[[], bool]) -> None:
        """Wait (bounded) until ``check()`` holds, re-checked whenever a watched event fires."""
        async with asyncio.timeout(BOUND):
            while not check():
                self.changed.clear()
                await self.changed.wait()

    async def settled(self, child_id: str) -> None:
        """Wait until ``child_id``'s residency epoch has ended (``subagent/end``)."""
        await self.until(lambda: any(e.id == child_id for e in self.ends))
        self.ends[:] = [e for e in self.ends if e.id != child_id]

    async def asked(self, agent_id: str, prompt: str) -> Agent:
        """Wait until live ``agent_id`` is in a model request for ``prompt``; the agent."""
        await self.until(
            lambda: any(
                r.session_id == agent_id and r.last_user_text == prompt for r in self.model.requests
            )
        )
        return self.agent(agent_id)


def turn_ends(agent: Agent) -> list[str]:
    """The reasons of ``agent``'s ``turn/end`` events, in order."""
    return [e.data.reason.kind for e in agent.session.events if e.type == "turn/end"]


def text(result: ToolExecutionResult) -> str:
    return blocks_text(result.content)


def user_texts(agent: Agent) -> list[str]:
    """The texts of ``agent``'s user messages, without the delegation statement a resumed
    child is given."""
    texts = (blocks_text(m.content) for m in agent.session.derive_messages() if m.role == "user")
    return [t for t in texts if t != DELEGATION_STATEMENT]


@contextlib.asynccontextmanager
async def boot(
    plugins: Iterable[str] = BOTH,
    *,
    model: Model | None = None,
    store_root: Path | None = None,
    query: bool = True,
    config: dict[str, dict[str, Any]] | None = None,
) -> AsyncIterator[Booted]:
    """A host with ``subagent``, ``plugins``, the local provider and a root parent; sessions
    in memory, or as JSONL files under ``store_root``; ``query=False`` leaves out the
    ``session-query`` row; ``config`` is per-plugin config by plugin name."""
    model = model or Model()
    async with scripted_host(
        "subagent",
        *plugins,
        model=model,
        modules=MODULES,
        store="jsonl" if store_root is not None else "memory",
        store_root=store_root,
        query=query,
        config=config,
    ) as host:
        host.ctx.plugin("local-provider")[SUBAGENTS].register_provider(LocalProvider())
        handle = await host.create_agent()
        model.parent_id = handle.agent.id
        ends: list[SubagentRunEndInfo] = []
        changed = model.changed = asyncio.Event()

        def on_end(info: SubagentRunEndInfo) -> None:
            ends.append(info)
            changed.set()

        def on_any(*_: Any) -> None:
            changed.set()

        host.ctx.on("subagent/end", on_end)
        for name in (
            "agent/status",
            "agent/inbox/inserted",
            "agent/inbox/claimed",
            "agent/disposed",
        ):
            host.ctx.on(name, on_any)
        booted = Booted(host=host, model=model, parent=handle.agent, ends=ends, changed=changed)
        try:
            yield booted
        finally:
            for gate in model.gates.values():
                gate.set()


@pytest.fixture
def kit() -> SimpleNamespace:
    """This harness for a test module (conftest modules are not importable by name):
    ``kit.boot(...)``, ``kit.Model``, ``kit.text(result)``, ``kit.user_texts(agent)``."""
    return SimpleNamespace(
        boot=boot, Model=Model, text=text, user_texts=user_texts, turn_ends=turn_ends, BOTH=BOTH
    )
