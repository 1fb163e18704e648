"""`dsh-subagents run`: from process start to its first model request (issue 25's target:
at most 300 ms with the sources byte-compiled).

Each round starts two fresh processes, in alternating order: ``python -c pass`` (the bare
interpreter, for reference) and ``python -m dsh_subagents.cli run`` on the default
composition with ``--model openai:bench``, whose requests go to the loopback chat-completions
server. A run is timed from just before its process is spawned to the moment the server
receives its request. Both are printed as medians with quartiles, and so is the difference;
then the CPU time (user and system, every thread) of a run until its request (read from
``/proc`` while the server holds its reply back, on Linux) and of the whole run to its exit.
The CPU times move much less than the wall clock on a busy machine: read them there.
Output is a pipe (no live tree, so ``rich`` is not imported), the home a fresh temporary
folder (the session is stored there, as by default).

Byte-code: everything the run imports is compiled first, this checkout's ``packages/`` and
every folder on the interpreter's path (site-packages above all: uv installs without
compiling, and with ``PYTHONDONTWRITEBYTECODE`` set no import writes a cache, so an
uncompiled site-packages is compiled again by every run, which then measures the compiler).
``compileall`` skips what is up to date, so only the first run pays. The warm-up run then
checks that every module it imported had its byte-code and names those that did not.

With ``--model scripted`` a run is on the offline scripted model instead (no server, no
SDK: what the runtime, its plugins and the command cost by themselves). Its "request" is the
scripted model's first ``stream`` call: a hook the run is started through wraps
``ScriptedAdapter.stream`` when ``dsh_core._scripted`` is imported (nothing else changes) and
reports, at that call, the wall-clock time and the process's CPU time (every thread).

    python benchmarks/cli_start.py --rounds 21
    python benchmarks/cli_start.py --model scripted --rounds 21
    python benchmarks/cli_start.py --importtime   # the slowest imports of one run
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from dsh_llm_openai.testing import ChatCompletionsServer, text_reply

ROOT = Path(__file__).resolve().parent.parent


def _quartiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"median {q[1] * 1000:6.1f} ms  (quartiles {q[0] * 1000:.1f} .. {q[2] * 1000:.1f})"


def _bare() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - start


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


#: How long the server holds its reply back: the run waits meanwhile, so its CPU time read
#: then is the CPU time until the request.
REPLY_DELAY = 0.2
#: The CPU time (user + system) of each timed run, from spawn to exit.
CPU: list[float] = []


#: Runs the command as ``-m`` does and, at exit, prints (to stderr, after a marker) the
#: imported modules whose byte-code cache is missing: each was compiled by this run.
_CHECK = """
import atexit, os, runpy, sys

def _uncompiled():
    missing = sorted(
        name
        for name, module in list(sys.modules.items())
        if (cached := getattr(getattr(module, "__spec__", None), "cached", None))
        and getattr(module.__spec__, "has_location", False)
        and not os.path.exists(cached)
    )
    print("\\n@uncompiled " + " ".join(missing), file=sys.stderr)

atexit.register(_uncompiled)
sys.argv[0] = "dsh-subagents"
runpy.run_module("dsh_subagents.cli", run_name="__main__", alter_sys=True)
"""


#: Runs the command as ``-m`` does, on the scripted model; at the model's first ``stream``
#: call prints (to stderr, after a marker) the wall-clock time and the CPU time used so far.
_SCRIPTED = """
import importlib.util, runpy, sys, time

class Hook:  # a finder of nothing: it wraps the module's loader once and steps aside
    def find_spec(self, name, path=None, target=None):
        if name != "dsh_core._scripted":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            stream = module.ScriptedAdapter.stream

            def first(self, *args, **kwargs):
                module.ScriptedAdapter.stream = stream
                print(f"\\n@request {time.time()!r} {time.process_time()!r}", file=sys.stderr)
                return stream(self, *args, **kwargs)

            module.ScriptedAdapter.stream = first

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, Hook())
sys.argv[0] = "dsh-subagents"
runpy.run_module("dsh_subagents.cli", run_name="__main__", alter_sys=True)
"""


def _run_with(script: str, model: str, env: dict[str, str]) -> str:
    """``run --model MODEL hi`` under ``script`` (a ``python -c`` wrapper that reports on
    stderr); its stderr. A failed run ends the benchmark."""
    done = subprocess.run(
        [sys.executable, "-c", script, "run", "--model", model, "hi"],
        capture_output=True,
        env=env,
        timeout=120,
    )
    if done.returncode != 0:
        raise SystemExit(f"the run failed ({done.returncode}): {done.stderr.decode()}")
    return done.stderr.decode()


def _run_scripted(env: dict[str, str]) -> float:
    """One run on the scripted model: the wall-clock time to its first ``stream`` call
    (and the CPU time until then, recorded)."""
    cpu = _children_cpu()
    start = time.time()
    err = _run_with(_SCRIPTED, "scripted", env)
    at, used = err.rpartition("@request ")[2].split()[:2]
    CPU.append(_children_cpu() - cpu)
    CPU_TO_REQUEST.append(float(used))
    return float(at) - start


#: Test folders no run imports (the standard library's hold files that do not compile).
_TESTS = re.compile(r"[/\\](tests?|idle_test|lib2to3)[/\\]")


def compile_everything() -> None:
    """Byte-compile this checkout's packages and every folder on the path (site-packages,
    the standard library): what is up to date is skipped; a folder that cannot be written
    (a system standard library) is left as it is."""
    folders = [ROOT / "packages"]
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        folder = Path(sysconfig.get_paths()[key])
        if folder not in folders:
            folders.append(folder)
    for folder in folders:
        if folder.is_dir() and os.access(folder, os.W_OK):
            compileall.compile_dir(folder, quiet=2, rx=_TESTS)


def _check_compiled(server: ChatCompletionsServer, env: dict[str, str]) -> None:
    """One run that names the modules it imported without byte-code (each a compile in
    every timed run): a warning, since the figures then measure the compiler."""
    server.received.clear()
    tail = _run_with(_CHECK, "openai:bench", env).rpartition("@uncompiled ")[2].split()
    if tail:
        print(f"warning: {len(tail)} modules were imported without byte-code: {' '.join(tail)}")


def _proc_cpu(pid: int) -> float | None:
    """The CPU time (user + system, every thread) process ``pid`` has used so far, from
    ``/proc`` (Linux; ``None`` elsewhere). Clock ticks: 10 ms steps, a median smooths them."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: The CPU time of each timed run until its first request (the reply waits meanwhile).
CPU_TO_REQUEST: list[float] = []


def _run(server: ChatCompletionsServer, env: dict[str, str]) -> float:
    server.received.clear()
    cpu = _children_cpu()
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "dsh_subagents.cli", "run", "--model", "openai:bench", "hi"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    if not server.received.wait(60):
        child.kill()
        raise SystemExit(f"no request within 60 s: {child.communicate()}")
    elapsed = time.perf_counter() - start
    to_request = _proc_cpu(child.pid)  # the reply is held back (REPLY_DELAY): it waits
    _, err = child.communicate(timeout=60)
    if child.returncode != 0:
        raise SystemExit(f"the run failed ({child.returncode}): {err.decode()}")
    CPU.append(_children_cpu() - cpu)
    if to_request is not None:
        CPU_TO_REQUEST.append(to_request)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument(
        "--model",
        choices=("openai", "scripted"),
        default="openai",
        help="openai (the default): on the loopback server; scripted: the offline model",
    )
    args = parser.parse_args()
    compile_everything()
    if args.model == "scripted":
        with tempfile.TemporaryDirectory() as home:
            env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
            env["DSH_SUBAGENTS_HOME"] = home
            _run_scripted(env)  # warm the disk cache
            CPU.clear()
            CPU_TO_REQUEST.clear()
            _report(*_rounds(args.rounds, lambda: _run_scripted(env)))
        return
    with (
        tempfile.TemporaryDirectory() as home,
        ChatCompletionsServer(default=attrs.evolve(text_reply("ok"), delay=REPLY_DELAY)) as server,
    ):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
        env.update(
            DSH_SUBAGENTS_HOME=home, OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="sk-bench"
        )
        if args.importtime:
            done = subprocess.run(
                [
                    sys.executable,
                    "-X",
                    "importtime",
                    "-m",
                    "dsh_subagents.cli",
                    "run",
                    "--model",
                    "openai:bench",
                    "hi",
                ],
                capture_output=True,
                env=env,
                check=True,
            )
            rows = [
                line.split("|")
                for line in done.stderr.decode().splitlines()
                if line.startswith("import time:") and "cumulative" not in line
            ]
            top = sorted(rows, key=lambda r: -int(r[1]))[:25]
            for row in top:
                print(f"{int(row[1]) / 1000:8.1f} ms  {row[2].rstrip()}")
            return
        _check_compiled(server, env)  # and warm the disk cache
        bare, runs = _rounds(args.rounds, lambda: _run(server, env))
    _report(bare, runs)


def _rounds(rounds: int, run: Callable[[], float]) -> tuple[list[float], list[float]]:
    """``rounds`` pairs of a bare interpreter and a run, in alternating order."""
    bare: list[float] = []
    runs: list[float] = []
    for i in range(rounds):
        if i % 2:
            runs.append(run())
            bare.append(_bare())
        else:
            bare.append(_bare())
            runs.append(run())
    return bare, runs


def _report(bare: list[float], runs: list[float]) -> None:
    print(f"python -c pass                     {_quartiles(bare)}")
    print(f"dsh-subagents run, first request   {_quartiles(runs)}")
    diffs = [r - b for r, b in zip(runs, bare, strict=True)]
    print(f"difference (pairs)                 {_quartiles(diffs)}")
    if CPU_TO_REQUEST:
        print(f"CPU to the first request           {_quartiles(CPU_TO_REQUEST)}")
    print(f"CPU of a whole run (to its exit)   {_quartiles(CPU)}")


if __name__ == "__main__":
    main()
