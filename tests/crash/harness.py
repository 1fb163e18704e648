"""The crash tier's driver: kill host processes at seeded random points, then check them.

``run(points, seed, workdir)`` starts ``points`` host processes (``host.py``) one after the
other, each on its own JSONL store, and kills each with SIGKILL at a moment drawn from a
seeded RNG: after a random number of acknowledgements (the host prints ``ack`` after each
side record) plus a random delay, or after a random delay alone once the root exists. Every
wait is bounded. One fresh checker process (``check.py``) then verifies every kill point.

Run it directly: ``python tests/crash/harness.py POINTS [SEED]`` prints the tally.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROUNDS = 10_000  # far more than a host gets through before its kill point
_HOST_DEADLINE = 60.0  # seconds one host may take to reach its kill point
_CHECK_DEADLINE = 60.0  # seconds the checker may take per kill point


def _lines(stream: Any, out: queue.Queue[str | None]) -> None:
    for raw in iter(stream.readline, b""):
        out.put(raw.decode("utf-8", "replace").strip())
    out.put(None)


def kill_point(rng: random.Random, store: Path, side: Path) -> dict[str, Any]:
    """One host, killed at a random point; what the killer saw."""
    store.mkdir(parents=True)
    by_acks = rng.random() < 0.7
    acks_wanted = rng.randint(1, 120) if by_acks else 0
    delay = rng.uniform(0.0, 0.02) if by_acks else rng.uniform(0.0, 0.6)
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "host.py"), str(store), str(side), str(ROUNDS)],
        stdout=subprocess.PIPE,
        cwd=HERE,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True)
    reader.start()
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
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                ended = "exited"
            elif line == "ready":
                ready = True
                if not by_acks:
                    break
            elif line == "ack":
                acks += 1
                if acks >= acks_wanted:
                    break
        if ended is None:
            time.sleep(delay)  # the kill moment itself (random), not a synchronisation
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=_HOST_DEADLINE)
        if proc.stdout is not None:
            proc.stdout.close()
        reader.join(timeout=5)
    return {
        "killed": proc.returncode == -signal.SIGKILL,
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
