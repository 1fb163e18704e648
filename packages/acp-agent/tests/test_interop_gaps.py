"""dsh-acp-agent: the protocol gaps interop with other clients found (ACPC-1, 2, 5, 6, 9)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import acp
import pytest
from acp._transport import memory_transport_pair

from dsh_acp_agent import AgentServerConfig, open_agent
from dsh_acp_agent._server import SESSION_LOCKED_CODE, DshAcpAgent


class _Recorder:
    def __init__(self) -> None:
        self.updates: list[Any] = []
        self.running = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)
        if getattr(getattr(update, "content", None), "text", None) == "working":
            self.running.set()

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@contextlib.asynccontextmanager
async def _served(config: AgentServerConfig) -> AsyncIterator[tuple[Any, _Recorder, DshAcpAgent]]:
    recorder = _Recorder()
    client_end, agent_end = memory_transport_pair()
    async with open_agent(config) as agent:
        server = asyncio.ensure_future(acp.run_agent(agent, agent_end))
        client = acp.connect_to_agent(recorder, client_end)
        try:
            yield client, recorder, agent
        finally:
            await client.close()
            async with asyncio.timeout(10):
                await server


@pytest.fixture
def hold(monkeypatch: pytest.MonkeyPatch) -> AgentServerConfig:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    return AgentServerConfig(
        modules={"hold-model": "hold_model"}, plugins=({"plugin": "hold-model"},),
        provider="hold",
    )  # fmt: skip


async def test_load_of_a_session_another_process_holds_is_its_own_error(tmp_path: Path) -> None:
    """ACPC-1: session/load of a session another live server holds (its file locked) is
    refused with the documented "Session locked" code, not -32002 (resource not found);
    an unknown id is still -32002."""
    config = AgentServerConfig(store="jsonl", store_root=str(tmp_path / "sessions"))
    async with _served(config) as (holder, _, _):
        sid = (await holder.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        async with asyncio.timeout(10):
            await holder.prompt(session_id=sid, prompt=[acp.text_block("mine")])
        async with _served(config) as (other, _, _):
            with pytest.raises(acp.RequestError) as refused:
                async with asyncio.timeout(10):
                    await other.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])
            assert refused.value.code == SESSION_LOCKED_CODE == -32042
            assert refused.value.data == {
                "sessionId": sid,
                "reason": "held by another live process",
            }
            with pytest.raises(acp.RequestError) as missing:
                await other.load_session(cwd=str(tmp_path), session_id="gone", mcp_servers=[])
            assert missing.value.code == -32002


async def test_a_prompt_after_a_cancel_waits_for_the_cancelled_turn(
    tmp_path: Path, hold: AgentServerConfig
) -> None:
    """ACPC-2: a prompt that arrives while a cancelled turn still unwinds waits for it and
    then runs (the cancelled prompt answers cancelled, the new one end_turn); a prompt on a
    turn that was not cancelled is still refused -32600."""
    async with _served(hold) as (client, rec, agent):
        sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        first = asyncio.ensure_future(
            client.prompt(session_id=sid, prompt=[acp.text_block("hold")])
        )
        async with asyncio.timeout(10):
            await rec.running.wait()
            with pytest.raises(acp.RequestError) as refused:
                await agent.prompt(session_id=sid, prompt=[acp.text_block("too soon")])
            assert refused.value.code == -32600
            # The cancel and the next prompt in one step: the turn cannot have unwound yet.
            await agent.cancel(session_id=sid)
            assert agent.sessions[sid].busy
            second = asyncio.ensure_future(
                agent.prompt(session_id=sid, prompt=[acp.text_block("after")])
            )
            assert (await first).stop_reason == "cancelled"
            assert (await second).stop_reason == "end_turn"


async def test_tool_call_raw_input_is_the_parsed_object(tmp_path: Path) -> None:
    """ACPC-6: a tool call's rawInput is the arguments' JSON value (an object), live and in a
    session/load replay; arguments that are not JSON stay the string."""
    body = """
[[rules]]
when = { last_role = "tool" }
reply = "done"

[[rules]]
reply = { tool_calls = [{ name = "nope", id = "c1", arguments = { path = "a.txt", n = 2 } }] }
"""
    script = tmp_path / "script.toml"
    script.write_text(body, encoding="utf-8")
    row = {"plugin": "llm-scripted", "config": {"script": str(script)}}
    config = AgentServerConfig(plugins=(row,), store="jsonl", store_root=str(tmp_path / "sessions"))
    async with _served(config) as (client, rec, _):
        sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        async with asyncio.timeout(10):
            await client.prompt(session_id=sid, prompt=[acp.text_block("go")])
        (call,) = [u for u in rec.updates if u.session_update == "tool_call"]
        assert call.raw_input == {"path": "a.txt", "n": 2}
    async with _served(config) as (client, rec, _):
        async with asyncio.timeout(10):
            await client.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])
        (call,) = [u for u in rec.updates if u.session_update == "tool_call"]
        assert call.raw_input == {"path": "a.txt", "n": 2}
    from dsh_acp_agent._server import raw_input

    assert raw_input('{"a": [1]}') == {"a": [1]}
    assert raw_input("{not json") == "{not json"


_LINES = [
    {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}},
    {"jsonrpc": "2.0", "id": 1, "method": "session/new",
     "params": {"cwd": "/", "mcpServers": []}},
]  # fmt: skip


@pytest.mark.slow
def test_stdout_may_be_a_regular_file(tmp_path: Path) -> None:
    """ACPC-5: with stdout redirected to a regular file (``dsh-acp-agent > out``) the server
    serves (the answers are in the file, in order) and exits 0 at EOF."""
    out = tmp_path / "out.jsonl"
    with out.open("wb") as sink:
        done = subprocess.run(
            [sys.executable, "-m", "dsh_acp_agent"],
            input="".join(json.dumps(line) + "\n" for line in _LINES).encode(),
            stdout=sink,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert [a["id"] for a in answers] == [0, 1]
    assert answers[1]["result"]["sessionId"]


@pytest.mark.slow
def test_the_process_ends_without_the_interpreter_teardown(tmp_path: Path) -> None:
    """ACPC-9: after serving (the host disposed), the console script ends the process at once:
    the interpreter's teardown (here an atexit hook standing in for it) never runs, the log
    written before is flushed, and the exit status is main's."""
    code = (
        "import atexit, logging, sys\n"
        "atexit.register(lambda: sys.stderr.write('TEARDOWN\\n'))\n"
        "from dsh_acp_agent.cli import run\n"
        "sys.argv = ['dsh-acp-agent', '--log-level', 'INFO']\n"
        "logging.getLogger('probe').warning('before the end')\n"
        "run()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input="".join(json.dumps(line) + "\n" for line in _LINES).encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "before the end" in err
    assert "TEARDOWN" not in err
    assert [json.loads(line)["id"] for line in done.stdout.decode().splitlines()] == [0, 1]
