"""Delegation benchmark: what one parent -> child -> parent round trip costs.

One delegation = a fresh parent agent whose scripted model emits one tool call -> the tool
starts a one-shot child through ``ctx.subagents.start()`` -> the child's scripted model answers
in one call -> the run is disposed -> the parent's model answers with the child's text -> the
parent is disposed. The same shape as the peer scripts in ``benchmarks/peers/`` (each of their
delegations is a fresh ``run``), so the ratios are comparable.

Each configuration (provider x store) runs in its own process: one warm-up, N sequential
delegations, then N concurrent ones (``asyncio.gather``), and reports ms per delegation and the
process's peak RSS. The cyclic GC stays on; each timed phase starts after a ``gc.collect()``
so that it is not billed for a collection the previous phase made due.

    python benchmarks/delegation.py                 # every configuration, a table
    python benchmarks/delegation.py --seq 200 --conc 50 --only spawn:memory
    python benchmarks/delegation.py --live 2000   # with 2000 idle agents alive meanwhile
    python benchmarks/delegation.py --only spawn:memory --only spawn:tool --seq 200

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
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONFIGS = ("spawn:memory", "fork:memory", "spawn:jsonl", "fork:jsonl", "spawn:tool")


async def _measure(
    provider: str, store: str, n_seq: int, n_conc: int, root: Path, n_live: int = 0
) -> dict[str, Any]:
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
    async with scripted_host(
        *rows,
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
        t0 = time.perf_counter()
        for _ in range(n_seq):
            await one()
        seq = time.perf_counter() - t0
        gc.collect()
        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n_conc)))
        conc = time.perf_counter() - t0
        live = len(host.ctx.agents.list()) - len(idle)
    return {
        "config": f"{provider}:{'tool' if real_tool else store}",
        "seq_ms": seq / n_seq * 1000,
        "conc_s": conc,
        "conc_ms_each": conc / n_conc * 1000,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "leftover_agents": live,
    }


def _child(config: str, n_seq: int, n_conc: int, n_live: int) -> None:
    provider, store = config.split(":")
    with tempfile.TemporaryDirectory(prefix="dsh-bench-") as tmp:
        result = asyncio.run(_measure(provider, store, n_seq, n_conc, Path(tmp), n_live))
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=200, help="sequential delegations")
    parser.add_argument("--conc", type=int, default=50, help="concurrent delegations")
    parser.add_argument("--only", choices=CONFIGS, action="append", help="run only these")
    parser.add_argument("--live", type=int, default=0, help="idle agents kept alive meanwhile")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.seq, args.conc, args.live)
        return
    rows = []
    sizes = ["--seq", str(args.seq), "--conc", str(args.conc), "--live", str(args.live)]
    for config in args.only or CONFIGS:
        out = subprocess.run(
            [sys.executable, __file__, "--child", config, *sizes],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "DSH_DISABLE_PLUGIN_AUTOLOAD": "1"},
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    live = f", {args.live} idle agents alive" if args.live else ""
    print(f"python {sys.version.split()[0]}; {args.seq} sequential, {args.conc} concurrent{live}")
    print(f"{'config':<14} {'ms/delegation (seq)':>20} {'conc total s':>13} {'peak RSS MB':>12}")
    for r in rows:
        print(
            f"{r['config']:<14} {r['seq_ms']:>20.3f} {r['conc_s']:>13.3f} {r['peak_rss_mb']:>12.1f}"
        )


if __name__ == "__main__":
    main()
