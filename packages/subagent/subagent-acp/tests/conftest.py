"""Scaffolding shared by the continuable and warm-pool tests: a host with the ``acp`` provider
on the fake agent process, its parent agent, and the epoch ends it saw (the ``acp`` fixture)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import dsh_subagent.plugin
import dsh_subagent_acp.plugin
from dsh_core import Agent, SessionMeta, text_blocks
from dsh_core.testing import TestHost, scripted_host
from dsh_subagent import (
    SUBAGENTS,
    ContinuableStartSpec,
    CoordinatorMessageSource,
    SubagentFollowupOptions,
    SubagentRunEndInfo,
    SubagentService,
)
from dsh_subagent_acp._continuable import AcpSessions
from dsh_subagent_acp._pool import AcpPool
from dsh_subagent_acp._process import ChildProcess

FAKE_AGENT = str(Path(__file__).with_name("fake_acp_agent.py"))
MODULES = {"subagent": dsh_subagent.plugin, "subagent-acp": dsh_subagent_acp.plugin}
BOUND = 20


class Tree:
    """A host with the ``acp`` provider, a parent agent, and the epoch ends it saw."""

    def __init__(self, host: TestHost, parent: Agent) -> None:
        self.host = host
        self.parent = parent
        self.ends: list[SubagentRunEndInfo] = []
        self.changed = asyncio.Event()
        host.ctx.on("subagent/end", self._end)

    def _end(self, info: SubagentRunEndInfo) -> None:
        self.ends.append(info)
        self.changed.set()

    @property
    def svc(self) -> SubagentService:
        return self.parent.ctx[SUBAGENTS]

    @property
    def sessions(self) -> AcpSessions:
        provider = self.svc.get_provider("acp")
        assert provider is not None
        sessions = provider.sessions  # type: ignore[attr-defined]
        assert isinstance(sessions, AcpSessions)
        return sessions

    @property
    def pool(self) -> AcpPool:
        assert self.sessions.pool is not None
        return self.sessions.pool

    async def filled(self) -> set[int]:
        """Wait (bounded) until the pool is full; the pids it holds."""
        async with asyncio.timeout(BOUND):
            await self.pool.filled()
        return {warm.child.pid for warm in self.pool.ready}

    async def start(self, prompt: str = "hi", parent: Agent | None = None) -> str:
        spec = ContinuableStartSpec(
            provider="acp", label="remote", prompt=text_blocks(prompt), parent=parent or self.parent
        )
        async with asyncio.timeout(BOUND):
            return (await self.svc.start_continuable(spec)).child_id

    async def followup(self, child_id: str, prompt: str) -> None:
        source = CoordinatorMessageSource(sender_session_id=self.parent.id)
        async with asyncio.timeout(BOUND):
            await self.svc.followup(
                self.parent, child_id, text_blocks(prompt), SubagentFollowupOptions(source=source)
            )

    async def ended(self, count: int) -> SubagentRunEndInfo:
        async with asyncio.timeout(BOUND):
            while len(self.ends) < count:
                self.changed.clear()
                await self.changed.wait()
        return self.ends[count - 1]

    def pid(self, child_id: str) -> int:
        return self.process(child_id).pid

    def process(self, child_id: str) -> ChildProcess:
        return self.sessions.held[child_id].opened.child


@contextlib.asynccontextmanager
async def tree(*flags: str, parent_cwd: str | None = None, **changes: Any) -> AsyncIterator[Tree]:
    """The provider row runs the fake agent with ``flags``; ``changes`` override its config."""
    config = {
        "command": sys.executable,
        "args": [FAKE_AGENT, *flags],
        "dispose_eof_grace_ms": 3000,
        "dispose_grace_ms": 3000,
        "start_timeout_ms": 10_000,
        **changes,
    }
    async with scripted_host(
        "subagent", "subagent-acp", modules=MODULES, config={"subagent-acp": config}
    ) as host:
        handle = await host.create_agent(meta=SessionMeta(cwd=parent_cwd or os.getcwd()))
        try:
            yield Tree(host, handle.agent)
        finally:
            await handle.dispose()


@pytest.fixture
def acp() -> types.SimpleNamespace:
    """``acp.tree(...)`` opens a :class:`Tree`; ``acp.Tree`` wraps a host of a test's own."""
    return types.SimpleNamespace(tree=tree, Tree=Tree)
