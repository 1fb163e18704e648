"""Shared pytest set-up for every distribution's tests and the cross-package tests."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["dsh_core.testing.pytest_plugin"]

# No deadline: timing is measured in benchmarks/, never asserted. `ci` keeps the run short: the
# `tests` sessions of `nox` use it, on each of three Pythons.
settings.register_profile("dsh", deadline=None, max_examples=100)
settings.register_profile(
    "ci", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", deadline=None, max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dsh"))


@pytest.fixture(autouse=True)
def _private_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every test gets its own `$DSH_SUBAGENTS_HOME`: `dsh-subagents run` stores its sessions
    there by default, and no test may write into the real home of whoever runs the suite."""
    monkeypatch.setenv("DSH_SUBAGENTS_HOME", str(tmp_path_factory.mktemp("home")))
