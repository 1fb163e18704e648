"""`dsh-subagents run`: the tree settles before the run ends, its flags, and its usage errors.

Offline: the scripted model, the default composition (the `subagent` tool on `spawn`).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dsh_core import make_plugin_manager
from dsh_subagents import _run
from dsh_subagents._run import RunOptions, compose_run, run_agent
from dsh_subagents.cli import main

#: A root that delegates "count to 3" in the background on "go" and answers the notice; the
#: child (on the same script) echoes its prompt.
DELEGATE = r"""
default = "{{last_user}}"

[[rules]]
when = { unanswered = 'Background subagent (?P<child>\S+) finished' }
reply = "Child {{child}} is done."

[[rules]]
when = { last_role = "tool" }
reply = "Started; waiting for it."

[[rules]]
when = { last_user = '^go$' }
[[rules.reply.tool_calls]]
name = "subagent"
arguments = { description = "count", prompt = "count to 3" }
"""


#: A root that starts a child on "spin" in the background; the child calls a missing tool
#: for ever.
SPIN = r"""
default = "{{last_user}}"

[[rules]]
when = { conversation = '(?m)^spin$' }
reply = { tool_calls = [{ name = "nothing" }] }

[[rules]]
when = { last_role = "tool" }
reply = "Started; waiting for it."

[[rules]]
when = { last_user = '^go$' }
reply = { tool_calls = [{ name = "subagent", arguments = { description = "s", prompt = "spin" } }] }
"""


#: A rule for the root resumed after a stop: it answers the drained child's notice.
STOPPED = r"""
[[rules]]
when = { unanswered = 'Background subagent (?P<child>\S+) was stopped' }
reply = "Heard that {{child}} was stopped."
"""


def _script(tmp_path: Path, text: str, name: str = "model.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def run(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    status = main(["run", *args], out=out)
    return status, out.getvalue(), capsys.readouterr().err


def _log(store: Path, session_id: str) -> list[dict[str, Any]]:
    text = (store / f"{session_id}.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def _sessions(store: Path) -> dict[str, list[dict[str, Any]]]:
    return {p.stem: _log(store, p.stem) for p in store.glob("*.jsonl")}


def test_the_run_waits_for_a_background_child_and_the_root_answers_its_notice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CLI-1, CLI-7: a default run's `subagent` tool starts a continuable child in the
    background; the run goes on after the root's turn until the child finished (completed,
    not disposed) and the root answered its settlement notice, each answer on its own line."""
    store = tmp_path / "store"
    script = _script(tmp_path, DELEGATE)
    status, out, err = run("--store", str(store), "--model", f"scripted:{script}", "go",
                           capsys=capsys)  # fmt: skip
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == '→ subagent {"description":"count","prompt":"count to 3"}'
    child = lines[1].split()[2]
    assert lines[1:] == [
        f"⇢ child {child} started (spawn)",
        f"← started subagent {child}",
        "Started; waiting for it.",
        f"⇠ child {child} ended: completed",
        f"Child {child} is done.",
    ]
    ends = [e["data"]["reason"]["kind"] for e in _log(store, child) if e.get("type") == "turn/end"]
    assert ends == ["completed"]


def test_max_steps_bounds_every_turn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CLI-8: `--max-steps N` is the agents' step limit: a model that calls tools for ever
    makes N requests, and the run says the turn ended at its limit (exit status 1)."""
    script = _script(tmp_path, 'default = { tool_calls = [{ name = "nothing" }] }\n')
    status, out, err = run("--max-steps", "3", "--model", f"scripted:{script}", "loop",
                           capsys=capsys)  # fmt: skip
    assert status == 1
    assert out.count("→ nothing") == 3
    assert "the turn ended max-steps: the turn reached its step limit (3 steps)" in err


def test_max_steps_bounds_the_children_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CLI-8: `--max-steps N` bounds every agent of the run, not only the root: a child
    that calls tools for ever makes N requests, ends `max-steps`, and its notice wakes the
    root, whose last turn completes (exit status 0)."""
    script = _script(tmp_path, SPIN)
    status, out, err = run("--max-steps", "3", "--model", f"scripted:{script}", "go",
                           capsys=capsys)  # fmt: skip
    assert status == 0, err
    child = out.splitlines()[1].split()[2]
    assert out.count(f"[{child}] → nothing") == 3
    assert f"⇠ child {child} ended: max-steps" in out


def test_system_sets_the_persona(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CLI-9: `--system TEXT` is in the system prompt the model reads."""
    script = _script(
        tmp_path,
        'default = "no persona"\n[[rules]]\nwhen = { system = "You are Ada" }\n'
        'reply = "Ada here."\n',
    )
    status, out, _ = run("--system", "You are Ada.", "--model", f"scripted:{script}", "hi",
                         capsys=capsys)  # fmt: skip
    assert (status, out) == (0, "Ada here.\n")
    status, out, _ = run("--model", f"scripted:{script}", "hi", capsys=capsys)
    assert (status, out) == (0, "no persona\n")


def test_sessions_are_stored_under_the_home_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """CLI-10: without store flags the session goes to `$DSH_SUBAGENTS_HOME/sessions` and
    the run prints the command that continues it; `--no-store` writes nothing."""
    monkeypatch.setenv("DSH_SUBAGENTS_HOME", str(tmp_path / "home"))
    status, _, err = run("hello", capsys=capsys)
    assert status == 0
    session_id = err.split()[1]
    stored = tmp_path / "home" / "sessions" / f"{session_id}.jsonl"
    assert stored.is_file()
    assert f'(continue: dsh-subagents run --resume {session_id} "...")' in err
    status, _, err = run("--no-store", "again", capsys=capsys)
    assert status == 0 and err.endswith("(not stored)\n")
    assert len(list((tmp_path / "home" / "sessions").glob("*.jsonl"))) == 1


def test_continue_takes_the_latest_root_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CLI-11: `-c` continues the root session written last, never a child session (even
    one written after it)."""
    store = tmp_path / "store"
    script = _script(tmp_path, DELEGATE)
    first = run("--store", str(store), "one", capsys=capsys)[2].split()[1]
    status, _, err = run("--store", str(store), "--model", f"scripted:{script}", "go",
                         capsys=capsys)  # fmt: skip
    assert status == 0, err
    second = err.split()[1]
    os.utime(store / f"{first}.jsonl", (1, 1))  # the first is older, whatever the clock says
    assert len(list(store.glob("*.jsonl"))) == 3  # the two roots and the child
    status, out, err = run("--store", str(store), "-c", "again", capsys=capsys)
    assert (status, out) == (0, "again\n"), err
    assert err.split()[1] == second
    users = [e for e in _log(store, second) if e.get("type") == "user/message"]
    assert users[-1]["data"]["content"][0]["text"] == "again"


def test_resume_takes_a_unique_prefix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CLI-12, CLI-90: `--resume` takes an id or a unique prefix of one (`session-` may be left
    out, as in `sessions show`); a prefix of several is
    `SESSION_AMBIGUOUS` and an unknown one `SESSION_NOT_FOUND` (exit status 2)."""
    store = tmp_path / "store"
    ids = [run("--store", str(store), p, capsys=capsys)[2].split()[1] for p in ("a", "b")]
    first_difference = next(i for i, (a, b) in enumerate(zip(*ids, strict=True)) if a != b)
    short = ids[0][: first_difference + 1]
    status, out, err = run("--store", str(store), "--resume", short, "more", capsys=capsys)
    assert (status, out) == (0, "more\n") and err.split()[1] == ids[0]
    bare = ids[1].removeprefix("session-")  # CLI-90: one rule with `sessions show/tree`
    status, out, err = run("--store", str(store), "--resume", bare, "more", capsys=capsys)
    assert (status, out) == (0, "more\n") and err.split()[1] == ids[1]
    status, out, err = run("--store", str(store), "--resume", "session-", "x", capsys=capsys)
    assert (status, out) == (2, "") and "[SESSION_AMBIGUOUS]" in err
    status, out, err = run("--store", str(store), "--resume", "nobody", "x", capsys=capsys)
    assert (status, out) == (2, "") and "[SESSION_NOT_FOUND]" in err


def _cli(*args: str, tmp_path: Path, stdin: bytes | None = None, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[bytes]:  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
    base["DSH_SUBAGENTS_HOME"] = str(tmp_path / "home")
    return subprocess.run(
        [sys.executable, "-m", "dsh_subagents.cli", "run", *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        env={**base, **(env or {})},
        cwd=tmp_path,
        timeout=120,
        check=False,
    )


def _usage_error(
    args: list[str],
    stdin: bytes,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """In-process: `dsh-subagents run ARGS` reading ``stdin`` (a pipe's bytes) exits 2 and
    prints nothing; what it says on stderr."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    out = io.StringIO()
    with pytest.raises(SystemExit) as exc:
        main(["run", *args], out=out)
    assert (exc.value.code, out.getvalue()) == (2, "")
    return capsys.readouterr().err


def test_the_prompt_comes_from_standard_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """CLI-13: `-` reads the prompt from standard input, and so does a pipe with no prompt
    argument; input that is not UTF-8 is a usage error (exit status 2). Both readings run as
    processes on a real pipe; the decoding of the bytes read is checked in-process."""
    done = _cli("-", tmp_path=tmp_path, stdin="from stdin ✓".encode())
    assert (done.returncode, done.stdout.decode()) == (0, "from stdin ✓\n"), done.stderr
    done = _cli(tmp_path=tmp_path, stdin=b"piped\n")
    assert (done.returncode, done.stdout) == (0, b"piped\n"), done.stderr
    err = _usage_error(["-"], b"caf\xe9", monkeypatch, capsys)
    assert "not UTF-8 (byte 0xe9 at offset 3)" in err


@pytest.mark.parametrize("prompt", ["", "  \n"])
def test_an_empty_prompt_is_a_usage_error(
    tmp_path: Path, prompt: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """CLI-21: `run ""` (or blank input on a pipe) is a usage error: exit 2, nothing runs.
    Blank input on a real pipe runs as a process; the blank argument in-process."""
    done = _cli(tmp_path=tmp_path, stdin=prompt.encode())
    assert (done.returncode, done.stdout) == (2, b""), done.stderr
    assert b"dsh-subagents run: error: the prompt is empty" in done.stderr
    monkeypatch.setenv("DSH_SUBAGENTS_HOME", str(tmp_path / "home"))
    err = _usage_error([prompt], b"", monkeypatch, capsys)
    assert "dsh-subagents run: error: the prompt is empty" in err
    assert not (tmp_path / "home" / "sessions").exists()


def test_a_model_name_without_provider_suggests_one(capsys: pytest.CaptureFixture[str]) -> None:
    """CLI-22: `--model gpt-4o-mini` (no adapter answers that name) suggests
    `--model openai:gpt-4o-mini`; exit status 2."""
    status, out, err = run("--model", "gpt-4o-mini", "hi", capsys=capsys)
    assert (status, out) == (2, "")
    assert "--model openai:gpt-4o-mini" in err and "[RUN_MODEL]" in err


def test_a_missing_plugin_names_its_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """CLI-23: a row naming a plugin of this project that is not there says which
    distribution mounts it: `pip install` it, or add it to `DSH_PLUGINS` when it is installed
    but not selected; a near miss suggests the name."""
    config = _script(tmp_path, '[[plugins]]\nplugin = "llm-openai"\n', "dsh.toml")
    monkeypatch.setenv("DSH_PLUGINS", "dsh-core")
    status, _, err = run("--config", str(config), "hi", capsys=capsys)
    assert status == 2 and "[PLUGIN_UNKNOWN]" in err
    assert "'llm-openai' is mounted by dsh-llm-openai, which is installed but not loaded" in err
    monkeypatch.setattr(_run, "_installed", lambda dist: False)
    status, _, err = run("--config", str(config), "hi", capsys=capsys)
    assert "'llm-openai' is mounted by dsh-llm-openai: pip install dsh-llm-openai" in err
    monkeypatch.delenv("DSH_PLUGINS")
    typo = _script(tmp_path, '[[plugins]]\nplugin = "llm-opneai"\n', "typo.toml")
    status, _, err = run("--config", str(typo), "hi", capsys=capsys)
    assert status == 2 and "did you mean 'llm-openai'?" in err


def test_a_store_that_is_a_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CLI-24: `--store` naming a file says it is not a directory (`RUN_STORE`, exit 2)
    before anything boots; the file is left as it was."""
    file = tmp_path / "notes.txt"
    file.write_text("mine", encoding="utf-8")
    status, out, err = run("--store", str(file), "hi", capsys=capsys)
    assert (status, out) == (2, "")
    assert f"the session store {file} is not a directory" in err and "[RUN_STORE]" in err
    assert file.read_text(encoding="utf-8") == "mine"


def test_autoload_off_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """CLI-25: with `DSH_DISABLE_PLUGIN_AUTOLOAD` set (and no `DSH_PLUGINS`) nothing is
    loaded, and the error says that autoload is off and how to load plugins."""
    monkeypatch.setenv("DSH_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("DSH_PLUGINS", raising=False)
    status, out, err = run("hi", capsys=capsys)
    assert (status, out) == (2, "")
    assert "plugin autoload is off (DSH_DISABLE_PLUGIN_AUTOLOAD is set)" in err


def test_the_control_tools_come_only_with_a_subagent_tool() -> None:
    """CLI-7: the default composition mounts the `subagent` tool on `spawn` (background
    children continuable) with `send_message`, `interrupt_agent` and `list_agents`; without
    the `spawn` provider it mounts none of them."""
    specs = make_plugin_manager().collect_plugin_specs()
    control = {"tool-subagent-control", "tool-subagent-list-agents"}
    rows = compose_run(RunOptions(prompt="x"), specs).rows
    tools = [r for r in rows if r.plugin == "tool-subagent"]
    assert [dict(r.config) for r in tools] == [
        {"provider": "spawn", "background_mode": "continuable"}
    ]
    assert control <= {r.plugin for r in rows}
    fewer = {k: v for k, v in specs.items() if k != "subagent-spawn"}
    names = {r.plugin for r in compose_run(RunOptions(prompt="x"), fewer).rows}
    assert not (control | {"tool-subagent"}) & names


async def test_a_timeout_drains_the_children_and_their_notice_reaches_the_root(
    tmp_path: Path,
) -> None:
    """CLI-5: `--timeout` stops a run whose child would run for ever: the child is drained
    (its turn ends aborted) and its settlement notice reaches the root, and the run exits 124
    naming the session; the notice is still pending when the root is resumed."""
    script = _script(tmp_path, SPIN)
    store = tmp_path / "store"
    options = RunOptions(
        prompt="go",
        model=f"scripted:{script}",
        store=str(store),
        timeout=1.0,
        max_steps=10**9,
    )
    out, err = io.StringIO(), io.StringIO()
    status = await run_agent(options, make_plugin_manager(), out, err=err)
    assert status == 124, err.getvalue()
    said = err.getvalue().splitlines()
    assert said[0] == "dsh-subagents run: --timeout 1 s reached: stopping 1 running subagent"
    root = said[1].split()[1]
    logs = _sessions(store)
    (child,) = [sid for sid in logs if sid != root]
    ends = [e["data"]["reason"]["kind"] for e in logs[child] if e.get("type") == "turn/end"]
    assert ends[-1] == "aborted"
    notices = [
        m["content"][0]["text"]
        for e in logs[root]
        if e.get("type") == "agent/inbox/spliced"
        for m in e["data"].get("inserted", ())
    ]
    assert notices[-1] == f"Background subagent {child} was stopped before it finished."
    # CLI-91: the notice outlives the run (disposing the root keeps its inbox): the resumed
    # root's next turn takes it with the new prompt.
    _script(tmp_path, SPIN + STOPPED)
    out, err = io.StringIO(), io.StringIO()
    again = RunOptions(prompt="and now?", model=f"scripted:{script}", store=str(store),
                       resume=root)  # fmt: skip
    status = await run_agent(again, make_plugin_manager(), out, err=err)
    assert (status, out.getvalue()) == (0, f"Heard that {child} was stopped.\n"), err.getvalue()


async def test_a_root_woken_for_ever_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CLI-6: a root whose every answer starts another child (each notice wakes it again)
    is stopped after MAX_ROOT_TURNS turns in one run: exit status 1, and it says so."""
    monkeypatch.setattr(_run, "MAX_ROOT_TURNS", 3)
    script = _script(
        tmp_path,
        'default = "{{last_user}}"\n'
        '[[rules]]\nwhen = { last_role = "tool" }\nreply = "Started."\n'
        "[[rules]]\nwhen = { unanswered = '^(go|Background subagent)' }\n"
        'reply = { tool_calls = [{ name = "subagent", arguments = { description = "again", '
        'prompt = "hi" } }] }\n',
    )
    out, err = io.StringIO(), io.StringIO()
    options = RunOptions(prompt="go", model=f"scripted:{script}", no_store=True)
    status = await run_agent(options, make_plugin_manager(), out, err=err)
    assert status == 1, err.getvalue()
    assert "the root agent took 3 turns in this run without its tree settling" in err.getvalue()
    assert out.getvalue().count("⇢ child ") == 3  # one per turn; the 4th was stopped at once
