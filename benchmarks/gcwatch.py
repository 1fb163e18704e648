"""What the cyclic garbage collector cost during a benchmark (``--gc`` in the scripts).

The collector runs when more container objects have been created than freed since its last
run, so a benchmark that keeps what it builds (a session log, a memory store) pays for it in
pauses that land in whatever code happens to allocate. This counts those pauses per
generation; it does not change when they happen.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from typing import Any


class GcWatch:
    """``with GcWatch() as w: ...`` then ``w.report(seconds)``."""

    def __init__(self) -> None:
        self.count: Counter[int] = Counter()
        self.seconds: Counter[int] = Counter()
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            generation = info["generation"]
            self.count[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._started

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def report(self, total: float) -> str:
        """One line: collections and pause time per generation, and their share of ``total``."""
        if not self.count:
            return "gc: no collection"
        parts = [
            f"gen{g} {self.count[g]}x {self.seconds[g] * 1e3:.1f} ms" for g in sorted(self.count)
        ]
        share = sum(self.seconds.values()) / total * 100 if total else 0.0
        return f"gc: {', '.join(parts)} ({share:.0f}% of {total * 1e3:.0f} ms)"
