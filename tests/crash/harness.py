"""The crash tier's driver: kill host processes at seeded random points, then check them.

``run(points, seed, workdir)`` starts ``points`` host processes (``host.py``) one after the
other, each on its own JSONL store, and kills each with SIGKILL at a moment drawn from a
seeded RNG: after a random number of acknowledgements (the host says ``ack`` after each side
record) plus a random delay, or after a random delay alone once the root exists. Each host
is forked from a fork server that imported the runtime once (a process of its own, so the
kill is as real as any). Every wait is bounded. One fresh checker process (``check.py``)
then verifies every kill point.

Run it directly: ``python tests/crash/harness.py POINTS [SEED]`` prints the tally.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROUNDS = 10_000  # far more than a host gets through before its kill point
_HOST_DEADLINE = 60.0  # seconds one host may take to reach its kill point
_CHECK_DEADLINE = 60.0  # seconds the checker may take per kill point


#: What the fork server imports once, so a host starts in milliseconds (a fork of it).
PRELOAD = [
    "host",
    "dsh_subagent.plugin",
    "dsh_subagent_spawn.plugin",
    "dsh_tool_subagent.plugin",
    "dsh_tool_subagent_control.plugin",
    "dsh_tool_subagent_report.plugin",
]


def _context() -> Any:
    """The fork server every host is forked from (started on first use)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def kill_point(rng: random.Random, store: Path, side: Path) -> dict[str, Any]:
    """One host, killed at a random point; what the killer saw."""
    store.mkdir(parents=True)
    by_acks = rng.random() < 0.7
    acks_wanted = rng.randint(1, 120) if by_acks else 0
    delay = rng.uniform(0.0, 0.02) if by_acks else rng.uniform(0.0, 0.6)
    ctx = _context()
    import host  # the target is pickled by reference: the fork server imports it too

    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=host.serve, args=(str(store), str(side), ROUNDS, send), daemon=True)
    proc.start()
    send.close()  # the host holds the only writing end: its death ends the pipe
    deadline = time.monotonic() + _HOST_DEADLINE
    acks = 0
    ready = False
    ended = None
    try:
        while ended is None:
            left = deadline - time.monotonic()
            if left <= 0:
                ended = "deadline"
                break
            if not receive.poll(left):
                continue
            try:
                word = receive.recv_bytes()
            except EOFError:
                ended = "exited"
                break
            if word == b"ready":
                ready = True
                if not by_acks:
                    break
            elif word == b"ack":
                acks += 1
                if acks >= acks_wanted:
                    break
        if ended is None:
            time.sleep(delay)  # the kill moment itself (random), not a synchronisation
            os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=_HOST_DEADLINE)
        receive.close()
    return {
        "killed": proc.exitcode == -signal.SIGKILL,
        "ready": ready,
        "acks_seen": acks,
        "ended": ended,
    }


def run(points: int, seed: int, workdir: Path) -> dict[str, Any]:
    """``points`` kill points from ``seed`` under ``workdir``; the tally (see check.py)."""
    rng = random.Random(seed)
    pairs: list[tuple[Path, Path]] = []
    kills: list[dict[str, Any]] = []
    for i in range(points):
        store, side = workdir / f"kill-{i}" / "store", workdir / f"kill-{i}" / "side.jsonl"
        kills.append(kill_point(rng, store, side))
        pairs.append((store, side))
    args = [str(p) for pair in pairs for p in pair]
    checked = subprocess.run(
        [sys.executable, str(HERE / "check.py"), *args],
        capture_output=True,
        cwd=HERE,
        timeout=_CHECK_DEADLINE * max(points, 1),
        check=False,
    )
    results = [json.loads(line) for line in checked.stdout.decode().splitlines() if line]
    lost = [f"{r['store']}: {item}" for r in results for item in r["lost"]]
    if checked.returncode != 0 or len(results) != points:
        lost.append(f"the checker exited {checked.returncode}: {checked.stderr.decode()[-2000:]}")
    return {
        "seed": seed,
        "kill_points": sum(k["killed"] for k in kills),
        "not_killed": [k for k in kills if not k["killed"] or k["ended"]],
        "children": sum(r.get("children", 0) for r in results),
        "followups": sum(r.get("followups", 0) for r in results),
        "reports": sum(r.get("reports", 0) for r in results),
        "mid_turn": sum(r.get("mid_turn", 0) for r in results),
        "resumed": sum(r.get("resumed", 0) for r in results),
        "reached": sum(r.get("reached", 0) for r in results),
        "lost": lost,
    }


def summary(tally: dict[str, Any]) -> str:
    """One line of the tally, then each loss."""
    head = (
        f"crash tier (seed {tally['seed']}): {tally['kill_points']} kill points, "
        f"{tally['children']} children handed out, {tally['followups']} follow-ups and "
        f"{tally['reports']} reports acknowledged, {tally['mid_turn']} children killed mid-turn, "
        f"{tally['resumed']} children cold-resumed, "
        f"{tally['reached']} grandchildren reached again; lost: {len(tally['lost'])}"
    )
    return "\n".join([head, *(f"  lost: {item}" for item in tally["lost"][:50])])


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else int(os.environ.get("DSH_CRASH_SEED", "1"))
    with tempfile.TemporaryDirectory(prefix="dsh-crash-") as tmp:
        result = run(count, seed, Path(tmp))
    print(summary(result))
    sys.exit(1 if result["lost"] or result["not_killed"] else 0)
