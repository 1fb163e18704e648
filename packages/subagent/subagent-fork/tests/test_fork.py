"""The ``fork`` provider: a child seeded with the parent's completed turns (FORK-1, DRV-7)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import attrs

import dsh_subagent.plugin
import dsh_subagent_fork.plugin
from dsh_core import (
    AbortController,
    Agent,
    ToolDefinition,
    ToolRunContext,
    blocks_text,
    check_balanced,
    text_blocks,
)
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
    ContinuableStartSpec,
    CoordinatorMessageSource,
    SubagentCapabilities,
    SubagentFollowupOptions,
    SubagentResult,
    SubagentRun,
    SubagentService,
    SubagentStartRequest,
)
from dsh_subagent_fork import ForkProvider

MODULES = {"subagent": dsh_subagent.plugin, "subagent-fork": dsh_subagent_fork.plugin}


def model(request: ScriptedRequest) -> ScriptedReply | str:
    text = request.last_user_text
    if text == "parent: delegate now" and request.last_tool_result is None:
        return ScriptedReply(tool_calls=(ScriptedToolCall(name="delegate"),))
    if request.last_tool_result is not None:
        return "parent got: " + request.last_tool_result
    if text == "child: stay silent":
        return ""
    if text.startswith("child"):
        seen = [
            m.text
            for m in request.messages
            if m.role == "user" and m.source.kind != "plugin"  # not the delegation statement
        ]
        return "child saw " + " | ".join(seen)
    return "PARENT ANSWER to " + text


@attrs.define
class Booted:
    host: TestHost
    parent: Agent
    runs: list[tuple[SubagentRun, SubagentResult, list[str]]] = attrs.Factory(list)

    @property
    def svc(self) -> SubagentService:
        return self.parent.ctx[SUBAGENTS]

    def request(self, prompt: str, parent: Agent | None = None) -> SubagentStartRequest:
        return SubagentStartRequest(
            prompt=text_blocks(prompt),
            parent=parent or self.parent,
            signal=AbortController().signal,
        )

    async def fork(self, prompt: str) -> SubagentRun:
        return await self.svc.start("fork", self.request(prompt))


@contextlib.asynccontextmanager
async def boot() -> AsyncIterator[Booted]:
    async with scripted_host("subagent", "subagent-fork", model=model, modules=MODULES) as host:
        parent = (await host.create_agent()).agent
        booted = Booted(host=host, parent=parent)

        async def delegate(arguments: Any, run: ToolRunContext) -> str:
            """Fork from inside the parent's in-flight turn."""
            assert run.agent is not None
            child = await run.agent.ctx[SUBAGENTS].start(
                "fork", booted.request("child: from inside the turn", parent=run.agent)
            )
            result = await child.result
            assert child.local_agent is not None
            booted.runs.append((child, result, [e.type for e in run.agent.session.events]))
            await child.dispose()
            return blocks_text(result.output)

        host.ctx.tools.register(
            ToolDefinition(name="delegate", description="Fork a child.", execute=delegate)
        )
        yield booted


def last_turn_end(agent: Agent) -> int:
    return max(e.seq for e in agent.session.events if e.type == "turn/end")


async def test_fork_provider_shape() -> None:
    """FORK-1: fork is registered as 'fork' with every start capability and inherits the
    parent's context."""
    async with boot() as b:
        provider = b.svc.get_provider("fork")
        assert isinstance(provider, ForkProvider)
        assert provider.inherits_parent_context is True
        assert provider.capabilities == SubagentCapabilities(
            output_schema=True, depth_limit=True, tool_filter=True, persona=True
        )


async def test_seed_is_the_completed_turn_prefix() -> None:
    """FORK-1: the seed is the parent's events from seq 0 through its last turn/end inclusive;
    the child header's seed_length is that length and the seed replays balanced."""
    async with boot() as b:
        await b.host.run(b.parent, "first")
        await b.host.run(b.parent, "second")
        prefix = b.parent.session.events[: last_turn_end(b.parent) + 1]
        run = await b.fork("child: what do you know?")
        child = run.local_agent
        assert child is not None
        assert child.session.header.seed_length == len(prefix)
        seeded = child.session.events[: len(prefix)]
        assert [(e.seq, e.type, e.data) for e in seeded] == [
            (e.seq, e.type, e.data) for e in prefix
        ]
        check_balanced(seeded)
        result = await run.result
        assert "first" in blocks_text(result.output) and "second" in blocks_text(result.output)
        await run.dispose()


async def test_in_flight_turn_is_excluded() -> None:
    """FORK-1: a fork started inside the parent's running turn gets only the completed turns;
    the in-flight turn (its turn/start and later) is not in the seed."""
    async with boot() as b:
        await b.host.run(b.parent, "earlier")
        completed = last_turn_end(b.parent) + 1
        answer = await b.host.run(b.parent, "parent: delegate now")
        (child_run, result, parent_types_then) = b.runs[0]
        child = child_run.local_agent
        assert child is not None
        assert child.session.header.seed_length == completed
        assert child.session.events[completed - 1].type == "turn/end"
        assert "turn/start" in parent_types_then[completed:]  # the in-flight turn, cut off
        own = [e.data.text for e in child.session.events if e.type == "user/message"]
        assert "parent: delegate now" not in own
        assert "earlier" in blocks_text(result.output)
        assert "delegate now" not in blocks_text(result.output)
        assert answer.startswith("parent got: child saw")


async def test_no_completed_turn_means_no_seed() -> None:
    """FORK-1: with no completed parent turn there is no seed at all (seed_length unset)."""
    async with boot() as b:
        run = await b.fork("child: alone")
        child = run.local_agent
        assert child is not None
        assert child.session.header.seed_length is None
        assert child.session.first_live_seq == 0
        result = await run.result
        assert blocks_text(result.output) == "child saw child: alone"
        await run.dispose()


async def test_turn_numbering_continues_after_the_seed() -> None:
    """DSC-5, FORK-1: the child's first turn continues the seeded numbering (two inherited
    turns -> its turn is 3) and its descriptor sits in its own suffix."""
    async with boot() as b:
        await b.host.run(b.parent, "one")
        await b.host.run(b.parent, "two")
        run = await b.fork("child: count")
        await run.result
        child = run.local_agent
        assert child is not None
        seed_length = child.session.header.seed_length
        assert seed_length is not None
        own = child.session.events[seed_length:]
        assert [e.data.turn for e in own if e.type == "turn/start"] == [3]
        assert [e.type for e in own].count(DESCRIPTOR_EVENT) == 1
        assert DESCRIPTOR_EVENT not in [e.type for e in child.session.events[:seed_length]]
        await run.dispose()


async def test_empty_forked_turn_reports_nothing_inherited() -> None:
    """DRV-7: a forked child with an empty turn reports [], never the parent's seeded answer."""
    async with boot() as b:
        assert (await b.host.run(b.parent, "hi")).startswith("PARENT ANSWER")
        run = await b.fork("child: stay silent")
        result = await run.result
        assert result.output == ()
        assert result.stop_reason == "completed"
        await run.dispose()


async def test_prepare_continuable_captures_the_prefix_once() -> None:
    """FORK-1: prepare_continuable returns the completed prefix (or no seed without a completed
    turn), captured at the call: later parent turns do not change it."""
    async with boot() as b:
        provider = b.svc.get_provider("fork")
        assert isinstance(provider, ForkProvider)

        def request() -> ContinuableCreateRequest:
            return ContinuableCreateRequest(
                session_id="reserved", parent=b.parent, signal=AbortController().signal
            )

        assert (await provider.prepare_continuable(request())).seed is None
        await b.host.run(b.parent, "one")
        spec = await provider.prepare_continuable(request())
        assert spec.seed is not None
        length = len(spec.seed)
        assert length == last_turn_end(b.parent) + 1
        await b.host.run(b.parent, "two")
        assert len(spec.seed) == length
        assert spec.seed[-1].type == "turn/end"


async def settled(b: Booted, child_id: str) -> None:
    """Wait (bounded) until continuable child ``child_id`` has no Activation left."""
    manager = b.svc._state.continuation
    async with asyncio.timeout(5):
        while child_id in manager.activations or child_id in manager.retiring:
            child = b.host.ctx.agents.get(child_id)
            if child is not None and child.status == "running":
                await child.when_idle()
                continue
            pending = [t for t in b.host.ctx.host.tasks if not t.done()]
            assert pending, "a resident child that neither runs nor is being disposed"
            await asyncio.wait(pending)


async def test_continuable_fork_end_to_end() -> None:
    """FORK-1, DSC-5, CONT-10: a continuable fork child sees the parent's completed turns;
    seed_length is the prefix alone, the descriptor sits in the child's own suffix, turn
    numbering continues after the inherited turn, the parent hears its settlement, and a
    follow-up cold-resumes it without re-seeding."""
    async with boot() as b:
        await b.host.run(b.parent, "first")
        prefix_length = last_turn_end(b.parent) + 1
        started = await b.svc.start_continuable(
            ContinuableStartSpec(
                provider="fork",
                label="forked helper",
                prompt=text_blocks("child: what do you know?"),
                parent=b.parent,
            )
        )
        child = b.host.ctx.agents.get(started.child_id)
        assert child is not None
        assert child.session.header.seed_length == prefix_length
        own = child.session.events[prefix_length:]
        assert [e.type for e in own].count(DESCRIPTOR_EVENT) == 1
        await settled(b, started.child_id)
        events = child.session.events
        assert [e.data.turn for e in events if e.type == "turn/start"] == [1, 2]
        answers = [m.text for m in child.session.derive_messages() if m.role == "assistant"]
        assert answers[-1] == "child saw first | child: what do you know?"
        await b.parent.when_idle()
        notices = [
            m for m in b.parent.session.derive_messages() if m.source.kind == "subagent-settled"
        ]
        assert len(notices) == 1
        await b.svc.followup(
            b.parent,
            started.child_id,
            text_blocks("child: and now?"),
            SubagentFollowupOptions(source=CoordinatorMessageSource(sender_session_id=b.parent.id)),
        )
        resumed = b.host.ctx.agents.get(started.child_id)
        assert resumed is not None and resumed is not child
        await settled(b, started.child_id)
        events = resumed.session.events
        assert [e.data.turn for e in events if e.type == "turn/start"] == [1, 2, 3]
        assert [e.type for e in events].count(DESCRIPTOR_EVENT) == 1  # never a second one
        assert check_balanced(events) is None
