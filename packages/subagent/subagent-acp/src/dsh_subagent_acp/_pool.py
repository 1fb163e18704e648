"""The warm pool of one provider row (ACPC-30..36): agent processes started and initialized
ahead of need.

A row with ``pool = N`` keeps up to N processes that have answered ``initialize`` and nothing
else. A new child (one-shot or continuable) or a cold resume takes one instead of paying the
process start: the pool hands it out once and never takes it back, so every child gets a
process whose only traffic was ``initialize``; the pool then refills in the background, one
process at a time. Before a hand-out the process is checked: one that exited or whose pipes
closed is reaped and replaced, never handed out. A refill that fails backs off (0.1 s,
doubling, at most 30 s); after ``MAX_FAILURES`` failures in a row the pool stops trying, and
each later hand-out that finds it empty allows one more try, so a broken command never
spins. Unloading the plugin ends every pooled process with the disposal ladder.

Pooled processes are started in the row's ``cwd``, or the host's working directory when the
row has none, with the same scrubbed environment as a direct start. A child whose working
directory differs gets a process started directly in its own (the ACP session's ``cwd`` goes
in ``session/new``, but an agent's own relative paths follow its process's).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import sys
from collections import deque
from typing import TYPE_CHECKING

from ._config import AcpConfig
from ._errors import AcpError
from ._process import child_environment

if TYPE_CHECKING:
    from ._client import Warm

__all__ = ["MAX_FAILURES", "AcpPool"]

_log = logging.getLogger("dsh.subagent.acp")

#: ACPC-34: failed refills in a row after which the pool stops trying (until a hand-out).
MAX_FAILURES = 5
_BACKOFF_S = 0.1
_BACKOFF_MAX_S = 30.0
_CLIENT = "dsh_subagent_acp._client"


class AcpPool:
    """Up to ``config.pool`` initialized agent processes of the row ``name``, started in
    ``cwd``. ``attempts`` counts the processes it started (tests and benchmarks read it)."""

    def __init__(self, *, name: str, config: AcpConfig, cwd: str) -> None:
        self.name = name
        self.config = config
        self.cwd = cwd
        self.size = config.pool
        self.ready: deque[Warm] = deque()
        self.failures = 0
        self.attempts = 0
        self.closed = False
        self._filler: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Future[None]] = set()
        self._changed = asyncio.Event()

    def fill(self) -> None:
        """Refill in the background, unless a refill runs, or the pool is full or closed."""
        if self.closed or len(self.ready) >= self.size:
            return
        if self._filler is None or self._filler.done():
            self._filler = asyncio.ensure_future(self._fill())

    async def _fill(self) -> None:
        if _CLIENT not in sys.modules:  # the SDK's import (most of a second) off the loop
            await asyncio.to_thread(importlib.import_module, _CLIENT)
        from ._client import warm_up

        while not self.closed and len(self.ready) < self.size:
            if self.failures >= MAX_FAILURES:
                _log.warning(
                    'subagent-acp "%s": the pool stopped refilling after %d failed starts',
                    self.name,
                    self.failures,
                )
                return
            if self.failures:
                await asyncio.sleep(min(_BACKOFF_S * 2 ** (self.failures - 1), _BACKOFF_MAX_S))
            self.attempts += 1
            # ACPC-37: the scrub of a direct start, taken when the process starts.
            env = child_environment(self.config.env, passed=self.config.pass_env)
            try:
                warm = await warm_up(name=self.name, config=self.config, cwd=self.cwd, env=env)
            except AcpError as exc:
                self.failures += 1
                _log.warning('subagent-acp "%s": a pooled process failed: %s', self.name, exc)
                continue
            if not self._open():  # closed while it started
                self._release(warm)
                return
            self.ready.append(warm)
            warm.child.exited.add_done_callback(functools.partial(self._died, warm))
            self._changed.set()

    def _open(self) -> bool:
        return not self.closed

    def _died(self, warm: Warm, _: object = None) -> None:
        """ACPC-33: a pooled process that exits while it waits is reaped and replaced."""
        if warm in self.ready:
            self.ready.remove(warm)
            self.failures += 1
            self._release(warm)
            self.fill()

    def take(self, cwd: str) -> Warm | None:
        """ACPC-31..33, 37: a healthy pooled process for a child working in ``cwd``, handed
        out for good (never taken back: ACPC-32); ``None`` when there is none, or the child
        works elsewhere (the caller starts one directly)."""
        if self.size == 0 or self.closed or cwd != self.cwd:
            return None
        while self.ready:
            warm = self.ready.popleft()
            if warm.healthy():
                self.failures = 0
                self.fill()
                return warm
            self.failures += 1
            self._release(warm)
        self.failures = min(self.failures, MAX_FAILURES - 1)  # ACPC-34: one more try
        self.fill()
        return None

    async def filled(self) -> None:
        """Wait until the pool holds ``size`` processes (callers bound the wait)."""
        while len(self.ready) < self.size:
            self._changed.clear()
            await self._changed.wait()

    def _release(self, warm: Warm) -> None:
        from ._client import reap

        task = asyncio.ensure_future(reap(warm.child, warm.conn, self.config))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def close(self) -> None:
        """ACPC-35: the plugin unloads: no refill starts again, and every pooled process
        (and one being started) ends with the disposal ladder, waited for."""
        self.closed = True
        filler = self._filler
        if filler is not None and not filler.done():
            filler.cancel()
            await asyncio.wait({filler})
        while self.ready:
            self._release(self.ready.popleft())
        while self._releasing:
            await asyncio.gather(*tuple(self._releasing), return_exceptions=True)
