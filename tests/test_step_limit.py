"""The per-turn step limit across the stack: a child's run stopped at its step limit, as the
parent's `subagent` tool result, a settlement notice, `list_agents` and `dsh-subagents run` show it
(ROB-10..12, ROB-14)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

from dsh_core import AgentOptions, PluginRow, ToolDefinition, blocks_text, make_plugin_manager
from dsh_core.testing import ScriptedReply, ScriptedRequest, scripted_host, tool_call_reply
from dsh_subagent import SubagentStartRequest
from dsh_subagent.in_process import child_agent_options
from dsh_subagents._run import RunOptions, run_agent

LOAD = (
    "dsh-subagent",
    "dsh-subagent-spawn",
    "dsh-tool-subagent",
    "dsh-tool-subagent-control",
    "dsh-tool-subagent-report",
)
CONTROL = ("tool-subagent-control", "tool-subagent-list-agents")
LIMITED = AgentOptions(provider="scripted", model="scripted-1", max_steps=3)


async def _noop(args: Any, run: Any) -> str:
    return "nothing happened"


NOOP = ToolDefinition(name="noop", description="Does nothing.", execute=_noop)


def _last_results(request: ScriptedRequest) -> list[str]:
    """The texts of the tool results and user messages after the latest assistant message."""
    texts: list[str] = []
    for m in reversed(request.messages):
        if m.role == "assistant":
            break
        if m.role == "tool":
            texts.append("".join(blocks_text(b.content) for b in m.content))  # type: ignore[attr-defined]
        else:
            texts.append(m.text)
    return texts[::-1]


def _steps(events: Any, turn: int) -> int:
    return sum(1 for e in events if e.type == "step/start" and e.data.turn == turn)


async def test_a_foreground_child_stopped_at_its_step_limit_is_a_failed_subagent_result() -> None:
    """ROB-10, ROB-12: a child whose model calls tools for ever inherits its parent's step
    limit (3) and stops there; the parent's `subagent` call is answered SUBAGENT_RUN_FAILED
    with the step-limit headline and diagnostic, and the parent's turn completes."""

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if request.session_id != "lead":
            return tool_call_reply("noop")  # the child: never done
        new = _last_results(request)
        if new == ["go"]:
            return tool_call_reply(("subagent", {"description": "loop", "prompt": "loop"}))
        return f"saw: {new[0]}"

    async with scripted_host(
        "subagent",
        "subagent-spawn",
        PluginRow(plugin="tool-subagent", config={"provider": "spawn"}),
        model=model,
        load=LOAD,
    ) as host:
        host.ctx.tools.register(NOOP)
        lead = (await host.create_agent(session_id="lead", options=LIMITED)).agent
        async with asyncio.timeout(30):
            answer = await host.run(lead, "go")
        assert answer == (
            "saw: Error: subagent run hit its step limit before finishing\n"
            "Diagnostic: the turn reached its step limit (3 steps)"
        )
        (result,) = [e.data for e in lead.session.events if e.type == "tool/result"]
        assert result.error.code == "SUBAGENT_RUN_FAILED"


async def test_a_continuable_child_at_its_step_limit_is_noticed_and_listed(
    tmp_path: Path,
) -> None:
    """ROB-11, ROB-12: a continuable child stopped at its inherited step limit settles with
    a notice saying so, `list_agents` marks it `stopped at its step limit`, and resumed by
    `send_message` it runs under the same limit."""
    ids: list[str] = []

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if request.session_id != "lead":
            if request.session_id not in ids:
                ids.append(request.session_id)
            return tool_call_reply("noop")
        new = _last_results(request)
        if new == ["go"]:
            return tool_call_reply(("subagent", {"description": "looper", "prompt": "loop"}))
        if new and new[0].startswith("Background subagent"):
            return tool_call_reply(("list_agents", {}))
        if new == ["again"]:
            return tool_call_reply(("send_message", {"subagent_id": ids[0], "message": "more"}))
        return f"saw: {' | '.join(new)}"

    ended: list[str] = []
    settled = [asyncio.Event(), asyncio.Event()]

    def on_end(info: Any) -> None:
        ended.append(info.stop_reason)
        settled[len(ended) - 1].set()

    async with scripted_host(
        "subagent",
        "subagent-spawn",
        PluginRow(
            plugin="tool-subagent",
            config={"provider": "spawn", "background_mode": "continuable"},
        ),
        *CONTROL,
        model=model,
        load=LOAD,
        store="jsonl",
        store_root=tmp_path,
    ) as host:
        host.ctx.tools.register(NOOP)
        host.ctx.on("subagent/end", on_end)
        lead = (await host.create_agent(session_id="lead", options=LIMITED)).agent
        async with asyncio.timeout(30):
            await host.run(lead, "go")
            await settled[0].wait()
            await lead.when_idle()  # the notice's turn: list_agents, then the answer
        child = ids[0]
        notice = f"Background subagent {child} reached its step limit before it finished."
        listed = f"{child} [ready, stopped at its step limit] — looper"
        messages = lead.session.derive_messages()
        assert any(m.role == "user" and m.text.startswith(notice) for m in messages)
        assert blocks_text(messages[-1].content) == f"saw: {listed}"
        async with asyncio.timeout(30):
            await host.run(lead, "again")
            await settled[1].wait()
            await lead.when_idle()
        assert ended == ["max-steps", "max-steps"]
        _, events = await host.ctx.session_persistence.load(child)
        assert (_steps(events, 1), _steps(events, 2)) == (3, 3)


def test_a_child_takes_the_parents_step_limit_unless_its_request_sets_one() -> None:
    """ROB-12: child_agent_options inherits the parent's max_steps; a request's own wins."""

    class Parent:
        options = AgentOptions(provider="p", model="m", max_steps=9)

    parent: Any = Parent()
    assert child_agent_options(parent, None, 1).max_steps == 9
    own = AgentOptions(max_steps=4)
    assert child_agent_options(parent, own, 1).max_steps == 4
    request = SubagentStartRequest(prompt=(), parent=parent, agent_options=own)
    assert request.agent_options is own


async def test_dsh_run_says_the_turn_ended_at_its_step_limit(tmp_path: Path) -> None:
    """ROB-14: `dsh-subagents run` on a model that calls tools for ever stops at the `agents` row's
    `max_steps` and says so on standard error, exit status 1."""
    script = tmp_path / "loop.toml"
    script.write_text('default = { tool_calls = [{ name = "nothing" }] }\n', encoding="utf-8")
    config = tmp_path / "dsh.toml"
    rows = ["sessions", "llm", "tools", "system-prompt"]
    config.write_text(
        "".join(f'[[plugins]]\nplugin = "{r}"\n' for r in rows)
        + '[[plugins]]\nplugin = "agents"\nconfig = { max_steps = 2 }\n',
        encoding="utf-8",
    )
    out, err = io.StringIO(), io.StringIO()
    options = RunOptions(prompt="Loop.", config=str(config), model=f"scripted:{script}")
    status = await run_agent(options, make_plugin_manager(), out, err=err)
    assert status == 1
    assert (
        "dsh-subagents run: the turn ended max-steps: the turn reached its step limit "
        "(2 steps) [MAX_STEPS]" in err.getvalue()
    )
    assert out.getvalue().count("→ nothing") == 2
