"""The crash tier: a tree of continuable children on the JSONL store, its host process killed
with SIGKILL at seeded random points, each kill point checked by a fresh process
(``tests/crash/``: the host, the checker, the driver).

The default run checks a few seeded kill points; ``nox -s crash`` runs the ``crash``-marked
test at ``DSH_CRASH_POINTS`` kill points (default 200, seed ``DSH_CRASH_SEED``)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent / "crash"


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("crash_harness", HERE / "harness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(points: int, seed: int, tmp_path: Path) -> None:
    harness = _harness()
    tally = harness.run(points, seed, tmp_path)
    print(harness.summary(tally))
    assert tally["lost"] == []
    assert tally["not_killed"] == []
    assert tally["kill_points"] == points
    assert tally["resumed"] > 0 and tally["reached"] > 0


def test_a_killed_tree_loses_nothing_acknowledged_quick(tmp_path: Path) -> None:
    """DUR-35..DUR-38: at a few seeded kill points, every child id handed out is listed with
    its parent and depth and cold-resumes (its own children reachable again), and every
    acknowledged follow-up and accepted report is in the acknowledging agent's log."""
    _run(int(os.environ.get("DSH_CRASH_QUICK_POINTS", "10")), 20261201, tmp_path)


@pytest.mark.crash
def test_a_killed_tree_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """DUR-35..DUR-38 at DSH_CRASH_POINTS kill points (default 200)."""
    points = int(os.environ.get("DSH_CRASH_POINTS", "200"))
    _run(points, int(os.environ.get("DSH_CRASH_SEED", "1")), tmp_path)
