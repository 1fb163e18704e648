"""Continuable ACP children with dsh-acp-agent as the child process (JSONL stores on both
sides; the parent's test-time invariant checkers off, as in a real host): the start (process
start, initialize, session/new, first turn), a warm follow-up round trip (``followup`` until
the epoch's ``subagent/end``), each beside one prompt round trip of the SDK-only echo agent of
``acp.py`` (the order flipped every pair; the medians and the pairs' ratio, with the CPU of
both processes), and a cold resume after kill -9 of the child (the command started again,
``session/load``, the turn), split into the process start to ``initialize`` answered, the
load's replay, and the turn. ``--followups 200`` makes the cold resume one of a 200-turn
session.

With ``--pool-rounds N`` it measures instead a new child's start-to-first-update (from
``start_continuable`` to the first ``session/update`` of its answer) with and without the
warm pool: two hosts, one whose ``acp`` row has ``pool = 1`` and one without, N rounds of one
child each, the order flipped every round; the pooled host's pool is full before each of its
rounds (its refill is not timed). Medians of each side and of the rounds' ratios, the time
until the child is ready (``start_continuable`` returned: ``session/new`` answered, the child
created), and the CPU of both processes to the answer.

    python benchmarks/acp_continuable.py [--followups 20] [--kills 3]
    python benchmarks/acp_continuable.py --followups 200 --kills 3
    python benchmarks/acp_continuable.py --pool-rounds 15

With ``--count N`` it runs only N warm follow-ups of one child (after 5 it does not count),
nothing beside them, and prints the parent's CPU per follow-up (median and quartiles, all its
threads); ``--profile tottime|cumtime`` runs those N under cProfile and prints its top entries.
``benchmarks/instructions.sh TREE followup`` counts the parent's instructions per follow-up
with it.

    python benchmarks/acp_continuable.py --count 200 --profile tottime
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.util
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# This folder holds acp.py, which would shadow the SDK's package: the tests' helpers instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent / "tests"))

import acp_tree as tree  # noqa: E402
import test_acp_continuable as helpers  # noqa: E402

from dsh_core import SessionMeta, text_blocks  # noqa: E402
from dsh_core.testing import TestHost, scripted_host  # noqa: E402
from dsh_subagent import SUBAGENTS, ContinuableStartSpec  # noqa: E402
from dsh_subagent_acp import _client  # noqa: E402
from dsh_subagent_acp._continuable import AcpSessions  # noqa: E402


def _raw_agent() -> str:
    """The SDK-only echo agent of ``acp.py`` (loaded from its file: the folder is not on
    ``sys.path``, where that file would shadow the SDK)."""
    spec = importlib.util.spec_from_file_location("acp_bench", _HERE / "acp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raw: str = module.RAW_AGENT
    return raw


@contextlib.asynccontextmanager
async def _host(tmp: Path):  # type: ignore[no-untyped-def]
    """The tests' host (dsh-acp-agent children on a JSONL store, a JSONL parent), with the
    test-time invariant checkers off, as in a real host: they re-read a resumed child's whole
    log, which a follow-up to a settled child does each time."""
    async with scripted_host(
        "subagent",
        "subagent-acp",
        modules=tree.MODULES,
        config={"subagent-acp": helpers.agent_row(tmp)},
        store="jsonl",
        store_root=tmp / "parent-sessions",
        invariants=False,
    ) as host:
        yield host


class _Raw:
    """The SDK-only echo agent, spawned and warm: ``round_trip()`` times one prompt."""

    def __init__(self, conn: Any, sid: str) -> None:
        self.conn, self.sid = conn, sid

    async def round_trip(self) -> float:
        import acp

        t = time.perf_counter()
        await self.conn.prompt(session_id=self.sid, prompt=[acp.text_block("ping")])
        return time.perf_counter() - t


#: Marks of a cold resume: when the child answered ``initialize``, and ``session/load``.
_MARKS: dict[str, float] = {}


def _mark_phases() -> None:
    initialize, load_step = _client._initialize, _client.load_session_step

    async def timed_initialize(conn: Any) -> Any:
        answer = await initialize(conn)
        _MARKS["initialize"] = time.perf_counter()
        return answer

    def timed_load_step(*args: Any) -> Any:
        step = load_step(*args)

        def timed(conn: Any, init: Any, client: Any) -> tuple[str, Any]:
            what, awaitable = step(conn, init, client)

            async def load() -> Any:
                found = await awaitable
                _MARKS["load"] = time.perf_counter()
                return found

            return what, load()

        return timed

    _client._initialize = timed_initialize  # type: ignore[assignment]
    _client.load_session_step = timed_load_step  # type: ignore[assignment]


async def _parent_idle(parent: Any) -> None:
    """Untimed: the parent's own turn answering the settlement notice, which is the parent's
    work after the follow-up ended, not the follow-up's (left running, it fell into whichever
    round trip came next, the SDK-only one's as often as the next follow-up's)."""
    async with asyncio.timeout(helpers.BOUND):
        await parent.when_idle()


def _median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms"


async def _run(followups: int, kills: int) -> None:
    import acp

    _mark_phases()
    tmp = Path(tempfile.mkdtemp())
    raw_script = tmp / "raw_agent.py"
    raw_script.write_text(_raw_agent(), encoding="utf-8")
    sink = _Sink()
    row = helpers.agent_row(tmp)
    async with (
        _host(tmp) as host,
        acp.spawn_agent_process(
            sink, sys.executable, "-P", str(raw_script), env=dict(os.environ)
        ) as (raw_conn, _),
        acp.spawn_agent_process(
            sink, row["command"], *row["args"], env={**os.environ, **row["env"]}
        ) as (direct_conn, _),
    ):
        await raw_conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        raw = _Raw(raw_conn, (await raw_conn.new_session(cwd=str(tmp), mcp_servers=[])).session_id)
        # The child's own floor: the same dsh-acp-agent, its config and store, prompted by the
        # SDK directly (no parent host, no seam): what a follow-up costs beyond it is ours.
        await direct_conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        direct = _Raw(
            direct_conn, (await direct_conn.new_session(cwd=str(tmp), mcp_servers=[])).session_id
        )
        for _ in range(20):
            await raw.round_trip()
            await direct.round_trip()
        ends = tree.Ends(host, helpers.BOUND)
        handle = await host.create_agent(meta=SessionMeta(cwd=str(tmp)))
        parent = handle.agent
        spec = ContinuableStartSpec(
            provider="acp", label="bench", prompt=text_blocks("first"), parent=parent
        )
        t = time.perf_counter()
        child_id = (await host.ctx[SUBAGENTS].start_continuable(spec)).child_id
        await ends.answer(1)
        start = time.perf_counter() - t
        n, warm, sdk, ratios, cpu, child_cpu, cold = 1, [], [], [], [], [], []
        direct_walls: list[float] = []
        direct_ratios: list[float] = []

        async def followup(i: int) -> float:
            nonlocal n
            pid = tree.child_process(host, child_id).pid
            before, own = _cpu(pid), time.process_time()
            t = time.perf_counter()
            await tree.followup(parent, child_id, f"q{i}", helpers.BOUND)
            n += 1
            await ends.answer(n)
            wall = time.perf_counter() - t
            cpu.append(time.process_time() - own)
            child_cpu.append(_cpu(pid) - before)
            await _parent_idle(parent)
            return wall

        for i in range(followups):
            # The three in turn, the order rotated every round.
            timed: dict[str, float] = {}
            steps = {"followup": functools.partial(followup, i), "sdk": raw.round_trip,
                     "direct": direct.round_trip}  # fmt: skip
            order = ["followup", "sdk", "direct"]
            for name in order[i % 3 :] + order[: i % 3]:
                timed[name] = await steps[name]()
            a, b, c = timed["followup"], timed["sdk"], timed["direct"]
            warm.append(a)
            sdk.append(b)
            ratios.append(a / b)
            direct_walls.append(c)
            direct_ratios.append(c / b)
        phases: list[tuple[float, float, float]] = []
        for i in range(kills):
            process = tree.child_process(host, child_id)
            os.kill(process.pid, signal.SIGKILL)
            await process.exited
            _MARKS.clear()
            t = time.perf_counter()
            await tree.followup(parent, child_id, f"c{i}", helpers.BOUND)
            n += 1
            await ends.answer(n)
            done = time.perf_counter()
            cold.append(done - t)
            phases.append((_MARKS["initialize"] - t, _MARKS["load"] - _MARKS["initialize"],
                           done - _MARKS["load"]))  # fmt: skip
        print(f"start: {start * 1000:.0f} ms")
        print(
            f"warm follow-up ({followups}, each beside one SDK-only prompt and one prompt of the "
            "SDK to the same dsh-acp-agent directly, the order rotated every round): medians of "
            "all, the first 20 and the last 20 (the parent resumes the settled local child at "
            "each follow-up, from its store's warm log)"
        )
        for label, part in (
            ("all", slice(None)),
            ("first 20", slice(0, 20)),
            ("last 20", slice(max(0, followups - 20), followups)),
        ):
            print(
                f"  {label:<9} follow-up {_median_ms(warm[part])}, SDK-only round trip "
                f"{_median_ms(sdk[part])}, ratio {statistics.median(ratios[part]):.2f}x; CPU: "
                f"parent {_median_ms(cpu[part])}, child "
                f"{statistics.fmean(child_cpu[part]) * 1000:.1f} ms (a mean: /proc counts ticks)"
            )
        print(
            f"  the child's floor: dsh-acp-agent prompted by the SDK directly "
            f"{_median_ms(direct_walls)}, ratio to the SDK-only round trip "
            f"{statistics.median(direct_ratios):.2f}x; so a follow-up costs the parent host about "
            f"{(statistics.median(warm) - statistics.median(direct_walls)) * 1000:.1f} ms beyond it"
        )
        if cold:
            print(
                f"cold resume after kill -9 ({kills}, session of up to {n} turns): median "
                f"{_median_ms(cold)}: to initialize answered (process start, imports) "
                f"{_median_ms([p[0] for p in phases])}, session/load "
                f"{_median_ms([p[1] for p in phases])}, then the turn "
                f"{_median_ms([p[2] for p in phases])}"
            )
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")
        await handle.dispose()


async def _count(count: int, profile: str | None) -> None:
    """``count`` warm follow-ups of one child, after 5 uncounted: the parent's CPU per
    follow-up (``time.process_time``: all its threads), or the profile of them."""
    import cProfile
    import pstats

    tmp = Path(tempfile.mkdtemp())
    async with _host(tmp) as host:
        ends = tree.Ends(host, helpers.BOUND)
        handle = await host.create_agent(meta=SessionMeta(cwd=str(tmp)))
        parent = handle.agent
        spec = ContinuableStartSpec(
            provider="acp", label="bench", prompt=text_blocks("first"), parent=parent
        )
        child_id = (await host.ctx[SUBAGENTS].start_continuable(spec)).child_id
        n = 1
        await ends.answer(n)
        for i in range(5):
            await tree.followup(parent, child_id, f"w{i}", helpers.BOUND)
            n += 1
            await ends.answer(n)
        profiler = cProfile.Profile() if profile else None
        cpu: list[float] = []
        if profiler is not None:
            profiler.enable()
        for i in range(count):
            own = time.process_time()
            await tree.followup(parent, child_id, f"q{i}", helpers.BOUND)
            n += 1
            await ends.answer(n)
            cpu.append(time.process_time() - own)
            await _parent_idle(parent)
        if profiler is not None:
            profiler.disable()
        q = statistics.quantiles(cpu, n=4)
        print(
            f"{count} warm follow-ups: parent CPU per follow-up median {q[1] * 1000:.2f} ms "
            f"(quartiles {q[0] * 1000:.2f} / {q[2] * 1000:.2f})"
            + (" under cProfile" if profiler is not None else "")
        )
        tenth = max(1, count // 10)
        print(
            f"  the first tenth's median {statistics.median(cpu[:tenth]) * 1000:.2f} ms, the last "
            f"tenth's {statistics.median(cpu[-tenth:]) * 1000:.2f} ms (the child's log grows by "
            "each follow-up: a cost that grows with it shows here)"
        )
        if profiler is not None:
            pstats.Stats(profiler).sort_stats(profile).print_stats(30)
        await handle.dispose()


class _Sink:
    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        pass

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


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
    config = {**helpers.agent_row(tmp), "pool": pool}
    async with scripted_host(
        "subagent", "subagent-acp", modules=tree.MODULES, config={"subagent-acp": config}
    ) as host:
        yield host


def _sessions(host: TestHost) -> AcpSessions:
    sessions = host.ctx[SUBAGENTS].get_provider("acp").sessions  # type: ignore[union-attr]
    assert isinstance(sessions, AcpSessions)
    return sessions


async def _first_update(host: TestHost, ends: tree.Ends, refilled: TestHost) -> float:
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
    _READY.append(time.perf_counter() - t)
    opened = _sessions(host).held[child_id].opened
    await ends.answer(len(ends.ends) + 1)
    first = _FIRST.pop(id(opened.client)) - t
    _CPU.append((time.process_time() - cpu, _cpu(opened.child.pid) - before))
    await handle.dispose()  # its child's process ends with it
    return first


#: Per timed start: seconds until ``start_continuable`` returned (``session/new`` answered,
#: the child created: ready for its first turn, which runs next).
_READY: list[float] = []
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
        sides = {
            "no pool": (cold, tree.Ends(cold, helpers.BOUND)),
            "pool": (warm, tree.Ends(warm, helpers.BOUND)),
        }
        await _first_update(*sides["no pool"], warm)  # warm-up: the SDK's import, caches
        await _first_update(*sides["pool"], warm)
        times: dict[str, list[float]] = {"no pool": [], "pool": []}
        cpu: dict[str, list[tuple[float, float]]] = {"no pool": [], "pool": []}
        ready: dict[str, list[float]] = {"no pool": [], "pool": []}
        for i in range(rounds):
            order = ["no pool", "pool"] if i % 2 == 0 else ["pool", "no pool"]
            for side in order:
                times[side].append(await _first_update(*sides[side], warm))
                cpu[side].append(_CPU.pop())
                ready[side].append(_READY.pop())
        ratios = [c / w for c, w in zip(times["no pool"], times["pool"], strict=True)]
        for side, values in times.items():
            median = statistics.median(values) * 1000
            ours = statistics.median(c for c, _ in cpu[side]) * 1000
            # the child's CPU is a mean: /proc counts it in ticks (10 ms)
            child = statistics.fmean(c for _, c in cpu[side]) * 1000
            print(
                f"start-to-first-update, {side}: median {median:.1f} ms; ready (session/new "
                f"answered, the child created) {statistics.median(ready[side]) * 1000:.1f} ms "
                f"(CPU to the answer: parent {ours:.1f} ms, child {child:.1f} ms)"
            )
        print(f"no pool / pool: median {statistics.median(ratios):.1f}x ({rounds} rounds)")
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--followups", type=int, default=20)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--pool-rounds", type=int, default=0)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--profile", choices=("tottime", "cumtime"))
    args = parser.parse_args()
    if args.count:
        asyncio.run(_count(args.count, args.profile))
    elif args.pool_rounds:
        asyncio.run(_pool_rounds(args.pool_rounds))
    else:
        asyncio.run(_run(args.followups, args.kills))


if __name__ == "__main__":
    main()
