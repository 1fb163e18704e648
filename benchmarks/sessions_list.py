"""``dsh-subagents sessions list`` over 10,000 stored sessions.

Run ``python benchmarks/sessions_list.py`` (``--count N`` for another size, ``--runs N`` for
the repetitions). Writes one real session with a scripted model (three turns, each answer
with its token usage) and copies it to make N stored sessions (default 10,000): nine in ten
are root sessions, and every tenth is a child of the root before it (its header only).
Then it times, median of ``--runs``:

- ``sessions list`` in-process (``main([...])``, output to a string): the newest 20 roots,
  and ``--all`` (every root summarised: its head, turns and tokens read);
- the same as a subprocess (``python -m dsh_subagents.cli``), interpreter start included;
- the ``sessions`` command alone as a subprocess (its module, without the imports of the rest
  of the command line, dsh-core above all): what the command costs once those are lazy.

Each figure also gives the CPU time: on a busy machine it moves less than the wall time.

Target (issue 25): <= 1 s for 10,000 stored sessions. The files are in the page cache after
being written, as on a warm machine; a cold disk adds its reads. Everything the command
imports is byte-compiled first (as ``cli_start.py`` does: this checkout and site-packages),
so the subprocess figures do not include compiling ``_sessions.py`` in every run.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsh_core import TokenUsage
from dsh_core.testing import ScriptedReply, scripted_host
from dsh_subagents.cli import main


async def _one(root: Path) -> tuple[str, str]:
    replies = [
        ScriptedReply(text=f"answer {i}", usage=TokenUsage(input_tokens=100 * i, output_tokens=i))
        for i in range(1, 4)
    ]
    async with scripted_host(model=replies, store="jsonl", store_root=root) as h:
        handle = await h.create_agent(session_id="session-template")
        for prompt in ("plan a trip", "and the hotel?", "thanks"):
            await h.run(handle.agent, prompt)
        await handle.dispose()
    root_text = (root / "session-template.jsonl").read_text()
    child = (
        '{"id":"session-child","created_at":1,"parent_session":"session-template",'
        '"origin":"subagent","delegation_depth":1,"version":1}\n'
    )
    return root_text, child


def make(folder: Path, count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root_text, child = asyncio.run(_one(Path(tmp)))
    parent = "session-template"
    for i in range(count):
        sid = f"session-{i:032x}"
        if i % 10 == 9:
            text = child.replace("session-child", sid).replace("session-template", parent)
        else:
            text, parent = root_text.replace("session-template", sid), sid
        (folder / f"{sid}.jsonl").write_text(text)


def _in_process(args: list[str], runs: int) -> tuple[float, float]:
    """Median wall time and median CPU time (this process) of ``runs`` calls."""
    times, cpu = [], []
    for _ in range(runs):
        out = io.StringIO()
        t, c = time.perf_counter(), time.process_time()
        assert main(args, out=out) == 0
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return statistics.median(times), statistics.median(cpu)


#: The ``sessions`` command alone, without the rest of the command line's imports (dsh-core).
_ALONE = """
import argparse, sys
from dsh_subagents import _sessions_args as _sessions
parser = argparse.ArgumentParser()
_sessions.add_parser(parser.add_subparsers())
args = parser.parse_args(sys.argv[1:])
sys.exit(args.run(args, sys.stdout))
"""


def _subprocess(args: list[str], runs: int, alone: bool = False) -> tuple[float, float]:
    """Median wall time and median CPU time (the child, user + system) of ``runs`` runs."""
    times, cpu = [], []
    entry = ["-c", _ALONE] if alone else ["-m", "dsh_subagents.cli"]
    cmd = [sys.executable, *entry, *args]
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(times), statistics.median(cpu)


def run(count: int, runs: int) -> None:
    from cli_start import compile_everything  # this folder is the script's sys.path[0]

    compile_everything()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make(folder, count)
        files = len(os.listdir(folder))
        print(f"{files} stored sessions ({count - count // 10} roots), median of {runs} runs")
        base = ["sessions", "list", "--store", str(folder)]
        for name, args in (("newest 20", base), ("--all", [*base, "--all"])):
            for how, measure in (
                ("in-process", _in_process),
                ("subprocess", _subprocess),
                ("sessions alone", lambda a, r: _subprocess(a, r, alone=True)),
            ):
                wall, cpu = measure(args, runs)
                print(f"  {how:<14}  {name:<10} {wall * 1000:8.1f} ms  (CPU {cpu * 1000:.1f} ms)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    ns = parser.parse_args()
    run(ns.count, ns.runs)
