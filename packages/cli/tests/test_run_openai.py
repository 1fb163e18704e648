"""`dsh-subagents run` on the real OpenAI-compatible adapter, served by its loopback server.

No network: every request goes to :class:`ChatCompletionsServer` on 127.0.0.1.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from dsh_llm_openai.testing import ChatCompletionsServer, Reply, chunk, text_reply
from dsh_subagents.cli import main

KEY = "sk-test-0123456789abcdefXYZ"
BAD = "x\ud800y"  # a lone surrogate: valid in a Python str and in escaped JSON, not in UTF-8


def test_a_surrogate_echoed_into_a_tool_result_does_not_brick_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ROB-53: a model calls a tool with a lone surrogate in its name and arguments (valid
    JSON on the wire); the error result names the call; the next request still goes out
    (replaced), the turn completes, `dsh-subagents run` exits 0, and the log keeps what was said."""
    monkeypatch.setenv("LOOPBACK_KEY", KEY)
    arguments = json.dumps({"job_id": BAD}, ensure_ascii=False)
    call = {"index": 0, "id": "c1", "function": {"name": f"find_{BAD}", "arguments": arguments}}
    first = Reply(chunks=(chunk(tool_calls=[call]), chunk(finish_reason="tool_calls")))
    with ChatCompletionsServer(first, text_reply("All done.")) as server:
        config = tmp_path / "dsh.toml"
        rows = ["sessions", "llm", "tools", "system-prompt", "agents", "jobs"]
        config.write_text(
            "".join(f'[[plugins]]\nplugin = "{r}"\n' for r in rows)
            + f'[[plugins]]\nplugin = "llm-openai"\nconfig = {{ base_url = "{server.base_url}", '
            'api_key_env = "LOOPBACK_KEY", model = "loop-1" }\n',
            encoding="utf-8",
        )
        store = tmp_path / "sessions"
        out = io.StringIO()
        status = main(["run", "--config", str(config), "--store", str(store), "go"], out=out)
        err = capsys.readouterr().err
        assert status == 0, err
        assert out.getvalue().endswith("All done.\n")
        assert len(server.requests) == 2
        wire = json.dumps(server.requests[1].body, ensure_ascii=False)
        assert "\ud800" not in wire and "x\ufffdy" in wire
    (log,) = store.glob("*.jsonl")
    said = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    names = [e["data"]["name"] for e in said if e.get("type") == "tool/call"]
    assert f"find_{BAD}" in names  # the call as the model made it, surrogate and all
