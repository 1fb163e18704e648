"""Durable subagent listing: ``list_children`` and ``list_descendants`` on the JSONL store.

Run ``python benchmarks/listing.py`` (``--quick`` for 1,000 sessions). Writes 10,000 one-shot
child logs under one parent, and a 10,000-node tree of them, then times:

- the first call in a fresh process (a child process per run: no header or scan is
  remembered yet, every log is read once; the files are in the page cache, as they are
  after a restart on a warm machine), the median of ``--repeat`` processes (default 3);
- later calls in the same process (the median of 5 calls in each process, then the median
  over the processes): the store proves every log unchanged, so nothing is read again.

Each figure also gives the CPU time of the process (every thread, the store's reads too):
on a busy machine it moves less than the wall time.

Targets: <= 1 s cold, <= 100 ms repeated. Figures depend on the machine and its load; a
shared machine can move them by a third, so compare runs made back to back.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dsh_core import (
    AssistantMessageData,
    Context,
    EventTypeRegistry,
    Host,
    Message,
    ModelSource,
    SessionEvent,
    SessionHeader,
    SessionStoreService,
    StepData,
    TextBlock,
    TurnEndData,
    TurnEndReason,
    TurnStartData,
    UserSource,
    dumps,
    encode_header,
    text_blocks,
)
from dsh_core._persistence import JsonlSessionPersistence
from dsh_core._query import install_session_query
from dsh_subagent import (
    DESCRIPTOR_EVENT,
    DESCRIPTOR_EVENT_TYPE,
    SUBAGENTS,
    SubagentState,
    descriptor_payload,
    snapshot_one_shot_descriptor,
)

PARENT = "parent"


def types() -> EventTypeRegistry:
    registry = EventTypeRegistry()
    registry.register(DESCRIPTOR_EVENT_TYPE)
    return registry


def child_lines() -> bytes:
    """The event lines of a finished one-shot child, as the in-process driver writes them
    (one turn: prompt, descriptor, one step with a streamed answer). Built from the public
    event types, so the script needs nothing beyond the installed distributions."""
    reply = Message(
        id="assistant-2",
        role="assistant",
        content=(TextBlock(text="- revenue up 4%\n- costs flat\n- two new customers"),),
        source=ModelSource(provider="test", model="test-1"),
    )
    prompt = Message(
        id="user-1",
        role="user",
        content=text_blocks("Summarise the quarterly report in three bullet points."),
        source=UserSource(),
    )
    descriptor = descriptor_payload(snapshot_one_shot_descriptor("spawn", "summarise the report"))
    rows: list[tuple[str, Any, tuple[int, ...] | None, bool]] = [
        ("turn/start", TurnStartData(turn=1), None, False),
        (DESCRIPTOR_EVENT, descriptor, None, True),
        ("step/start", StepData(turn=1, step=1), None, False),
        ("user/message", prompt, (), False),
        ("assistant/message", AssistantMessageData(turn=1, step=1, message=reply), (), False),
        ("step/end", StepData(turn=1, step=1), None, False),
        ("turn/end", TurnEndData(turn=1, reason=TurnEndReason(kind="completed")), None, False),
    ]
    events = [
        SessionEvent(
            type=type,
            seq=seq,
            time=1_700_000_000_001 + seq,
            data=data,
            source_event_seqs=cites,
            surface_op="append" if cites is not None else None,
            ignorable=ignorable,
        )
        for seq, (type, data, cites, ignorable) in enumerate(rows)
    ]
    registry = types()
    return "".join(dumps(registry.encode(e)) + "\n" for e in events).encode()


def write(root: Path, headers: list[SessionHeader], body: bytes) -> None:
    """Session files written plainly (10k fsyncs would time the disk): header line + body."""
    root.mkdir(parents=True)
    for h in headers:
        line = (dumps(encode_header(h)) + "\n").encode()
        (root / f"{h.id}.jsonl").write_bytes(line + (body if h.parent_session else b""))


def flat(count: int) -> list[SessionHeader]:
    """One parent and ``count`` direct children."""
    children = [
        SessionHeader(
            id=f"c{i:06d}",
            created_at=1_000 + i,
            cwd="/home/me/project",
            parent_session=PARENT,
            origin="subagent",
            delegation_depth=1,
        )
        for i in range(count)
    ]
    return [SessionHeader(id=PARENT, created_at=1, cwd="/home/me/project"), *children]


def tree(count: int) -> list[SessionHeader]:
    """One root and ``count`` descendants; each one's parent is a random earlier node."""
    rng = random.Random(7)
    out = [SessionHeader(id=PARENT, created_at=1, cwd="/home/me/project")]
    for i in range(count):
        parent = PARENT if i == 0 else rng.choice((PARENT, f"t{rng.randrange(i):06d}"))
        out.append(
            SessionHeader(
                id=f"t{i:06d}",
                created_at=1_000 + i,
                cwd="/home/me/project",
                parent_session=parent,
                origin="subagent",
            )
        )
    return out


def host(root: Path) -> Context:
    """A bare host: sessions, the JSONL store, the session query and ``subagents``."""
    h = Host("bench")
    ctx = Context(h, h.root)
    ctx.provide("sessions", SessionStoreService(types()))
    persistence = JsonlSessionPersistence(root)
    persistence.install(ctx)
    ctx.provide("session_persistence", persistence)
    install_session_query(ctx)
    ctx.provide("subagents", SubagentState(ctx))
    return ctx


async def measure(root: Path, call: str, repeat: int) -> list[float]:
    """[first call, its CPU time, median later call, its CPU time, rows] in this process (CPU
    time: of every thread of the process, so of the store's reads too)."""
    ctx = host(root)
    method = getattr(ctx[SUBAGENTS], call)
    gc.collect()
    cpu = time.process_time()
    started = time.perf_counter()
    rows = await method(PARENT)
    first = [time.perf_counter() - started, time.process_time() - cpu]
    later = []
    for _ in range(repeat):
        gc.collect()
        cpu = time.process_time()
        started = time.perf_counter()
        again = await method(PARENT)
        later.append((time.perf_counter() - started, time.process_time() - cpu))
        assert again == rows
    await ctx.dispose()
    return [
        *first,
        statistics.median(wall for wall, _ in later),
        statistics.median(cpu for _, cpu in later),
        len(rows),
    ]


def cold(root: Path, call: str) -> list[float]:
    """:func:`measure` in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, __file__, "--measure", str(root), call],
        check=True,
        capture_output=True,
        text=True,
    )
    found: list[float] = json.loads(out.stdout)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description="Durable subagent listing benchmarks.")
    parser.add_argument("--quick", action="store_true", help="1,000 sessions")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per figure")
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        root, call = args.measure
        print(json.dumps(asyncio.run(measure(Path(root), call, 5))))
        return
    count = 1_000 if args.quick else 10_000
    body = child_lines()
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="dsh-bench-") as tmp:
        for name, call, headers in (
            (f"list_children, {count:,} children", "list_children", flat(count)),
            (f"list_descendants, {count:,}-node tree", "list_descendants", tree(count)),
        ):
            root = Path(tmp) / call
            write(root, headers, body)
            runs = [cold(root, call) for _ in range(args.repeat)]
            assert all(run[4] == count for run in runs), (runs, count)
            first, first_cpu, later, later_cpu = (
                statistics.median(run[i] for run in runs) for i in range(4)
            )
            rows.append(
                (
                    f"{name}: first call, fresh process",
                    f"{first * 1e3:.0f} ms",
                    f"{first_cpu * 1e3:.0f} ms",
                    "<= 1 s",
                )
            )
            rows.append(
                (
                    f"{name}: later calls",
                    f"{later * 1e3:.1f} ms",
                    f"{later_cpu * 1e3:.1f} ms",
                    "<= 100 ms",
                )
            )
    width = max(len(r[0]) for r in rows)
    print(f"medians of {args.repeat} fresh processes")
    print(f"{'benchmark':<{width}}  {'result':>10}  {'cpu':>10}  target")
    for name, result, cpu, target in rows:
        print(f"{name:<{width}}  {result:>10}  {cpu:>10}  {target}")


if __name__ == "__main__":
    main()
