"""The timed phases every peer script shares, the same as ``benchmarks/delegation.py``'s.

One warm-up delegation, then two phases, each for at least ``--seconds`` (default 1 s, long
enough that the scheduler's noise is a small part of it): *sequential*, one delegation after
another (at least ``--seq``), and *concurrent*, batches of ``--conc`` delegations at once
(``asyncio.gather``), one batch after another. Each phase starts after a ``gc.collect()``.
Without ``--json`` a script prints one line per variant; with it, one JSON object per line
(what ``compare.py`` reads).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import time
from collections.abc import Awaitable, Callable
from typing import Any


def arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seq", type=int, default=200, help="sequential delegations, at least")
    parser.add_argument("--conc", type=int, default=50, help="concurrent delegations per batch")
    parser.add_argument("--seconds", type=float, default=1.0, help="each phase's length, at least")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    return parser


async def phases(
    one: Callable[[], Awaitable[Any]], n_seq: int, n_conc: int, seconds: float
) -> dict[str, float]:
    """Warm-up, then the sequential and the concurrent phase; ms per delegation of each."""
    await one()
    clock = time.perf_counter
    gc.collect()  # as benchmarks/delegation.py: each timed phase starts clean
    done = 0
    t0 = clock()
    while done < n_seq or clock() - t0 < seconds:
        await one()
        done += 1
    seq = clock() - t0
    gc.collect()
    batches = 0
    t0 = clock()
    while batches < 1 or clock() - t0 < seconds:
        await asyncio.gather(*(one() for _ in range(n_conc)))
        batches += 1
    conc = clock() - t0
    return {
        "seq_ms": seq / done * 1000,
        "seq_count": done,
        "conc_ms_each": conc / (batches * n_conc) * 1000,
        "conc_batches": batches,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def report(name: str, result: dict[str, float], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"name": name, **result}))
        return
    print(
        f"{name}: sequential {result['seq_ms']:.3f} ms/delegation ({result['seq_count']:.0f}); "
        f"concurrent {result['conc_ms_each']:.3f} ms/delegation ({result['conc_batches']:.0f} "
        f"batches); peak RSS {result['peak_rss_mb']:.1f} MB"
    )
