"""Continuable ACP children (ACPC-10..19) against the fake agent process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

import dsh_subagent.plugin
import dsh_subagent_acp.plugin
from dsh_core import SessionMeta, blocks_text, text_blocks
from dsh_core.testing import scripted_host
from dsh_subagent import (
    ContinuableStartSpec,
    UserInterruptAuthority,
)
from dsh_subagent_acp._continuable import decode_model, encode_model, new_input
from dsh_subagent_acp._process import ChildProcess

FAKE_AGENT = str(Path(__file__).with_name("fake_acp_agent.py"))
MODULES = {"subagent": dsh_subagent.plugin, "subagent-acp": dsh_subagent_acp.plugin}
BOUND = 20


async def _gone(child: ChildProcess) -> None:
    """Wait (bounded) until the child process has exited and been reaped."""
    async with asyncio.timeout(BOUND):
        await child.exited
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)


def _turn_ends(agent_events: Any) -> list[Any]:
    return [e.data for e in agent_events if e.type == "turn/end"]


async def test_a_followup_is_a_new_prompt_of_the_same_live_session(acp: Any) -> None:
    """ACPC-10, ACPC-11: a continuable ACP child answers its prompt, settles, and a
    follow-up goes to the same live process, as a new prompt of the same ACP session; the
    descriptor keeps the route and the ACP session; the child is listed like any other."""
    async with acp.tree() as t:
        child_id = await t.start("first")
        first = await t.ended(1)
        assert (first.stop_reason, blocks_text(first.last_assistant_message or ())) == (
            "completed",
            "echo: first",
        )
        pid = t.pid(child_id)
        await t.followup(child_id, "second")
        second = await t.ended(2)
        assert blocks_text(second.last_assistant_message or ()) == "echo: second"
        assert t.pid(child_id) == pid
        _, events = await t.host.ctx.session_persistence.load(child_id)
        (descriptor,) = [e.data for e in events if e.type == "subagent/descriptor"]
        assert descriptor["provider"] == "acp"
        assert descriptor["agent_provider"] == "subagent-acp/acp"
        assert decode_model(descriptor["agent_model"]) == ("fake-session-1", os.getcwd())
        (entry,) = await t.svc.list_children(t.parent.id)
        assert (entry.id, entry.mode) == (child_id, "continuable")


async def test_a_turn_leaves_no_waiter_on_the_live_process(acp: Any) -> None:
    """ACPC-80: a turn waits for the prompt's answer, the process's exit and the interrupt
    without leaving a callback on the process's exit after it: the process outlives its
    turns, so many follow-ups do not pile callbacks up there."""
    async with acp.tree() as t:
        child_id = await t.start("first")
        await t.ended(1)
        exited = t.process(child_id).exited
        waiters = len(exited._callbacks or ())  # None when there is none (the C future)
        for i in range(5):
            await t.followup(child_id, f"again {i}")
            await t.ended(2 + i)
            assert len(exited._callbacks or ()) == waiters


async def test_a_turn_moves_the_idle_release_on_without_a_new_timer(acp: Any) -> None:
    """ACPC-81: a follow-up's turn keeps the process's idle timer and moves its release time
    on; the timer firing at its old time finds the process idle for less than
    idle_release_ms, keeps it and waits for the rest."""
    async with acp.tree(idle_release_ms=60_000) as t:
        child_id = await t.start("first")
        await t.ended(1)
        held = t.sessions.held[child_id]
        timer, until = held.idle, held.idle_until
        assert timer is not None
        await t.followup(child_id, "second")
        await t.ended(2)
        assert held.idle is timer and held.idle_until > until
        timer.cancel()
        t.sessions._idle(held)  # the old timer, firing early
        assert t.sessions.held[child_id] is held
        assert held.idle is not None and held.idle.when() == held.idle_until


async def test_a_child_killed_between_turns_resumes_through_load(acp: Any) -> None:
    """ACPC-13: after kill -9 of the child between turns, a follow-up starts the command
    again and loads the ACP session; what the load replays is not output."""
    async with acp.tree("--load") as t:
        child_id = await t.start("first")
        await t.ended(1)
        pid = t.pid(child_id)
        process = t.process(child_id)
        os.kill(pid, signal.SIGKILL)
        await _gone(process)
        await t.followup(child_id, "after the kill")
        second = await t.ended(2)
        assert second.stop_reason == "completed"
        assert blocks_text(second.last_assistant_message or ()) == "echo: after the kill"
        assert t.pid(child_id) != pid


async def test_an_agent_that_only_resumes_is_resumed(acp: Any) -> None:
    """ACPC-13: an agent that advertises session resume but not load is resumed with it."""
    async with acp.tree("--resume", idle_release_ms=1) as t:
        child_id = await t.start("first")
        await t.ended(1)
        await t.followup(child_id, "again")
        second = await t.ended(2)
        assert blocks_text(second.last_assistant_message or ()) == "echo: again"


async def test_an_agent_that_cannot_load_refuses_the_resume_and_says_why(acp: Any) -> None:
    """ACPC-14: when the process is gone and the agent advertises neither load nor resume,
    the follow-up's turn fails ACP_NOT_RESUMABLE, saying why; the epoch ends error."""
    async with acp.tree() as t:
        child_id = await t.start("first")
        await t.ended(1)
        pid = t.pid(child_id)
        process = t.process(child_id)
        os.kill(pid, signal.SIGKILL)
        await _gone(process)
        await t.followup(child_id, "after the kill")
        second = await t.ended(2)
        assert second.stop_reason == "error"
        _, events = await t.host.ctx.session_persistence.load(child_id)
        failure = _turn_ends(events)[-1].reason.error
        assert failure.code == "ACP_NOT_RESUMABLE"
        assert "advertises neither session/load nor session resume" in failure.message
        assert child_id not in t.sessions.held


async def test_an_idle_process_is_released_and_comes_back_through_load(acp: Any) -> None:
    """ACPC-15: a process idle for idle_release_ms is released (the ladder ends it); the
    next follow-up starts it again and loads the session."""
    async with acp.tree("--load", idle_release_ms=50) as t:
        child_id = await t.start("first")
        await t.ended(1)
        await _gone(t.process(child_id))
        assert child_id not in t.sessions.held
        await t.followup(child_id, "later")
        second = await t.ended(2)
        assert blocks_text(second.last_assistant_message or ()) == "echo: later"


async def test_disposing_the_parent_ends_its_childrens_processes(acp: Any) -> None:
    """ACPC-16: disposing the parent agent ends its continuable children's processes at
    once (idle time notwithstanding); unloading the plugin ends the others."""
    async with acp.tree(idle_release_ms=600_000) as t:
        child_id = await t.start()
        await t.ended(1)
        process = t.process(child_id)
        other = await t.host.create_agent(meta=SessionMeta(cwd=os.getcwd()))
        spec = ContinuableStartSpec(
            provider="acp", label="kept", prompt=text_blocks("x"), parent=other.agent
        )
        kept = (await t.svc.start_continuable(spec)).child_id
        await t.ended(2)
        kept_process = t.process(kept)
        async with asyncio.timeout(BOUND):
            await other.dispose()
        await _gone(kept_process)
        assert not process.exited.done()  # the first parent lives: its child's process too
    await _gone(process)


async def test_an_interrupt_cancels_the_childs_prompt(acp: Any) -> None:
    """ACPC-17: interrupting a continuable ACP child's turn sends session/cancel; the child
    answers cancelled, the turn ends aborted at that answer (not after the disposal grace,
    a minute here), and the process is kept for the next turn."""
    async with acp.tree("--hold-text", "hold", dispose_grace_ms=60_000) as t:
        prompting = asyncio.Event()
        sessions = t.sessions
        prompt = sessions._prompt

        async def watched(*args: Any) -> Any:
            prompting.set()
            return await prompt(*args)

        sessions._prompt = watched  # type: ignore[method-assign]
        child_id = await t.start("hold")
        async with asyncio.timeout(BOUND):
            await prompting.wait()
        pid = t.pid(child_id)
        t.svc.interrupt(child_id, UserInterruptAuthority(parent_session_id=t.parent.id))
        first = await t.ended(1)
        assert first.stop_reason == "aborted"
        await t.followup(child_id, "next")
        second = await t.ended(2)
        assert blocks_text(second.last_assistant_message or ()) == "echo: next"
        assert t.pid(child_id) == pid


def test_the_model_string_and_the_turns_input() -> None:
    """ACPC-12: the descriptor's model string round-trips; a stored value that is not one
    is refused; a turn sends the user messages after the last answer."""
    from dsh_core import ModelSource, PluginSource, assistant_message, user_message

    assert decode_model(encode_model("s-1", "/w")) == ("s-1", "/w")
    for bad in ("", "x", "[]", json.dumps({"acp_session": "s"}), encode_model("s", "rel")):
        assert decode_model(bad) is None
    history = [
        user_message(text_blocks("old")),
        assistant_message(text_blocks("answer"), source=ModelSource(provider="p", model="m")),
        user_message(text_blocks("one")),
        user_message(
            text_blocks("local context"), source=PluginSource(plugin="x", form="snapshot")
        ),
        user_message(text_blocks("two")),
    ]
    assert new_input(history) == "one\n\ntwo"


async def _prompting(t: Any, prompt: str) -> str:
    """Start a child with ``prompt`` and wait (bounded) until its prompt reached the agent."""
    prompting = asyncio.Event()
    sessions = t.sessions
    original = sessions._prompt

    async def watched(*args: Any) -> Any:
        prompting.set()
        return await original(*args)

    sessions._prompt = watched  # type: ignore[method-assign]
    child_id = await t.start(prompt)
    async with asyncio.timeout(BOUND):
        await prompting.wait()
    return child_id


@pytest.mark.parametrize("kind", ["children", "descendants"])
async def test_a_drain_ends_the_childs_process_child_first(kind: str, acp: Any) -> None:
    """ACPC-38: a drain that releases a continuable ACP child ends its process with the
    disposal ladder within the child's own release (idle time notwithstanding): the process
    is gone by the time the drain resolves; a settled child keeps its process."""
    async with acp.tree("--hold-text", "hold", idle_release_ms=600_000) as t:
        settled = await t.start("done")
        await t.ended(1)
        kept = t.process(settled)
        child_id = await _prompting(t, "hold")
        process = t.process(child_id)
        if kind == "children":
            release = t.svc.drain_continuable_children(t.parent, [child_id])
        else:
            release = t.svc.drain_continuable_descendants([t.parent])
        async with asyncio.timeout(BOUND):
            await release
        assert process.exited.done()
        assert child_id not in t.sessions.held
        assert (await t.ended(2)).stop_reason == "aborted"
        assert not kept.exited.done()
    await _gone(process)


async def test_closing_the_host_drains_running_children_before_ending_processes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    acp: Any,
) -> None:
    """ACPC-39: closing the host cancels a continuable ACP child's running turn and
    releases the child before its process ends (child-first): the turn ends aborted, the
    agent was sent session/cancel, and the process is gone."""
    log = tmp_path / "methods"
    monkeypatch.setenv("FAKE_ACP_METHODS", str(log))
    config = {
        "command": sys.executable,
        "args": [FAKE_AGENT, "--hold-text", "hold"],
        "start_timeout_ms": 10_000,
        "idle_release_ms": 600_000,
    }
    async with scripted_host(
        "subagent", "subagent-acp", modules=MODULES, config={"subagent-acp": config}
    ) as host:
        handle = await host.create_agent(meta=SessionMeta(cwd=os.getcwd()))
        t = acp.Tree(host, handle.agent)
        child_id = await _prompting(t, "hold")
        process = t.process(child_id)
    await _gone(process)
    assert (await t.ended(1)).stop_reason == "aborted"
    assert log.read_text().split()[-1] == "session/cancel"
