"""Cold resume of a settled continuable child (issue 13's target), in a fresh process.

Run ``python benchmarks/resume.py`` (``--quick`` for a smoke run; ``--sizes 10000`` for one
size). For each size it writes, once, a JSONL store holding a parent session and a settled
continuable child (started through ``subagent-spawn``) whose log has about that many events:
turns of a user message, an assistant message with two tool calls, their calls and results,
and a final answer, as the agent loop logs them. Each measurement then runs in a fresh
interpreter on a fresh copy of that store (so every run resumes the same log): boot a host on
the store, resume the parent, and time ``SubagentService.followup`` to the settled child up to
the inbox's acceptance (the read of the child's log, the descriptor fold, the agent resume
and the admission), then on to the settlement notice in the parent's inbox (the child's turn
and its settlement). The median of ``--repeat`` fresh processes is reported, with the fastest
and the slowest. Target: 10,000 events accepted in <= 50 ms.

``benchmarks/continuable.py --only resume`` runs this same measurement (it calls
:func:`cold_resume`), so both scripts report one cold-resume figure.

``--make N --root DIR`` only writes a store (printing the child's id), for
``instructions.sh TREE resume``, which counts the instructions per event of the follow-up.
``--profile N`` runs one measurement of the N-event log under cProfile instead, through the
notice (the store's worker-thread reads inlined, so the profile sees them; ``--sort tottime``).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import dsh_subagent.plugin
import dsh_subagent_spawn.plugin
from dsh_core import AbortController, ToolDefinition, ToolRunContext, text_blocks
from dsh_core.testing import ScriptedReply, ScriptedRequest, ScriptedToolCall, scripted_host
from dsh_subagent import (
    SUBAGENTS,
    ContinuableStartSpec,
    CoordinatorMessageSource,
    SubagentFollowupOptions,
)

MODULES = {"subagent": dsh_subagent.plugin, "subagent-spawn": dsh_subagent_spawn.plugin}
PARENT = "session-parent"
BOUND = 600  # seconds: every wait of a measurement is bounded


def model(request: ScriptedRequest) -> ScriptedReply | str:
    """Two tool calls after each user message, then an answer."""
    last = request.last
    if last is not None and last.role == "user":
        n = request.index
        return ScriptedReply(
            text=f"Looking into it ({n}).",
            tool_calls=(
                ScriptedToolCall(name="look", arguments={"path": f"src/file_{n}.py"}),
                ScriptedToolCall(name="look", arguments={"path": f"tests/test_{n}.py"}),
            ),
        )
    return "Done: " + request.last_user_text + " " + "the details of the answer. " * 4


async def look(arguments: Any, ctx: ToolRunContext) -> str:
    return f"contents of {arguments['path']}\n" + "line of code\n" * 8


async def make(root: Path, size: int) -> str:
    """Write the store of ``size`` events at ``root``; return the child's id."""
    async with scripted_host(
        "subagent", "subagent-spawn", model=model, modules=MODULES, store="jsonl", store_root=root
    ) as host:
        host.ctx.tools.register(ToolDefinition(name="look", description="Look.", execute=look))
        parent = (await host.create_agent(session_id=PARENT)).agent
        svc = parent.ctx[SUBAGENTS]
        started = await svc.start_continuable(
            ContinuableStartSpec(
                provider="spawn",
                label="helper",
                prompt=text_blocks("first task"),
                parent=parent,
                signal=AbortController().signal,
            )
        )
        manager = host.ctx[SUBAGENTS]._state.continuation
        child_id = started.child_id
        async with asyncio.timeout(60):
            await manager.activations[child_id].agent.when_idle()
            while child_id in manager.activations or child_id in manager.retiring:
                pending = [t for t in host.ctx.host.tasks if not t.done()]
                await (asyncio.wait(pending) if pending else asyncio.sleep(0))
    # Grow the child's log through the core agent: the same turns, without the seam.
    async with scripted_host(model=model, store="jsonl", store_root=root) as host:
        host.ctx.tools.register(ToolDefinition(name="look", description="Look.", execute=look))
        child = (await host.resume_agent(child_id)).agent
        n = 0
        while child.session.seq < size:
            n += 1
            await host.run(child, f"task {n}")
    return child_id


async def measure(root: Path, child_id: str, exit: bool = False) -> dict[str, float]:
    """One cold-resume follow-up in this (fresh) process, in milliseconds: until acceptance
    (``ms``) and until the settlement notice reached the parent's inbox (``notice_ms``);
    ``exit`` ends the process at once after acceptance (instruction counts then cover nothing
    beyond it). The test-time invariant checkers are off, as in a production host."""
    async with scripted_host(
        "subagent",
        "subagent-spawn",
        model=model,
        modules=MODULES,
        store="jsonl",
        store_root=root,
        invariants=False,
    ) as host:
        parent = (await host.resume_agent(PARENT)).agent
        svc = parent.ctx[SUBAGENTS]
        options = SubagentFollowupOptions(
            source=CoordinatorMessageSource(sender_session_id=parent.id),
            signal=AbortController().signal,
        )
        notice = asyncio.get_running_loop().create_future()

        def inserted(agent: Any, message: Any) -> None:
            kind = message.source.kind
            if agent is parent and kind == "subagent-settled" and not notice.done():
                notice.set_result(None)

        host.ctx.on("agent/inbox/inserted", inserted)
        start = time.perf_counter()
        await svc.followup(parent, child_id, text_blocks("again"), options)
        accepted = time.perf_counter() - start
        if exit:
            os._exit(0)
        manager = host.ctx[SUBAGENTS]._state.continuation
        events = manager.activations[child_id].agent.session.seq
        async with asyncio.timeout(BOUND):
            await notice
        settled = time.perf_counter() - start
        async with asyncio.timeout(BOUND):
            await parent.when_idle()
    return {"ms": accepted * 1000, "notice_ms": settled * 1000, "events": events}


def child(args: argparse.Namespace) -> None:
    root, child_id = Path(args.root), args.child
    if args.profile_out:
        # The store's reads run in worker threads, which cProfile does not see: inline them.
        from dsh_core._persistence import JsonlSessionPersistence

        JsonlSessionPersistence._threaded = False
        profiler = cProfile.Profile()
        result = profiler.runcall(asyncio.run, measure(root, child_id))
        profiler.dump_stats(args.profile_out)
    else:
        result = asyncio.run(measure(root, child_id, args.exit))
    print(json.dumps(result))


def fresh(root: Path, child_id: str, profile_out: str | None = None) -> dict[str, float]:
    """:func:`measure` in a fresh interpreter, on a fresh copy of the store at ``root``."""
    with tempfile.TemporaryDirectory(prefix="dsh-bench-run-") as tmp:
        copy = Path(tmp) / "store"
        shutil.copytree(root, copy)
        return _fresh(copy, child_id, profile_out)


def _fresh(root: Path, child_id: str, profile_out: str | None) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", child_id, "--root", str(root)]
    if profile_out:
        cmd += ["--profile-out", profile_out]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),  # the same code
        "DSH_DISABLE_PLUGIN_AUTOLOAD": "1",  # plugins by module only, as the other scripts
    }
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(done.stderr)
    out = done.stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def cold_resume(sizes: list[int], repeat: int) -> list[dict[str, float]]:
    """For each size: the store built once, then ``repeat`` fresh processes, each on a fresh
    copy of it. Per size: ``events``, and the median, fastest and slowest acceptance
    (``ms``, ``min_ms``, ``max_ms``) and notice (``notice_ms``) over the processes."""
    out = []
    with tempfile.TemporaryDirectory(prefix="dsh-bench-") as tmp:
        for size in sizes:
            root = Path(tmp) / f"s{size}"
            child_id = asyncio.run(make(root, size))
            runs = [fresh(root, child_id) for _ in range(repeat)]
            accepted = [r["ms"] for r in runs]
            out.append(
                {
                    "events": runs[0]["events"],
                    "ms": statistics.median(accepted),
                    "min_ms": min(accepted),
                    "max_ms": max(accepted),
                    "notice_ms": statistics.median(r["notice_ms"] for r in runs),
                    "runs": repeat,
                }
            )
    return out


def line(row: dict[str, float]) -> str:
    """One row of the report, as both scripts print it."""
    return (
        f"{int(row['events']):>6} events: accepted in {row['ms']:.2f} ms "
        f"(median of {int(row['runs'])}; {row['min_ms']:.2f} to {row['max_ms']:.2f}), "
        f"notice after {row['notice_ms']:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", type=int, nargs="*", default=[10, 1000, 10000])
    parser.add_argument("--repeat", type=int, default=5, help="fresh processes per size")
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--sort", default="cumulative", help="the profile's order")
    parser.add_argument("--make", type=int, help="only write a store of N events at --root")
    parser.add_argument("--exit", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.make:
        print(asyncio.run(make(Path(args.root), args.make)))  # the child's id
        return
    if args.profile:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "store"
            child_id = asyncio.run(make(root, args.profile))
            out = str(Path(tmp) / "profile")
            fresh(root, child_id, out)
            pstats.Stats(out).sort_stats(args.sort).print_stats(45)
        return
    sizes, repeat = ([10, 100], 3) if args.quick else (args.sizes, args.repeat)
    print("cold resume (jsonl), a fresh process each, follow-up until accepted and until notice")
    for row in cold_resume(sizes, repeat):
        print(line(row))


if __name__ == "__main__":
    main()
