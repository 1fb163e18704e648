"""dsh-acp-agent: a dsh host served over ACP (acp 16.2). The agent runs in this process over
the SDK's in-memory transport pair; one test runs the console script as a process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import acp
import pytest
from acp._transport import memory_transport_pair

from dsh_acp_agent import AgentServerConfig, ConfigError, load_config, open_agent
from dsh_core import PluginError


class Recorder:
    """A client that records the session updates it is sent."""

    def __init__(self) -> None:
        self.updates: list[Any] = []
        self.running = asyncio.Event()
        self.arrived = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)
        self.arrived.set()
        if getattr(getattr(update, "content", None), "text", None) == "working":
            self.running.set()

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def text(self, kind: str = "agent_message_chunk") -> str:
        return "".join(u.content.text for u in self.updates if u.session_update == kind)


@contextlib.asynccontextmanager
async def served(config: AgentServerConfig) -> AsyncIterator[tuple[Any, Recorder]]:
    """An ACP client connected to ``open_agent(config)`` in this process."""
    recorder = Recorder()
    client_end, agent_end = memory_transport_pair()
    async with open_agent(config) as agent:
        server = asyncio.ensure_future(acp.run_agent(agent, agent_end))
        client = acp.connect_to_agent(recorder, client_end)
        try:
            yield client, recorder
        finally:
            await client.close()  # the server reads EOF and stops
            async with asyncio.timeout(10):
                await server


def script(tmp_path: Path, body: str) -> dict[str, Any]:
    """A ``plugins`` row mounting the scripted model on a script file."""
    path = tmp_path / "script.toml"
    path.write_text(body, encoding="utf-8")
    return {"plugin": "llm-scripted", "config": {"script": str(path)}}


@pytest.fixture
def hold(monkeypatch: pytest.MonkeyPatch) -> AgentServerConfig:
    """A server whose model is the test plugin ``hold_model`` (provider ``hold``)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    return AgentServerConfig(
        modules={"hold-model": "hold_model"}, plugins=({"plugin": "hold-model"},),
        provider="hold",
    )  # fmt: skip


async def test_initialize_and_prompt_stream_text(tmp_path: Path) -> None:
    """acp 16.2: initialize answers v1 (no loadSession on the memory store); a prompt streams
    the answer as agent_message_chunk and ends end_turn."""
    async with served(AgentServerConfig()) as (client, rec):
        init = await client.initialize(protocol_version=acp.PROTOCOL_VERSION)
        assert init.protocol_version == 1
        assert init.agent_capabilities.load_session is False
        assert init.agent_info.name == "dsh-acp-agent"
        sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        async with asyncio.timeout(10):
            response = await client.prompt(session_id=sid, prompt=[acp.text_block("hello")])
        assert response.stop_reason == "end_turn"
        assert rec.text() == "hello"  # the echo model


@pytest.mark.parametrize(
    ("reply", "stop_reason"),
    [
        ('"fine"', "end_turn"),
        ('{ text = "Once", finish = "max-tokens" }', "max_tokens"),
        ('{ tool_calls = [{ name = "nope" }] }', "max_turn_requests"),  # at the step limit
    ],
)
async def test_turn_end_maps_to_stop_reason(tmp_path: Path, reply: str, stop_reason: str) -> None:
    """acp 16.2, ROB-13: the dsh turn's end is answered with the ACP stop reason (a turn that
    reached its step limit: max_turn_requests)."""
    config = AgentServerConfig(plugins=(script(tmp_path, f"default = {reply}\n"),))
    async with served(config) as (client, _):
        sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        async with asyncio.timeout(10):
            response = await client.prompt(session_id=sid, prompt=[acp.text_block("go")])
        assert response.stop_reason == stop_reason


async def test_failed_turn_is_a_prompt_error(tmp_path: Path) -> None:
    """acp 16.2: a turn that ends in error has no ACP stop reason: the prompt fails."""
    body = 'default = { error = { message = "asked to fail", code = "X" } }\n'
    config = AgentServerConfig(plugins=(script(tmp_path, body),))
    async with served(config) as (client, _):
        sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        with pytest.raises(acp.RequestError):
            async with asyncio.timeout(10):
                await client.prompt(session_id=sid, prompt=[acp.text_block("go")])


async def test_tool_calls_stream_as_tool_cards(tmp_path: Path) -> None:
    """acp 16.2: reasoning streams as agent_thought_chunk; an unknown tool call still streams
    as tool_call then a failed tool_call_update."""
    body = """
[[rules]]
when = { last_role = "tool" }
reply = "done"

[[rules]]
reply = { reasoning = "hmm", tool_calls = [{ name = "nope", id = "c1" }] }
"""
    async with served(AgentServerConfig(plugins=(script(tmp_path, body),))) as (client, rec):
        sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        async with asyncio.timeout(10):
            response = await client.prompt(session_id=sid, prompt=[acp.text_block("go")])
        assert response.stop_reason == "end_turn"
        kinds = [u.session_update for u in rec.updates]
        assert kinds.index("agent_thought_chunk") < kinds.index("tool_call")
        assert kinds.index("tool_call") < kinds.index("tool_call_update")
        (done,) = [u for u in rec.updates if u.session_update == "tool_call_update"]
        assert (done.tool_call_id, done.status) == ("c1", "failed")
        assert rec.text() == "done"


async def test_cancel_answers_cancelled(tmp_path: Path, hold: AgentServerConfig) -> None:
    """acp 16.2: session/cancel stops the running turn; its prompt answers cancelled."""
    async with served(hold) as (client, rec):
        sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        prompt = asyncio.ensure_future(
            client.prompt(session_id=sid, prompt=[acp.text_block("hold")])
        )
        async with asyncio.timeout(10):
            await rec.running.wait()
            await client.cancel(session_id=sid)
            assert (await prompt).stop_reason == "cancelled"
            again = await client.prompt(session_id=sid, prompt=[acp.text_block("after")])
        assert again.stop_reason == "end_turn"


async def test_a_second_prompt_on_a_busy_session_is_refused(
    tmp_path: Path, hold: AgentServerConfig
) -> None:
    """acp 16.2: a prompt while one runs on the same session is refused (-32600) and leaves
    the running one alone; a cancel before any prompt, or for an unknown session, cancels
    nothing: the next prompt still ends end_turn."""
    async with served(hold) as (client, rec):
        sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        await client.cancel(session_id=sid)
        await client.cancel(session_id="no-such-session")
        async with asyncio.timeout(10):
            fresh = await client.prompt(session_id=sid, prompt=[acp.text_block("fresh")])
        assert fresh.stop_reason == "end_turn"
        first = asyncio.ensure_future(
            client.prompt(session_id=sid, prompt=[acp.text_block("hold")])
        )
        async with asyncio.timeout(10):
            await rec.running.wait()
            with pytest.raises(acp.RequestError) as refused:
                await client.prompt(session_id=sid, prompt=[acp.text_block("again")])
            assert refused.value.code == -32600
            assert not first.done()
            await client.cancel(session_id=sid)
            assert (await first).stop_reason == "cancelled"


async def test_updates_stream_while_the_turn_waits_and_the_answer_follows_them(
    tmp_path: Path, hold: AgentServerConfig
) -> None:
    """acp 16.2: text a turn streams before it waits (on its model) reaches the client while
    the prompt is still open; when the turn goes on and ends, the prompt answers end_turn,
    after the update; the next prompt on the session streams as before."""
    import hold_model

    hold_model.GATE = asyncio.Event()
    async with served(hold) as (client, rec):
        sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        prompt = asyncio.ensure_future(
            client.prompt(session_id=sid, prompt=[acp.text_block("gate")])
        )
        async with asyncio.timeout(10):
            await rec.arrived.wait()
            assert not prompt.done()
            assert rec.text() == "first"
            hold_model.GATE.set()
            assert (await prompt).stop_reason == "end_turn"
            again = await client.prompt(session_id=sid, prompt=[acp.text_block("next")])
        assert again.stop_reason == "end_turn"
        assert rec.text() == "firstnext"


async def test_deltas_that_pile_up_go_out_as_one_update(
    tmp_path: Path, hold: AgentServerConfig
) -> None:
    """acp 16.2: the text deltas a turn streams while its prompt is not sending (here, a whole
    answer at once) are sent as one agent_message_chunk, its reasoning's as one
    agent_thought_chunk, in the order they came; the text is the same."""
    async with served(hold) as (client, rec):
        sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        async with asyncio.timeout(10):
            response = await client.prompt(session_id=sid, prompt=[acp.text_block("split")])
        assert response.stop_reason == "end_turn"
        sent = [(u.session_update, u.content.text) for u in rec.updates]
        assert sent == [
            ("agent_thought_chunk", "let me think"),
            ("agent_message_chunk", "one, two, three"),
        ]


async def test_load_replays_a_stored_session(tmp_path: Path) -> None:
    """acp 16.2: with the jsonl store, loadSession is advertised; a second server resumes a
    session from the store and replays it; an unknown id is refused."""
    config = AgentServerConfig(store="jsonl", store_root=str(tmp_path / "sessions"))
    async with served(config) as (client, _):
        init = await client.initialize(protocol_version=acp.PROTOCOL_VERSION)
        assert init.agent_capabilities.load_session is True
        sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        async with asyncio.timeout(10):
            await client.prompt(session_id=sid, prompt=[acp.text_block("remember me")])
    async with served(config) as (client, rec):
        async with asyncio.timeout(10):
            await client.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])
        assert [u.session_update for u in rec.updates] == [
            "user_message_chunk",
            "agent_message_chunk",
        ]
        assert rec.text() == "remember me"
        with pytest.raises(acp.RequestError):
            await client.load_session(cwd=str(tmp_path), session_id="missing", mcp_servers=[])


async def test_load_of_a_live_session_replays_it_without_a_store_it_is_refused(
    tmp_path: Path,
) -> None:
    """acp 16.2: with the jsonl store, session/load of a session this server runs replays it
    and the session goes on; on the memory store session/load is method-not-found (-32601),
    for a live id and an unknown one alike."""
    config = AgentServerConfig(store="jsonl", store_root=str(tmp_path / "sessions"))
    async with served(config) as (client, rec):
        sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        async with asyncio.timeout(10):
            await client.prompt(session_id=sid, prompt=[acp.text_block("one")])
            rec.updates.clear()
            await client.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])
            assert [u.session_update for u in rec.updates] == [
                "user_message_chunk",
                "agent_message_chunk",
            ]
            again = await client.prompt(session_id=sid, prompt=[acp.text_block("two")])
        assert again.stop_reason == "end_turn"
    async with served(AgentServerConfig()) as (client, _):
        sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        for session_id in (sid, "missing"):
            with pytest.raises(acp.RequestError) as refused:
                await client.load_session(cwd=str(tmp_path), session_id=session_id, mcp_servers=[])
            assert refused.value.code == -32601


async def test_unknown_session_and_relative_cwd_are_refused(tmp_path: Path) -> None:
    """acp 16.2: a prompt for an unknown session and a relative cwd are protocol errors."""
    async with served(AgentServerConfig()) as (client, _):
        with pytest.raises(acp.RequestError):
            await client.prompt(session_id="nope", prompt=[acp.text_block("x")])
        with pytest.raises(acp.RequestError):
            await client.new_session(cwd="relative", mcp_servers=[])


async def test_any_host_mounting_the_plugin_serves_itself(tmp_path: Path) -> None:
    """acp 16.2: a host that mounts `acp-agent` serves itself through ctx.acp_agent.serve."""
    import dsh_acp_agent.plugin
    from dsh_core.testing import scripted_host

    async with scripted_host(
        "acp-agent",
        modules={"acp-agent": dsh_acp_agent.plugin},
        config={"acp-agent": {"provider": "scripted", "model": "scripted-1"}},
    ) as host:
        client_end, agent_end = memory_transport_pair()
        server = asyncio.ensure_future(host.ctx.acp_agent.serve(agent_end))
        recorder = Recorder()
        client = acp.connect_to_agent(recorder, client_end)
        sid = (await client.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        async with asyncio.timeout(10):
            response = await client.prompt(session_id=sid, prompt=[acp.text_block("hi there")])
        assert (response.stop_reason, recorder.text()) == ("end_turn", "hi there")
        await client.close()
        async with asyncio.timeout(10):
            await server
        assert host.ctx.agents.get(sid) is None  # the served session was disposed


def test_config_file(tmp_path: Path) -> None:
    """acp 16.2: the config file's keys, and a refusal that names what is wrong."""
    path = tmp_path / "agent.toml"
    path.write_text(
        'load = ["x"]\n[model]\nprovider = "p"\nmodel = "m"\n[store]\nkind = "jsonl"\n'
        'root = "s"\n[[plugins]]\nplugin = "llm-scripted"\n',
        encoding="utf-8",
    )
    config = load_config(path)
    assert (config.provider, config.model, config.durable) == ("p", "m", True)
    assert config.store_root == str(tmp_path / "s")
    rows = config.rows()
    assert {"plugin": "llm-scripted"} in rows and "llm-scripted" not in rows
    assert rows[-1] == {"plugin": "acp-agent", "config": {"provider": "p", "model": "m"}}
    path.write_text("surprise = 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown keys"):
        load_config(path)


def test_a_bad_config_file_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """acp 16.2: a config file that cannot be used exits 2 with one line on stderr, before
    anything is served (nothing on stdout)."""
    from dsh_acp_agent.cli import main

    path = tmp_path / "agent.toml"
    path.write_text('[store]\nkind = "paper"\n', encoding="utf-8")
    assert main(["--config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("dsh-acp-agent: error: ") and "store.kind" in err
    assert main(["--config", str(tmp_path / "missing.toml")]) == 2


def test_a_config_file_not_in_utf_8_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """acp 16.2: a config file in another encoding exits 2 with one line naming it, never a
    UnicodeDecodeError traceback."""
    from dsh_acp_agent.cli import main

    path = tmp_path / "agent.toml"
    path.write_bytes('[model]\nmodel = "caf\xe9"\n'.encode("latin-1"))
    assert main(["--config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"dsh-acp-agent: error: cannot read {path}: ")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ('plugin = "jobs"\nconfig = { cap = "3" }', "plugins[0] (plugin 'jobs') config: key 'cap'"),
        ('plugin = "jobs"\nextra = 1', "plugins[0] needs `plugin`"),
        ("plugin = 5", "plugins[0]: `plugin` must be a string"),
    ],
)
async def test_a_bad_row_of_the_config_file_is_named_as_the_file_numbers_it(
    tmp_path: Path, row: str, needle: str
) -> None:
    """acp 16.2, dx 12.5: a row of the file's [[plugins]] that is wrong is named by the file
    and by its index in the file (the server's own rows before it are not counted)."""
    path = tmp_path / "agent.toml"
    path.write_text(f"[[plugins]]\n{row}\n", encoding="utf-8")
    with pytest.raises(PluginError) as err:
        async with open_agent(load_config(path)):
            pass
    assert err.value.code == "PLUGIN_CONFIG"
    assert str(err.value).startswith(f"{path}: {needle}")


@pytest.mark.parametrize("stdin", ["devnull", "file", "closed"])
def test_stdin_that_is_not_a_pipe_is_a_one_line_error(tmp_path: Path, stdin: str) -> None:
    """acp 16.2: the protocol comes on a pipe or a socket; with /dev/null the server hung for
    ever after a logged traceback, with a file it died on a ValueError. Either is one line
    and exit status 2, before anything is served."""
    request = tmp_path / "requests.jsonl"
    request.write_text("{}\n", encoding="utf-8")
    redirect = {"devnull": "</dev/null", "file": f"<'{request}'", "closed": "<&-"}[stdin]
    done = subprocess.run(
        ["/bin/sh", "-c", f"exec '{sys.executable}' -m dsh_acp_agent {redirect}"],
        stdin=subprocess.PIPE,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("dsh-acp-agent: error: stdin ")
    assert len(done.stderr.splitlines()) == 1
    assert done.stdout == ""


@pytest.mark.slow
def test_console_script_keeps_stdout_for_the_protocol(tmp_path: Path) -> None:
    """acp 16.2: nothing but protocol on stdout: a plugin's print goes to stderr; the process
    serves until stdin closes, then exits 0."""
    (tmp_path / "noisy.py").write_text(
        "from dsh_core import PluginSpec, hookimpl\n"
        "def _apply(ctx, _):\n    print('noise from a plugin')\n"
        "@hookimpl\ndef dsh_plugins():\n"
        "    return [PluginSpec(name='noisy', apply=_apply, description='prints')]\n",
        encoding="utf-8",
    )
    config = tmp_path / "agent.toml"
    config.write_text('modules = { noisy = "noisy" }\n[[plugins]]\nplugin = "noisy"\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    lines = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}},
        {"jsonrpc": "2.0", "id": 1, "method": "session/new",
         "params": {"cwd": str(tmp_path), "mcpServers": []}},
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "dsh_acp_agent", "--config", str(config)],
        input="".join(json.dumps(line) + "\n" for line in lines),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["id"] for a in answers] == [0, 1]
    assert answers[1]["result"]["sessionId"]
    assert "noise from a plugin" in done.stderr


@pytest.mark.slow
async def test_stdin_eof_mid_turn_ends_the_process(tmp_path: Path) -> None:
    """acp 16.2: stdin closing while a turn runs (its model never ending by itself) ends the
    process, bounded, with status 0: the served agents are disposed, not waited for."""
    config = tmp_path / "agent.toml"
    config.write_text(
        'modules = { hold-model = "hold_model" }\n[[plugins]]\nplugin = "hold-model"\n'
        '[model]\nprovider = "hold"\nmodel = "m"\n',
        encoding="utf-8",
    )
    env = dict(os.environ)
    tests = str(Path(__file__).parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests, env.get("PYTHONPATH")]))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dsh_acp_agent", "--config", str(config),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    try:
        async with asyncio.timeout(60):
            requests = [
                {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                 "params": {"protocolVersion": 1}},
                {"jsonrpc": "2.0", "id": 1, "method": "session/new",
                 "params": {"cwd": str(tmp_path), "mcpServers": []}},
            ]  # fmt: skip
            process.stdin.write("".join(json.dumps(r) + "\n" for r in requests).encode())
            while (answer := json.loads(await process.stdout.readline())).get("id") != 1:
                pass
            prompt = {"sessionId": answer["result"]["sessionId"],
                      "prompt": [{"type": "text", "text": "hold"}]}  # fmt: skip
            line = {"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": prompt}
            process.stdin.write((json.dumps(line) + "\n").encode())
            while b'"working"' not in await process.stdout.readline():
                pass
        process.stdin.close()
        async with asyncio.timeout(10):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.slow
def test_a_host_that_cannot_boot_exits_1(tmp_path: Path) -> None:
    """acp 16.2: a composition that cannot boot (an unknown plugin) exits 1 with the error and
    its code on stderr, and writes nothing on stdout."""
    config = tmp_path / "agent.toml"
    config.write_text('[[plugins]]\nplugin = "no-such-plugin"\n', encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "dsh_acp_agent", "--config", str(config)],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert "[PLUGIN_UNKNOWN]" in done.stderr


def test_console_script_raises_the_collectors_first_threshold() -> None:
    """acp 16 Performance: the server process collects its youngest generation every
    10,000 allocations, not 700 (a prompt allocates a few hundred objects that die young);
    the older thresholds stay."""
    import gc

    from dsh_acp_agent import cli

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        cli._tune_collector()
        assert gc.get_threshold() == (cli.YOUNG_THRESHOLD, 10, 10) == (10_000, 10, 10)
    finally:
        gc.set_threshold(*before)


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        pytest.param({"max_tokens": 0}, "key 'max_tokens' must be at least 1, got 0", id="zero"),
        pytest.param({"max_tokens": -3}, "key 'max_tokens' must be at least 1", id="negative"),
        pytest.param({"provider": ""}, "key 'provider' must not be empty", id="provider"),
        pytest.param({"model": ""}, "key 'model' must not be empty", id="model"),
    ],
)
async def test_the_plugin_row_refuses_what_the_config_file_refuses(
    config: dict[str, Any], needle: str
) -> None:
    """acp 16.2, dx 12.5: an `acp-agent` row's route is checked like the file's [model]: a
    `max_tokens` under 1 or an empty provider/model is PLUGIN_CONFIG naming the row and key."""
    import dsh_acp_agent.plugin
    from dsh_core.testing import scripted_host

    with pytest.raises(PluginError) as err:
        async with scripted_host(
            "acp-agent", modules={"acp-agent": dsh_acp_agent.plugin}, config={"acp-agent": config}
        ):
            pass
    assert err.value.code == "PLUGIN_CONFIG"
    assert "(plugin 'acp-agent') config: " in str(err.value)
    assert needle in str(err.value)


@pytest.mark.parametrize("value", ["0", "-1", '"8"', "1.5", "true"])
def test_the_config_file_max_tokens_is_a_positive_integer(tmp_path: Path, value: str) -> None:
    """acp 16.2: the file's `[model] max_tokens` is a positive integer, as the plugin row's."""
    path = tmp_path / "agent.toml"
    path.write_text(f"[model]\nmax_tokens = {value}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"model\.max_tokens must be a positive integer"):
        load_config(path)
