"""The shared in-process one-shot driver, through a tiny test provider (DRV, DEP, DSC-4, OUT-1,
STR, BUG-1, BUG-3).

The provider here calls ``dsh_subagent.in_process.start_in_process_run`` directly (optionally
seeded with the parent's completed turns), so this distribution's tests need no sibling.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    AgentOptions,
    Context,
    ContextError,
    LlmFailure,
    PreStep,
    PreStepDecision,
    PromptContext,
    PromptSection,
    SessionMeta,
    TextBlock,
    TokenUsage,
    ToolDefinition,
    ToolError,
    ToolExecutionInput,
    ToolExecutionResult,
    ToolFailure,
    ToolRestriction,
    ToolRunContext,
    blocks_text,
    text_blocks,
    thaw_json,
    user_message,
)
from dsh_core.testing import (
    ScriptedReply,
    ScriptedRequest,
    ScriptedToolCall,
    TestHost,
    default_options,
    scripted_host,
)
from dsh_subagent import (
    DESCRIPTOR_EVENT,
    SUBAGENT_DEPTH_KEY,
    SUBAGENTS,
    DescriptorError,
    ResolvedSubagentStartRequest,
    SubagentCapabilities,
    SubagentDepthError,
    SubagentResult,
    SubagentRun,
    SubagentRunEndInfo,
    SubagentRunInfo,
    SubagentService,
    SubagentStartRequest,
)
from dsh_subagent.in_process import completed_turn_prefix, start_in_process_run

ALL = SubagentCapabilities(output_schema=True, depth_limit=True, tool_filter=True, persona=True)
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}
GUIDANCE = "call the structured_output tool exactly once"
ABORTED_BEFORE = "subagent request was aborted before child publication"
WATCHED = (
    "session/created",
    "agent/created",
    "agent/session-start",
    "subagent/start",
    "subagent/end",
)
Script = Callable[[ScriptedRequest], "ScriptedReply | str | Awaitable[ScriptedReply | str]"]


@attrs.frozen
class LocalProvider:
    """A test provider over the shared driver; ``seeded`` forks the parent's completed turns."""

    name: str = "local"
    capabilities: SubagentCapabilities = ALL
    inherits_parent_context: bool = False
    seeded: bool = False

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        seed = completed_turn_prefix(request.parent) if self.seeded else None
        return await start_in_process_run(request, seed=seed)


@attrs.define
class Booted:
    host: TestHost
    parent: Agent
    provider_owner: Context
    events: list[tuple[str, Any]]
    ended: asyncio.Event

    async def ends(self, count: int = 1) -> list[SubagentRunEndInfo]:
        """The subagent/end payloads, once (bounded) at least ``count`` were observed."""
        async with asyncio.timeout(5):
            while len(self.named("subagent/end")) < count:
                self.ended.clear()
                await self.ended.wait()
        return [args[0] for _, args in self.named("subagent/end")]

    @property
    def svc(self) -> SubagentService:
        return self.parent.ctx[SUBAGENTS]

    def request(self, prompt: str = "child: hello", **changes: Any) -> SubagentStartRequest:
        fields: dict[str, Any] = {
            "prompt": text_blocks(prompt),
            "parent": self.parent,
            "signal": AbortController().signal,
        }
        fields.update(changes)
        return SubagentStartRequest(**fields)

    async def start(self, prompt: str = "child: hello", **changes: Any) -> SubagentRun:
        return await self.svc.start("local", self.request(prompt, **changes))

    def requests_of(self, agent_id: str) -> list[Any]:
        return [r for r in self.host.model.requests if r.session_id == agent_id]

    def named(self, *names: str) -> list[tuple[str, Any]]:
        return [e for e in self.events if e[0] in names]

    def counts(self) -> tuple[int, int]:
        return len(self.host.ctx.agents.list()), len(self.host.ctx.sessions.list())


def echo(request: ScriptedRequest) -> str:
    return "answer: " + request.last_user_text


@contextlib.asynccontextmanager
async def boot(
    model: Script = echo,
    *,
    persona: str = "",
    seeded: bool = False,
    parent_options: AgentOptions | None = None,
) -> AsyncIterator[Booted]:
    """A host with ``subagent``, the local provider (owned by a disposable plugin context), a
    parent agent, and the publication events recorded."""
    async with scripted_host(
        "subagent",
        model=model,
        modules={"subagent": dsh_subagent.plugin},
        config={"system-prompt": {"persona": persona}},
    ) as host:
        owner = host.ctx.plugin("local-provider")
        owner[SUBAGENTS].register_provider(LocalProvider(seeded=seeded))
        parent = (await host.create_agent(options=parent_options or default_options())).agent
        events: list[tuple[str, Any]] = []
        for name in WATCHED:
            host.ctx.on(name, lambda *args, _n=name: events.append((_n, args)))
        ended = asyncio.Event()
        host.ctx.on("subagent/end", lambda info: ended.set())
        yield Booted(host=host, parent=parent, provider_owner=owner, events=events, ended=ended)


def child_of(run: SubagentRun) -> Agent:
    """The run's local child (an in-process run always has one)."""
    assert run.local_agent is not None
    return run.local_agent


def types_of(agent: Agent) -> list[str]:
    return [e.type for e in agent.session.events]


def turn_ends(agent: Agent) -> list[Any]:
    return [e.data.reason for e in agent.session.events if e.type == "turn/end"]


def look_tool(calls: list[str]) -> ToolDefinition:
    async def run(arguments: Any, ctx: ToolRunContext) -> str:
        calls.append(ctx.agent.id if ctx.agent is not None else "")
        return "looked"

    return ToolDefinition(name="look", description="Look around.", execute=run)


# -- DRV-1, DEP-3, DEP-4: publication and the child's identity ------------------------------------


async def test_start_resolves_after_publication() -> None:
    """DRV-1: start resolves with the published child: registered, exposed as local_agent, with
    its own session recording the parent."""
    async with boot() as b:
        run = await b.start()
        child = run.local_agent
        assert child is not None
        assert run.id == child.id == child.session.id
        assert b.host.ctx.agents.get(run.id) is child
        assert b.host.ctx.sessions.get(run.id) is child.session
        assert child.session is not b.parent.session
        assert child.session.header.parent_session == b.parent.id
        result = await run.result
        assert (result.stop_reason, blocks_text(result.output)) == (
            "completed",
            "answer: child: hello",
        )
        await run.dispose()


async def test_child_header_records_lineage() -> None:
    """DEP-3: the child header records parent_session, the parent's cwd, origin subagent and
    its delegation depth; no seed_length without a seed."""
    async with boot() as b:
        run = await b.start()
        header = child_of(run).session.header
        assert header.parent_session == b.parent.id
        assert header.cwd == b.parent.session.header.cwd == str(Path.cwd())
        assert header.origin == "subagent"
        assert header.delegation_depth == 1
        assert header.seed_length is None
        await run.dispose()


async def test_seeded_child_header_counts_the_seed() -> None:
    """DEP-3: a seeded child records seed_length equal to the seeded prefix length."""
    async with boot(seeded=True) as b:
        await b.host.run(b.parent, "first parent turn")
        prefix = completed_turn_prefix(b.parent)
        assert prefix is not None
        run = await b.start()
        child = run.local_agent
        assert child is not None
        assert child.session.header.seed_length == len(prefix) > 0
        assert [e.type for e in child.session.events[: len(prefix)]] == [e.type for e in prefix]
        await run.result
        await run.dispose()


async def test_child_depth_is_recorded_durably_and_at_runtime() -> None:
    """DEP-2/DEP-3: a child of a depth-2 parent is depth 3 in its header and its options."""
    async with boot() as b:
        deep = (
            await b.host.create_agent(
                options=default_options(extensions={SUBAGENT_DEPTH_KEY: 1}),
                meta=SessionMeta(cwd=str(Path.cwd()), delegation_depth=2),
            )
        ).agent
        run = await b.start(parent=deep, max_depth=3)
        child = run.local_agent
        assert child is not None
        assert child.session.header.delegation_depth == 3
        assert child.options.extensions[SUBAGENT_DEPTH_KEY] == 3
        await run.dispose()


async def test_max_depth_refuses_before_any_child() -> None:
    """DEP-2: a child deeper than max_depth is refused with SubagentDepthError; nothing is
    created and nothing is announced."""
    async with boot() as b:
        before = b.counts()
        with pytest.raises(SubagentDepthError, match="subagent depth 1 exceeds maxDepth 0"):
            await b.start(max_depth=0)
        assert b.counts() == before
        assert b.events == []


async def test_child_options_overlay_the_parent_route() -> None:
    """DEP-4: the child gets the parent's provider, model and max_tokens, overlaid with the
    request's declared options, plus subagent_depth."""
    async with boot(parent_options=default_options(max_tokens=321)) as b:
        run = await b.start(agent_options=AgentOptions(model="other-model"))
        child = run.local_agent
        assert child is not None
        assert child.options == AgentOptions(
            provider="scripted",
            model="other-model",
            max_tokens=321,
            extensions={SUBAGENT_DEPTH_KEY: 1},
        )
        assert (await run.result).stop_reason == "completed"
        (request,) = b.requests_of(child.id)
        assert (request.model, request.max_tokens) == ("other-model", 321)
        await run.dispose()


async def test_no_route_is_not_invented() -> None:
    """DEP-4: with no route on parent or request the child's options are only subagent_depth,
    and its turn ends in error."""
    async with boot(parent_options=AgentOptions()) as b:
        run = await b.start()
        child = run.local_agent
        assert child is not None
        assert child.options == AgentOptions(extensions={SUBAGENT_DEPTH_KEY: 1})
        result = await run.result
        assert result.stop_reason == "error"
        assert result.diagnostic is not None and "model route" in result.diagnostic
        assert b.requests_of(child.id) == []
        await run.dispose()


# -- DEP-5, DEP-7, BUG-3: composition inside the creation window ----------------------------------


async def test_persona_shadows_deployment_persona_for_the_child_only() -> None:
    """DEP-5: a persona replaces deployment:persona in the child's first request only; the
    parent keeps the deployment persona."""
    async with boot(persona="DEPLOYMENT PERSONA") as b:
        await b.host.run(b.parent, "parent turn")
        run = await b.start(persona="CHILD PERSONA on {{model}}")
        await run.result
        (request,) = b.requests_of(run.id)
        assert "CHILD PERSONA on scripted-1" in request.system
        assert "DEPLOYMENT PERSONA" not in request.system
        assert "DEPLOYMENT PERSONA" in b.requests_of(b.parent.id)[0].system
        await b.host.run(b.parent, "parent again")
        assert "DEPLOYMENT PERSONA" in b.requests_of(b.parent.id)[-1].system
        assert "CHILD PERSONA" not in b.requests_of(b.parent.id)[-1].system
        await run.dispose()


async def test_empty_persona_shadows_with_nothing() -> None:
    """DEP-5: an empty persona hides the deployment persona from the child."""
    async with boot(persona="DEPLOYMENT PERSONA") as b:
        run = await b.start(persona="")
        await run.result
        (request,) = b.requests_of(run.id)
        assert "DEPLOYMENT PERSONA" not in (request.system or "")
        plain = await b.start()
        await plain.result
        assert "DEPLOYMENT PERSONA" in b.requests_of(plain.id)[0].system
        await run.dispose()
        await plain.dispose()


async def test_delegation_statement_reaches_only_the_child() -> None:
    """DEP-5: the child's first request carries the subagent:delegation runtime statement; the
    parent's does not."""
    async with boot() as b:
        await b.host.run(b.parent, "parent turn")
        run = await b.start()
        await run.result
        (request,) = b.requests_of(run.id)
        texts = [m.text for m in request.messages if m.role == "user"]
        assert any("You are a subagent" in t for t in texts)
        parent_texts = [m.text for m in b.requests_of(b.parent.id)[0].messages]
        assert not any("You are a subagent" in t for t in parent_texts)
        await run.dispose()


async def test_tool_filter_hides_inherited_tools_from_prompt_and_execution() -> None:
    """DEP-5: a deny filter removes an inherited tool from the child's prompt and its calls fail
    UNKNOWN_TOOL without running; the parent still sees the tool."""
    calls: list[str] = []

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if request.last_user_text == "child: call look" and request.last_tool_result is None:
            return ScriptedReply(tool_calls=(ScriptedToolCall(name="look"),))
        if request.last_tool_result is not None:
            return "after: " + request.last_tool_result
        return "plain"

    async with boot(model) as b:
        b.host.ctx.tools.register(look_tool(calls))
        b.host.ctx.tools.register(
            ToolDefinition(name="other", description="x", execute=_returns("other"))
        )
        run = await b.start("child: call look", tool_filter=ToolRestriction(deny=("look",)))
        result = await run.result
        first = b.requests_of(run.id)[0]
        assert "look" not in [t.name for t in first.tools or ()]
        assert "other" in [t.name for t in first.tools or ()]
        assert calls == []
        assert "unknown tool" in blocks_text(result.output)
        errors = [e.data.error for e in child_of(run).session.events if e.type == "tool/result"]
        assert [e.code for e in errors if e is not None] == ["UNKNOWN_TOOL"]
        await b.host.run(b.parent, "parent turn")
        assert "look" in [t.name for t in b.requests_of(b.parent.id)[0].tools or ()]
        await run.dispose()


def _returns(value: str) -> Callable[[Any, ToolRunContext], Awaitable[str]]:
    async def run(arguments: Any, ctx: ToolRunContext) -> str:
        return value

    return run


async def test_tool_filter_never_hides_own_structured_output() -> None:
    """DEP-7, BUG-3: allow=[] hides every inherited (global) tool but never the child's own
    structured_output."""

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        return ScriptedReply(
            tool_calls=(ScriptedToolCall(name="structured_output", arguments={"answer": "a"}),)
        )

    async with boot(model) as b:
        b.host.ctx.tools.register(look_tool([]))
        run = await b.start(output_schema=SCHEMA, tool_filter=ToolRestriction(allow=()))
        result = await run.result
        (request,) = b.requests_of(run.id)
        assert [t.name for t in request.tools or ()] == ["structured_output"]
        assert result.stop_reason == "completed"
        assert thaw_json(result.structured) == {"answer": "a"}
        await run.dispose()


async def test_parent_scoped_tools_are_not_inherited() -> None:
    """BUG-3: a child composes on a fresh flat scope: the parent's own scoped tools are neither
    visible to it nor nameable in its filter (only inherited layers are filterable)."""
    async with boot() as b:
        b.parent.ctx.tools.register(
            ToolDefinition(name="parent_only", description="x", execute=_returns("p"))
        )
        run = await b.start()
        await run.result
        assert "parent_only" not in [t.name for t in b.requests_of(run.id)[0].tools or ()]
        await run.dispose()
        before = b.counts()
        with pytest.raises(ToolError, match='unknown global tool "parent_only"'):
            await b.start(tool_filter=ToolRestriction(deny=("parent_only",)))
        assert b.counts() == before


async def test_unknown_filter_name_fails_creation_and_leaves_nothing() -> None:
    """DEP-5, DRV-3: an unknown tool-filter name fails child creation loudly; no agent, session
    or publication event is left behind."""
    async with boot() as b:
        before = b.counts()
        with pytest.raises(ToolError, match='unknown global tool "nope"') as caught:
            await b.start(tool_filter=ToolRestriction(allow=("nope",)))
        assert caught.value.code == "UNKNOWN_TOOL"
        assert b.counts() == before
        assert b.events == []
        assert b.host.model.requests == []


# -- DSC-1, DSC-4, DSC-6: the descriptor in the child's log ---------------------------------------


async def test_descriptor_appended_in_turn_one_before_the_first_request() -> None:
    """DSC-4: the driver appends the resolved descriptor inside turn 1 before the first model
    request; it is log-only (no surface metadata, never in model history)."""
    seen_at_request: list[list[str]] = []

    def model(request: ScriptedRequest) -> str:
        if request.session_id is not None:
            session = hosts[0].ctx.sessions.get(request.session_id)
            assert session is not None
            seen_at_request.append([e.type for e in session.events])
        return "ok"

    hosts: list[TestHost] = []
    async with boot(model) as b:
        hosts.append(b.host)
        run = await b.start(label="survey")
        await run.result
        child = run.local_agent
        assert child is not None
        types = types_of(child)
        assert types.count(DESCRIPTOR_EVENT) == 1
        at = types.index(DESCRIPTOR_EVENT)
        assert types.index("turn/start") < at < types.index("step/start")
        assert types.index("request/header") > at
        assert DESCRIPTOR_EVENT in seen_at_request[-1]
        event = child.session.events[at]
        assert event.surface_op is None and event.source_event_seqs is None
        assert thaw_json(event.data) == {
            "version": 2,
            "mode": "one-shot",
            "provider": "local",
            "label": "survey",
        }
        (request,) = b.requests_of(child.id)
        assert not any("one-shot" in m.text for m in request.messages)
        await run.dispose()


async def test_descriptor_stores_no_composition_inputs() -> None:
    """DSC-6: a start with schema, depth cap, options and persona logs a descriptor holding only
    version, mode and provider."""

    def model(request: ScriptedRequest) -> ScriptedReply:
        return ScriptedReply(
            tool_calls=(ScriptedToolCall(name="structured_output", arguments={"answer": "a"}),)
        )

    async with boot(model) as b:
        run = await b.start(
            output_schema=SCHEMA,
            max_depth=5,
            agent_options=AgentOptions(max_tokens=99),
            persona="p",
            tool_filter=ToolRestriction(allow=()),
        )
        await run.result
        events = child_of(run).session.events
        (descriptor,) = [e.data for e in events if e.type == DESCRIPTOR_EVENT]
        assert thaw_json(descriptor) == {"version": 2, "mode": "one-shot", "provider": "local"}
        await run.dispose()


async def test_rejected_first_pre_step_gets_no_descriptor() -> None:
    """DSC-4, DRV-6: a child whose first pre-step is rejected gets no descriptor, makes no
    request, and its run ends as refusal."""
    async with boot() as b:

        def on_created(agent: Agent) -> None:
            if agent.session.header.origin != "subagent":
                return

            async def reject(
                pre: PreStep, next_: Callable[..., Awaitable[PreStepDecision]]
            ) -> PreStepDecision:
                if pre.agent is agent:
                    return PreStepDecision(kind="reject", reason="policy")
                return await next_()

            b.host.ctx.on("agent/pre-step", reject)  # after the child's own descriptor hook

        b.host.ctx.on("agent/created", on_created)
        run = await b.start()
        result = await run.result
        child = run.local_agent
        assert child is not None
        assert DESCRIPTOR_EVENT not in types_of(child)
        assert [r.kind for r in turn_ends(child)] == ["blocked"]
        assert result.stop_reason == "refusal"
        assert b.requests_of(child.id) == []
        await run.dispose()


async def test_descriptor_hook_leaves_after_its_first_entered_step() -> None:
    """DSC-4: once the descriptor is placed the child's pre-step hook is gone, so its later
    steps run without it, and the log keeps exactly one descriptor."""
    hooked: list[bool] = []

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if request.last_tool_result is None and request.last_user_text == "child: look":
            return ScriptedReply(tool_calls=(ScriptedToolCall(name="probe", arguments={}),))
        return "done"

    async with boot(model) as b:

        async def probe(arguments: Any, run: ToolRunContext) -> str:
            hooked.append(b.host.ctx.has_listeners("agent/pre-step"))
            return "probed"

        b.host.ctx.tools.register(ToolDefinition(name="probe", description="Probe.", execute=probe))
        assert not b.host.ctx.has_listeners("agent/pre-step")
        run = await b.start("child: look")
        result = await run.result
        child = child_of(run)
        assert (result.stop_reason, blocks_text(result.output)) == ("completed", "done")
        assert hooked == [False]
        assert types_of(child).count("step/start") == 2
        assert types_of(child).count(DESCRIPTOR_EVENT) == 1
        await run.dispose()


async def test_descriptor_hook_stays_until_a_step_enters() -> None:
    """DSC-4: after a rejected first pre-step the hook stays in place; the child's first
    entered step (in a later turn) gets the one descriptor."""
    async with boot() as b:
        rejected: list[int] = []

        def on_created(agent: Agent) -> None:
            if agent.session.header.origin != "subagent":
                return

            async def reject_once(
                pre: PreStep, next_: Callable[..., Awaitable[PreStepDecision]]
            ) -> PreStepDecision:
                if pre.agent is agent and not rejected:
                    rejected.append(pre.turn)
                    return PreStepDecision(kind="reject", reason="policy")
                return await next_()

            b.host.ctx.on("agent/pre-step", reject_once)  # after the child's own hook

        b.host.ctx.on("agent/created", on_created)
        run = await b.start()
        assert (await run.result).stop_reason == "refusal"
        child = child_of(run)
        assert DESCRIPTOR_EVENT not in types_of(child)
        child.followup(user_message(text_blocks("child: again")))
        await child.when_idle()
        types = types_of(child)
        assert types.count(DESCRIPTOR_EVENT) == 1
        second_turn = [i for i, t in enumerate(types) if t == "turn/start"][1]
        assert second_turn < types.index(DESCRIPTOR_EVENT) < types.index("step/start")
        assert [r.kind for r in turn_ends(child)] == ["blocked", "completed"]
        await run.dispose()


async def test_non_string_label_fails_before_any_child() -> None:
    """DSC-1: a label that is not losslessly JSON-serializable fails before any child exists."""
    async with boot() as b:
        before = b.counts()
        with pytest.raises(DescriptorError, match="not losslessly JSON-serializable"):
            await b.start(label=3)
        assert b.counts() == before
        assert b.events == []


# -- DRV-2..5: cancellation before and after publication ------------------------------------------


async def test_pre_aborted_signal_leaves_nothing() -> None:
    """DRV-2: a signal aborted before start rejects "aborted before child publication"; agent
    and session counts are unchanged and no creation or subagent event fires."""
    async with boot() as b:
        before = b.counts()
        controller = AbortController()
        controller.abort("not needed")
        with pytest.raises(AbortedError, match=ABORTED_BEFORE) as caught:
            await b.start(signal=controller.signal)
        assert caught.value.reason == "not needed"
        assert b.counts() == before
        assert b.events == []


async def test_same_tick_abort_leaves_nothing() -> None:
    """DRV-2: an abort in the same tick as the start call rejects the same way and leaves no
    trace."""
    async with boot() as b:
        before = b.counts()
        controller = AbortController()
        pending = asyncio.ensure_future(b.start(signal=controller.signal))
        controller.abort("changed my mind")
        with pytest.raises(AbortedError, match=ABORTED_BEFORE):
            await pending
        assert b.counts() == before
        assert b.events == []
        assert b.host.model.requests == []


async def test_disposed_parent_is_an_inactive_context() -> None:
    """DRV-3: starting under a disposed parent rejects ("inactive context") and leaves
    nothing."""
    async with boot() as b:
        handle = await b.host.create_agent()
        await handle.dispose()
        before, seen = b.counts(), len(b.events)
        with pytest.raises(ContextError, match="inactive context"):
            await b.start(parent=handle.agent)
        assert b.counts() == before
        assert b.events[seen:] == []


async def test_abort_between_publication_and_listener_installation() -> None:
    """DRV-4: an abort landing right after publication still gives a published run with an id
    whose result is {output: [], stop_reason: aborted}; the child is never prompted."""
    async with boot() as b:
        controller = AbortController()

        def on_session_start(agent: Agent, source: str) -> None:
            if agent.session.header.origin == "subagent":
                controller.abort("just after publication")

        b.host.ctx.on("agent/session-start", on_session_start)
        run = await b.start(signal=controller.signal)
        assert run.id
        assert b.host.ctx.agents.get(run.id) is run.local_agent
        result = await run.result
        assert result == SubagentResult(output=(), stop_reason="aborted")
        assert b.requests_of(run.id) == []
        assert "user/message" not in types_of(child_of(run))
        await run.dispose()
        assert b.host.ctx.agents.get(run.id) is None
        (end,) = await b.ends()
        assert end.stop_reason == "aborted" and end.last_assistant_message is None


def held(gate: asyncio.Event, entered: asyncio.Event, text: str = "partial") -> Script:
    """A model that streams ``text`` for child prompts starting "hold", then waits at ``gate``."""

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if request.last_user_text.startswith("hold"):
            entered.set()
            return ScriptedReply(text=text, wait=gate.wait)
        return "answer: " + request.last_user_text

    return model


async def test_abort_after_publication_cancels_with_parent_cause() -> None:
    """DRV-5, BUG-1: an abort after publication cancels the child with cause parent; the turn
    ends aborted and the result keeps the streamed partial text."""
    gate, entered = asyncio.Event(), asyncio.Event()
    async with boot(held(gate, entered)) as b:
        controller = AbortController()
        run = await b.start("hold on", signal=controller.signal)
        await asyncio.wait_for(entered.wait(), 5)
        controller.abort("enough")
        result = await run.result
        assert result.stop_reason == "aborted"
        assert blocks_text(result.output) == "partial"
        child = run.local_agent
        assert child is not None
        (reason,) = turn_ends(child)
        assert reason.kind == "aborted"
        assert reason.cause is not None and reason.cause.kind == "parent"
        await run.dispose()


async def test_dispose_cancels_is_idempotent_and_removes_the_agent() -> None:
    """DRV-5: dispose cancels remaining work (cause parent), settles the result aborted, is
    idempotent under concurrent callers and removes the child agent and session."""
    gate, entered = asyncio.Event(), asyncio.Event()
    async with boot(held(gate, entered)) as b:
        run = await b.start("hold me")
        await asyncio.wait_for(entered.wait(), 5)
        child = run.local_agent
        assert child is not None
        await asyncio.gather(run.dispose(), run.dispose())
        assert run.result.done()
        assert (await run.result).stop_reason == "aborted"
        assert turn_ends(child)[0].cause.kind == "parent"
        assert b.host.ctx.agents.get(run.id) is None
        assert b.host.ctx.sessions.get(run.id) is None
        await run.dispose()


async def test_dispose_after_completion_keeps_the_result() -> None:
    """DRV-5: disposing a finished run keeps its completed result and removes the agent."""
    async with boot() as b:
        run = await b.start()
        result = await run.result
        await run.dispose()
        assert await run.result is result
        assert result.stop_reason == "completed"
        assert b.host.ctx.agents.get(run.id) is None


async def test_result_fault_stays_on_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """DRV-5, SVC-10: an infrastructure fault reading the child's result rejects run.result
    only (end reports error with no message); dispose still succeeds."""
    import dsh_subagent.in_process as driver

    def unreadable(events: object) -> None:
        raise RuntimeError("log unreadable")

    monkeypatch.setattr(driver, "select_output", unreadable)
    async with boot() as b:
        run = await b.start()
        with pytest.raises(RuntimeError, match="log unreadable"):
            await run.result
        await run.dispose()
        assert b.host.ctx.agents.get(run.id) is None
        (end,) = await b.ends()
        assert (end.stop_reason, end.last_assistant_message) == ("error", None)


# -- DRV-6: stop reasons of real runs -------------------------------------------------------------


async def test_model_failure_is_error_with_diagnostic() -> None:
    """DRV-6, OUT-1: a model failure ends the run as error with the failure as diagnostic; text
    streamed before the failure is the output."""

    def model(request: ScriptedRequest) -> ScriptedReply:
        return ScriptedReply(
            text="half an answ", failure=LlmFailure(message="upstream 503", code="HTTP_503")
        )

    async with boot(model) as b:
        run = await b.start()
        result = await run.result
        assert result.stop_reason == "error"
        assert result.diagnostic == "upstream 503"
        assert result.output == (TextBlock(text="half an answ"),)
        await run.dispose()


async def test_tool_call_text_then_tool_only_max_tokens() -> None:
    """BUG-1, OUT-1: text plus a tool call, then a tool-only max-tokens step (an empty,
    usage-only message) reports the earlier text with max-tokens, in result and end event."""

    def model(request: ScriptedRequest) -> ScriptedReply:
        if request.last_tool_result is None:
            return ScriptedReply(text="partial one", tool_calls=(ScriptedToolCall(name="look"),))
        return ScriptedReply(
            tool_calls=(ScriptedToolCall(name="look"),),
            finish="max-tokens",
            usage=TokenUsage(input_tokens=10, output_tokens=4096),
        )

    async with boot(model) as b:
        b.host.ctx.tools.register(look_tool([]))
        run = await b.start()
        result = await run.result
        assert result.stop_reason == "max-tokens"
        assert blocks_text(result.output) == "partial one"
        child = run.local_agent
        assert child is not None
        messages = [e.data for e in child.session.events if e.type == "assistant/message"]
        assert messages[-1].message.content == () and messages[-1].usage is not None
        await run.dispose()
        (end,) = await b.ends()
        assert isinstance(end, SubagentRunEndInfo)
        assert end.stop_reason == "max-tokens"
        assert end.last_assistant_message is not None
        assert blocks_text(end.last_assistant_message) == "partial one"


async def test_no_output_omits_last_assistant_message() -> None:
    """BUG-1, SVC-10: a child that answers nothing has output [] and its end event omits
    last_assistant_message."""
    async with boot(lambda request: ScriptedReply(text="")) as b:
        run = await b.start()
        result = await run.result
        assert (result.output, result.stop_reason) == ((), "completed")
        await run.dispose()
        (start,) = [args[0] for name, args in b.named("subagent/start")]
        (end,) = await b.ends()
        assert isinstance(start, SubagentRunInfo)
        assert (end.run_id, end.id, end.local) == (start.run_id, run.id, True)
        assert end.last_assistant_message is None


async def test_seeded_child_reports_only_its_own_output() -> None:
    """DRV-7: output is read after the seed boundary: a seeded child with an empty turn reports
    [], never the parent's seeded answer."""

    def model(request: ScriptedRequest) -> str:
        return "" if request.last_user_text == "child: say nothing" else "PARENT ANSWER"

    async with boot(model, seeded=True) as b:
        assert await b.host.run(b.parent, "parent turn") == "PARENT ANSWER"
        run = await b.start("child: say nothing")
        result = await run.result
        assert result.output == ()
        assert result.stop_reason == "completed"
        await run.dispose()


# -- DRV-8, DRV-9 ---------------------------------------------------------------------------------


async def test_no_flush_during_a_one_shot_run() -> None:
    """DRV-8: a foreground one-shot run adds no durability flush, even with a throwing
    session/flush listener."""
    flushed: list[str] = []

    def on_flush(session: Any) -> None:
        flushed.append(session.id)
        raise RuntimeError("flush listener failed")

    async with boot() as b:
        b.host.ctx.on("session/flush", on_flush)
        run = await b.start()
        result = await run.result
        await run.dispose()
        assert result.stop_reason == "completed"
        assert flushed == []


async def test_provider_unload_does_not_revoke_published_runs() -> None:
    """DRV-9, SVC-12, STR-1, hardening 11.10: unloading the provider blocks new starts, but
    published runs keep going (one completes, one can still be aborted); the structured tool
    stays while its run runs and is removed when the run settles, not only at dispose."""
    gate, entered = asyncio.Event(), asyncio.Event()

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if request.last_user_text == "hold then capture":
            entered.set()

            async def wait() -> None:
                await gate.wait()

            return ScriptedReply(
                tool_calls=(
                    ScriptedToolCall(name="structured_output", arguments={"answer": "late"}),
                ),
                wait=wait,
            )
        if request.last_user_text.startswith("hold"):
            return ScriptedReply(text="working", wait=asyncio.Event().wait)
        return "answer"

    async with boot(model) as b:
        controller = AbortController()
        capturing = await b.start("hold then capture", output_schema=SCHEMA)
        abortable = await b.start("hold forever", signal=controller.signal)
        await asyncio.wait_for(entered.wait(), 5)
        await b.provider_owner.dispose()
        assert b.svc.get_provider("local") is None
        child = capturing.local_agent
        assert child is not None
        assert child.ctx.tools.get("structured_output") is not None
        gate.set()
        result = await capturing.result
        assert (result.stop_reason, thaw_json(result.structured)) == (
            "completed",
            {"answer": "late"},
        )
        assert child.ctx.tools.get("structured_output") is None
        controller.abort("stop")
        assert (await abortable.result).stop_reason == "aborted"
        await capturing.dispose()
        await abortable.dispose()
        assert b.host.ctx.tools.get("structured_output", scope=child.ctx.scope) is None
        assert [end.provider for end in await b.ends(2)] == ["local", "local"]


# -- STR-1..3: structured output ------------------------------------------------------------------


def capture_model(*replies: Any) -> Script:
    """Child requests get ``replies`` in order (each a ScriptedReply, or a callable of the
    request); parent requests are echoed."""
    queue = list(replies)

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if not request.last_user_text.startswith("child"):
            return "parent: " + request.last_user_text
        reply = queue.pop(0) if queue else "nothing more"
        return reply(request) if callable(reply) else reply

    return model


def capture_call(arguments: Any, *more: ScriptedToolCall) -> ScriptedReply:
    return ScriptedReply(
        tool_calls=(ScriptedToolCall(name="structured_output", arguments=arguments), *more)
    )


async def test_structured_tool_and_section_are_child_scoped() -> None:
    """STR-1: the child gets a scoped structured_output tool (parameters = the schema) and a
    tool:structured_output section at order 190, last in its system text."""
    async with boot(capture_model(capture_call({"answer": "x"}))) as b:
        b.host.ctx.system_prompt.section(PromptSection(name="a:189", order=189, text="ORDER-189"))
        run = await b.start(output_schema=SCHEMA)
        await run.result
        (request,) = b.requests_of(run.id)
        (tool,) = [t for t in request.tools if t.name == "structured_output"]
        assert thaw_json(tool.parameters) == SCHEMA
        assert request.system.index("ORDER-189") < request.system.index(GUIDANCE)
        assert GUIDANCE in request.system.split("\n\n")[-1]  # the last section
        await run.dispose()
        b.host.ctx.system_prompt.section(PromptSection(name="a:191", order=191, text="ORDER-191"))
        second = await b.start(output_schema=SCHEMA)
        await second.result
        system = b.requests_of(second.id)[0].system
        assert system.index("ORDER-189") < system.index(GUIDANCE) < system.index("ORDER-191")
        await second.dispose()


async def test_structured_tool_is_unknown_to_everyone_else() -> None:
    """STR-1: nothing is registered globally: the parent, another agent and agentless callers
    get UNKNOWN_TOOL while a child with a schema is live."""
    gate, entered = asyncio.Event(), asyncio.Event()
    async with boot(held(gate, entered)) as b:
        run = await b.start("hold for schema", output_schema=SCHEMA)
        await asyncio.wait_for(entered.wait(), 5)
        assert b.host.ctx.tools.get("structured_output") is None
        assert b.parent.ctx.tools.get("structured_output") is None
        other = (await b.host.create_agent()).agent
        for agent in (b.parent, other, None):
            outcome: ToolExecutionResult = await b.host.ctx.tools.execute(
                ToolExecutionInput(
                    call_id="c",
                    name="structured_output",
                    arguments='{"answer": "forged"}',
                    signal=AbortController().signal,
                    agent=agent,
                )
            )
            assert outcome.error is not None and outcome.error.code == "UNKNOWN_TOOL"
        await b.host.run(b.parent, "parent turn")
        assert "structured_output" not in [
            t.name for t in b.requests_of(b.parent.id)[0].tools or ()
        ]
        await run.dispose()


async def test_concurrent_children_each_see_their_own_schema() -> None:
    """STR-1: concurrent children each get their own structured_output schema."""
    schema_b = {"type": "object", "properties": {"count": {"type": "integer"}}}
    gate = asyncio.Event()
    arrived: list[str] = []
    both = asyncio.Event()

    def model(request: ScriptedRequest) -> ScriptedReply:
        arrived.append(request.last_user_text)
        if len(arrived) == 2:
            both.set()
        return ScriptedReply(text="waiting", wait=gate.wait)

    async with boot(model) as b:
        first, second = await asyncio.gather(
            b.start("child a", output_schema=SCHEMA), b.start("child b", output_schema=schema_b)
        )
        await asyncio.wait_for(both.wait(), 5)
        for run, schema in ((first, SCHEMA), (second, schema_b)):
            (request,) = b.requests_of(run.id)
            (tool,) = [t for t in request.tools if t.name == "structured_output"]
            assert thaw_json(tool.parameters) == schema
        await asyncio.gather(first.dispose(), second.dispose())


async def test_invalid_arguments_retry_in_the_same_turn() -> None:
    """STR-2: an invalid capture call gets an INVALID_ARGS result; the model retries in the same
    turn and the valid value is the structured result."""
    async with boot(
        capture_model(capture_call({"answer": 5}), capture_call({"answer": "ok"}))
    ) as b:
        run = await b.start("child: answer", output_schema=SCHEMA)
        result = await run.result
        child = run.local_agent
        assert child is not None
        assert (result.stop_reason, thaw_json(result.structured)) == ("completed", {"answer": "ok"})
        codes = [
            e.data.error.code if e.data.error else None
            for e in child.session.events
            if e.type == "tool/result"
        ]
        assert codes == ["INVALID_ARGS", None]
        assert types_of(child).count("turn/start") == 1
        assert len(b.requests_of(child.id)) == 2
        await run.dispose()


async def test_capture_concludes_the_turn() -> None:
    """STR-2: a valid capture concludes the turn: no further model request; the result carries
    structured with completed and the tool answers "Structured output recorded."."""
    async with boot(capture_model(capture_call({"answer": "done"}))) as b:
        run = await b.start("child: answer", output_schema=SCHEMA)
        result = await run.result
        assert (result.stop_reason, thaw_json(result.structured)) == (
            "completed",
            {"answer": "done"},
        )
        assert len(b.requests_of(run.id)) == 1
        child = run.local_agent
        assert child is not None
        (tool_result,) = [e.data for e in child.session.events if e.type == "tool/result"]
        assert tool_result.message.text == "" and tool_result.error is None
        block = tool_result.message.content[0]
        assert blocks_text(block.content) == "Structured output recorded."
        await run.dispose()


async def test_post_execute_block_leaves_no_capture() -> None:
    """STR-2: a capture whose final result is blocked by post-execute is not committed and the
    turn continues; the later valid capture is the result."""
    async with boot(
        capture_model(capture_call({"answer": "one"}), capture_call({"answer": "two"}))
    ) as b:
        blocked: list[str] = []

        async def post(
            call: ToolExecutionInput,
            outcome: ToolExecutionResult,
            next_: Callable[..., Awaitable[ToolExecutionResult]],
        ) -> ToolExecutionResult:
            if call.name == "structured_output" and not blocked:
                blocked.append(call.call_id)
                return ToolExecutionResult(
                    error=ToolFailure(message="blocked by policy", code="POLICY"),
                    content=(TextBlock(text="Error: blocked by policy"),),
                )
            return await next_()

        b.host.ctx.on("tools/post-execute", post)
        run = await b.start("child: answer", output_schema=SCHEMA)
        result = await run.result
        assert blocked
        assert (result.stop_reason, thaw_json(result.structured)) == (
            "completed",
            {"answer": "two"},
        )
        assert len(b.requests_of(run.id)) == 2
        await run.dispose()


async def test_accept_with_replacement_still_commits() -> None:
    """STR-2: a post-execute listener that accepts with replaced content still commits."""
    async with boot(capture_model(capture_call({"answer": "kept"}))) as b:

        async def post(
            call: ToolExecutionInput,
            outcome: ToolExecutionResult,
            next_: Callable[..., Awaitable[ToolExecutionResult]],
        ) -> ToolExecutionResult:
            done = await next_()
            return attrs.evolve(done, content=(TextBlock(text="noted"),))

        b.host.ctx.on("tools/post-execute", post)
        run = await b.start("child: answer", output_schema=SCHEMA)
        result = await run.result
        assert (result.stop_reason, thaw_json(result.structured)) == (
            "completed",
            {"answer": "kept"},
        )
        await run.dispose()


async def test_later_calls_in_the_response_are_denied() -> None:
    """STR-3: after a capture, later calls in the same response are denied (not run, error
    results) and no pre-execute listener can re-allow them; earlier calls still run."""
    ran: list[str] = []
    reply = capture_call({"answer": "first"}, ScriptedToolCall(name="look"))
    async with boot(capture_model(reply)) as b:
        b.host.ctx.tools.register(look_tool(ran))

        async def allow_all(call: ToolExecutionInput, next_: Any) -> str:
            return "allow"

        b.host.ctx.on("tools/pre-execute", allow_all)
        run = await b.start("child: answer", output_schema=SCHEMA)
        result = await run.result
        assert (result.stop_reason, thaw_json(result.structured)) == (
            "completed",
            {"answer": "first"},
        )
        assert ran == []
        child = run.local_agent
        assert child is not None
        errors = [e.data.error for e in child.session.events if e.type == "tool/result"]
        assert errors[0] is None
        assert errors[1] is not None and errors[1].code == "TOOL_DENIED"
        await run.dispose()

    ran.clear()
    earlier = ScriptedReply(
        tool_calls=(
            ScriptedToolCall(name="look"),
            ScriptedToolCall(name="structured_output", arguments={"answer": "second"}),
        )
    )
    async with boot(capture_model(earlier)) as b:
        b.host.ctx.tools.register(look_tool(ran))
        run = await b.start("child: answer", output_schema=SCHEMA)
        result = await run.result
        assert thaw_json(result.structured) == {"answer": "second"}
        assert ran == [run.id]
        await run.dispose()


async def test_clean_turn_without_capture_is_an_error_without_reprompt() -> None:
    """STR-3: a clean turn that never captured ends as error with exactly one model request."""
    async with boot(capture_model("just text")) as b:
        run = await b.start("child: answer", output_schema=SCHEMA)
        result = await run.result
        assert result.stop_reason == "error"
        assert result.structured is None
        assert result.diagnostic is not None and "structured_output" in result.diagnostic
        assert blocks_text(result.output) == "just text"
        assert len(b.requests_of(run.id)) == 1
        await run.dispose()


async def test_errored_child_stays_error() -> None:
    """STR-3: a child that fails keeps error (and its own diagnostic), schema or not."""
    failing = ScriptedReply(failure=LlmFailure(message="model down", code="DOWN"))
    async with boot(capture_model(failing)) as b:
        run = await b.start("child: answer", output_schema=SCHEMA)
        result = await run.result
        assert (result.stop_reason, result.diagnostic) == ("error", "model down")
        await run.dispose()


async def test_cancel_after_clean_turn_without_capture_is_aborted() -> None:
    """STR-3: a cancel arriving after a clean turn that captured nothing gives aborted."""
    async with boot(capture_model("just text")) as b:
        controller = AbortController()

        def on_status(agent: Agent, status: str) -> None:
            if agent.session.header.origin == "subagent" and status == "idle":
                controller.abort("cancel after the turn")

        b.host.ctx.on("agent/status", on_status)
        run = await b.start("child: answer", output_schema=SCHEMA, signal=controller.signal)
        result = await run.result
        child = run.local_agent
        assert child is not None
        assert [r.kind for r in turn_ends(child)] == ["completed"]
        assert result.stop_reason == "aborted"
        assert result.structured is None
        await run.dispose()


async def test_handle_disposal_failure_rejects_dispose_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DRV-5: only a handle-disposal failure rejects dispose; the result keeps its own outcome,
    and every later dispose() re-raises that same failure."""
    from dsh_core import AgentHandle

    real = AgentHandle.dispose

    async def failing(self: AgentHandle) -> None:
        await real(self)
        raise RuntimeError("handle teardown failed")

    async with boot() as b:
        run = await b.start()
        result = await run.result
        monkeypatch.setattr(AgentHandle, "dispose", failing)
        with pytest.raises(RuntimeError, match="handle teardown failed"):
            await run.dispose()
        with pytest.raises(RuntimeError, match="handle teardown failed"):
            await run.dispose()
        monkeypatch.setattr(AgentHandle, "dispose", real)
        assert result.stop_reason == "completed"
        assert await run.result is result
        assert b.host.ctx.agents.get(run.id) is None


# -- hardening 11.6, 11.8, 11.10: orphans, shared results, composition pins -----------------------


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("prompt", None),
        ("prompt", 5),
        ("prompt", "a bare string"),
        ("prompt", ["hi"]),
        ("prompt", (TextBlock(text="ok"), 5)),
        ("parent", None),
        ("signal", None),
        ("persona", 3),
        ("agent_options", {"model": "m"}),
        ("tool_filter", ("x",)),
    ],
)
async def test_invalid_request_fails_before_any_child(field: str, bad: object) -> None:
    """DRV-3, hardening 11.6: a request field of the wrong type is a TypeError naming the field,
    raised before anything exists: no agent, session, creation or subagent event, no request."""
    async with boot() as b:
        before = b.counts()
        request = attrs.evolve(b.request(), **{field: bad})
        with pytest.raises(TypeError, match=f"SubagentStartRequest.{field} ") as caught:
            await b.svc.start("local", request)
        assert getattr(caught.value, "code", None) == "INVALID_START_REQUEST"
        assert b.counts() == before
        assert b.events == []
        assert b.host.model.requests == []


async def test_failure_after_publication_disposes_the_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DRV-3, hardening 11.6: a failure after the child was published (here: building its
    first message) disposes the child before the error propagates: no agent or session is
    left and no subagent/start is announced."""
    import dsh_subagent.in_process as driver

    def broken(content: object) -> None:
        raise RuntimeError("prompt unusable")

    monkeypatch.setattr(driver, "user_message", broken)
    async with boot() as b:
        before = b.counts()
        with pytest.raises(RuntimeError, match="prompt unusable"):
            await b.start()
        assert b.counts() == before
        assert b.named("subagent/start", "subagent/end") == []
        assert b.host.model.requests == []


async def test_a_consumer_that_stops_waiting_never_wedges_dispose() -> None:
    """DRV-5, hardening 11.8: asyncio.wait_for(run.result, ...) timing out leaves the run live;
    dispose() still cancels the child (cause parent), returns, and the result settles aborted
    for every awaiter."""
    gate, entered = asyncio.Event(), asyncio.Event()
    async with boot(held(gate, entered)) as b:
        run = await b.start("hold me")
        await asyncio.wait_for(entered.wait(), 5)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(run.result, 0.01)
        assert not run.result.done()
        waiting = asyncio.ensure_future(asyncio.wait_for(run.result, 5))
        await asyncio.wait_for(run.dispose(), 5)
        assert (await waiting).stop_reason == "aborted"
        assert (await run.result).stop_reason == "aborted"
        assert turn_ends(child_of(run))[0].cause.kind == "parent"
        assert b.host.ctx.agents.get(run.id) is None


async def test_dispose_stops_the_child_whatever_the_result_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DRV-5, hardening 11.8: dispose() stops a child that is still running even when the
    run's result was already settled (here, by the provider's future being cancelled)."""
    import dsh_subagent.in_process as driver

    made: list[asyncio.Future[SubagentResult]] = []
    real_run = driver.SubagentRun

    def capturing(**kwargs: Any) -> SubagentRun:
        made.append(kwargs["result"])
        return real_run(**kwargs)

    monkeypatch.setattr(driver, "SubagentRun", capturing)
    gate, entered = asyncio.Event(), asyncio.Event()
    async with boot(held(gate, entered)) as b:
        run = await b.start("hold me")
        await asyncio.wait_for(entered.wait(), 5)
        made[0].cancel()
        await asyncio.wait_for(run.dispose(), 5)
        assert turn_ends(child_of(run))[0].cause.kind == "parent"
        assert b.host.ctx.agents.get(run.id) is None


async def test_dispose_cancels_the_child_exactly_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """DRV-5, hardening 11.8: concurrent dispose() calls and a later one share one disposal:
    the child is cancelled (cause parent) exactly once and every caller sees it done."""
    causes: list[tuple[str, str]] = []
    real = Agent.cancel

    def counting(self: Agent, cause: Any, *, keep_inbox: bool = False) -> None:
        causes.append((self.id, cause.kind))
        real(self, cause, keep_inbox=keep_inbox)

    monkeypatch.setattr(Agent, "cancel", counting)
    gate, entered = asyncio.Event(), asyncio.Event()
    async with boot(held(gate, entered)) as b:
        run = await b.start("hold me")
        await asyncio.wait_for(entered.wait(), 5)
        outcomes = await asyncio.wait_for(
            asyncio.gather(run.dispose(), run.dispose(), return_exceptions=True), 5
        )
        assert outcomes == [None, None]
        await asyncio.wait_for(run.dispose(), 5)
        assert [c for c in causes if c == (run.id, "parent")] == [(run.id, "parent")]
        assert (await run.result).stop_reason == "aborted"


async def test_structured_tool_removed_when_the_run_settles() -> None:
    """DRV-9, STR-1, hardening 11.10: once the run settles, the child's structured_output tool
    and its guidance are gone before dispose: a later turn of the still-live child is offered
    neither, and the run keeps its captured value."""
    async with boot(capture_model(capture_call({"answer": "x"}), "plain again")) as b:
        run = await b.start("child: answer", output_schema=SCHEMA)
        result = await run.result
        assert (result.stop_reason, thaw_json(result.structured)) == ("completed", {"answer": "x"})
        child = child_of(run)
        assert b.host.ctx.tools.get("structured_output", scope=child.ctx.scope) is None
        child.followup(user_message("child: again"))
        await asyncio.wait_for(child.when_idle(), 5)
        first, last = b.requests_of(run.id)
        assert "structured_output" in [t.name for t in first.tools or ()]
        assert "structured_output" not in [t.name for t in last.tools or ()]
        assert GUIDANCE not in (last.system or "")
        assert await run.result is result
        await run.dispose()


async def test_reused_call_id_never_promotes_a_failed_stage() -> None:
    """STR-2, hardening 11.10: a capture whose final result was blocked stays uncommitted even
    when a later, successful call reuses its call id; the clean turn then ends error."""
    ran: list[str] = []
    blocked_capture = ScriptedReply(
        tool_calls=(
            ScriptedToolCall(name="structured_output", arguments={"answer": "no"}, id="dup"),
        )
    )
    reused = ScriptedReply(tool_calls=(ScriptedToolCall(name="look", id="dup"),))
    async with boot(capture_model(blocked_capture, reused, "done")) as b:
        b.host.ctx.tools.register(look_tool(ran))

        async def post(
            call: ToolExecutionInput,
            outcome: ToolExecutionResult,
            next_: Callable[..., Awaitable[ToolExecutionResult]],
        ) -> ToolExecutionResult:
            if call.name == "structured_output":
                return ToolExecutionResult(
                    error=ToolFailure(message="blocked by policy", code="POLICY"),
                    content=(TextBlock(text="Error: blocked by policy"),),
                )
            return await next_()

        b.host.ctx.on("tools/post-execute", post)
        run = await b.start("child: answer", output_schema=SCHEMA)
        result = await run.result
        assert ran == [run.id]
        child = child_of(run)
        calls = [e.data.call_id for e in child.session.events if e.type == "tool/call"]
        assert calls == ["dup", "dup"]
        assert (result.stop_reason, result.structured) == ("error", None)
        assert result.diagnostic is not None and "structured_output" in result.diagnostic
        await run.dispose()


async def test_persona_sits_at_order_zero() -> None:
    """DEP-5, hardening 11.10: the persona section is at order 0: after a section at order -1
    and before one at order 1 in the child's system text."""
    async with boot(persona="DEPLOYMENT PERSONA") as b:
        prompt = b.host.ctx.system_prompt
        prompt.section(PromptSection(name="a:minus", order=-1, text="ORDER-MINUS-ONE"))
        prompt.section(PromptSection(name="a:plus", order=1, text="ORDER-PLUS-ONE"))
        run = await b.start(persona="CHILD PERSONA")
        await run.result
        system = b.requests_of(run.id)[0].system
        order = [system.index(t) for t in ("ORDER-MINUS-ONE", "CHILD PERSONA", "ORDER-PLUS-ONE")]
        assert order == sorted(order)
        await run.dispose()


async def test_delegation_statement_sits_at_order_120() -> None:
    """DEP-5, hardening 11.10: the subagent:delegation statement is a runtime context at order
    120: after a context at order 119 and before one at order 121 in the child's request."""
    async with boot() as b:
        prompt = b.host.ctx.system_prompt
        prompt.context(PromptContext(name="a:119", order=119, text="CONTEXT-119"))
        prompt.context(PromptContext(name="a:121", order=121, text="CONTEXT-121"))
        run = await b.start()
        await run.result
        (request,) = b.requests_of(run.id)
        text = "\n".join(m.text for m in request.messages)
        order = [text.index(t) for t in ("CONTEXT-119", "You are a subagent", "CONTEXT-121")]
        assert order == sorted(order)
        await run.dispose()
