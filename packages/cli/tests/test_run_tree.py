"""`dsh-subagents run` as a process: a real-model route on the loopback OpenAI-compatible
server whose root starts a continuable and a background one-shot child, and the live tree in a
pseudo-terminal (what it draws, and the terminal left clean after the run, Ctrl-C, and a second
Ctrl-C)."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from dsh_llm_openai.testing import ChatCompletionsServer, Reply, chunk, text_reply
from dsh_subagents.cli import main

from .test_run_flags import DELEGATE, SPIN

ROOT_USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
KID_USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def _call(index: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "index": index,
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def test_the_run_waits_for_a_continuable_and_a_background_child_on_a_real_route(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CLI-1, CLI-2, CLI-14, CLI-20: on the loopback server, the root starts a continuable child
    and a one-shot background job whose model answers late; the run ends only after both
    completed and the root answered the continuable child's notice; plain lines (no terminal
    codes) off a terminal; `-u` sums the logged usage of the root and both children."""
    calls = [
        _call(0, "subagent", {"description": "cont", "prompt": "continue me"}),
        _call(
            1, "job_subagent", {"description": "job", "prompt": "job me", "run_in_background": True}
        ),
    ]
    root = ChatCompletionsServer(
        Reply(
            chunks=(
                chunk(tool_calls=calls),
                chunk(finish_reason="tool_calls"),
                chunk(usage=ROOT_USAGE),
            )
        ),
        default=text_reply("Noted.", usage=ROOT_USAGE),
    )
    # The children answer late: the root's first turn is long over when they finish.
    kids = ChatCompletionsServer(default=attrs.evolve(text_reply("kid done", usage=KID_USAGE),
                                                      delay=0.5))  # fmt: skip
    kid_options = '{ provider = "kids", model = "kid" }'
    config = tmp_path / "dsh.toml"
    rows = ["sessions", "llm", "tools", "system-prompt", "agents", "jobs", "subagent",
            "subagent-spawn"]  # fmt: skip
    with root, kids:
        config.write_text(
            "".join(f'[[plugins]]\nplugin = "{r}"\n' for r in rows)
            + '[[plugins]]\nplugin = "tool-subagent"\nconfig = { provider = "spawn", '
            f'background_mode = "continuable", agent_options = {kid_options} }}\n'
            '[[plugins]]\nplugin = "tool-subagent"\nconfig = { provider = "spawn", '
            f'tool_name = "job_subagent", agent_options = {kid_options} }}\n'
            f'[[plugins]]\nplugin = "llm-openai"\nconfig = {{ base_url = "{root.base_url}", '
            'api_key = "sk-x", model = "root-1" }\n'
            f'[[plugins]]\nplugin = "llm-openai"\nconfig = {{ provider = "kids", base_url = '
            f'"{kids.base_url}", api_key = "sk-x" }}\n',
            encoding="utf-8",
        )
        store = tmp_path / "store"
        out = io.StringIO()
        status = main(["run", "-u", "--config", str(config), "--store", str(store), "go"], out=out)
        err = capsys.readouterr().err
    assert status == 0, err
    shown = out.getvalue()
    assert "\x1b" not in shown
    # The root answered the continuable child's notice after that child ended; the job (no
    # notice: its output is read with job_output) may end before or after that answer.
    lines = shown.splitlines()
    (cont,) = [ln.split()[-1] for ln in lines if ln.startswith("← started subagent ")]
    cont_end = lines.index(f"⇠ child {cont} ended: completed")
    assert "Noted." in lines[cont_end + 1 :], shown
    assert all(ln == "Noted." or ln.startswith("⇠ child ") for ln in lines[cont_end:]), shown
    last = json.dumps(root.requests[-1].body["messages"])
    assert "Background subagent " in last and "kid done" in last
    assert len(kids.requests) == 2
    session = err.splitlines()[-1].split()[1]
    logs = {p.stem: p.read_text(encoding="utf-8") for p in store.glob("*.jsonl")}
    children = [sid for sid in logs if sid != session]
    assert len(children) == 2
    for sid in children:
        ends = [json.loads(line) for line in logs[sid].splitlines()]
        kinds = [e["data"]["reason"]["kind"] for e in ends if e.get("type") == "turn/end"]
        assert kinds == ["completed"], (sid, kinds)
    n = len(root.requests)
    assert (
        f"usage: whole tree (the root and 2 subagents): {n + 2} requests, {11 * n + 10:,} input "
        f"and {7 * n + 6:,} output tokens"
    ) in err.splitlines()


# -- the live tree in a pseudo-terminal -----------------------------------------------------

_CSI = re.compile(r"\x1b\[(\??)([0-9;]*)([A-Za-z])")
#: A drawn row of the live tree: label, provider, mode, status, turns, elapsed.
_ROW = r"{label}\s+spawn\s+continuable\s+(running|waiting)\s+\d+\s+\d+s"


def screen(raw: str) -> list[str]:
    """The lines a terminal shows after ``raw`` (text, CR, LF, cursor up and down, erase
    line; colours and modes ignored): enough to see what rich's live region left behind."""
    lines = [""]
    row = col = 0
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == "\x1b":
            m = _CSI.match(raw, i)
            if m is None:
                i += 1
                continue
            _, arg, op = m.groups()
            n = int(arg) if arg.isdigit() else 1
            if op == "A":
                row = max(0, row - n)
            elif op == "B":
                row += n
            elif op == "K":
                lines[row] = "" if arg == "2" else lines[row][:col]
            elif op == "G":
                col = n - 1
            i = m.end()
            continue
        while len(lines) <= row:
            lines.append("")
        if c == "\r":
            col = 0
        elif c == "\n":
            row += 1
            while len(lines) <= row:
                lines.append("")
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + c + line[col + 1 :]
            col += 1
        i += 1
    # The terminal echoes a typed Ctrl-C as ^C where the cursor is: not the program's output.
    return [line.replace("^C", "").rstrip() for line in lines if line.strip()]


def _in_pty(argv: list[str], cwd: Path, keys: list[tuple[str, bytes]]) -> tuple[int, str]:
    """Run ``argv`` on a pseudo-terminal (its controlling terminal, 100 columns); each time
    the output first shows a pattern of ``keys`` (in order), type its bytes. The exit status
    and everything it wrote."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
    env.update(
        DSH_SUBAGENTS_HOME=str(cwd / "home"), TERM="xterm-256color", COLUMNS="100", LINES="30"
    )
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session of its own whose terminal is the pty
        try:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.chdir(cwd)
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    raw = b""
    pending = list(keys)
    deadline = time.monotonic() + 120
    ended = False
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no end within 120 s: {raw!r}"
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            try:
                more = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not more:
                break
            raw += more
            if pending and re.search(pending[0][0], raw.decode(errors="replace")):
                os.write(fd, pending.pop(0)[1])
        ended = True  # it closed its terminal: it is exiting
    finally:
        if not ended:  # a check above failed while it runs: end it, the test reports why
            os.kill(pid, signal.SIGKILL)
        _, wait = os.waitpid(pid, 0)
        os.close(fd)
    assert not pending, f"never saw {pending[0][0]!r}: {raw!r}"
    return os.waitstatus_to_exitcode(wait), raw.decode(errors="replace")


def _clean(raw: str) -> list[str]:
    """The final screen, checked to hold no live region and to end with the cursor shown."""
    shown = screen(raw)
    assert not [line for line in shown if re.search(r"\bprovider\b.*\bmode\b", line)], shown
    assert raw.count("\x1b[?25l") >= 1 and raw.rfind("\x1b[?25h") > raw.rfind("\x1b[?25l"), raw
    return shown


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dsh_subagents.cli", "run", *args]


def test_the_live_tree_shows_the_running_child_and_leaves_the_terminal_clean(
    tmp_path: Path,
) -> None:
    """CLI-15: on a terminal the live region draws each running child (label, provider, mode,
    status, turns, elapsed) below the transcript; when the tree settles it is erased and the
    cursor shown again, leaving the transcript lines only."""
    (tmp_path / "model.toml").write_text(DELEGATE, encoding="utf-8")
    status, raw = _in_pty(_cli("--model", "scripted:model.toml", "go"), tmp_path, [])
    assert status == 0, raw
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw)  # without colours and cursor moves
    assert re.search(r"subagent\s+provider\s+mode\s+status\s+turns\s+elapsed", drawn), raw
    assert re.search(_ROW.format(label="count"), drawn), raw
    shown = _clean(raw)
    assert shown[0] == '→ subagent {"description":"count","prompt":"count to 3"}'
    assert shown[-2].startswith("Child session-") and shown[-2].endswith(" is done.")
    assert shown[-1].startswith("session session-")


def test_ctrl_c_in_the_live_tree_drains_and_leaves_the_terminal_clean(tmp_path: Path) -> None:
    """CLI-3, CLI-16: Ctrl-C typed while a child runs: the child is stopped, the region
    erased, the cursor shown; the run names the session and the command that continues it,
    and exits 130."""
    (tmp_path / "model.toml").write_text(SPIN, encoding="utf-8")
    argv = _cli("--model", "scripted:model.toml", "--max-steps", str(10**9), "go")
    status, raw = _in_pty(argv, tmp_path, [(_ROW.format(label="s"), b"\x03")])
    assert status == 130, raw
    shown = _clean(raw)
    assert "dsh-subagents run: interrupted: stopping 1 running subagent" in shown
    assert re.fullmatch(
        r'session (\S+) \(continue: dsh-subagents run --resume \1 "\.\.\."\)', shown[-1]
    ), shown
    assert "Traceback" not in raw


#: A wrapper that adds a tool ignoring cancellation (a stuck drain) to the command.
STUCK = """
import asyncio, sys
import dsh_subagents.cli as cli
from dsh_core import PluginSpec, ToolDefinition, hookimpl

async def stuck(args, run):
    while True:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass

class Plugin:
    @hookimpl
    def dsh_plugins(self):
        def apply(ctx, _):
            ctx.tools.register(ToolDefinition(name="stuck", description="x", execute=stuck))
        return [PluginSpec(name="stuck", apply=apply, requires=("tools",))]

import dsh_core
real = dsh_core.make_plugin_manager  # the command imports it when a command runs
dsh_core.make_plugin_manager = lambda **kw: real(plugins={"stuck": Plugin()}, **kw)
import dsh_subagents._run as run
run.STILL_STOPPING = 0.2  # the hint's delay (2 s): the test waits for the hint, not the clock
sys.exit(cli.main())
"""


def test_a_second_ctrl_c_quits_at_once(tmp_path: Path) -> None:
    """CLI-4: when the stop cannot finish (a tool that ignores cancellation), the run says
    that Ctrl-C again quits at once; the second Ctrl-C ends the process then, status 130,
    terminal clean."""
    (tmp_path / "stuck.py").write_text(STUCK, encoding="utf-8")
    (tmp_path / "model.toml").write_text(
        'default = "x"\n[[rules]]\nwhen = { last_user = "^go$" }\n'
        'reply = { tool_calls = [{ name = "stuck" }] }\n',
        encoding="utf-8",
    )
    argv = [sys.executable, "stuck.py", "run", "--model", "scripted:model.toml", "go"]
    keys = [("→ stuck", b"\x03"), ("Ctrl-C again quits at once", b"\x03")]
    status, raw = _in_pty(argv, tmp_path, keys)
    assert status == 130, raw
    shown = screen(raw)
    assert shown[-3:] == [
        "dsh-subagents run: interrupted",
        "dsh-subagents run: still stopping: Ctrl-C again quits at once",
        "dsh-subagents run: interrupted again: quitting at once",
    ], shown
