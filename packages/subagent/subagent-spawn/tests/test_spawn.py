"""The ``spawn`` provider: a fresh in-process child (DRV-1, DRV-9, SVC-4, SVC-12, STR)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest

import dsh_subagent.plugin
import dsh_subagent_spawn.plugin
from dsh_core import AbortController, Agent, Context, blocks_text, text_blocks, thaw_json
from dsh_core.testing import (
    ScriptedReply,
    ScriptedRequest,
    ScriptedToolCall,
    TestHost,
    scripted_host,
)
from dsh_subagent import (
    DESCRIPTOR_EVENT,
    SUBAGENTS,
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ContinuableStartSpec,
    CoordinatorMessageSource,
    SubagentCapabilities,
    SubagentError,
    SubagentFollowupOptions,
    SubagentRun,
    SubagentService,
    SubagentStartRequest,
)
from dsh_subagent.in_process import DELEGATION_STATEMENT
from dsh_subagent_spawn import SpawnProvider

MODULES = {"subagent": dsh_subagent.plugin, "subagent-spawn": dsh_subagent_spawn.plugin}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def make_model(gates: dict[str, asyncio.Event]) -> Any:
    """Children prompted "hold..." stream then wait at their gate (or until aborted)."""

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        text = request.last_user_text
        if text.startswith("hold"):
            return ScriptedReply(text="working", wait=gates.get(text, asyncio.Event()).wait)
        if text == "structured please":
            return ScriptedReply(
                tool_calls=(ScriptedToolCall(name="structured_output", arguments={"n": 7}),)
            )
        return "spawned answer: " + text

    return model


@attrs.define
class Booted:
    host: TestHost
    parent: Agent
    events: list[str]

    @property
    def svc(self) -> SubagentService:
        return self.parent.ctx[SUBAGENTS]

    def request(self, prompt: str, **changes: Any) -> SubagentStartRequest:
        return SubagentStartRequest(
            prompt=text_blocks(prompt),
            parent=self.parent,
            signal=changes.pop("signal", None) or AbortController().signal,
            **changes,
        )

    async def start(self, prompt: str, **changes: Any) -> SubagentRun:
        return await self.svc.start("spawn", self.request(prompt, **changes))

    def plugin_context(self, name: str) -> Context:
        (ctx,) = [c for n, c in self.host.runtime.mounted if n == name]
        return ctx

    def counts(self) -> tuple[int, int]:
        return len(self.host.ctx.agents.list()), len(self.host.ctx.sessions.list())


@contextlib.asynccontextmanager
async def boot(
    config: dict[str, Any] | None = None, gates: dict[str, asyncio.Event] | None = None
) -> AsyncIterator[Booted]:
    async with scripted_host(
        "subagent",
        "subagent-spawn",
        model=make_model(gates or {}),
        modules=MODULES,
        config={"subagent-spawn": config} if config else None,
    ) as host:
        events: list[str] = []
        for name in ("session/created", "agent/created", "subagent/start", "subagent/end"):
            host.ctx.on(name, lambda *args, _n=name: events.append(_n))
        for name in ("subagent/provider-added", "subagent/provider-removed"):
            host.ctx.on(name, lambda *args, _n=name: events.append(_n))
        parent = (await host.create_agent()).agent
        yield Booted(host=host, parent=parent, events=events)


async def test_spawn_provider_shape() -> None:
    """DRV: spawn is registered as 'spawn' with every start capability and no inherited
    context; prepare_continuable returns an empty spec (a fresh session)."""
    async with boot() as b:
        provider = b.svc.get_provider("spawn")
        assert isinstance(provider, SpawnProvider)
        assert provider.capabilities == SubagentCapabilities(
            output_schema=True, depth_limit=True, tool_filter=True, persona=True
        )
        assert provider.inherits_parent_context is False
        await b.host.run(b.parent, "parent turn")
        spec = await provider.prepare_continuable(
            ContinuableCreateRequest(
                session_id="reserved", parent=b.parent, signal=AbortController().signal
            )
        )
        assert spec == ContinuableCreateSpec()
        assert spec.seed is None


async def test_provider_name_is_configurable() -> None:
    """DRV: the provider_name config renames the registered provider."""
    async with boot({"provider_name": "fresh"}) as b:
        assert b.svc.list() == ["fresh"]
        run = await b.svc.start("fresh", b.request("hello"))
        assert (await run.result).stop_reason == "completed"
        await run.dispose()


async def test_spawned_child_sees_nothing_of_the_parent() -> None:
    """DRV-1: a spawned child is published with its own session; its log holds nothing from
    the parent before its prompt, and its model request carries only its own prompt."""
    async with boot() as b:
        await b.host.run(b.parent, "PARENT SECRET")
        run = await b.start("child task")
        child = run.local_agent
        assert child is not None
        assert b.host.ctx.agents.get(run.id) is child
        assert child.session.header.parent_session == b.parent.id
        assert child.session.header.seed_length is None
        result = await run.result
        assert blocks_text(result.output) == "spawned answer: child task"
        users = [e.data.text for e in child.session.events if e.type == "user/message"]
        assert not any("PARENT SECRET" in text for text in users)
        assert users == ["child task", DELEGATION_STATEMENT]  # prompt, then the snapshot
        (request,) = [r for r in b.host.model.requests if r.session_id == child.id]
        assert not any("PARENT SECRET" in m.text for m in request.messages)
        assert [e.type for e in child.session.events].count(DESCRIPTOR_EVENT) == 1
        await run.dispose()
        assert b.host.ctx.agents.get(run.id) is None


async def test_start_after_unmount_attempts_nothing() -> None:
    """SVC-4: after subagent-spawn is unmounted, a start rejects with NO_PROVIDER: no child
    creation is attempted and no publication event fires."""
    async with boot() as b:
        await b.plugin_context("subagent-spawn").dispose()
        assert b.events[-1] == "subagent/provider-removed"
        before, seen = b.counts(), len(b.events)
        with pytest.raises(SubagentError) as caught:
            await b.start("hello")
        assert caught.value.code == "NO_PROVIDER"
        assert b.counts() == before
        assert b.events[seen:] == []


async def test_start_racing_the_unmount() -> None:
    """SVC-4: a start scheduled in the same tick as an unmount that lands first rejects with
    NO_PROVIDER and creates nothing."""
    async with boot() as b:
        before, seen = b.counts(), len(b.events)
        unmount = asyncio.ensure_future(b.plugin_context("subagent-spawn").dispose())
        pending = asyncio.ensure_future(b.start("hello"))
        with pytest.raises(SubagentError) as caught:
            await pending
        await unmount
        assert caught.value.code == "NO_PROVIDER"
        assert b.counts() == before
        assert b.events[seen:] == ["subagent/provider-removed"]


async def test_unmount_mid_run_keeps_the_run() -> None:
    """DRV-9, SVC-12: unmounting spawn mid-run blocks new starts but the published run keeps
    going and completes; its end still names 'spawn'; another run can still be aborted."""
    gate = asyncio.Event()
    async with boot(gates={"hold spawn": gate}) as b:
        ended: list[Any] = []
        done = asyncio.Event()

        def on_end(info: Any) -> None:
            ended.append(info)
            if len(ended) == 2:
                done.set()

        b.host.ctx.on("subagent/end", on_end)
        controller = AbortController()
        kept = await b.start("hold spawn")
        abortable = await b.start("hold other", signal=controller.signal)
        await b.plugin_context("subagent-spawn").dispose()
        with pytest.raises(SubagentError):
            await b.start("hello")
        assert not kept.result.done()
        gate.set()
        assert (await kept.result).stop_reason == "completed"
        controller.abort("stop")
        assert (await abortable.result).stop_reason == "aborted"
        await asyncio.wait_for(done.wait(), 5)
        assert {info.provider for info in ended} == {"spawn"}
        await kept.dispose()
        await abortable.dispose()


async def test_structured_output_through_spawn() -> None:
    """STR-2: a spawned child's structured_output capture is the run's structured result, and
    the tool goes away with the child."""
    async with boot() as b:
        run = await b.start("structured please", output_schema=SCHEMA)
        result = await run.result
        assert (result.stop_reason, thaw_json(result.structured)) == ("completed", {"n": 7})
        child = run.local_agent
        assert child is not None
        scope = child.ctx.scope
        await run.dispose()
        assert b.host.ctx.tools.get("structured_output", scope=scope) is None


async def test_continuable_spawn_end_to_end() -> None:
    """CONT-2, DSC-5, CONT-10: a continuable spawn child starts fresh (no seed, no seed_length,
    turn 1), settles, and after the spawn plugin unloads a follow-up still cold-resumes it;
    both epochs report provider spawn."""
    async with boot() as b:
        ends: list[Any] = []
        b.host.ctx.on("subagent/end", ends.append)
        await b.host.run(b.parent, "parent turn")
        started = await b.svc.start_continuable(
            ContinuableStartSpec(
                provider="spawn", label="helper", prompt=text_blocks("fresh"), parent=b.parent
            )
        )
        child = b.host.ctx.agents.get(started.child_id)
        assert child is not None
        assert child.session.header.seed_length is None
        manager = b.svc._state.continuation

        async def settled() -> None:
            async with asyncio.timeout(5):
                while started.child_id in manager.activations or started.child_id in (
                    manager.retiring
                ):
                    agent = b.host.ctx.agents.get(started.child_id)
                    if agent is not None and agent.status == "running":
                        await agent.when_idle()
                        continue
                    pending = [t for t in b.host.ctx.host.tasks if not t.done()]
                    assert pending
                    await asyncio.wait(pending)

        await settled()
        assert [e.data.turn for e in child.session.events if e.type == "turn/start"] == [1]
        users = [m.text for m in child.session.derive_messages() if m.role == "user"]
        assert "parent turn" not in users
        await b.plugin_context("subagent-spawn").dispose()
        assert b.svc.get_provider("spawn") is None
        await b.svc.followup(
            b.parent,
            started.child_id,
            text_blocks("again"),
            SubagentFollowupOptions(source=CoordinatorMessageSource(sender_session_id=b.parent.id)),
        )
        await settled()
        assert [(e.provider, e.stop_reason) for e in ends] == [
            ("spawn", "completed"),
            ("spawn", "completed"),
        ]
