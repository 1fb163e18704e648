"""`dsh-subagents run` and `dsh-subagents demo` under Ctrl-C, as a terminal delivers it (SIGINT
to the process group): a one-line notice, exit status 130, no traceback, nothing left
running; even when the model never suspends (a script whose rule calls a missing tool on
every request)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

#: A script that loops for ever: every request calls a tool no agent has.
LOOP = 'default = { tool_calls = [{ name = "no_such_tool" }] }\n'


def _hear_sigint() -> None:
    """In the child before exec: SIGINT back to its default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """Run ``dsh ARGS`` until it shows a tool call, press Ctrl-C; its status, output, errors."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
    env["DSH_SUBAGENTS_HOME"] = str(tmp_path / "home")
    child = subprocess.Popen(
        [sys.executable, "-m", "dsh_subagents.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        # Ctrl-C's own disposition, whatever this test inherited: a test run started as a
        # background job of a non-interactive shell ignores SIGINT, and a child inheriting
        # that would never hear the interrupt (it would run on until the bound below).
        preexec_fn=_hear_sigint,
    )
    try:
        assert child.stdout is not None
        shown = b""
        while "→".encode() not in shown:  # the loop is running: interrupt it
            ready, _, _ = select.select([child.stdout], [], [], 60)
            assert ready, f"dsh {args[0]} showed nothing within 60 s"
            more = os.read(child.stdout.fileno(), 65536)
            assert more, f"dsh {args[0]} ended early: {child.communicate()}"
            shown += more
        os.killpg(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
    with pytest.raises(ProcessLookupError):  # nothing of its group outlived it
        os.killpg(child.pid, 0)
    return child.returncode, (shown + out).decode(), err.decode()


@pytest.mark.parametrize("command", ["run", "demo"])
def test_ctrl_c_on_a_model_that_never_suspends_exits_130_without_a_traceback(
    tmp_path: Path, command: str
) -> None:
    """dsh-subagents run/demo (configuration.md: 130 after Ctrl-C), CLI-3, CLI-26: a turn
    looping on a scripted model whose every step is synchronous still hears Ctrl-C; the
    command says it was interrupted on one line (`run` then names the session and the command
    that continues it) and exits 130, with no Python traceback."""
    script = tmp_path / "loop.toml"
    script.write_text(LOOP, encoding="utf-8")
    # CLI-26: a step limit the loop cannot reach before the interrupt. With the default 100
    # steps, a loaded machine let the whole turn end `max-steps` (exit 1) between the first
    # tool call shown and the SIGINT this test sends.
    args = ["run", "--model", f"scripted:{script}", "--max-steps", str(10**9), "go"]
    if command == "demo":
        args = ["demo", "--store", str(tmp_path / "store"), "--model", f"scripted:{script}",
                "--max-steps", str(10**9)]  # fmt: skip
    status, out, err = _interrupt(tmp_path, *args)
    assert "→ no_such_tool" in out
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert lines[0] == f"dsh-subagents {command}: interrupted", (status, err)
    if command == "run":  # CLI-3: the root's id and the command that continues it
        assert len(lines) == 2, err
        assert re.fullmatch(
            r'session (\S+) \(continue: dsh-subagents run --resume \1 "\.\.\."\)', lines[1]
        ), lines[1]
    else:
        assert len(lines) == 1, err
    assert status == 130, err
