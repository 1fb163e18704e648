"""Continuable-children benchmark: follow-ups, cold resume, and many children at once.

Three measurements, each in a process of its own (``spawn`` provider, scripted model):

- ``roundtrip`` (in memory), two ways. *Settled*: a parent's follow-up to its continuable child,
  through the child's turn, to the settlement notice in the parent's inbox
  (``agent/inbox/inserted``). Between round trips the child has settled and released its
  Activation, so each ``followup`` brings it back from the store (CONT-7); a fresh child is
  taken every ``PER_CHILD`` rounds (untimed), since a resume reads the whole log and each round
  adds a turn to it. The parent's own turn over the notice finishes outside the timed span.
  Reported: ms per round trip, and the part until ``followup`` returned (acceptance).
  *Waiting*: the child stays resident and idle because its own child works on; a follow-up
  wakes the same agent (no resume), and the round trip ends when its turn is done (a waiting
  child does not settle, so there is no notice).
- ``resume`` (JSONL): the cold resume of ``benchmarks/resume.py``, the same measurement (this
  script calls it): a settled child whose log holds about 10 / 1,000 / 10,000 events, built
  once; then each of ``--repeat`` fresh processes opens a fresh copy of that store, resumes the
  parent and times one follow-up, until acceptance (the cold resume: inspect, load,
  materialise) and until the settlement notice.
- ``fanout`` (in memory): one parent starts N (1,000) continuable children concurrently and
  waits until every one has settled (its ``subagent/end``) and the parent is idle again: wall
  time and the process's peak RSS.

    python benchmarks/continuable.py                    # all three, a table
    python benchmarks/continuable.py --only roundtrip --rounds 2000
    python benchmarks/continuable.py --only resume --sizes 10 1000 10000
    python benchmarks/continuable.py --only fanout --children 1000

Targets (issue 13): round trip <= 1 ms; cold resume of 10,000 events <= 50 ms; 1,000 children
settled in <= 2 s with peak RSS <= 300 MB.
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
import time
from typing import Any

PARENT = "bench-parent"
BOUND = 600  # seconds: every wait of a measurement is bounded


def _modules() -> dict[str, Any]:
    import dsh_subagent.plugin
    import dsh_subagent_spawn.plugin

    return {"subagent": dsh_subagent.plugin, "subagent-spawn": dsh_subagent_spawn.plugin}


def _model(request: Any) -> str:
    return f"done: {request.last_user_text}"


class _Watch:
    """Settlement notices reaching the parent, and ``subagent/end`` events, as futures."""

    def __init__(self, host: Any, parent: Any) -> None:
        self.parent = parent
        self.notice: asyncio.Future[None] | None = None
        self.ends = 0
        self.all_ended: asyncio.Future[None] | None = None
        self.expected = 0
        host.ctx.on("agent/inbox/inserted", self._inserted)
        host.ctx.on("subagent/end", self._end)

    def _inserted(self, agent: Any, message: Any) -> None:
        if agent is self.parent and message.source.kind == "subagent-settled":
            notice = self.notice
            if notice is not None and not notice.done():
                notice.set_result(None)

    def _end(self, info: Any) -> None:
        self.ends += 1
        done = self.all_ended
        if done is not None and self.ends >= self.expected and not done.done():
            done.set_result(None)

    def arm(self) -> asyncio.Future[None]:
        self.notice = asyncio.get_running_loop().create_future()
        return self.notice


async def _start(host: Any, parent: Any, prompt: str, child_id: str | None = None) -> Any:
    from dsh_core import text_blocks
    from dsh_subagent import SUBAGENTS, ContinuableStartSpec

    return await parent.ctx[SUBAGENTS].start_continuable(
        ContinuableStartSpec(
            provider="spawn",
            label="bench",
            prompt=text_blocks(prompt),
            parent=parent,
            child_id=child_id,
        )
    )


async def _followup(parent: Any, child_id: str, text: str) -> str:
    from dsh_core import text_blocks
    from dsh_subagent import SUBAGENTS, CoordinatorMessageSource, SubagentFollowupOptions

    options = SubagentFollowupOptions(source=CoordinatorMessageSource(sender_session_id=parent.id))
    message_id: str = await parent.ctx[SUBAGENTS].followup(
        parent, child_id, text_blocks(text), options
    )
    return message_id


# -- (a) the follow-up round trip -------------------------------------------------------------

#: Follow-ups per settled child before the next round takes a fresh one: each settled round trip
#: cold-resumes the child, whose log grows by a turn each time (a resume reads it all).
PER_CHILD = 10


async def _roundtrip(rounds: int) -> dict[str, Any]:
    from dsh_core.testing import ScriptedAdapter, ScriptedReply, scripted_host

    never = asyncio.Event()  # the waiting child's own child works until the host closes
    gate = asyncio.Event()

    def model(request: Any) -> Any:
        if request.last_user_text == "work forever":
            return ScriptedReply(text="working", wait=never.wait)
        if request.last_user_text == "set up":
            return ScriptedReply(text="ready", wait=gate.wait)
        return _model(request)

    async with scripted_host(
        "subagent",
        "subagent-spawn",
        model=ScriptedAdapter(model, record=False),
        invariants=False,
        modules=_modules(),
    ) as host:
        parent = (await host.create_agent(session_id=PARENT)).agent
        watch = _Watch(host, parent)
        async with asyncio.timeout(BOUND):
            # settled: follow-up -> cold resume -> the child's turn -> the notice to the parent
            settled = accepted = 0.0
            child_id = ""
            for i in range(rounds + PER_CHILD):  # the first child's rounds warm up
                if i % PER_CHILD == 0:
                    notice = watch.arm()
                    child_id = (await _start(host, parent, "first")).child_id
                    await notice
                    await parent.when_idle()
                    if i == PER_CHILD:
                        gc.collect()
                notice = watch.arm()
                t0 = time.perf_counter()
                await _followup(parent, child_id, "again")
                t1 = time.perf_counter()
                await notice
                t2 = time.perf_counter()
                if i >= PER_CHILD:
                    settled += t2 - t0
                    accepted += t1 - t0
                await parent.when_idle()
            # waiting: a resident idle child (its own child still works) is woken in place
            started = await _start(host, parent, "set up")
            middle = host.ctx.agents.get(started.child_id)
            await _start(host, middle, "work forever")
            gate.set()
            await middle.when_idle()
            for _ in range(PER_CHILD):  # warm-up
                await _followup(parent, started.child_id, "again")
                await middle.when_idle()
            gc.collect()
            t0 = time.perf_counter()
            for _ in range(rounds):
                await _followup(parent, started.child_id, "again")
                await middle.when_idle()
            waiting = time.perf_counter() - t0
            never.set()
    return {
        "measure": "roundtrip",
        "rounds": rounds,
        "ms": settled / rounds * 1000,
        "accept_ms": accepted / rounds * 1000,
        "waiting_ms": waiting / rounds * 1000,
    }


# -- (b) cold resume: benchmarks/resume.py, one measurement for both scripts -------------------


# -- (c) many children at once -----------------------------------------------------------------


async def _fanout(children: int) -> dict[str, Any]:
    from dsh_core.testing import ScriptedAdapter, scripted_host

    async with scripted_host(
        "subagent",
        "subagent-spawn",
        model=ScriptedAdapter(_model, record=False),
        invariants=False,
        modules=_modules(),
        # all of them run at once in one tree: the cap (32 by default) raised to their number
        config={"subagent": {"max_running_children_per_tree": children}},
    ) as host:
        parent = (await host.create_agent(session_id=PARENT)).agent
        watch = _Watch(host, parent)
        watch.expected = children
        watch.all_ended = asyncio.get_running_loop().create_future()
        gc.collect()
        async with asyncio.timeout(BOUND):
            t0 = time.perf_counter()
            await asyncio.gather(*(_start(host, parent, f"task {i}") for i in range(children)))
            t1 = time.perf_counter()
            await watch.all_ended
            t2 = time.perf_counter()
            await parent.when_idle()
            t3 = time.perf_counter()
        left = len(host.ctx.agents.list()) - 1
    return {
        "measure": "fanout",
        "children": children,
        "started_s": t1 - t0,
        "settled_s": t2 - t0,
        "parent_idle_s": t3 - t0,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "leftover_agents": left,
    }


# -- driver ------------------------------------------------------------------------------------


def _run_child(argv: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, *argv],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "DSH_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric figure's median over the runs."""
    return {
        key: statistics.median(run[key] for run in runs)
        for key, value in runs[0].items()
        if isinstance(value, int | float)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("roundtrip", "resume", "fanout"), action="append")
    parser.add_argument("--rounds", type=int, default=1000, help="round trips timed")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 1000, 10000])
    parser.add_argument("--repeat", type=int, default=5, help="fresh processes per figure")
    parser.add_argument("--children", type=int, default=1000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "roundtrip":
        print(json.dumps(asyncio.run(_roundtrip(args.rounds))))
        return
    if args.child == "fanout":
        print(json.dumps(asyncio.run(_fanout(args.children))))
        return
    only = args.only or ["roundtrip", "resume", "fanout"]
    print(f"python {sys.version.split()[0]}; spawn provider, scripted model")
    print(f"each figure: the median of {args.repeat} fresh processes")
    if "roundtrip" in only:
        runs = [
            _run_child(["--child", "roundtrip", "--rounds", str(args.rounds)])
            for _ in range(args.repeat)
        ]
        r = _medians(runs)
        print(
            f"roundtrip (memory)  settled child: {r['ms']:.3f} ms per follow-up -> notice "
            f"({r['accept_ms']:.3f} ms until accepted); waiting child: {r['waiting_ms']:.3f} ms "
            f"per follow-up -> its turn done; {args.rounds} rounds each"
        )
    if "resume" in only:
        import resume  # this folder's resume.py: one cold-resume measurement for both scripts

        for row in resume.cold_resume(args.sizes, args.repeat):
            print(f"resume (jsonl)      {resume.line(row)}")
    if "fanout" in only:
        runs = [
            _run_child(["--child", "fanout", "--children", str(args.children)])
            for _ in range(args.repeat)
        ]
        r = _medians(runs)
        print(
            f"fanout (memory)     {args.children} children: started in {r['started_s']:.3f} s, "
            f"all settled in {r['settled_s']:.3f} s, parent idle at {r['parent_idle_s']:.3f} s; "
            f"peak RSS {r['peak_rss_mb']:.1f} MB; agents left {r['leftover_agents']:.0f}"
        )


if __name__ == "__main__":
    main()
