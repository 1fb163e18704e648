"""A pytest plugin that runs ``async def`` tests, each on a fresh event loop, bounded in time.

Enable it with ``pytest_plugins = ["dsh_core.testing.pytest_plugin"]`` in a root conftest.
Every async test (and every async hypothesis test body) runs under ``asyncio.run`` inside
``asyncio.timeout``: a hang fails fast with ``TimeoutError`` instead of stalling the run. The
bound is ``DSH_TEST_TIMEOUT`` seconds (default 60), or ``@pytest.mark.dsh_timeout(seconds)``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

__all__ = ["pytest_configure", "pytest_pyfunc_call"]

_DEFAULT_TIMEOUT = float(os.environ.get("DSH_TEST_TIMEOUT", "60"))


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``dsh_timeout`` marker."""
    config.addinivalue_line(
        "markers", "dsh_timeout(seconds): bound an async test's run time (default 60 s)"
    )


def _bounded(fn: Callable[..., Coroutine[Any, Any, object]], seconds: float) -> Callable[..., None]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        async def main() -> None:
            async with asyncio.timeout(seconds):
                await fn(*args, **kwargs)

        asyncio.run(main())

    return run


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run coroutine tests; let pytest call everything else."""
    marker = pyfuncitem.get_closest_marker("dsh_timeout")
    seconds = float(marker.args[0]) if marker else _DEFAULT_TIMEOUT
    func = pyfuncitem.obj
    hyp = getattr(func, "hypothesis", None)
    if hyp is not None and inspect.iscoroutinefunction(hyp.inner_test):
        hyp.inner_test = _bounded(hyp.inner_test, seconds)
        return None
    if not inspect.iscoroutinefunction(func):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    _bounded(func, seconds)(**{name: pyfuncitem.funcargs[name] for name in names})
    return True
