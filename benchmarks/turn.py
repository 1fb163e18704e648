"""Turn benchmark: one scripted turn with one tool call, end to end, in-memory store.

A turn = ``followup`` -> the model calls a tool -> the tool answers -> the model answers ->
``when_idle``. That is two model requests and about 17 log events. Each agent serves
``--per-agent`` turns (its history grows meanwhile, as in a real conversation) and is then
disposed; the time per turn excludes agent creation.

    python benchmarks/turn.py               # default: 4000 turns, 50 per agent
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
import sys
import time
from typing import Any


async def measure(turns: int, per_agent: int, invariants: bool, history: int = 0) -> float:
    """Seconds per turn. With ``history``, one agent serves ``history`` untimed turns, then
    ``turns`` timed ones (``per_agent`` does not apply)."""
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
            t0 = time.perf_counter()
            for _ in range(turns):
                agent.followup(user_message("go"))
                await agent.when_idle()
            elapsed = time.perf_counter() - t0
            await handle.dispose()
            return elapsed / turns
        elapsed = 0.0
        done = -per_agent  # the first agent is the warm-up
        while done < turns:
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
    return elapsed / turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=4000)
    parser.add_argument("--per-agent", type=int, default=50)
    parser.add_argument("--invariants", action="store_true")
    parser.add_argument("--gc", action="store_true", help="report the collector's pauses")
    parser.add_argument(
        "--history", type=int, default=0, help="time TURNS turns of one agent after this many"
    )
    args = parser.parse_args()
    from gcwatch import GcWatch

    with GcWatch() as watch:
        per_turn = asyncio.run(measure(args.turns, args.per_agent, args.invariants, args.history))
    gc_note = "on" if gc.isenabled() else "off"
    print(
        f"python {sys.version.split()[0]}: {per_turn * 1e6:.1f} us per turn "
        f"({args.turns} turns, "
        + (f"after {args.history} on one agent" if args.history else f"{args.per_agent} per agent")
        + ", invariants "
        f"{'on' if args.invariants else 'off'}, gc {gc_note}); peak RSS "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MB"
    )
    if args.gc:  # pauses of the whole run (agent creation and warm-up too), against timed turns
        print(watch.report(per_turn * args.turns))


if __name__ == "__main__":
    main()
