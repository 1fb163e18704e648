"""The child-scoped ``report`` tool and its ``tool:report`` section (contract §6, RPT-1..6).

The harness: a host with ``subagent``, (optionally) the ``tool-subagent-report`` plugin, a
fake provider on the shared in-process driver, and one scripted model answering each agent
from its own queue (a held reply keeps an agent "in its model request"). Every wait is
bounded; the tool is always called through ``ctx.tools.execute`` or a real agent turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsh_subagent.plugin
import dsh_tool_subagent_report.plugin
from dsh_core import (
    AbortController,
    AbortSignal,
    Agent,
    Context,
    JobService,
    Message,
    PluginError,
    PromptSection,
    SystemPromptRegistry,
    TextBlock,
    ToolDefinition,
    ToolError,
    ToolExecutionInput,
    ToolExecutionResult,
    ToolRegistry,
    ToolRestriction,
    ToolRunContext,
    replay_inbox,
    text_blocks,
    user_message,
)
from dsh_core.testing import (
    ScriptedReply,
    ScriptedRequest,
    ScriptedToolCall,
    TestHost,
    held_reply,
    scripted_host,
)
from dsh_subagent import (
    SUBAGENTS,
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ContinuableStartSpec,
    CoordinatorMessageSource,
    ResolvedSubagentStartRequest,
    SubagentError,
    SubagentFollowupOptions,
    SubagentRun,
    SubagentRunEndInfo,
    SubagentService,
    SubagentStartRequest,
)
from dsh_subagent.in_process import IN_PROCESS_CAPABILITIES, start_in_process_run
from dsh_tool_subagent_report import (
    REPORT_SECTION,
    REPORT_SECTION_TEXT,
    ReportConfig,
    ReportSetupError,
    report_setup,
)

BOUND = 5  # seconds: every wait gives up after this long
PLUGIN = "tool-subagent-report"
MODULES = {"subagent": dsh_subagent.plugin, PLUGIN: dsh_tool_subagent_report.plugin}
(SPEC,) = dsh_tool_subagent_report.plugin.dsh_plugins()  # the plugin as the host mounts it


class Models:
    """One scripted model for every agent: each agent id has its own queue of replies (an
    empty queue answers ``"ok"``); every request is recorded per agent."""

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
    """Provider ``fake``: one-shot children on the shared in-process driver, and fresh
    continuable children."""

    name = "fake"
    capabilities = IN_PROCESS_CAPABILITIES
    inherits_parent_context = False

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        return await start_in_process_run(request)

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        return ContinuableCreateSpec()


_calls = itertools.count(1)


@attrs.define
class World:
    host: TestHost
    models: Models
    root: Agent
    ends: list[SubagentRunEndInfo]
    _end: asyncio.Event = attrs.field(factory=asyncio.Event)

    @property
    def svc(self) -> SubagentService:
        return self.host.ctx[SUBAGENTS]

    async def start(
        self,
        parent: Agent,
        child_id: str,
        prompt: str = "work",
        *,
        hold: bool = False,
        tool_filter: ToolRestriction | None = None,
    ) -> tuple[Agent, asyncio.Event | None]:
        """Start continuable ``child_id`` under ``parent``; with ``hold`` its first request is
        held (the returned gate releases it) and this waits until it is in that request."""
        gate = self.models.hold(child_id, "partial") if hold else None
        await self.svc.start_continuable(
            ContinuableStartSpec(
                provider="fake",
                label=f"task {child_id}",
                prompt=text_blocks(prompt),
                parent=parent,
                child_id=child_id,
                tool_filter=tool_filter,
            )
        )
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

    async def ended(self, child_id: str, count: int = 1) -> SubagentRunEndInfo:
        """Wait (bounded) for ``child_id``'s ``count``-th ``subagent/end``."""
        async with asyncio.timeout(BOUND):
            while True:
                mine = [e for e in self.ends if e.id == child_id]
                if len(mine) >= count:
                    return mine[count - 1]
                await self._end.wait()

    def on_end(self, info: SubagentRunEndInfo) -> None:
        self.ends.append(info)
        self._end.set()
        self._end = asyncio.Event()


@contextlib.asynccontextmanager
async def world(
    delivery: str | None = None,
    *,
    report: bool = True,
    config: Mapping[str, Any] | None = None,
    store_root: Path | None = None,
) -> AsyncIterator[World]:
    """A host with ``subagent``, the ``report`` plugin (unless ``report=False``; its
    ``report_delivery`` when given), the fake provider and a root agent; ends recorded.
    Sessions are kept in memory, or as JSONL files under ``store_root``."""
    models = Models()
    rows = ["subagent", PLUGIN] if report else ["subagent"]
    if config is None and delivery is not None:
        config = {PLUGIN: {"report_delivery": delivery}}
    async with scripted_host(
        *rows,
        model=models,
        modules=MODULES,
        config=config,
        store="jsonl" if store_root is not None else "memory",
        store_root=store_root,
    ) as host:
        host.ctx[SUBAGENTS].register_provider(Provider())
        root = (await host.create_agent(session_id="root")).agent
        w = World(host=host, models=models, root=root, ends=[])
        host.ctx.on("subagent/end", w.on_end)
        yield w


async def call_report(
    agent: Agent | None,
    arguments: Any,
    *,
    via: Agent | None = None,
    signal: AbortSignal | None = None,
) -> ToolExecutionResult:
    """Execute ``report`` through the real path (``ctx.tools.execute``) as ``agent``, from
    ``via``'s registry view (default: ``agent``'s), bounded."""
    view = via if via is not None else agent
    assert view is not None
    call = ToolExecutionInput(
        call_id=f"call-{next(_calls)}",
        name="report",
        arguments=arguments,
        signal=signal if signal is not None else AbortSignal(),
        agent=agent,
    )
    async with asyncio.timeout(BOUND):
        return await view.ctx.tools.execute(call)


async def idle(*agents: Agent) -> None:
    """Wait (bounded) until every agent is idle."""
    async with asyncio.timeout(BOUND):
        for agent in agents:
            await agent.when_idle()


def user_texts(agent: Agent) -> list[tuple[str, str]]:
    """``(source kind, text)`` of each user message in ``agent``'s log, snapshots left out."""
    out = []
    for event in agent.session.events:
        if event.type != "user/message":
            continue
        message: Message = event.data
        if getattr(message.source, "form", None) == "snapshot":
            continue
        out.append((message.source.kind, "\n".join(b.text for b in message.content)))  # type: ignore[attr-defined]
    return out


def result_text(result: ToolExecutionResult) -> str:
    return "".join(getattr(b, "text", "") for b in result.content)


def report_call(output: Any, call_id: str = "r1") -> ScriptedReply:
    """A model reply calling ``report`` with ``{"output": output}``."""
    return ScriptedReply(
        tool_calls=(ScriptedToolCall(name="report", arguments={"output": output}, id=call_id),)
    )


ACCEPTED = "report accepted by the agent that started you as message "


# -- config (decisions table: three deliveries) ---------------------------------------------------


@pytest.mark.parametrize(
    ("delivery", "target"),
    [
        (None, "next-step"),
        ("next-step", "next-step"),
        ("quiet", "next-step"),
        ("wakeup", "next-turn"),
    ],
)
async def test_config_takes_the_three_deliveries_and_defaults_to_next_step(
    delivery: str | None, target: str
) -> None:
    """Contract §6 surface [M], decisions table "Report delivery" (tools 15.3): `report_delivery`
    takes quiet, wakeup and next-step, and defaults to next-step (a busy parent gets the report at
    its next step, not as a new turn)."""
    async with world(delivery) as w:
        held = w.models.hold("root")
        w.root.followup(user_message("go"))
        await w.models.requested("root")
        kid, gate = await w.start(w.root, "kid", hold=True)
        result = await call_report(kid, {"output": "x"})
        assert result.ok, result.error
        queued = w.root.inbox.next_step if target == "next-step" else w.root.inbox.next_turn
        assert [m.id for m in queued] == [result.value["messageId"]]
        assert len(w.root.inbox) == 1
        held.set()
        assert gate is not None
        gate.set()


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (
            {"report_delivery": "loud"},
            "key 'report_delivery': must be 'quiet', 'wakeup' or 'next-step', got 'loud'",
        ),
        ({"report_delivery": "Quiet"}, "key 'report_delivery': must be"),
        ({"report_delivery": 3}, "key 'report_delivery' (str)"),
        ({"report_delivery": None}, "key 'report_delivery' (str)"),
        ({"delivery": "quiet"}, "'delivery' is unknown"),
    ],
)
async def test_a_bad_config_fails_the_boot_naming_row_and_key(
    raw: dict[str, Any], fragment: str
) -> None:
    """Contract §6 surface (tools 15.3): any other delivery, a wrong type or an unknown key fails
    the boot with PLUGIN_CONFIG naming the row and the key."""
    with pytest.raises(PluginError) as caught:
        async with scripted_host("subagent", PLUGIN, modules=MODULES, config={PLUGIN: raw}):
            pass
    assert caught.value.code == "PLUGIN_CONFIG"
    message = str(caught.value)
    assert re.search(r"plugins\[\d+\] \(plugin 'tool-subagent-report'\) config: ", message)
    assert fragment in message
    assert "key ''" not in message  # the validator names its own key, once


# -- RPT-1: registration --------------------------------------------------------------------------


async def test_each_continuable_child_and_no_one_else_has_report() -> None:
    """RPT-1 (tools 15.3): every continuable child gets its own scope-local report; the root, a
    one-shot child, the global layer never see it, and loading the plugin registers no
    send_message."""
    async with world() as w:
        a, gate_a = await w.start(w.root, "kid-a", hold=True)
        b, gate_b = await w.start(w.root, "kid-b", hold=True)
        run = await w.svc.start(
            "fake", SubagentStartRequest(prompt=text_blocks("one shot"), parent=w.root)
        )
        async with asyncio.timeout(BOUND):
            await run.result
        one_shot = run.local_agent
        assert one_shot is not None
        tools = w.host.ctx.tools
        mine_a, mine_b = a.ctx.tools.get("report"), b.ctx.tools.get("report")
        assert mine_a is not None and mine_b is not None
        assert tools.get("report", None) is None  # the global layer
        assert w.root.ctx.tools.get("report") is None
        assert tools.get("report", one_shot.ctx.scope) is None
        # scope-local: each child's own layer holds it (not inherited from anywhere)
        layers = tools._svc.layers  # type: ignore[attr-defined]
        assert "report" in layers[a.ctx.scope] and "report" in layers[b.ctx.scope]
        assert all("report" not in layers.get(s, {}) for s in (None, w.root.ctx.scope))
        for scope in (None, w.root.ctx.scope, a.ctx.scope, b.ctx.scope, one_shot.ctx.scope):
            assert tools.get("send_message", scope) is None
        # the child's model is offered report; the root's and the one-shot child's are not
        (child_request,) = w.models.requests["kid-a"]
        assert "report" in [t.name for t in child_request.tools or ()]
        assert all(
            "report" not in [t.name for t in r.tools or ()] for r in w.models.requests[one_shot.id]
        )
        await run.dispose()
        for gate in (gate_a, gate_b):
            assert gate is not None
            gate.set()


async def test_a_resumed_child_gets_report_again() -> None:
    """RPT-1, RPT-4 (tools 15.3): a resumed continuable child (a new Activation) gets its own report
    too; the first epoch's stale agent has none any more."""
    async with world() as w:
        first, _ = await w.start(w.root, "kid")
        await w.ended("kid")
        assert w.host.ctx.agents.get("kid") is None
        gate = w.models.hold("kid")
        await w.followup(w.root, "kid", "more")
        await w.models.requested("kid", 2)
        resumed = w.host.ctx.agents.get("kid")
        assert resumed is not None and resumed is not first
        assert resumed.ctx.tools.get("report") is not None
        result = await call_report(resumed, {"output": "from the second epoch"})
        assert result.ok, result.error
        # the first epoch's agent is a stale copy: its scope, and its report, are gone
        stale = await call_report(first, {"output": "from the first epoch"})
        assert stale.error is not None and stale.error.code == "UNKNOWN_TOOL"
        gate.set()


async def test_report_survives_an_allow_nothing_tool_filter() -> None:
    """RPT-1 (tools 15.3): a child started with tool_filter {allow: []} still has report (its own
    tool), and nothing inherited."""
    async with world("quiet") as w:
        kid, gate = await w.start(w.root, "kid", hold=True, tool_filter=ToolRestriction(allow=()))
        assert [s.name for s in kid.ctx.tools.schemas()] == ["report"]
        result = await call_report(kid, {"output": "filtered but here"})
        assert result.ok, result.error
        assert gate is not None
        gate.set()


async def test_without_the_plugin_a_child_cannot_report() -> None:
    """RPT-1 (tools 15.3): without the package, a child's report call is an errored result."""
    async with world(report=False) as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        result = await call_report(kid, {"output": "nobody listens"})
        assert result.error is not None and result.error.code == "UNKNOWN_TOOL"
        assert w.root.inbox.next_step == []
        assert gate is not None
        gate.set()


# -- RPT-2: the tool:report section ---------------------------------------------------------------


async def test_the_section_is_child_scoped_at_order_117() -> None:
    """RPT-2 (tools 15.3): each child's prompt has `tool:report` between sections ordered 116.9 and
    117.1 (order 117), saying to report once before finishing, self-contained, and that reporting
    never ends the turn; the parent and the global assembly do not have it."""
    async with world() as w:
        w.host.ctx.system_prompt.section(PromptSection(name="before", order=116.9, text="B"))
        w.host.ctx.system_prompt.section(PromptSection(name="after", order=117.1, text="A"))
        a, gate_a = await w.start(w.root, "kid-a", hold=True)
        b, gate_b = await w.start(w.root, "kid-b", hold=True)
        for child in (a, b):
            names = [name for name, _ in child.ctx.system_prompt.assemble().sections]
            i = names.index(REPORT_SECTION)
            assert names[i - 1 : i + 2] == ["before", REPORT_SECTION, "after"]
        text = dict(a.ctx.system_prompt.assemble().sections)[REPORT_SECTION]
        assert "report once" in text and "self-contained" in text
        assert "never ends your turn" in text
        assert REPORT_SECTION_TEXT in (w.models.requests["kid-a"][0].system or "")
        for ctx in (w.root.ctx, w.host.ctx):
            assert REPORT_SECTION not in dict(ctx.system_prompt.assemble().sections)
        # a sibling's copy is its own: releasing one child leaves the other's in place
        await asyncio.wait_for(w.svc.drain_continuable_children(w.root, ["kid-a"]), BOUND)
        assert REPORT_SECTION in dict(b.ctx.system_prompt.assemble().sections)
        for gate in (gate_a, gate_b):
            assert gate is not None
            gate.set()


async def test_a_failed_tool_registration_rolls_the_section_back() -> None:
    """RPT-2, REG-2 (tools 15.3): when registering report fails (the name is taken in that scope)
    the section is removed again and the registration's error surfaces."""
    async with world(report=False) as w:
        handle = await w.host.create_agent(session_id="scoped")
        ctx = handle.agent.ctx
        ctx.tools.register(ToolDefinition(name="report", description="taken", execute=_never))
        setup = report_setup(w.svc, "next-step")
        with pytest.raises(ToolError) as caught:
            setup(ctx)
        assert caught.value.code == "DUPLICATE_TOOL"
        assert REPORT_SECTION not in dict(ctx.system_prompt.assemble().sections)


async def test_a_start_whose_report_cannot_register_publishes_nothing() -> None:
    """RPT-2, REG-2 (tools 15.3): through start_continuable, a name conflict fails the start with
    the registration's error and no child is published."""
    async with world(report=False) as w:
        created: list[str] = []
        w.host.ctx.on("session/created", lambda s: created.append(s.id), global_=True)
        taken = ToolDefinition(name="report", description="taken", execute=_never)
        w.svc.register_continuable_setup(lambda ctx: ctx.tools.register(taken))
        w.svc.register_continuable_setup(report_setup(w.svc, "next-step"))
        with pytest.raises(ToolError) as caught:
            await w.start(w.root, "kid")
        assert caught.value.code == "DUPLICATE_TOOL"
        assert created == []
        assert w.host.ctx.agents.get("kid") is None


async def test_a_failed_rollback_is_aggregated_with_the_registration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RPT-2 (tools 15.3): if rolling the section back fails too, both errors surface together
    (REPORT_SETUP_FAILED, caused by a group of the two)."""
    rollback = RuntimeError("section removal failed")

    def section(self: SystemPromptRegistry, value: PromptSection) -> Callable[[], object]:
        remove = original(self, value)

        def failing() -> object:
            remove()
            raise rollback

        return failing

    original = SystemPromptRegistry.section
    async with world(report=False) as w:
        handle = await w.host.create_agent(session_id="scoped")
        ctx = handle.agent.ctx
        ctx.tools.register(ToolDefinition(name="report", description="taken", execute=_never))
        monkeypatch.setattr(SystemPromptRegistry, "section", section)
        with pytest.raises(ReportSetupError) as caught:
            report_setup(w.svc, "next-step")(ctx)
        monkeypatch.undo()
        assert caught.value.code == "REPORT_SETUP_FAILED"
        group = caught.value.__cause__
        assert isinstance(group, ExceptionGroup)
        first, second = group.exceptions
        assert isinstance(first, ToolError) and first.code == "DUPLICATE_TOOL"
        assert second is rollback


async def test_the_disposer_attempts_both_revocations_and_aggregates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RPT-2 (tools 15.3): the installation's disposer revokes the tool and the section even when
    both revocations raise, and raises one REPORT_RELEASE_FAILED caused by both failures."""
    faults = [RuntimeError("tool revocation failed"), RuntimeError("section revocation failed")]

    def failing(remove: Callable[[], object], fault: Exception) -> Callable[[], object]:
        def revoke() -> object:
            remove()
            raise fault

        return revoke

    register, section = ToolRegistry.register, SystemPromptRegistry.section
    async with world(report=False) as w:
        handle = await w.host.create_agent(session_id="scoped")
        ctx = handle.agent.ctx
        monkeypatch.setattr(
            ToolRegistry, "register", lambda self, d: failing(register(self, d), faults[0])
        )
        monkeypatch.setattr(
            SystemPromptRegistry, "section", lambda self, s: failing(section(self, s), faults[1])
        )
        release = report_setup(w.svc, "next-step")(ctx)
        monkeypatch.undo()
        assert ctx.tools.get("report") is not None
        with pytest.raises(ReportSetupError) as caught:
            release()
        assert caught.value.code == "REPORT_RELEASE_FAILED"
        assert isinstance(caught.value.__cause__, ExceptionGroup)
        assert list(caught.value.__cause__.exceptions) == faults
        assert ctx.tools.get("report") is None
        assert REPORT_SECTION not in dict(ctx.system_prompt.assemble().sections)


async def _never(arguments: Any, run: ToolRunContext) -> str:
    raise AssertionError("not called")


# -- RPT-3: execution -----------------------------------------------------------------------------


async def test_a_report_reaches_the_parent_and_the_result_names_its_message() -> None:
    """RPT-3 [M] (tools 15.3): in a real child turn, report delivers "Background subagent <id>
    reported:\\n<output>" from the child to its parent, which (next-step, idle) wakes and makes a
    model request; the tool result is "report accepted by the agent that started you as message
    <id>" and the child's turn goes on."""
    async with world() as w:
        w.models.say("kid", report_call("found it"), "all done")
        await w.start(w.root, "kid")
        await w.ended("kid")
        await idle(w.root)
        reports = [(k, t) for k, t in user_texts(w.root) if k == "subagent-report"]
        assert reports == [("subagent-report", "Background subagent kid reported:\nfound it")]
        (message_id,) = [
            e.data.id
            for e in w.root.session.events
            if e.type == "user/message" and e.data.source.kind == "subagent-report"
        ]
        request = w.models.requests["root"][0]
        seen = [m for m in request.messages if m.source.kind == "subagent-report"]
        assert [m.id for m in seen] == [message_id]
        assert seen[0].source.sender_session_id == "kid"  # type: ignore[attr-defined]
        # the child went on after reporting: its next request was answered "all done"
        assert len(w.models.requests["kid"]) == 2
        assert tool_results_of(w.models.requests["kid"][1]) == [ACCEPTED + message_id]


def tool_results_of(request: ScriptedRequest) -> list[str]:
    """The tool results a request showed the model."""
    return [
        result_text_of(block) for m in request.messages if m.role == "tool" for block in m.content
    ]


def result_text_of(block: Any) -> str:
    return "".join(getattr(b, "text", "") for b in block.content)


async def test_quiet_delivery_does_not_wake_the_parent() -> None:
    """RPT-3 (tools 15.3): quiet delivers the report into the parent's next step with no wake and no
    new parent request."""
    async with world("quiet") as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        result = await call_report(kid, {"output": "quietly"})
        assert result.ok, result.error
        (pending,) = w.root.inbox.next_step
        assert result.value == {"messageId": pending.id}
        assert result_text(result) == ACCEPTED + pending.id
        assert w.root.status == "idle" and w.models.requests["root"] == []
        assert w.root.inbox.next_turn == []
        assert gate is not None
        gate.set()


async def test_wakeup_delivery_queues_a_new_parent_turn() -> None:
    """RPT-3 (tools 15.3), decisions table (wakeup, ours): wakeup queues the report as a new parent
    turn, and an idle parent wakes and makes a model request with it."""
    async with world("wakeup") as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        result = await call_report(kid, {"output": "wake up"})
        assert result.ok, result.error
        request = await w.models.requested("root")
        assert [m.id for m in request.messages if m.source.kind == "subagent-report"] == [
            result.value["messageId"]
        ]
        assert gate is not None
        gate.set()


async def test_several_reports_stay_in_fifo_order() -> None:
    """RPT-3 (tools 15.3): several reports of one response are kept in FIFO order in the parent's
    next step."""
    async with world("quiet") as w:
        w.models.say(
            "kid",
            ScriptedReply(
                tool_calls=tuple(
                    ScriptedToolCall(name="report", arguments={"output": f"r{i}"}, id=f"c{i}")
                    for i in range(3)
                )
            ),
            "done",
        )
        await w.start(w.root, "kid")
        await w.ended("kid")
        await idle(w.root)  # the settlement notice woke it: it claimed the reports
        reports = [text for kind, text in user_texts(w.root) if kind == "subagent-report"]
        assert reports == [f"Background subagent kid reported:\nr{i}" for i in range(3)]


async def test_a_report_comes_before_the_later_settlement_notice() -> None:
    """RPT-3, BUG-2 (tools 15.3): a report and the child's later settlement notice reach a busy
    parent in one batch, report first, with no next-turn entry; the report stays after settling."""
    async with world() as w:
        held = w.models.hold("root")
        w.root.followup(user_message("go"))
        await w.models.requested("root")
        w.models.say("kid", report_call("the answer"), "finished")
        await w.start(w.root, "kid")
        await w.ended("kid")
        assert w.root.inbox.next_turn == []
        assert [m.source.kind for m in w.root.inbox.next_step] == [
            "subagent-report",
            "subagent-settled",
        ]
        held.set()
        request = await w.models.requested("root", 2)
        kinds = [m.source.kind for m in request.messages]
        assert kinds.index("subagent-report") < kinds.index("subagent-settled")
        await idle(w.root)
        assert ("subagent-report", "Background subagent kid reported:\nthe answer") in user_texts(
            w.root
        )


async def test_a_grandchilds_report_reaches_its_parent_not_the_root() -> None:
    """RPT-3 (tools 15.3): reports go exactly one edge up: a grandchild's report reaches the
    intermediate child, never the root."""
    async with world("quiet") as w:
        mid, gate_mid = await w.start(w.root, "mid", hold=True)
        grand, gate_grand = await w.start(mid, "grand", hold=True)
        result = await call_report(grand, {"output": "for mid"})
        assert result.ok, result.error
        assert [m.id for m in mid.inbox.next_step] == [result.value["messageId"]]
        assert w.root.inbox.next_step == []
        for gate in (gate_grand, gate_mid):
            assert gate is not None
            gate.set()


# -- RPT-4: failures are errored results ----------------------------------------------------------


async def test_a_call_with_no_agent_or_a_forged_one_is_unauthorized() -> None:
    """RPT-4 (tools 15.3): a call without a calling agent, and the tool run for another agent (the
    root, a forged caller), fail UNAUTHORIZED, and nothing is delivered."""
    async with world() as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        result = await call_report(None, {"output": "x"}, via=kid)
        assert result.error is not None and result.error.code == "UNAUTHORIZED"
        assert "put your answer in your reply" in result_text(result)
        definition = kid.ctx.tools.get("report")
        assert definition is not None
        run = ToolRunContext(
            call_id="forged", name="report", arguments={"output": "x"},
            signal=AbortSignal(), agent=w.root, ctx=kid.ctx,
        )  # fmt: skip
        with pytest.raises(ToolError) as caught:
            await definition.execute({"output": "x"}, run)
        assert caught.value.code == "UNAUTHORIZED"
        assert w.root.inbox.next_step == [] and w.root.inbox.next_turn == []
        assert gate is not None
        gate.set()


async def test_a_signal_aborted_at_dispatch_is_an_errored_result() -> None:
    """RPT-4 (tools 15.3): a call whose signal is aborted by the time it runs is an errored result,
    and nothing is delivered."""
    async with world() as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        controller = AbortController()

        async def abort_then_allow(call: ToolExecutionInput, next_: Any) -> str:
            controller.abort("stop")
            return "allow"

        w.host.ctx.on("tools/pre-execute", abort_then_allow, global_=True)
        result = await call_report(kid, {"output": "x"}, signal=controller.signal)
        assert result.error is not None and result.error.code == "ABORTED"
        assert w.root.inbox.next_step == []
        already = await call_report(kid, {"output": "x"}, signal=controller.signal)
        assert already.error is not None
        assert already.error.code == "ABORTED_BEFORE_DISPATCH"
        assert gate is not None
        gate.set()


async def test_a_disposed_parent_is_parent_unavailable() -> None:
    """RPT-4 (tools 15.3): once the parent is disposed the report is an errored PARENT_UNAVAILABLE
    result with the contract's text."""
    async with world() as w:
        mid = await w.host.create_agent(session_id="mid")
        kid, gate = await w.start(mid.agent, "kid", hold=True)
        await asyncio.wait_for(mid.dispose(), BOUND)
        result = await call_report(kid, {"output": "x"})
        assert result.error is not None and result.error.code == "PARENT_UNAVAILABLE"
        assert result_text(result).startswith(
            "Error: direct parent is not live; report was not delivered"
        )
        assert gate is not None
        gate.set()


async def test_a_child_under_a_draining_root_gets_draining() -> None:
    """RPT-4 (tools 15.3): a child under a draining root reports DRAINING."""
    async with world() as w:
        kid, _ = await w.start(w.root, "kid", hold=True)
        release = w.svc.drain_continuable_descendants([w.root])
        result = await call_report(kid, {"output": "x"}, via=kid)
        assert result.error is not None and result.error.code == "DRAINING"
        assert w.root.inbox.next_step == []
        await asyncio.wait_for(release, BOUND)


async def test_an_inject_that_raises_is_parent_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RPT-4 (tools 15.3): a parent.inject that raises gives PARENT_UNAVAILABLE, and nothing is
    delivered."""
    async with world("quiet") as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        original = Agent.inject

        def refuse(agent: Agent, message: Message) -> None:
            if agent.id == "root":
                raise RuntimeError("inbox refused")
            original(agent, message)

        monkeypatch.setattr(Agent, "inject", refuse)
        result = await call_report(kid, {"output": "x"})
        monkeypatch.undo()
        assert result.error is not None and result.error.code == "PARENT_UNAVAILABLE"
        assert len(w.root.inbox) == 0
        assert gate is not None
        gate.set()


@pytest.mark.parametrize("delivery", ["quiet", "next-step", "wakeup"])
async def test_a_report_the_parents_store_cannot_write_is_not_accepted(
    delivery: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-32: on the JSONL store, a report the parent's log cannot take is an errored
    SESSION_IO saying it was not accepted, and nothing is left in the parent's inbox; once
    the store writes again, the accepted message id is in the parent's file."""
    from dsh_core import SessionError
    from dsh_core._sessions import Session

    original = Session.checkpoint

    def full(self: Session) -> None:
        if self.header.id == "root":
            raise SessionError("cannot write session file: no space left", code="SESSION_IO")
        original(self)

    async with world(delivery, store_root=tmp_path) as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        monkeypatch.setattr(Session, "checkpoint", full)
        result = await call_report(kid, {"output": "x"})
        monkeypatch.setattr(Session, "checkpoint", original)
        assert result.error is not None and result.error.code == "SESSION_IO"
        assert "The report was not accepted" in result_text(result)
        assert len(w.root.inbox) == 0
        result = await call_report(kid, {"output": "y"})
        assert result.ok, result.error
        accepted = result_text(result).removeprefix(ACCEPTED)
        assert accepted in (tmp_path / "root.jsonl").read_text()
        assert gate is not None
        gate.set()


async def test_a_parent_being_disposed_but_registered_accepts_the_report() -> None:
    """RPT-4 (tools 15.3): a parent whose disposal has started but which is still registered accepts
    the report; once its disposal completed, reports fail PARENT_UNAVAILABLE."""
    async with world() as w:
        mid = await w.host.create_agent(session_id="mid")
        kid, gate = await w.start(mid.agent, "kid", hold=True)
        during: list[ToolExecutionResult] = []

        async def report_while_disposing() -> None:
            assert w.host.ctx.agents.get("mid") is mid.agent
            during.append(await call_report(kid, {"output": "last words"}))

        mid.agent.ctx.fiber.add(report_while_disposing)
        await asyncio.wait_for(mid.dispose(), BOUND)
        (accepted,) = during
        assert accepted.ok, accepted.error
        (kept,) = replay_inbox(mid.agent.session.events)[1]
        assert accepted.value == {"messageId": kept.id}
        after = await call_report(kid, {"output": "too late"})
        assert after.error is not None and after.error.code == "PARENT_UNAVAILABLE"
        assert gate is not None
        gate.set()


# -- RPT-5: unload, reload, self-revocation -------------------------------------------------------


async def test_unloading_revokes_from_resident_children_and_reloading_does_not_restore() -> None:
    """RPT-5, REG-4 (tools 15.3): unmounting the plugin removes report and its section from a
    resident child at once; mounting it again leaves that child without them, and gives them to the
    next child."""
    async with world(report=False) as w:
        mounted = w.host.ctx.plugin(PLUGIN)
        await _mount(mounted)
        kid, gate = await w.start(w.root, "kid", hold=True)
        assert kid.ctx.tools.get("report") is not None
        await mounted.dispose()
        assert kid.ctx.tools.get("report") is None
        assert REPORT_SECTION not in dict(kid.ctx.system_prompt.assemble().sections)
        gone = await call_report(kid, {"output": "x"})
        assert gone.error is not None and gone.error.code == "UNKNOWN_TOOL"
        await _mount(w.host.ctx.plugin(PLUGIN))
        assert kid.ctx.tools.get("report") is None
        assert REPORT_SECTION not in dict(kid.ctx.system_prompt.assemble().sections)
        later, later_gate = await w.start(w.root, "later", hold=True)
        assert later.ctx.tools.get("report") is not None
        for g in (gate, later_gate):
            assert g is not None
            g.set()


async def _mount(ctx: Context) -> None:
    outcome = SPEC.apply(ctx, ReportConfig())
    if outcome is not None:
        await outcome


async def test_a_self_revoking_contribution_fails_the_start_unannounced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RPT-5, REG-3 (tools 15.3): when the report contribution is removed while it installs into a
    child, start_continuable rejects ACTIVATION_SETUP_REVOKED and no session is announced."""
    registrations: list[Callable[[], object]] = []
    original = SubagentService.register_continuable_setup

    def recording(self: SubagentService, setup: Any) -> Any:
        registration = original(self, setup)
        registrations.append(registration)
        return registration

    monkeypatch.setattr(SubagentService, "register_continuable_setup", recording)
    async with world() as w:
        (registration,) = registrations
        created: list[str] = []
        w.host.ctx.on("session/created", lambda s: created.append(s.id), global_=True)
        armed = [True]

        def revoke_inside_the_install() -> None:
            if armed:
                armed.clear()
                registration()  # the plugin's own registration, removed mid-install

        w.host.ctx.on("tools/change", revoke_inside_the_install, global_=True)
        with pytest.raises(SubagentError) as caught:
            await w.start(w.root, "kid")
        assert caught.value.code == "ACTIVATION_SETUP_REVOKED"
        assert created == []
        assert w.host.ctx.agents.get("kid") is None


# -- RPT-6: nothing implicit ----------------------------------------------------------------------


async def test_no_implicit_report_and_no_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """RPT-6 (tools 15.3): a child that never calls report reports nothing: its log holds only its
    prompt as user text, the parent gets only the separate subagent-settled notice, and no job is
    created."""
    jobs: list[str] = []
    monkeypatch.setattr(JobService, "start", lambda self, **kw: jobs.append(kw["kind"]))
    async with world() as w:
        w.models.say("kid", "my final answer")
        kid, _ = await w.start(w.root, "kid", "the task")
        await w.ended("kid")
        await idle(w.root)
        assert [text for _, text in user_texts(kid)] == ["the task"]
        kinds = [k for k, _ in user_texts(w.root)]
        assert "subagent-report" not in kinds
        assert kinds.count("subagent-settled") == 1
        assert jobs == []


# -- random model input through the real path -----------------------------------------------------


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    _containers,
    max_leaves=8,
)
ARGUMENTS = (
    JSONISH
    | st.fixed_dictionaries({"output": JSONISH})
    | st.fixed_dictionaries({"output": st.text()}, optional={"extra": JSONISH})
    | st.text(max_size=40)  # raw text: maybe JSON, mostly not
    | st.builds(lambda n: {"output": "x" * n}, st.integers(0, 200_000))
)
DOCUMENTED = {"INVALID_ARGS", "UNAUTHORIZED", "PARENT_UNAVAILABLE", "DRAINING", "ABORTED"}


@settings(max_examples=60, deadline=None)
@given(arguments=ARGUMENTS, caller=st.sampled_from(["kid", "none"]))
async def test_random_arguments_give_an_ok_or_a_documented_error(
    arguments: Any, caller: str
) -> None:
    """RPT-3/RPT-4, tools 15 (bad input): any JSON-ish arguments, from the child or with no
    calling agent, give an ok result or an errored one with a documented code; never a raise,
    never a hang; an ok result delivered exactly that output."""
    async with world("quiet") as w:
        kid, gate = await w.start(w.root, "kid", hold=True)
        result = await call_report(kid if caller == "kid" else None, arguments, via=kid)
        if result.ok:
            (pending,) = w.root.inbox.next_step
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
            assert pending.content[1] == TextBlock(text=parsed["output"])
            assert result_text(result) == ACCEPTED + pending.id
        else:
            assert result.error is not None and result.error.code in DOCUMENTED
            assert result_text(result).startswith("Error: ")
            assert len(w.root.inbox) == 0
        assert gate is not None
        gate.set()
