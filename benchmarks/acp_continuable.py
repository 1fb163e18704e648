"""Continuable ACP children with dsh-acp-agent as the child process (JSONL stores on both
sides): the start (process start, initialize, session/new, first turn), a warm follow-up
round trip (``followup`` until the epoch's ``subagent/end``), and a cold resume after kill -9
of the child (the command started again, session/load, the turn).

With ``--pool-rounds N`` it measures instead a new child's start-to-first-update (from
``start_continuable`` to the first ``session/update`` of its answer) with and without the
warm pool: two hosts, one whose ``acp`` row has ``pool = 1`` and one without, N rounds of one
child each, the order flipped every round; the pooled host's pool is full before each of its
rounds (its refill is not timed). Medians of each side and of the rounds' ratios.

    python benchmarks/acp_continuable.py [--followups 20] [--kills 3]
    python benchmarks/acp_continuable.py --pool-rounds 15
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from dsh_core.testing import TestHost, scripted_host  # noqa: E402
from dsh_subagent import SUBAGENTS, ContinuableStartSpec  # noqa: E402
from dsh_subagent_acp import _client  # noqa: E402
from dsh_subagent_acp._continuable import AcpSessions  # noqa: E402


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


#: By client object: when its first session/update arrived (the pool rounds' end mark).
_FIRST: dict[int, float] = {}
_update = _client._ParentClient.session_update


async def _marked(
    self: _client._ParentClient, session_id: str, update: object, **kw: object
) -> None:
    if session_id == self.session_id and not self.replaying:
        _FIRST.setdefault(id(self), time.perf_counter())
    await _update(self, session_id, update, **kw)


@contextlib.asynccontextmanager
async def _pool_host(tmp: Path, pool: int):  # type: ignore[no-untyped-def]
    paths = [str(helpers.FIXTURES), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
    config = {
        "command": sys.executable,
        "args": ["-m", "dsh_acp_agent", "--config", str(helpers._child_config(tmp))],
        "env": {"PYTHONPATH": ":".join(paths)},
        "start_timeout_ms": helpers.BOUND * 1000,
        "pool": pool,
    }
    async with scripted_host(
        "subagent", "subagent-acp", modules=helpers.MODULES, config={"subagent-acp": config}
    ) as host:
        yield host


def _sessions(host: TestHost) -> AcpSessions:
    sessions = host.ctx[SUBAGENTS].get_provider("acp").sessions  # type: ignore[union-attr]
    assert isinstance(sessions, AcpSessions)
    return sessions


async def _first_update(host: TestHost, ends: helpers._Ends, refilled: TestHost) -> float:
    """One child on a fresh parent: seconds from start_continuable to its first update. The
    pool of ``refilled`` is full first, so no refill runs beside the timed start."""
    pool = _sessions(refilled).pool
    assert pool is not None
    await asyncio.wait_for(pool.filled(), helpers.BOUND)
    handle = await host.create_agent(meta=SessionMeta(cwd=os.getcwd()))
    spec = ContinuableStartSpec(
        provider="acp", label="bench", prompt=text_blocks("hello"), parent=handle.agent
    )
    own = _sessions(host).pool
    before = _cpu(own.ready[0].child.pid) if own is not None else 0.0
    cpu = time.process_time()
    t = time.perf_counter()
    child_id = (await host.ctx[SUBAGENTS].start_continuable(spec)).child_id
    opened = _sessions(host).held[child_id].opened
    await ends.answer(len(ends.ends) + 1)
    first = _FIRST.pop(id(opened.client)) - t
    _CPU.append((time.process_time() - cpu, _cpu(opened.child.pid) - before))
    await handle.dispose()  # its child's process ends with it
    return first


#: Per timed start: (this process's CPU, the child process's CPU), start to answer.
_CPU: list[tuple[float, float]] = []


def _cpu(pid: int) -> float:
    """A live process's CPU seconds (user + system), from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _pool_rounds(rounds: int) -> None:
    _client._ParentClient.session_update = _marked  # type: ignore[method-assign]
    tmp = Path(tempfile.mkdtemp())
    (tmp / "cold").mkdir()
    (tmp / "warm").mkdir()
    async with _pool_host(tmp / "cold", 0) as cold, _pool_host(tmp / "warm", 1) as warm:
        sides = {"no pool": (cold, helpers._Ends(cold)), "pool": (warm, helpers._Ends(warm))}
        await _first_update(*sides["no pool"], warm)  # warm-up: the SDK's import, caches
        await _first_update(*sides["pool"], warm)
        times: dict[str, list[float]] = {"no pool": [], "pool": []}
        cpu: dict[str, list[tuple[float, float]]] = {"no pool": [], "pool": []}
        for i in range(rounds):
            order = ["no pool", "pool"] if i % 2 == 0 else ["pool", "no pool"]
            for side in order:
                times[side].append(await _first_update(*sides[side], warm))
                cpu[side].append(_CPU.pop())
        ratios = [c / w for c, w in zip(times["no pool"], times["pool"], strict=True)]
        for side, values in times.items():
            median = statistics.median(values) * 1000
            ours = statistics.median(c for c, _ in cpu[side]) * 1000
            child = statistics.median(c for _, c in cpu[side]) * 1000
            print(
                f"start-to-first-update, {side}: median {median:.1f} ms "
                f"(CPU to the answer: parent {ours:.0f} ms, child {child:.0f} ms)"
            )
        print(f"no pool / pool: median {statistics.median(ratios):.1f}x ({rounds} rounds)")
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--followups", type=int, default=20)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--pool-rounds", type=int, default=0)
    args = parser.parse_args()
    if args.pool_rounds:
        asyncio.run(_pool_rounds(args.pool_rounds))
    else:
        asyncio.run(_run(args.followups, args.kills))


if __name__ == "__main__":
    main()
