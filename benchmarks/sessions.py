"""Session log benchmarks: JSONL append throughput, load time, lineage tracing.

Run ``python benchmarks/sessions.py`` (``--quick`` for a smoke run). Prints one table. Numbers
depend on the machine and above all on the disk (every flush ends in an ``fsync``) and on how
fast it hands work to a thread and back (once per flush), so compare runs on one machine only.
Every figure is the median of several runs (``--repeat``, default 5; 3 for the appends); later
calls of a trace are the median of the calls after the first. Targets: >= 100k events/s
appended with a flush every 100 events, a 10k-event session loads in < 50 ms, tracing among 10k
sessions takes < 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from gcwatch import GcWatch

from dsh_core import (
    AssistantChunkData,
    Context,
    EventTypeRegistry,
    Host,
    SessionHeader,
    SessionStoreService,
    StepData,
    TextDelta,
    TurnEndData,
    TurnEndReason,
    TurnStartData,
    dumps,
    encode_header,
)
from dsh_core._persistence import (
    JsonlSessionPersistence,
    MemorySessionPersistence,
    SessionPersistence,
)
from dsh_core._query import SessionLineageNode, install_session_query

FLUSH_EVERY = 100
CHUNKS_PER_TURN = 400


def host() -> Context:
    """A bare host: the session store only (no invariant checking, no agents)."""
    h = Host("bench")
    ctx = Context(h, h.root)
    ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
    return ctx


async def median_of(repeat: int, run: Callable[[], Awaitable[object]]) -> float:
    """The median of ``repeat`` runs, in seconds (each after a ``gc.collect()``)."""
    times = []
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        await run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def append_and_flush(root: Path, id: str, events: int) -> float:
    """Seconds to append ``events`` events to a JSONL-tracked session, flushing every 100.

    The log is what a model stream mostly produces: turns of 400 ``assistant/chunk`` events.
    """
    ctx = host()
    JsonlSessionPersistence(root).install(ctx)
    owner = ctx.plugin("writer")
    session = owner.sessions.create(id)
    append = session.append
    pending = 0
    turn = 0
    started = time.perf_counter()
    while session.seq < events:
        turn += 1
        append("turn/start", TurnStartData(turn=turn))
        append("step/start", StepData(turn=turn, step=1))
        for i in range(min(CHUNKS_PER_TURN, events - session.seq - 2)):
            chunk = TextDelta(index=0, text=f"token {i} ")
            append("assistant/chunk", AssistantChunkData(turn=turn, step=1, chunk=chunk))
            pending += 1
            if pending == FLUSH_EVERY:
                await owner.sessions.flush(session)
                pending = 0
        append("step/end", StepData(turn=turn, step=1))
        append("turn/end", TurnEndData(turn=turn, reason=TurnEndReason(kind="completed")))
    await owner.sessions.flush(session)
    elapsed = time.perf_counter() - started
    await ctx.dispose()
    return elapsed


async def load(root: Path, id: str, repeat: int) -> float:
    """Median seconds for ``load`` of a cold session (read, parse, validate, nothing to repair)."""
    ctx = host()
    persistence = JsonlSessionPersistence(root)
    persistence.install(ctx)
    try:
        return await median_of(repeat, lambda: persistence.load(id))
    finally:
        await ctx.dispose()


def forest(count: int) -> list[SessionHeader]:
    """``count`` headers in 100 trees; each session's parent is a recent one of its tree."""
    rng = random.Random(7)
    headers = []
    for i in range(count):
        tree, position = divmod(i, count // 100)
        parent = None
        if position:
            parent = (
                f"s{tree * (count // 100) + rng.randrange(max(0, position - 20), position):06d}"
            )
        headers.append(SessionHeader(id=f"s{i:06d}", created_at=1_000 + i, parent_session=parent))
    return headers


def size(nodes: tuple[SessionLineageNode, ...]) -> int:
    todo, seen = list(nodes), 0
    while todo:
        node = todo.pop()
        seen += 1
        todo.extend(node.descendants)
    return seen


def write_headers(root: Path, headers: list[SessionHeader]) -> None:
    """Header-only session files, written plainly: 10k fsyncs would time the disk."""
    root.mkdir(parents=True)
    for h in headers:
        (root / f"{h.id}.jsonl").write_text(dumps(encode_header(h)) + "\n")


async def trace(
    make: Callable[[], SessionPersistence], root: Path | None, count: int, repeat: int
) -> tuple[float, float, int]:
    """(first trace, later trace, traced subtree size) among ``count`` stored sessions, each a
    median: the first call over ``repeat`` fresh backends on the same sessions (nothing read
    or derived yet; the files are in the page cache), later calls over ``repeat`` calls."""
    headers = forest(count)
    if root is not None:
        write_headers(root, headers)
    target = headers[count // 100 * 3 + count // 200].id  # inside the fourth tree
    firsts: list[float] = []
    later = 0.0
    lineage = 0
    for i in range(repeat):
        ctx = host()
        persistence = make()
        persistence.install(ctx)
        ctx.provide("session_persistence", persistence)
        query = install_session_query(ctx)
        if root is None:
            for h in headers:
                await persistence.create(h)
        gc.collect()
        started = time.perf_counter()
        result = await query.trace_session(target)
        firsts.append(time.perf_counter() - started)
        lineage = size(result.descendants) + len(result.ancestors)
        if i == 0:
            later = await median_of(repeat, functools.partial(query.trace_session, target))
        await ctx.dispose()
    return statistics.median(firsts), later, lineage


async def main() -> None:
    parser = argparse.ArgumentParser(description="Session log benchmarks.")
    parser.add_argument("--quick", action="store_true", help="small sizes, three runs each")
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure (median)")
    parser.add_argument("--gc", action="store_true", help="report the collector's pauses")
    args = parser.parse_args()
    sizes = (1_000, 10_000) if args.quick else (10_000, 100_000)
    repeat = 3 if args.quick else args.repeat
    rows: list[tuple[str, str, str]] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dsh-bench-") as tmp:
        logs = Path(tmp) / "logs"
        loaded: dict[int, str] = {}
        for n in sizes:
            runs = []
            for i in range(min(repeat, 3)):  # a fresh session each run; the last one is loaded
                gc.collect()
                with GcWatch() as watch:
                    runs.append(await append_and_flush(logs, f"log{n}-{i}", n))
                notes.append(f"append+flush {n:,} run {i + 1}: {watch.report(runs[-1])}")
            loaded[n] = f"log{n}-{len(runs) - 1}"
            seconds = statistics.median(runs)
            rows.append(
                (f"append+flush {n:,} events (flush/100)", f"{n / seconds:,.0f} ev/s", ">= 100k")
            )
        for n in sizes:
            seconds = await load(logs, loaded[n], repeat)
            rows.append(
                (
                    f"load a {n:,}-event session",
                    f"{seconds * 1e3:.1f} ms",
                    "< 50 ms" if n == 10_000 else "",
                )
            )
        count = sizes[0]
        _, later, lineage = await trace(MemorySessionPersistence, None, count, repeat)
        rows.append(
            (
                f"trace among {count:,} sessions, memory ({lineage} in lineage)",
                f"{later * 1e3:.1f} ms",
                "< 100 ms",
            )
        )
        folder = Path(tmp) / "t"
        first, later, _ = await trace(
            lambda: JsonlSessionPersistence(folder), folder, count, repeat
        )
        rows.append(
            (f"trace among {count:,} sessions, JSONL, first call", f"{first * 1e3:.1f} ms", "")
        )
        rows.append(
            (
                f"trace among {count:,} sessions, JSONL, later calls",
                f"{later * 1e3:.1f} ms",
                "< 100 ms",
            )
        )
    width = max(len(r[0]) for r in rows)
    print(f"medians of {repeat} runs (appends: of {min(repeat, 3)})")
    print(f"{'benchmark':<{width}}  {'result':>13}  target")
    for name, result, target in rows:
        print(f"{name:<{width}}  {result:>13}  {target}")
    if args.gc:
        print("\n".join(notes))


if __name__ == "__main__":
    asyncio.run(main())
