"""dsh-subagent-acp driving dsh-acp-agent: the real SDK on both sides, a scripted model in the
child (acp 16.3, integration tier). Each test starts dsh-acp-agent processes (about a second
each, mostly the SDK's import)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import dsh_subagent.plugin
import dsh_subagent_acp.plugin
from dsh_core import AbortController, SessionMeta, blocks_text, text_blocks
from dsh_core.testing import scripted_host
from dsh_subagent import SUBAGENTS, SubagentRun, SubagentStartRequest

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures" / "acp"
MODULES = {"subagent": dsh_subagent.plugin, "subagent-acp": dsh_subagent_acp.plugin}


def _child_config(tmp_path: Path, *, store: str = "memory") -> Path:
    """A dsh-acp-agent config: subagent + spawn, the test child's model and delegate tool."""
    path = tmp_path / "child.toml"
    path.write_text(
        f"""
load = ["dsh-subagent", "dsh-subagent-spawn"]
modules = {{ acp-test-child = "acp_child_plugins" }}

[model]
provider = "test-child"
model = "m"

[store]
kind = "{store}"
root = "sessions"

[[plugins]]
plugin = "subagent"

[[plugins]]
plugin = "subagent-spawn"

[[plugins]]
plugin = "acp-test-child"
""",
        encoding="utf-8",
    )
    return path


def _child_env() -> dict[str, str]:
    """Where the child finds the test plugin module (and, in a dev checkout, the sources)."""
    paths = [str(FIXTURES), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths)}


@contextlib.asynccontextmanager
async def _parent(tmp_path: Path) -> AsyncIterator[Any]:
    config = {
        "command": sys.executable,
        "args": ["-m", "dsh_acp_agent", "--config", str(_child_config(tmp_path))],
        "env": _child_env(),
        "dispose_eof_grace_ms": 5000,
        "dispose_grace_ms": 2000,
    }
    async with scripted_host(
        "subagent", "subagent-acp", modules=MODULES, config={"subagent-acp": config}
    ) as host:
        handle = await host.create_agent(meta=SessionMeta(cwd=str(tmp_path)))
        try:
            yield handle.agent
        finally:
            await handle.dispose()


async def _start(parent: Any, prompt: str, signal: Any = None) -> SubagentRun:
    request = SubagentStartRequest(
        prompt=text_blocks(prompt), parent=parent, signal=signal or AbortController().signal
    )
    async with asyncio.timeout(60):
        return await parent.ctx[SUBAGENTS].start("acp", request)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_prompt_streams_the_child_answer(tmp_path: Path) -> None:
    """acp 16.3 / ACP-3: a dsh child behind dsh-acp-agent answers; its streamed text is the
    output, completed; dispose ends the process at stdin EOF."""
    async with _parent(tmp_path) as parent:
        run = await _start(parent, "hello over acp")
        try:
            async with asyncio.timeout(60):
                result = await run.result
        finally:
            async with asyncio.timeout(60):
                await run.dispose()
        assert result.stop_reason == "completed"
        assert blocks_text(result.output) == "child says: hello over acp"
        assert _gone(run.pid)  # type: ignore[attr-defined]


async def test_a_child_delegates_to_its_own_spawn_child(tmp_path: Path) -> None:
    """acp 16.3: the ACP child delegates to a spawn child of its own, then answers with it."""
    async with _parent(tmp_path) as parent:
        run = await _start(parent, "delegate: sub task")
        try:
            async with asyncio.timeout(60):
                result = await run.result
        finally:
            await run.dispose()
        assert result.stop_reason == "completed"
        assert blocks_text(result.output) == "parent got: child says: sub task"


async def test_cancel_stops_a_running_child(tmp_path: Path) -> None:
    """ACP-5 / acp 16.2: an abort settles aborted at once; dispose reaps the child."""
    async with _parent(tmp_path) as parent:
        controller = AbortController()
        run = await _start(parent, "hold on", controller.signal)
        controller.abort("enough")
        assert (await run.result).stop_reason == "aborted"
        async with asyncio.timeout(60):
            await run.dispose()
        assert _gone(run.pid)  # type: ignore[attr-defined]


class _Recorder:
    """A raw SDK client that records every session update."""

    def __init__(self) -> None:
        self.updates: list[Any] = []
        self.working = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)
        if getattr(update.content, "text", None) == "working":  # a "hold" turn is running
            self.working.set()

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def kinds(self) -> list[str]:
        return [u.session_update for u in self.updates]


@contextlib.asynccontextmanager
async def _raw_child(tmp_path: Path, recorder: _Recorder, store: str) -> AsyncIterator[Any]:
    import acp

    config = _child_config(tmp_path, store=store)
    env = {**os.environ, **_child_env()}
    async with acp.spawn_agent_process(
        recorder, sys.executable, "-m", "dsh_acp_agent", "--config", str(config), env=env,
        cwd=tmp_path,
    ) as (conn, process):  # fmt: skip
        async with asyncio.timeout(60):
            init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        yield conn, init, process


async def test_served_updates_cancel_and_load(tmp_path: Path) -> None:
    """acp 16.2: dsh-acp-agent streams text, tool_call and tool_call_update; session/cancel
    answers the prompt cancelled; with a jsonl store it advertises loadSession and a new
    process replays a session from the store; an unknown id is refused."""
    import acp

    first = _Recorder()
    async with _raw_child(tmp_path, first, "jsonl") as (conn, init, _):
        assert init.agent_capabilities.load_session is True
        session_id = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        async with asyncio.timeout(60):
            response = await conn.prompt(
                session_id=session_id, prompt=[acp.text_block("delegate: x")]
            )
        assert response.stop_reason == "end_turn"
        kinds = first.kinds()
        assert kinds.index("tool_call") < kinds.index("tool_call_update")
        assert (
            "".join(
                u.content.text for u in first.updates if u.session_update == "agent_message_chunk"
            )
            == "parent got: child says: x"
        )
        prompt = asyncio.ensure_future(
            conn.prompt(session_id=session_id, prompt=[acp.text_block("hold please")])
        )
        async with asyncio.timeout(60):
            await first.working.wait()
            await conn.cancel(session_id=session_id)
            assert (await prompt).stop_reason == "cancelled"

    second = _Recorder()
    async with _raw_child(tmp_path, second, "jsonl") as (conn, _, _):
        async with asyncio.timeout(60):
            await conn.load_session(cwd=str(tmp_path), session_id=session_id, mcp_servers=[])
        replayed = second.kinds()
        assert replayed[0] == "user_message_chunk"
        assert "tool_call" in replayed and "agent_message_chunk" in replayed
        with pytest.raises(acp.RequestError):
            await conn.load_session(cwd=str(tmp_path), session_id="no-such-session", mcp_servers=[])
        async with asyncio.timeout(60):
            again = await conn.prompt(session_id=session_id, prompt=[acp.text_block("again")])
        assert again.stop_reason == "end_turn"


async def test_memory_store_offers_no_load(tmp_path: Path) -> None:
    """acp 16.2: without a durable store, initialize advertises no loadSession; a plugin's
    print to stdout does not corrupt the protocol (it lands on stderr)."""
    recorder = _Recorder()
    async with _raw_child(tmp_path, recorder, "memory") as (conn, init, _):
        assert init.agent_capabilities.load_session is False
        session_id = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        import acp

        async with asyncio.timeout(60):
            response = await conn.prompt(session_id=session_id, prompt=[acp.text_block("hi")])
        assert response.stop_reason == "end_turn"
