"""End-to-end scenarios of the model-facing tools (tools 15.4): a real host with every
subagent distribution, real agent loops, scripted models. The models call `subagent`,
`fork`, `send_message`, `list_agents`, `interrupt_agent`, `report`, `structured_output` and
`job_output` exactly as a model would, through the tools' own schemas."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsh_core import (
    AgentCancelCause,
    Message,
    PluginRow,
    ToolCallBlock,
    ToolDefinition,
    blocks_text,
    text_blocks,
    user_message,
)
from dsh_core.testing import (
    ScriptedReply,
    ScriptedRequest,
    held_reply,
    scripted_host,
    tool_call_reply,
)
from dsh_subagent import SUBAGENTS, ContinuableStartSpec, SubagentStartRequest

LOAD = (
    "dsh-subagent",
    "dsh-subagent-spawn",
    "dsh-subagent-fork",
    "dsh-tool-subagent",
    "dsh-tool-subagent-control",
    "dsh-tool-subagent-report",
)
CONTROL = ("tool-subagent-control", "tool-subagent-list-agents", "tool-subagent-report")


def _spawn_tool(**config: Any) -> PluginRow:
    return PluginRow(plugin="tool-subagent", config={"provider": "spawn", **config})


def _first_user(request: ScriptedRequest) -> str:
    """The first user message of the request's own conversation: a child's prompt."""
    for m in request.messages:
        if m.role == "user" and m.source.kind == "user":
            return m.text
    return ""


def _unanswered(request: ScriptedRequest) -> list[str]:
    """The texts of the messages after the latest assistant message (tool results by their
    content)."""
    texts: list[str] = []
    for m in reversed(request.messages):
        if m.role == "assistant":
            break
        if m.role == "tool":
            texts.append(
                "".join(blocks_text(b.content) for b in m.content if hasattr(b, "content"))
            )
        else:
            texts.append(m.text)
    return texts[::-1]


def _tool_results(messages: list[Message] | tuple[Message, ...]) -> list[str]:
    return [
        "".join(blocks_text(b.content) for b in m.content if hasattr(b, "content"))
        for m in messages
        if m.role == "tool"
    ]


def _ended(host: Any) -> Callable[[str, int], asyncio.Event]:
    """``until(child_id, n)``: an event set once ``n`` epochs of ``child_id`` have ended."""
    counts: dict[str, int] = {}
    waiting: dict[tuple[str, int], asyncio.Event] = {}

    def on_end(info: Any) -> None:
        counts[info.id] = counts.get(info.id, 0) + 1
        for (child, n), event in waiting.items():
            if child == info.id and counts[child] >= n:
                event.set()

    host.ctx.on("subagent/end", on_end)

    def until(child_id: str, n: int = 1) -> asyncio.Event:
        event = waiting.setdefault((child_id, n), asyncio.Event())
        if counts.get(child_id, 0) >= n:
            event.set()
        return event

    return until


async def test_a_parent_fans_out_hears_reports_and_notices_follows_up_lists_and_interrupts(
    tmp_path: Path,
) -> None:
    """tools 15.4, TOOL-9, TOOL-10, RPT-3, SET-1, SET-2, SET-3, BUG-2, CTL-1, CTL-2, CONT-7,
    CONT-10, CTL-4, CTL-5, BUG-4, CTL-3, INT-1, INT-2: three continuable spawn children from
    one response; the parent keeps working while they run and then reads two reports and
    three settlement notices in one step, each report before its child's notice; it follows
    up with a settled child (a cold resume from the JSONL store), lists its agents (that
    child running, the others ready) and interrupts it, and hears it was stopped."""
    in_step_2 = asyncio.Event()  # the parent is in its second request ("keeps working")
    busy = asyncio.Event()  # ... which is held until the children settled
    turn_b, turn_c = asyncio.Event(), asyncio.Event()  # the children run one after another
    held_a = asyncio.Event()  # child A's second epoch stays in its request (never set)
    known, stopped = asyncio.Event(), asyncio.Event()
    ids: dict[str, str] = {}

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        new = _unanswered(request)
        if request.session_id == "lead":
            if new == ["fan out"]:
                return tool_call_reply(
                    *(
                        ("subagent", {"description": f"Research part {p}", "prompt": f"task {p}"})
                        for p in "ABC"
                    )
                )
            if all(t.startswith("started subagent ") for t in new):
                in_step_2.set()
                return held_reply(busy, "still working on my part")
            if any("was stopped before it finished" in t for t in new):
                stopped.set()
                return "done"
            if any(t.startswith("Background subagent") for t in new):
                return tool_call_reply(
                    ("send_message", {"subagent_id": ids["A"], "message": "more for A"})
                )
            if new[0].startswith("message queued"):
                return tool_call_reply(("list_agents", {}))
            if "[running]" in new[0]:
                return tool_call_reply(("interrupt_agent", {"agent_id": ids["A"]}))
            return "waiting for the notice"
        part = _first_user(request).removeprefix("task ")
        ids.setdefault(part, request.session_id or "")
        if len(ids) == 3:
            known.set()
        if request.last_user_text == "more for A":
            return held_reply(held_a)
        if part == "C":
            return held_reply(turn_c, "C answered")
        if request.last is not None and request.last.role == "tool":
            return f"{part} answered"
        report = tool_call_reply(("report", {"output": f"{part} found something"}))
        return held_reply(in_step_2 if part == "A" else turn_b, report)

    async with scripted_host(
        "subagent",
        "subagent-spawn",
        _spawn_tool(background_mode="continuable"),
        *CONTROL,
        model=model,
        load=LOAD,
        store="jsonl",
        store_root=tmp_path,
    ) as host:
        until = _ended(host)
        host.ctx.on(
            "subagent/end", lambda info: (turn_b if info.id == ids.get("A") else turn_c).set()
        )
        lead = (await host.create_agent(session_id="lead")).agent
        lead.followup(user_message("fan out"))
        async with asyncio.timeout(30):
            await known.wait()
            for part in "ABC":
                await until(ids[part]).wait()
        a, b, c = ids["A"], ids["B"], ids["C"]
        # The parent is still in its second request: everything waits for its next step.
        assert lead.status == "running"
        pending = [(m.source.kind, m.text) for m in lead.inbox.next_step]
        assert not lead.inbox.next_turn
        done = "finished and will do no further work unless you send it more."
        assert pending == [
            ("subagent-report", f"Background subagent {a} reported:A found something"),
            ("subagent-settled", f"Background subagent {a} {done}Its closing message:A answered"),
            ("subagent-report", f"Background subagent {b} reported:B found something"),
            ("subagent-settled", f"Background subagent {b} {done}Its closing message:B answered"),
            ("subagent-settled", f"Background subagent {c} {done}Its closing message:C answered"),
        ]
        busy.set()
        async with asyncio.timeout(30):
            await until(a, 2).wait()  # the interrupted second epoch
            await stopped.wait()
            await lead.when_idle()
        messages = lead.session.derive_messages()
        first = next(m for m in messages if m.role == "assistant")
        calls = [b.name for b in first.content if isinstance(b, ToolCallBlock)]
        assert calls == ["subagent"] * 3  # one response
        results = _tool_results(messages)
        assert results[:3] == [f"started subagent {i}" for i in (a, b, c)]
        assert results[3] == f"message queued as the next turn for subagent {a}"
        assert results[4].splitlines() == [
            f"{a} [running] — Research part A",
            f"{b} [ready] — Research part B",
            f"{c} [ready] — Research part C",
        ]
        assert results[5] == f"interrupt requested for agent {a}"
        # Turn 1 read the five messages in one step, in the order they were queued.
        kinds = ("user", "subagent-report", "subagent-settled")
        user_texts = [m.text for m in messages if m.role == "user" and m.source.kind in kinds]
        assert user_texts[1:6] == [text for _, text in pending]
        assert user_texts[6].startswith(f"Background subagent {a} was stopped before it finished.")
        assert len(user_texts) == 7
        turns = [e for e in lead.session.events if e.type == "turn/start"]
        assert len(turns) <= 2  # the stop notice may wake one more turn; nothing else does
        # The follow-up was stored in child A's log, attributed to the coordinator.
        stored = [json.loads(line) for line in (tmp_path / f"{a}.jsonl").read_text().splitlines()]
        assert "more for A" in json.dumps(stored) and '"coordinator"' in json.dumps(stored)


async def test_a_fork_child_in_the_foreground_sees_the_completed_turns_only() -> None:
    """tools 15.4, FORK-1, FORK-2, TOOL-7, DRV-7: a one-shot `fork` tool waits for its
    child; the child's request holds the parent's completed turn but not the turn that is
    delegating; its answer is the tool result and the child is gone afterwards."""
    seen: list[list[str]] = []

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if request.session_id == "lead":
            new = _unanswered(request)
            if new == ["remember the number 42"]:
                return "noted"
            if new == ["ask a fork"]:
                return tool_call_reply(
                    ("fork", {"description": "Recall the number", "prompt": "which number?"})
                )
            return f"the fork said: {new[0]}"
        seen.append(
            [
                m.text
                for m in request.messages
                if m.role == "assistant" or (m.role == "user" and m.source.kind == "user")
            ]
        )
        return "it was 42"

    async with scripted_host(
        "subagent",
        "subagent-fork",
        PluginRow(plugin="tool-subagent", config={"provider": "fork", "tool_name": "fork"}),
        model=model,
        load=LOAD,
    ) as host:
        lead = (await host.create_agent(session_id="lead")).agent
        assert await host.run(lead, "remember the number 42") == "noted"
        schema = next(t for t in host.ctx.tools.schemas() if t.name == "fork")
        assert "run_in_background" in schema.parameters["properties"]  # one-shot: may ask
        assert await host.run(lead, "ask a fork") == "the fork said: it was 42"
        assert len(seen) == 1
        texts = [t for t in seen[0] if t]
        assert texts[:2] == ["remember the number 42", "noted"]
        assert "ask a fork" not in texts and texts[-1] == "which number?"
        assert [a.id for a in host.ctx.agents.list()] == ["lead"]


async def test_a_structured_output_child_records_its_value_through_the_real_loop() -> None:
    """tools 15.4, STR-1, STR-2, RPT-1: a one-shot spawn child with an output schema gets a
    child-scoped `structured_output` tool (and no `report`: it is not continuable); invalid
    arguments come back as an error it can fix in the same turn, and a valid call ends the
    turn with the value in the result."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    offered: list[tuple[str, ...]] = []

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if request.session_id == "lead":
            new = _unanswered(request)
            if new == ["extract"]:
                return tool_call_reply(("extract", {}))
            return f"got {new[0]}"
        offered.append(request.tool_names)
        if request.last is not None and request.last.role == "tool":
            return tool_call_reply(("structured_output", {"city": "Lisbon"}))
        return tool_call_reply(("structured_output", {"town": 3}))

    async def extract(args: Any, run: Any) -> str:
        request = SubagentStartRequest(
            prompt=text_blocks("Which city?"), parent=run.agent, output_schema=schema
        )
        child = await run.ctx[SUBAGENTS].start("spawn", request)
        try:
            result = await child.result
        finally:
            await child.dispose()
        return f"{result.stop_reason} {json.dumps(dict(result.structured))}"

    async with scripted_host(
        "subagent", "subagent-spawn", _spawn_tool(), *CONTROL, model=model, load=LOAD
    ) as host:
        host.ctx.tools.register(
            ToolDefinition(name="extract", description="extract", parameters={}, execute=extract)
        )
        lead = (await host.create_agent(session_id="lead")).agent
        assert await host.run(lead, "extract") == 'got completed {"city": "Lisbon"}'
        assert len(offered) == 2  # the invalid call, then the valid one: no third request
        assert all("structured_output" in names and "report" not in names for names in offered)
        assert "structured_output" not in {t.name for t in host.ctx.tools.schemas()}


async def test_a_depth_capped_chain_refuses_the_fourth_level_with_an_errored_result() -> None:
    """tools 15.4, DEP-2, TOOL-6, TOOL-7: with the default `max_depth` 3 (§4), each agent of
    a foreground chain delegates one level deeper; the third-level child's call is refused
    with an errored tool result naming the depth (no exception, no hang), and every level
    still completes its turn."""

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        last = request.last
        if last is not None and last.role == "tool":
            return f"below me: {_tool_results([last])[0]}"
        return tool_call_reply(
            ("subagent", {"description": "Go one level deeper", "prompt": "delegate again"})
        )

    async with scripted_host(
        "subagent", "subagent-spawn", _spawn_tool(), model=model, load=LOAD
    ) as host:
        results: list[tuple[str, Any]] = []
        host.ctx.on(
            "session/event",
            lambda session, event: (
                results.append((session.header.delegation_depth, event.data))
                if event.type == "tool/result"
                else None
            ),
        )
        lead = (await host.create_agent(session_id="lead")).agent
        async with asyncio.timeout(30):
            answer = await host.run(lead, "start the chain")
        by_depth = {depth or 0: data for depth, data in results}
        assert sorted(by_depth) == [0, 1, 2, 3]
        refused = by_depth[3]
        assert refused.error is not None
        assert "subagent depth 4 exceeds maxDepth 3" in _tool_results([refused.message])[0]
        assert all(by_depth[d].error is None for d in (0, 1, 2))
        assert answer.startswith("below me: below me: below me: ")
        assert "exceeds maxDepth 3" in answer
        ends = [e.data.reason.kind for e in lead.session.events if e.type == "turn/end"]
        assert ends == ["completed"]


async def test_a_one_shot_background_child_is_collected_with_job_output() -> None:
    """tools 15.4, TOOL-8, OUT-2: in one-shot mode `run_in_background: true` starts a
    job (`started background subagent job subagent-1`, no continuable child); `job_output`
    with `wait` collects the child's answer and status."""
    release = asyncio.Event()

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if request.session_id == "lead":
            new = _unanswered(request)
            if new == ["go"]:
                return tool_call_reply(
                    (
                        "subagent",
                        {
                            "description": "Count the lighthouses",
                            "prompt": "count them",
                            "run_in_background": True,
                        },
                    )
                )
            if new[0].startswith("started background subagent job "):
                job_id = new[0].rsplit(" ", 1)[1]
                release.set()
                return tool_call_reply(("job_output", {"job_id": job_id, "wait": True}))
            return f"collected: {new[0]}"
        return held_reply(release, "seven lighthouses")

    async with scripted_host(
        "subagent", "subagent-spawn", _spawn_tool(), model=model, load=LOAD
    ) as host:
        lead = (await host.create_agent(session_id="lead")).agent
        async with asyncio.timeout(30):
            answer = await host.run(lead, "go")
        results = _tool_results(lead.session.derive_messages())
        assert results[0] == "started background subagent job subagent-1"
        assert results[1] == "seven lighthouses\n[status: completed]"
        assert answer == "collected: seven lighthouses\n[status: completed]"
        entries = await host.ctx[SUBAGENTS].list_children("lead")
        assert [e.mode for e in entries] == ["one-shot"]


async def test_a_turn_cancelled_as_the_foreground_child_is_prompted_stops_the_child() -> None:
    """tools 15 (races), TOOL-7, DRV-5: the parent's turn is cancelled re-entrantly, by a
    listener of the very insertion of a foreground child's prompt (before the child's turn
    exists to be stopped); the child is still stopped before it asks its model anything and is
    disposed, and the parent's call ends, bounded, as `subagent run was cancelled`."""
    asked: list[str] = []

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if request.session_id == "lead":
            if request.last is not None and request.last.role == "tool":
                return "stopped"
            return tool_call_reply(
                ("subagent", {"description": "Count the lighthouses", "prompt": "count them"})
            )
        asked.append(request.session_id or "")
        return held_reply(asyncio.Event(), "never answered")

    async with scripted_host(
        "subagent", "subagent-spawn", _spawn_tool(), model=model, load=LOAD
    ) as host:
        lead = (await host.create_agent(session_id="lead")).agent

        def on_inserted(agent: Any, message: Message) -> None:
            if agent is not lead and blocks_text(message.content) == "count them":
                lead.cancel(AgentCancelCause(kind="user"))

        host.ctx.on("agent/inbox/inserted", on_inserted, global_=True)
        lead.followup(user_message("delegate"))
        async with asyncio.timeout(10):
            await lead.when_idle()
        results = _tool_results(lead.session.derive_messages())
        assert results == ["Error: subagent run was cancelled"]
        assert asked == []
        assert [a.id for a in host.ctx.agents.list()] == ["lead"]


async def test_no_steer_or_report_tool_unless_its_package_is_loaded() -> None:
    """CONT-17: with every subagent distribution but the report plugin loaded, neither a
    parent nor a continuable child has steer_subagent or report (nor any tool that cancels,
    kills, steers or resumes a child, or asks its residency); loading tool-subagent-report
    gives the child report."""
    without = ("tool-subagent-control", "tool-subagent-list-agents")
    forbidden = ("steer", "cancel", "kill", "resume", "residency", "report")
    for plugins, expect_report in ((without, False), (CONTROL, True)):
        gate = asyncio.Event()
        async with scripted_host(
            "subagent",
            "subagent-spawn",
            _spawn_tool(background_mode="continuable"),
            *plugins,
            model=lambda request, gate=gate: held_reply(gate, "done"),
            load=LOAD,
        ) as host:
            parent = (await host.create_agent(session_id="lead")).agent
            started = await host.ctx[SUBAGENTS].start_continuable(
                ContinuableStartSpec(
                    provider="spawn", label="task", prompt=text_blocks("go"), parent=parent
                )
            )
            child = host.ctx.agents.get(started.child_id)
            assert child is not None
            for agent, may_report in ((parent, False), (child, expect_report)):
                names = {s.name for s in agent.ctx.tools.schemas()}
                assert "subagent" in names and "send_message" in names
                assert "steer_subagent" not in names
                assert ("report" in names) is may_report, names
                others = names - {"report"}
                assert not [n for n in others if any(word in n for word in forbidden)], names
            gate.set()
