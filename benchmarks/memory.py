"""Memory benchmark: deterministic figures for what one delegation keeps alive and leaves behind.

Timings on a shared machine are noise; these counts are not. One delegation is the real-tool
route of ``delegation.py`` (a fresh parent whose scripted model calls the ``subagent`` tool of
dsh-tool-subagent, provider ``spawn``, memory store unless ``--store jsonl``). Printed:

- tracked/in-flight: growth of ``len(gc.get_objects())`` per delegation held in flight (every
  child's model waits on one ``asyncio.Event``; the figure is (objects with N in flight - objects
  before) / N). This is what each collection of the cyclic GC walks per delegation.
- bytes/in-flight: tracemalloc peak growth per delegation in flight.
- left/sequential: objects still tracked after N sequential delegations and ``gc.collect()``,
  divided by N (what the stores keep for each finished delegation).
- cycles/delegation: objects the collector finds unreachable (``gc.DEBUG_SAVEALL``) per
  sequential delegation: garbage that refcounting could not free.

    python benchmarks/memory.py                          # memory store, 200 in flight
    python benchmarks/memory.py --n 500 --store jsonl
    python benchmarks/memory.py --retain 0               # memory store keeping no disposed log
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any


async def _measure(n: int, store: str, root: Path, retain: int | None) -> dict[str, float]:
    import dsh_subagent.plugin
    import dsh_subagent_spawn.plugin
    import dsh_tool_subagent.plugin
    from dsh_core import PluginRow
    from dsh_core.testing import (
        ScriptedAdapter,
        ScriptedReply,
        ScriptedRequest,
        ScriptedToolCall,
        scripted_host,
    )

    call = ScriptedReply(
        tool_calls=(
            ScriptedToolCall(
                name="subagent",
                arguments={"description": "summarise a thing", "prompt": "summarise X"},
            ),
        )
    )
    gate = asyncio.Event()
    gate.set()
    waiting = {"n": 0, "of": 0}
    all_in = asyncio.Event()

    async def parked() -> object:
        waiting["n"] += 1
        if waiting["n"] == waiting["of"]:
            all_in.set()
        return await gate.wait()

    held = ScriptedReply(text="child result", wait=parked)

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if request.last_user_text == "summarise X":
            return held if not gate.is_set() else "child result"
        if request.last_tool_result is not None:
            return f"parent got: {request.last_tool_result}"
        return call

    rows: list[Any] = [
        "subagent",
        "subagent-spawn",
        PluginRow(plugin="tool-subagent", config={"provider": "spawn"}),
    ]
    config: dict[str, Any] = {}
    if retain is not None:
        config["session-persistence-memory"] = {"retain_disposed": retain}
    async with scripted_host(
        *rows,
        model=ScriptedAdapter(model, record=False),
        store=store,  # type: ignore[arg-type]
        store_root=root,
        config=config,
        invariants=False,
        modules={
            "subagent": dsh_subagent.plugin,
            "subagent-spawn": dsh_subagent_spawn.plugin,
            "tool-subagent": dsh_tool_subagent.plugin,
        },
    ) as host:

        async def one() -> None:
            handle = await host.create_agent()
            try:
                answer = await host.run(handle.agent, "do the thing")
            finally:
                await handle.dispose()
            assert answer == "parent got: child result", answer

        for _ in range(3):  # warm caches (prompt, tool schemas, interned strings)
            await one()
        gc.collect()

        # -- sequential: what N finished delegations leave, and the cycles they made -----------
        gc.collect()
        before = len(gc.get_objects())
        for _ in range(n):
            await one()
        gc.collect()
        left = len(gc.get_objects()) - before
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            gc.garbage.clear()
            for _ in range(n):
                await one()
            gc.collect()
            cycles = len(gc.garbage)
            gc.garbage.clear()
        finally:
            gc.set_debug(0)

        # -- in flight: N delegations each parked in its child's model call --------------------
        gate.clear()
        waiting["of"] = n
        gc.collect()
        base_objects = len(gc.get_objects())
        tracemalloc.start()
        base_bytes = tracemalloc.get_traced_memory()[0]
        tasks = [asyncio.ensure_future(one()) for _ in range(n)]
        async with asyncio.timeout(120):
            await all_in.wait()
        gc.collect()
        flight_objects = len(gc.get_objects())
        flight_bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        gate.set()
        async with asyncio.timeout(120):
            await asyncio.gather(*tasks)
        del tasks
    return {
        "tracked_in_flight": (flight_objects - base_objects) / n,
        "bytes_in_flight": (flight_bytes - base_bytes) / n,
        "left_per_seq": left / n,
        "cycles_per_delegation": cycles / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="delegations in flight / in a row")
    parser.add_argument("--store", choices=("memory", "jsonl"), default="memory")
    parser.add_argument(
        "--retain", type=int, default=None, help="memory store: retain_disposed (default: its own)"
    )
    args = parser.parse_args()
    os.environ.setdefault("DSH_DISABLE_PLUGIN_AUTOLOAD", "1")
    with tempfile.TemporaryDirectory(prefix="dsh-bench-") as tmp:
        r = asyncio.run(_measure(args.n, args.store, Path(tmp), args.retain))
    retain = "" if args.retain is None else f", retain_disposed={args.retain}"
    print(f"python {sys.version.split()[0]}; {args.n} delegations, {args.store} store{retain}")
    print(f"gc-tracked objects per delegation in flight   {r['tracked_in_flight']:10.1f}")
    print(f"tracemalloc peak bytes per delegation in flight {r['bytes_in_flight']:8.0f}")
    print(f"objects left per sequential delegation         {r['left_per_seq']:10.1f}")
    print(f"cyclic-garbage objects per delegation          {r['cycles_per_delegation']:10.1f}")


if __name__ == "__main__":
    main()
