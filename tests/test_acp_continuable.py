"""Continuable ACP children with dsh-acp-agent as the child process (ACPC-10..18, integration
tier): follow-ups to the live process, kill -9 of the child between turns, and a fresh parent
host that resumes the child from its store. The real SDK on both sides."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from acp_tree import FIXTURES, Ends, child_process, followup, jsonl_host, start_child

from dsh_core import SessionMeta, blocks_text
from dsh_subagent import SUBAGENTS
from dsh_subagent_acp._process import ChildProcess

pytestmark = [pytest.mark.slow, pytest.mark.dsh_timeout(600)]

BOUND = 120  # a loaded machine takes tens of seconds to start an SDK agent


def _child_config(tmp_path: Path) -> Path:
    """dsh-acp-agent on a JSONL store, with the test child's echoing model."""
    path = tmp_path / "child.toml"
    path.write_text(
        """
modules = { acp-test-child = "acp_child_plugins" }

[model]
provider = "test-child"
model = "m"

[store]
kind = "jsonl"
root = "child-sessions"

[[plugins]]
plugin = "acp-test-child"
""",
        encoding="utf-8",
    )
    return path


def agent_row(tmp_path: Path) -> dict[str, Any]:
    """The `acp` provider row that runs dsh-acp-agent on :func:`_child_config`'s config."""
    paths = [str(FIXTURES), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        "command": sys.executable,
        "args": ["-m", "dsh_acp_agent", "--config", str(_child_config(tmp_path))],
        "env": {"PYTHONPATH": os.pathsep.join(paths)},
        "start_timeout_ms": BOUND * 1000,
    }


async def test_a_dsh_acp_agent_child_continues_across_kills_and_restarts(tmp_path: Path) -> None:
    """ACPC-10, 11, 13, 18: a continuable child served by dsh-acp-agent answers; a follow-up
    is a new prompt to the same process; after kill -9 of that process between turns, a
    follow-up starts it again and loads the session (its replay is not output); after the
    parent host closes, a fresh host on the same store resumes the parent, and a follow-up
    cold-resumes the child through load. Each answer is that turn's only; the child's
    transcript is in the parent's store; no process is left behind."""
    processes: list[ChildProcess] = []
    async with jsonl_host(tmp_path / "parent-sessions", agent_row(tmp_path)) as host:
        ends = Ends(host, BOUND)
        handle = await host.create_agent(meta=SessionMeta(cwd=str(tmp_path)))
        parent = handle.agent
        child_id = await start_child(host, parent, "first", BOUND)
        assert await ends.answer(1) == "child says: first"
        process = child_process(host, child_id)
        processes.append(process)
        await followup(parent, child_id, "second", BOUND)
        assert await ends.answer(2) == "child says: second"
        assert child_process(host, child_id) is process

        os.kill(process.pid, signal.SIGKILL)
        async with asyncio.timeout(BOUND):
            await process.exited
        await followup(parent, child_id, "third", BOUND)
        assert await ends.answer(3) == "child says: third"
        processes.append(child_process(host, child_id))
        assert processes[-1].pid != process.pid
        parent_id = parent.id
        await handle.dispose()

    async with jsonl_host(tmp_path / "parent-sessions", agent_row(tmp_path)) as host:
        ends = Ends(host, BOUND)
        handle = await host.resume_agent(parent_id)
        parent = handle.agent
        (entry,) = await host.ctx[SUBAGENTS].list_children(parent_id)
        assert (entry.id, entry.mode, entry.activity) == (child_id, "continuable", "inactive")
        await followup(parent, child_id, "fourth", BOUND)
        assert await ends.answer(1) == "child says: fourth"
        processes.append(child_process(host, child_id))
        _, events = await host.ctx.session_persistence.load(child_id)
        asked = [
            blocks_text(e.data.content)
            for e in events
            if e.type == "user/message" and e.data.source.kind != "plugin"  # not the context
        ]
        assert asked == ["first", "second", "third", "fourth"]
        await handle.dispose()
    for process in processes:
        assert process.exited.done()
        with pytest.raises(ProcessLookupError):
            os.kill(process.pid, 0)
