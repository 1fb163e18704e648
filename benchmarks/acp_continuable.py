"""Continuable ACP children with dsh-acp-agent as the child process (JSONL stores on both
sides): the start (process start, initialize, session/new, first turn), a warm follow-up
round trip (``followup`` until the epoch's ``subagent/end``), and a cold resume after kill -9
of the child (the command started again, session/load, the turn).

    python benchmarks/acp_continuable.py [--followups 20] [--kills 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

# This folder holds acp.py, which would shadow the SDK's package: the tests' helpers instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent / "tests"))

import test_acp_continuable as helpers  # noqa: E402

from dsh_core import SessionMeta, text_blocks  # noqa: E402
from dsh_subagent import SUBAGENTS, ContinuableStartSpec  # noqa: E402


async def _run(followups: int, kills: int) -> None:
    tmp = Path(tempfile.mkdtemp())
    async with helpers._host(tmp) as host:
        ends = helpers._Ends(host)
        handle = await host.create_agent(meta=SessionMeta(cwd=str(tmp)))
        parent = handle.agent
        spec = ContinuableStartSpec(
            provider="acp", label="bench", prompt=text_blocks("first"), parent=parent
        )
        t = time.perf_counter()
        child_id = (await host.ctx[SUBAGENTS].start_continuable(spec)).child_id
        await ends.answer(1)
        start = time.perf_counter() - t
        n, warm, cold = 1, [], []
        for i in range(followups):
            t = time.perf_counter()
            await helpers._followup(parent, child_id, f"q{i}")
            n += 1
            await ends.answer(n)
            warm.append(time.perf_counter() - t)
        for i in range(kills):
            process = helpers._process(host, child_id)
            os.kill(process.pid, signal.SIGKILL)
            await process.exited
            t = time.perf_counter()
            await helpers._followup(parent, child_id, f"c{i}")
            n += 1
            await ends.answer(n)
            cold.append(time.perf_counter() - t)
        print(f"start: {start * 1000:.0f} ms")
        print(f"warm follow-up: median {statistics.median(warm) * 1000:.1f} ms ({followups})")
        if cold:
            print(
                f"cold resume after kill -9: median {statistics.median(cold) * 1000:.0f} ms "
                f"({kills}, session of up to {n} turns)"
            )
        await handle.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--followups", type=int, default=20)
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(_run(args.followups, args.kills))


if __name__ == "__main__":
    main()
