"""`dsh-subagents run`: one agent on the composed plugins, streamed to the terminal (llm-openai
17.3).

These runs use the scripted model only (no network); tests/test_run.py drives `dsh-subagents run`
on the
loopback chat-completions server and with child runs.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from dsh_subagents.cli import main


def run(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    status = main(["run", *args], out=out)
    return status, out.getvalue(), capsys.readouterr().err


def test_run_streams_the_answer_of_the_default_composition(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """llm-openai 17.3: with no flags `dsh-subagents run` composes the installed plugins on the
    offline
    echo model, prints the answer and the session id, and exits 0."""
    status, out, err = run("hello there", capsys=capsys)
    assert (status, out) == (0, "hello there\n")
    assert err.startswith("session session-")


def test_run_shows_tool_calls_and_results_as_they_happen(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llm-openai 17.3: `--model scripted:FILE` answers from a script; the tool call and its
    (failed) result are shown before the final answer."""
    script = tmp_path / "model.toml"
    script.write_text(
        """
[[rules]]
when = { last_role = "tool" }
reply = "The job said: {{last_tool_result}}"

[default]
tool_calls = [{ name = "job_output", arguments = { job_id = "job-x" } }]
""",
        encoding="utf-8",
    )
    status, out, _ = run("--model", f"scripted:{script}", "look", capsys=capsys)
    lines = out.splitlines()
    assert status == 0
    assert lines[0] == '→ job_output {"job_id":"job-x"}'
    assert lines[1].startswith("← Error: ") and lines[1].endswith("(error)")
    assert lines[2].startswith("The job said: Error: ")


def test_store_and_resume_continue_one_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llm-openai 17.3: `--store DIR` keeps the session as a JSONL file; `--resume ID` brings
    it back, and the second turn is appended to the same log."""
    store = tmp_path / "sessions"
    status, _, err = run("--store", str(store), "first", capsys=capsys)
    assert status == 0
    session_id = err.split()[1]
    assert f"--resume {session_id}" in err
    status, out, _ = run("--store", str(store), "--resume", session_id, "second", capsys=capsys)
    assert (status, out) == (0, "second\n")
    (stored,) = store.glob("*.jsonl")
    users = [
        line["data"]["content"][0]["text"]
        for line in map(json.loads, stored.read_text(encoding="utf-8").splitlines()[1:])
        if line.get("type") == "user/message"
    ]
    assert users == ["first", "second"]


def test_a_config_error_names_the_file_the_row_and_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llm-openai 17.3: a composition row with a wrong key fails before anything runs: exit
    2, the message names the file, `plugins[i]`, the plugin and the key."""
    config = tmp_path / "dsh.toml"
    config.write_text(
        """
[[plugins]]
plugin = "sessions"

[[plugins]]
plugin = "system-prompt"
config = { persona = 3 }

[[plugins]]
plugin = "llm"

[[plugins]]
plugin = "llm-scripted"
""",
        encoding="utf-8",
    )
    status, out, err = run("--config", str(config), "hi", capsys=capsys)
    assert (status, out) == (2, "")
    for part in (str(config), "plugins[1]", "'system-prompt'", "persona", "PLUGIN_CONFIG"):
        assert part in err, part


def test_a_composition_file_sets_the_persona_and_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llm-openai 17.3: a composition file is what runs: its rows (here the scripted model on
    a provider of its own name, chosen by `--model`) answer."""
    config = tmp_path / "dsh.toml"
    config.write_text(
        """
[[plugins]]
plugin = "sessions"
[[plugins]]
plugin = "llm"
[[plugins]]
plugin = "llm-scripted"
config = { provider = "offline" }
[[plugins]]
plugin = "tools"
[[plugins]]
plugin = "system-prompt"
[[plugins]]
plugin = "agents"
""",
        encoding="utf-8",
    )
    status, out, _ = run("--config", str(config), "--model", "offline:any", "ping", capsys=capsys)
    assert (status, out) == (0, "ping\n")


@pytest.mark.parametrize(
    ("model", "code"),
    [("nowhere:m", "NO_ADAPTER"), ("openai", "RUN_MODEL")],
)
def test_a_route_nothing_answers_fails_before_the_turn(
    model: str, code: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """llm-openai 17.3: a provider no row answers, or a provider without a model, is exit 2
    with a one-line error and its code; no turn runs."""
    status, out, err = run("--model", model, "hi", capsys=capsys)
    assert (status, out) == (2, "")
    assert err.startswith("dsh-subagents run: error: ") and f"[{code}]" in err


def test_a_bad_config_in_the_row_that_sets_model_names_the_file_and_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llm-openai 17.3 (config rule: errors name the row and the key): the row `dsh-subagents run`
    reads
    for its route before it boots is checked like every row, so its error names the file and
    `plugins[i]`, not only the plugin."""
    config = tmp_path / "bad.toml"
    config.write_text(
        '[[plugins]]\nplugin = "sessions"\n'
        '[[plugins]]\nplugin = "llm-scripted"\nconfig = { model = 5 }\n',
        encoding="utf-8",
    )
    status, out, err = run("--config", str(config), "hi", capsys=capsys)
    assert (status, out) == (2, "")
    assert f"{config}: plugins[1] (plugin 'llm-scripted') config: " in err
    assert "'model'" in err and "[PLUGIN_CONFIG]" in err


def test_an_unknown_plugin_is_reported_before_the_missing_route(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llm-openai 17.3: a file whose rows name an unknown plugin and no model fails with
    PLUGIN_UNKNOWN (the likely cause: the row meant to set the model), not RUN_MODEL."""
    config = tmp_path / "typo.toml"
    config.write_text('[[plugins]]\nplugin = "llm-opneai"\nconfig = { x = 1 }\n', "utf-8")
    status, out, err = run("--config", str(config), "hi", capsys=capsys)
    assert (status, out) == (2, "")
    assert "[PLUGIN_UNKNOWN]" in err and "'llm-opneai'" in err
    assert "RUN_MODEL" not in err


def test_a_file_with_no_model_row_is_run_model_once_it_boots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llm-openai 17.3: a sound file that sets no model and mounts no scripted model is
    RUN_MODEL, exit 2, and no turn runs."""
    config = tmp_path / "nomodel.toml"
    config.write_text('[[plugins]]\nplugin = "sessions"\n', encoding="utf-8")
    status, out, err = run("--config", str(config), "hi", capsys=capsys)
    assert (status, out) == (2, "")
    assert "sets `model`" in err and "[RUN_MODEL]" in err


def test_a_turn_that_fails_exits_1_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llm-openai 17.3: a model failure ends the turn `error`; `dsh-subagents run` prints why (the
    failure's message and code) and exits 1."""
    script = tmp_path / "fail.toml"
    script.write_text('default = { error = { message = "no luck", code = "X_FAIL" } }\n')
    status, _, err = run("--model", f"scripted:{script}", "hi", capsys=capsys)
    assert status == 1
    assert "the turn ended error: no luck [X_FAIL]" in err
