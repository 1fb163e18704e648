"""Continuable ACP children with dsh-acp-agent as the child process (ACPC-10..18, integration
tier): follow-ups to the live process, kill -9 of the child between turns, and a fresh parent
host that resumes the child from its store. The real SDK on both sides."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import dsh_subagent.plugin
import dsh_subagent_acp.plugin
from dsh_core import SessionMeta, blocks_text, text_blocks
from dsh_core.testing import TestHost, scripted_host
from dsh_subagent import (
    SUBAGENTS,
    ContinuableStartSpec,
    CoordinatorMessageSource,
    SubagentFollowupOptions,
    SubagentRunEndInfo,
)
from dsh_subagent_acp._continuable import AcpSessions
from dsh_subagent_acp._process import ChildProcess

pytestmark = [pytest.mark.slow, pytest.mark.dsh_timeout(600)]

FIXTURES = Path(__file__).parent / "fixtures" / "acp"
MODULES = {"subagent": dsh_subagent.plugin, "subagent-acp": dsh_subagent_acp.plugin}
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


class _Ends:
    def __init__(self, host: TestHost) -> None:
        self.ends: list[SubagentRunEndInfo] = []
        self.changed = asyncio.Event()
        host.ctx.on("subagent/end", self._end)

    def _end(self, info: SubagentRunEndInfo) -> None:
        self.ends.append(info)
        self.changed.set()

    async def answer(self, count: int) -> str:
        async with asyncio.timeout(BOUND):
            while len(self.ends) < count:
                self.changed.clear()
                await self.changed.wait()
        end = self.ends[count - 1]
        assert end.stop_reason == "completed", end
        return blocks_text(end.last_assistant_message or ())


@contextlib.asynccontextmanager
async def _host(tmp_path: Path) -> AsyncIterator[TestHost]:
    paths = [str(FIXTURES), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    config = {
        "command": sys.executable,
        "args": ["-m", "dsh_acp_agent", "--config", str(_child_config(tmp_path))],
        "env": {"PYTHONPATH": os.pathsep.join(paths)},
        "start_timeout_ms": BOUND * 1000,
    }
    async with scripted_host(
        "subagent",
        "subagent-acp",
        modules=MODULES,
        config={"subagent-acp": config},
        store="jsonl",
        store_root=tmp_path / "parent-sessions",
    ) as host:
        yield host


def _process(host: TestHost, child_id: str) -> ChildProcess:
    provider = host.ctx[SUBAGENTS].get_provider("acp")
    sessions = provider.sessions  # type: ignore[union-attr]
    assert isinstance(sessions, AcpSessions)
    return sessions.held[child_id].opened.child


async def _followup(parent: Any, child_id: str, text: str) -> None:
    source = CoordinatorMessageSource(sender_session_id=parent.id)
    async with asyncio.timeout(BOUND):
        await parent.ctx[SUBAGENTS].followup(
            parent, child_id, text_blocks(text), SubagentFollowupOptions(source=source)
        )


async def test_a_dsh_acp_agent_child_continues_across_kills_and_restarts(tmp_path: Path) -> None:
    """ACPC-10, 11, 13, 18: a continuable child served by dsh-acp-agent answers; a follow-up
    is a new prompt to the same process; after kill -9 of that process between turns, a
    follow-up starts it again and loads the session (its replay is not output); after the
    parent host closes, a fresh host on the same store resumes the parent, and a follow-up
    cold-resumes the child through load. Each answer is that turn's only; the child's
    transcript is in the parent's store; no process is left behind."""
    processes: list[ChildProcess] = []
    async with _host(tmp_path) as host:
        ends = _Ends(host)
        handle = await host.create_agent(meta=SessionMeta(cwd=str(tmp_path)))
        parent = handle.agent
        spec = ContinuableStartSpec(
            provider="acp", label="remote", prompt=text_blocks("first"), parent=parent
        )
        async with asyncio.timeout(BOUND):
            child_id = (await host.ctx[SUBAGENTS].start_continuable(spec)).child_id
        assert await ends.answer(1) == "child says: first"
        process = _process(host, child_id)
        processes.append(process)
        await _followup(parent, child_id, "second")
        assert await ends.answer(2) == "child says: second"
        assert _process(host, child_id) is process

        os.kill(process.pid, signal.SIGKILL)
        async with asyncio.timeout(BOUND):
            await process.exited
        await _followup(parent, child_id, "third")
        assert await ends.answer(3) == "child says: third"
        processes.append(_process(host, child_id))
        assert processes[-1].pid != process.pid
        parent_id = parent.id
        await handle.dispose()

    async with _host(tmp_path) as host:
        ends = _Ends(host)
        handle = await host.resume_agent(parent_id)
        parent = handle.agent
        (entry,) = await host.ctx[SUBAGENTS].list_children(parent_id)
        assert (entry.id, entry.mode, entry.activity) == (child_id, "continuable", "inactive")
        await _followup(parent, child_id, "fourth")
        assert await ends.answer(1) == "child says: fourth"
        processes.append(_process(host, child_id))
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
