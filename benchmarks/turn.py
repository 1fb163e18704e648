"""Turn benchmark: one scripted turn with one tool call, end to end, in-memory store.

A turn = ``followup`` -> the model calls a tool -> the tool answers -> the model answers ->
``when_idle``. That is two model requests and about 17 log events. Each agent serves
``--per-agent`` turns (its history grows meanwhile, as in a real conversation) and is then
disposed; the time per turn excludes agent creation. A round runs at least ``--turns`` turns
and at least ``--seconds`` (default 1 s) of timed turns, each round on a fresh host; the
figure is the median of ``--rounds`` rounds (default 5), with the fastest and slowest.

    python benchmarks/turn.py               # default: 5 rounds of >= 4000 turns and >= 1 s
    python benchmarks/turn.py --invariants  # with the invariant checkers (as in tests)
    python benchmarks/turn.py --gc          # and what the cyclic collector cost meanwhile
    python benchmarks/turn.py --history 10000 --turns 1000
        # one agent that has already served 10,000 turns (about 40,000 messages of history,
        # grown untimed first): the per-turn cost must not grow with the history
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import statistics
import sys
import time
from typing import Any


async def measure(
    turns: int, per_agent: int, invariants: bool, history: int = 0, seconds: float = 0.0
) -> float:
    """Seconds per turn, over at least ``turns`` timed turns and at least ``seconds`` of them.
    With ``history``, one agent serves ``history`` untimed turns, then the timed ones
    (``per_agent`` does not apply)."""
    from dsh_core import ToolDefinition, ToolRunContext, user_message
    from dsh_core.testing import (
        ScriptedAdapter,
        ScriptedReply,
        ScriptedRequest,
        ScriptedToolCall,
        scripted_host,
    )

    call = ScriptedReply(tool_calls=(ScriptedToolCall(name="echo", arguments={"text": "hi"}),))

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        return "done" if request.last_tool_result is not None else call

    async def echo(args: Any, run: ToolRunContext) -> str:
        return "echoed " + args["text"]

    # record=False: the test double keeps no request history (a real adapter keeps none).
    adapter = ScriptedAdapter(model, record=False)
    async with scripted_host(model=adapter, store="memory", invariants=invariants) as host:
        host.ctx.tools.register(
            ToolDefinition(
                name="echo",
                description="Echo a text.",
                parameters={"type": "object", "properties": {"text": {"type": "string"}}},
                execute=echo,
            )
        )
        if history:
            handle = await host.create_agent()
            agent = handle.agent
            for _ in range(history):
                agent.followup(user_message("go"))
                await agent.when_idle()
            done = 0
            t0 = time.perf_counter()
            while done < turns or time.perf_counter() - t0 < seconds:
                agent.followup(user_message("go"))
                await agent.when_idle()
                done += 1
            elapsed = time.perf_counter() - t0
            await handle.dispose()
            return elapsed / done
        elapsed = 0.0
        done = -per_agent  # the first agent is the warm-up
        while done < turns or elapsed < seconds:
            handle = await host.create_agent()
            agent = handle.agent
            t0 = time.perf_counter()
            for _ in range(per_agent):
                agent.followup(user_message("go"))
                await agent.when_idle()
            if done >= 0:
                elapsed += time.perf_counter() - t0
            done += per_agent
            await handle.dispose()
    return elapsed / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=4000, help="timed turns per round, at least")
    parser.add_argument("--seconds", type=float, default=1.0, help="timed seconds per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (median)")
    parser.add_argument("--per-agent", type=int, default=50)
    parser.add_argument("--invariants", action="store_true")
    parser.add_argument("--gc", action="store_true", help="report the collector's pauses")
    parser.add_argument(
        "--history", type=int, default=0, help="time TURNS turns of one agent after this many"
    )
    args = parser.parse_args()
    from gcwatch import GcWatch

    rounds = []
    started = time.perf_counter()
    with GcWatch() as watch:
        for _ in range(args.rounds):
            gc.collect()
            rounds.append(
                asyncio.run(
                    measure(args.turns, args.per_agent, args.invariants, args.history, args.seconds)
                )
            )
    total = time.perf_counter() - started
    per_turn = statistics.median(rounds)
    gc_note = "on" if gc.isenabled() else "off"
    print(
        f"python {sys.version.split()[0]}: {per_turn * 1e6:.1f} us per turn, median of "
        f"{args.rounds} rounds ({min(rounds) * 1e6:.1f} to {max(rounds) * 1e6:.1f}; each >= "
        f"{args.turns} turns and >= {args.seconds:g} s, "
        + (f"after {args.history} on one agent" if args.history else f"{args.per_agent} per agent")
        + ", invariants "
        f"{'on' if args.invariants else 'off'}, gc {gc_note}); peak RSS "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MB"
    )
    if args.gc:  # pauses of the whole run (hosts, agents, warm-up too), against its wall time
        print(watch.report(total))


if __name__ == "__main__":
    main()
