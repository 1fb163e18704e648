"""`dsh-subagents run` across distributions: a real-model route on the loopback chat-completions
server,
and child runs shown as they happen (llm-openai 17.3)."""

from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from dsh_core import (
    PluginSpec,
    ToolDefinition,
    blocks_text,
    hookimpl,
    make_plugin_manager,
    text_blocks,
)
from dsh_llm_openai.testing import ChatCompletionsServer, Reply, chunk, text_reply
from dsh_subagent import SubagentStartRequest
from dsh_subagents._run import RunOptions, run_agent
from dsh_subagents.cli import main


def test_run_streams_a_model_on_an_openai_compatible_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """llm-openai 17.3: a composition file's `llm-openai` row (base_url, the key from the
    variable it names, `model`) is the route of `dsh-subagents run`; the answer streams to the
    terminal
    and the request carries the prompt."""
    monkeypatch.setenv("LOOPBACK_KEY", "sk-loopback")
    with ChatCompletionsServer(text_reply("Streamed from the endpoint.", pieces=5)) as server:
        config = tmp_path / "dsh.toml"
        config.write_text(
            f"""
[[plugins]]
plugin = "sessions"
[[plugins]]
plugin = "llm"
[[plugins]]
plugin = "tools"
[[plugins]]
plugin = "system-prompt"
config = {{ persona = "You are terse." }}
[[plugins]]
plugin = "agents"
[[plugins]]
plugin = "llm-openai"
config = {{ base_url = "{server.base_url}", api_key_env = "LOOPBACK_KEY", model = "loop-1" }}
""",
            encoding="utf-8",
        )
        out = io.StringIO()
        assert main(["run", "--config", str(config), "Say something."], out=out) == 0
    assert out.getvalue() == "Streamed from the endpoint.\n"
    (seen,) = server.requests
    assert seen.body["model"] == "loop-1"
    assert seen.headers["authorization"] == "Bearer sk-loopback"
    assert seen.body["messages"][0]["role"] == "system"
    assert "You are terse." in seen.body["messages"][0]["content"]
    assert seen.body["messages"][-1] == {"role": "user", "content": "Say something."}
    assert "sk-loopback" not in capsys.readouterr().err


def _delegate_plugin() -> types.ModuleType:
    """A plugin with a `delegate` tool that runs a `spawn` child on its `task` argument."""

    async def delegate(arguments: Any, run: Any) -> str:
        child = await run.ctx.subagents.start(
            "spawn",
            SubagentStartRequest(
                prompt=text_blocks(arguments["task"]),
                parent=run.agent,
            ),
        )
        try:
            result = await child.result
        finally:
            await child.dispose()
        return blocks_text(result.output)

    def apply(ctx: Any, _: None) -> None:
        ctx.tools.register(
            ToolDefinition(name="delegate", description="Hand a task to a child.", execute=delegate)
        )

    module = types.ModuleType("delegate_plugin")

    @hookimpl
    def dsh_plugins() -> list[PluginSpec]:
        return [PluginSpec(name="delegate", apply=apply, requires=("tools", "subagents"))]

    module.dsh_plugins = dsh_plugins  # type: ignore[attr-defined]
    return module


async def test_run_shows_child_runs_as_they_happen(tmp_path: Path) -> None:
    """llm-openai 17.3: a tool that starts a `spawn` child shows the call, the child's start
    and end, and the result, in that order, before the final answer."""
    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "delegate", "arguments": '{"task": "count to 3"}'},
    }
    server = ChatCompletionsServer(
        Reply(chunks=(chunk(tool_calls=[call]), chunk(finish_reason="tool_calls"))),
        text_reply("1 2 3"),  # the child's answer
        text_reply("The child counted."),
    )
    config = tmp_path / "dsh.toml"
    rows = ["sessions", "llm", "tools", "system-prompt", "agents", "subagent", "subagent-spawn"]
    config.write_text(
        "".join(f'[[plugins]]\nplugin = "{r}"\n' for r in [*rows, "delegate"])
        + f'[[plugins]]\nplugin = "llm-openai"\nconfig = {{ base_url = "{server.base_url}", '
        'api_key = "sk-x", model = "loop-1" }\n',
        encoding="utf-8",
    )
    pm = make_plugin_manager(plugins={"delegate": _delegate_plugin()})
    out, err = io.StringIO(), io.StringIO()
    with server:
        status = await run_agent(RunOptions(prompt="Count.", config=str(config)), pm, out, err=err)
    assert status == 0, err.getvalue()
    lines = out.getvalue().splitlines()
    assert lines[0] == '→ delegate {"task": "count to 3"}'
    assert lines[1].startswith("⇢ child ") and lines[1].endswith(" started (spawn)")
    assert lines[2].startswith("⇠ child ") and lines[2].endswith(" ended: completed")
    assert lines[3:] == ["← 1 2 3", "The child counted."]


@pytest.mark.slow
def test_ctrl_c_cancels_the_turn_and_closes_the_http_stream(tmp_path: Path) -> None:
    """llm-openai 17.1/17.3: Ctrl-C (SIGINT) in the middle of a streamed answer cancels the
    turn, closes the HTTP stream (the server sees it go) and exits 130; the text that
    arrived was shown."""
    server = ChatCompletionsServer(Reply(chunks=(chunk(content="Partial"),), hold=60))
    config = tmp_path / "dsh.toml"
    rows = ["sessions", "llm", "tools", "system-prompt", "agents"]
    config.write_text(
        "".join(f'[[plugins]]\nplugin = "{r}"\n' for r in rows)
        + f'[[plugins]]\nplugin = "llm-openai"\nconfig = {{ base_url = "{server.base_url}", '
        'api_key = "sk-x", model = "loop-1" }\n',
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DSH_PLUGINS",)}
    env["DSH_SUBAGENTS_HOME"] = str(tmp_path / "home")
    with server:
        child = subprocess.Popen(
            [sys.executable, "-m", "dsh_subagents.cli", "run", "--config", str(config), "go"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert child.stdout is not None
            shown = b""
            while b"Partial" not in shown:  # the streamed text is on the terminal: interrupt
                ready, _, _ = select.select([child.stdout], [], [], 60)
                assert ready, "dsh-subagents run showed nothing within 60 s"
                more = os.read(child.stdout.fileno(), 100)
                assert more, f"dsh-subagents run ended early: {child.communicate()}"
                shown += more
            child.send_signal(signal.SIGINT)
            rest, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
        assert server.disconnected.wait(10)
    assert child.returncode == 130, err
    assert (shown.decode() + rest).startswith("Partial")
    assert "interrupted" in err
