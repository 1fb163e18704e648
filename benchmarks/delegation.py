"""Delegation benchmark: what one parent -> child -> parent round trip costs.

One delegation = a fresh parent agent whose scripted model emits one tool call -> the tool
starts a one-shot child through ``ctx.subagents.start()`` -> the child's scripted model answers
in one call -> the run is disposed -> the parent's model answers with the child's text -> the
parent is disposed. The same shape as the peer scripts in ``benchmarks/peers/`` (each of their
delegations is a fresh ``run``), so the ratios are comparable.

Each configuration (provider x store) runs in its own process: one warm-up, then two timed
phases, each for at least ``--seconds`` (default 1 s, long enough that the scheduler's noise is
a small part of it): *sequential*, one delegation after another (at least ``--seq`` of them),
and *concurrent*, batches of ``--conc`` delegations at once (``asyncio.gather``) one batch
after another. Each phase reports ms per delegation (its time over its delegations), and the
process its peak RSS. The cyclic GC stays on; each timed phase starts after a
``gc.collect()`` so that it is not billed for a collection the previous phase made due.

``--rounds R`` (default 3) runs every configuration R times, each time in a fresh process, in
an order rotated by one each round, so that what slows the machine for a while falls on every
configuration; the table gives each figure's median over the rounds, and, when both ran, the
ratio ``spawn:tool`` / ``spawn:memory`` of each round and its median.

    python benchmarks/delegation.py                 # every configuration, a table
    python benchmarks/delegation.py --only spawn:memory --rounds 5
    python benchmarks/delegation.py --live 2000   # with 2000 idle agents alive meanwhile
    python benchmarks/delegation.py --only spawn:memory --only spawn:tool --seconds 2
    python benchmarks/delegation.py --only spawn:tool --json out.json   # the rows, as JSON

``spawn:tool`` is the real-tool route: the parent calls the ``subagent`` tool of
dsh-tool-subagent (one plugin row, provider ``spawn``, memory store) instead of a bench tool
calling ``start()`` directly; compare it with ``spawn:memory`` for what the tool layer costs.

``--live N`` keeps N idle agents alive through the timed phases, each with a scoped prompt
context, a scoped tool, a scoped listener and one finished turn, as a parent's background
children have: the cost of a delegation should not grow with them.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONFIGS = ("spawn:memory", "fork:memory", "spawn:jsonl", "fork:jsonl", "spawn:tool")


async def _measure(
    provider: str,
    store: str,
    n_seq: int,
    n_conc: int,
    root: Path,
    n_live: int = 0,
    seconds: float = 0.0,
) -> dict[str, Any]:
    """One process's figures: at least ``n_seq`` sequential delegations and at least one
    batch of ``n_conc`` concurrent ones, each phase repeated until it has run ``seconds``
    (with the default 0, exactly ``n_seq`` and one batch, as ``instructions.sh`` counts)."""
    import dsh_subagent.plugin
    import dsh_subagent_fork.plugin
    import dsh_subagent_spawn.plugin
    import dsh_tool_subagent.plugin
    from dsh_core import (
        AbortController,
        Context,
        PluginRow,
        PromptContext,
        ToolDefinition,
        ToolRunContext,
        blocks_text,
        text_blocks,
    )
    from dsh_core.testing import (
        ScriptedAdapter,
        ScriptedReply,
        ScriptedRequest,
        ScriptedToolCall,
        scripted_host,
    )
    from dsh_subagent import SUBAGENTS, SubagentStartRequest

    real_tool = store == "tool"  # the subagent tool of dsh-tool-subagent, memory store
    if real_tool:
        store = "memory"
        call = ScriptedReply(
            tool_calls=(
                ScriptedToolCall(
                    name="subagent",
                    arguments={"description": "summarise a thing", "prompt": "summarise X"},
                ),
            )
        )
    else:
        call = ScriptedReply(
            tool_calls=(ScriptedToolCall(name="delegate", arguments={"task": "summarise X"}),)
        )

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if request.last_user_text == "summarise X":
            return "child result"
        if request.last_user_text == "stand by":
            return "standing by"  # an idle background agent (--live)
        if request.last_tool_result is not None:
            return f"parent got: {request.last_tool_result}"
        return call

    async def delegate(args: Any, run: ToolRunContext) -> str:
        assert run.agent is not None
        started = await run.ctx[SUBAGENTS].start(
            provider,
            SubagentStartRequest(
                prompt=text_blocks(args["task"]), parent=run.agent, signal=AbortController().signal
            ),
        )
        try:
            result = await started.result
        finally:
            await started.dispose()
        return blocks_text(result.output)

    rows: list[Any] = ["subagent", f"subagent-{provider}"]
    if real_tool:
        rows.append(PluginRow(plugin="tool-subagent", config={"provider": provider}))
    config: dict[str, Any] = {}
    retain = os.environ.get("DSH_BENCH_RETAIN")
    if retain is not None:  # --retain: the memory store's bound on disposed logs
        config["session-persistence-memory"] = {"retain_disposed": int(retain)}
    async with scripted_host(
        *rows,
        config=config,
        # record=False: the test double keeps no request history (a real adapter keeps none).
        model=ScriptedAdapter(model, record=False),
        store=store,  # type: ignore[arg-type]
        store_root=root,
        invariants=False,
        modules={
            "subagent": dsh_subagent.plugin,
            "subagent-spawn": dsh_subagent_spawn.plugin,
            "subagent-fork": dsh_subagent_fork.plugin,
            "tool-subagent": dsh_tool_subagent.plugin,
        },
    ) as host:
        if not real_tool:
            host.ctx.tools.register(
                ToolDefinition(
                    name="delegate",
                    description="Delegate a task to a child agent.",
                    parameters={
                        "type": "object",
                        "properties": {"task": {"type": "string"}},
                        "required": ["task"],
                    },
                    execute=delegate,
                    concurrency_safe=True,
                )
            )

        async def one() -> None:
            handle = await host.create_agent()
            try:
                answer = await host.run(handle.agent, "do the thing")
            finally:
                await handle.dispose()
            assert answer == "parent got: child result", answer

        async def idle_tool(args: Any, run: ToolRunContext) -> str:
            return "idle"

        def background(ctx: Context) -> None:
            ctx.on("agent/status", lambda agent, status: None)  # as a run watches its child
            ctx.system_prompt.context(PromptContext(name="bg", order=120, text="In background."))
            ctx.tools.register(
                ToolDefinition(
                    name="own", description="A scoped tool.", parameters={}, execute=idle_tool
                )
            )

        idle = [await host.create_agent(setup=background) for _ in range(n_live)]
        for handle in idle:  # each has worked once: its prompt and tools are cached
            assert await host.run(handle.agent, "stand by") == "standing by"
        await one()
        gc.collect()  # each phase starts clean: no collection owed by what ran before it
        # --cpu: the process's CPU time, which a busy machine's other processes inflate far
        # less than the wall time (what waiting for the CPU adds is left out).
        clock = time.process_time if os.environ.get("DSH_BENCH_CPU") else time.perf_counter
        done = 0
        t0 = clock()
        while done < n_seq or clock() - t0 < seconds:
            await one()
            done += 1
        seq = clock() - t0
        gc.collect()
        batches = 0
        t0 = clock()
        while batches < 1 or clock() - t0 < seconds:
            await asyncio.gather(*(one() for _ in range(n_conc)))
            batches += 1
        conc = clock() - t0
        live = len(host.ctx.agents.list()) - len(idle)
    return {
        "config": f"{provider}:{'tool' if real_tool else store}",
        "seq_ms": seq / done * 1000,
        "seq_count": done,
        "seq_s": seq,
        "conc_ms_each": conc / (batches * n_conc) * 1000,
        "conc_batch_ms": conc / batches * 1000,
        "conc_batches": batches,
        "conc_s": conc,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "leftover_agents": live,
    }


def _child(config: str, n_seq: int, n_conc: int, n_live: int, seconds: float) -> None:
    provider, store = config.split(":")
    with tempfile.TemporaryDirectory(prefix="dsh-bench-") as tmp:
        result = asyncio.run(_measure(provider, store, n_seq, n_conc, Path(tmp), n_live, seconds))
    print(json.dumps(result))


def run(config: str, n_seq: int, n_conc: int, n_live: int, seconds: float) -> dict[str, Any]:
    """One configuration measured in a fresh process (plugins by module, no autoload)."""
    sizes = ["--seq", str(n_seq), "--conc", str(n_conc), "--live", str(n_live)]
    out = subprocess.run(
        [sys.executable, __file__, "--child", config, *sizes, "--seconds", str(seconds)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "DSH_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    if out.returncode:
        raise SystemExit(f"{config} failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


FIGURES = ("seq_ms", "conc_ms_each", "conc_batch_ms", "peak_rss_mb", "seq_count", "conc_batches")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=200, help="sequential delegations, at least")
    parser.add_argument("--conc", type=int, default=50, help="concurrent delegations per batch")
    parser.add_argument("--seconds", type=float, default=1.0, help="each phase's length, at least")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per configuration")
    parser.add_argument("--only", choices=CONFIGS, action="append", help="run only these")
    parser.add_argument("--live", type=int, default=0, help="idle agents kept alive meanwhile")
    parser.add_argument("--json", help="also write the rows (and every round) to this file")
    parser.add_argument(
        "--cpu", action="store_true", help="time with the process's CPU time, not the wall clock"
    )
    parser.add_argument(
        "--retain", type=int, help="the memory store's retain_disposed (default: keep every log)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.seq, args.conc, args.live, args.seconds)
        return
    if args.cpu:  # read by each configuration's process
        os.environ["DSH_BENCH_CPU"] = "1"
    if args.retain is not None:
        os.environ["DSH_BENCH_RETAIN"] = str(args.retain)
    configs = list(dict.fromkeys(args.only or CONFIGS))
    rounds: dict[str, list[dict[str, Any]]] = {config: [] for config in configs}
    for i in range(args.rounds):
        turn = i % len(configs)
        for config in configs[turn:] + configs[:turn]:
            rounds[config].append(run(config, args.seq, args.conc, args.live, args.seconds))
    rows = {
        config: {key: statistics.median(r[key] for r in runs) for key in FIGURES}
        for config, runs in rounds.items()
    }
    live = f", {args.live} idle agents alive" if args.live else ""
    live += ", CPU time" if args.cpu else ""
    live += f", retain_disposed={args.retain}" if args.retain is not None else ""
    print(
        f"python {sys.version.split()[0]}; medians of {args.rounds} fresh processes per "
        f"configuration (alternating); each phase >= {args.seconds:g} s: sequential (at least "
        f"{args.seq}), then batches of {args.conc} concurrent{live}"
    )
    print(
        f"{'config':<14} {'ms/delegation seq':>18} {'(count)':>8} {'ms/delegation conc':>19} "
        f"{'(batches)':>9} {'peak RSS MB':>12}"
    )
    for config, r in rows.items():
        print(
            f"{config:<14} {r['seq_ms']:>18.3f} {r['seq_count']:>8.0f} {r['conc_ms_each']:>19.3f} "
            f"{r['conc_batches']:>9.0f} {r['peak_rss_mb']:>12.1f}"
        )
    if "spawn:tool" in rounds and "spawn:memory" in rounds:
        for key, label in (("seq_ms", "sequential"), ("conc_ms_each", "concurrent")):
            ratios = [
                t[key] / m[key]
                for t, m in zip(rounds["spawn:tool"], rounds["spawn:memory"], strict=True)
            ]
            print(
                f"spawn:tool / spawn:memory, {label}: median {statistics.median(ratios):.2f} "
                f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
