"""dsh-acp-agent on the JSONL store survives a kill -9: an answered prompt's turn is on disk
before the answer, so a new process's ``session/load`` replays every answered turn."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import acp
import pytest

pytestmark = pytest.mark.slow


class _Recorder:
    def __init__(self) -> None:
        self.updates: list[Any] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def texts(self, kind: str) -> str:
        return "".join(u.content.text for u in self.updates if u.session_update == kind)


@contextlib.asynccontextmanager
async def _agent(tmp_path: Path, recorder: _Recorder) -> AsyncIterator[tuple[Any, Any]]:
    config = tmp_path / "agent.toml"
    config.write_text('[store]\nkind = "jsonl"\nroot = "sessions"\n', encoding="utf-8")
    async with acp.spawn_agent_process(
        recorder, sys.executable, "-m", "dsh_acp_agent", "--config", str(config),
        env=dict(os.environ), cwd=tmp_path,
    ) as (conn, process):  # fmt: skip
        async with asyncio.timeout(60):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        yield conn, process


async def test_answered_prompts_survive_a_kill_and_load_replays_them(tmp_path: Path) -> None:
    """DUR-30: each answered session/prompt's turn is written before the answer; after two
    answered prompts and SIGKILL, a new process's session/load replays both turns."""
    first = _Recorder()
    async with _agent(tmp_path, first) as (conn, process):
        session_id = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        for text in ("first question", "second question"):
            async with asyncio.timeout(60):
                answer = await conn.prompt(session_id=session_id, prompt=[acp.text_block(text)])
            assert answer.stop_reason == "end_turn"
        process.send_signal(signal.SIGKILL)  # no teardown, no flush: only what was written
        async with asyncio.timeout(60):
            assert await process.wait() == -signal.SIGKILL
    assert first.texts("agent_message_chunk") == "first questionsecond question"

    second = _Recorder()
    async with _agent(tmp_path, second) as (conn, _):
        async with asyncio.timeout(60):
            await conn.load_session(cwd=str(tmp_path), session_id=session_id, mcp_servers=[])
    assert second.texts("user_message_chunk") == "first questionsecond question"
    assert second.texts("agent_message_chunk") == "first questionsecond question"


async def test_a_prompt_whose_turn_cannot_be_written_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-39: on the JSONL store, a turn whose lines cannot be written at its end fails the
    prompt (internal error) instead of answering end_turn for a turn a crash would lose."""
    from acp._transport import memory_transport_pair

    from dsh_acp_agent import AgentServerConfig, open_agent
    from dsh_core import SessionError
    from dsh_core._sessions import Session

    original = Session.checkpoint

    def checkpoint(self: Session) -> None:
        if self.events and self.events[-1].type == "turn/end":  # the disk fills at turn end
            raise SessionError("cannot write session file: no space left", code="SESSION_IO")
        original(self)

    config = AgentServerConfig(store="jsonl", store_root=str(tmp_path / "sessions"))
    client_end, agent_end = memory_transport_pair()
    async with open_agent(config) as agent:
        server = asyncio.ensure_future(acp.run_agent(agent, agent_end))
        client = acp.connect_to_agent(_Recorder(), client_end)
        try:
            async with asyncio.timeout(30):
                await client.initialize(protocol_version=acp.PROTOCOL_VERSION)
                sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
                monkeypatch.setattr(Session, "checkpoint", checkpoint)
                with pytest.raises(acp.RequestError) as caught:
                    await client.prompt(session_id=sid, prompt=[acp.text_block("hello")])
                assert "could not be written" in str(caught.value.data)
                monkeypatch.setattr(Session, "checkpoint", original)
                answer = await client.prompt(session_id=sid, prompt=[acp.text_block("again")])
                assert answer.stop_reason == "end_turn"
        finally:
            await client.close()
            async with asyncio.timeout(10):
                await server
