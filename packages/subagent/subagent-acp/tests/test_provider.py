"""The ``acp`` provider (contract §3, ACP-1..8) against a fake ACP agent process."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import dsh_subagent.plugin
import dsh_subagent_acp.plugin
from dsh_core import AbortController, Agent, AbortSignal, SessionMeta, text_blocks
from dsh_core.testing import TestHost, scripted_host
from dsh_subagent import SUBAGENTS, SubagentRun, SubagentService, SubagentStartRequest
from dsh_subagent.testing import ANSWER_PREFIX, HOLD_PROMPT, ContractHost, ProviderContract

FAKE_AGENT = str(Path(__file__).with_name("fake_acp_agent.py"))
MODULES = {"subagent": dsh_subagent.plugin, "subagent-acp": dsh_subagent_acp.plugin}


def fake_config(*flags: str, **changes: Any) -> dict[str, Any]:
    """``subagent-acp`` config running the fake agent with ``flags``; short graces."""
    return {
        "command": sys.executable,
        "args": [FAKE_AGENT, *flags],
        "dispose_eof_grace_ms": 3000,
        "dispose_grace_ms": 3000,
        "start_timeout_ms": 10_000,
        **changes,
    }


class Booted:
    """A host with the ``acp`` provider and a parent agent."""

    def __init__(self, host: TestHost, parent: Agent) -> None:
        self.host = host
        self.parent = parent

    @property
    def svc(self) -> SubagentService:
        return self.parent.ctx[SUBAGENTS]

    async def start(
        self, prompt: str = "hi", *, signal: AbortSignal | None = None, **changes: Any
    ) -> SubagentRun:
        request = SubagentStartRequest(
            prompt=changes.pop("blocks", None) or text_blocks(prompt),
            parent=self.parent,
            signal=signal or AbortController().signal,
            **changes,
        )
        return await self.svc.start("acp", request)


@contextlib.asynccontextmanager
async def acp_host(
    *flags: str, cwd: str | None = None, parent_cwd: str | None = "", **changes: Any
) -> AsyncIterator[Booted]:
    """A scripted host whose ``acp`` provider runs the fake agent with ``flags``."""
    config = fake_config(*flags, **changes)
    if cwd is not None:
        config["cwd"] = cwd
    async with scripted_host(
        "subagent", "subagent-acp", modules=MODULES, config={"subagent-acp": config}
    ) as host:
        meta = SessionMeta(cwd=os.getcwd() if parent_cwd == "" else parent_cwd)
        handle = await host.create_agent(meta=meta)
        try:
            yield Booted(host, handle.agent)
        finally:
            await handle.dispose()


def assert_reaped(pid: int) -> None:
    """The process is gone and reaped: no zombie, no orphan (a zombie still takes kill 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    raise AssertionError(f"process {pid} is still there (running or a zombie)")


@contextlib.asynccontextmanager
async def _contract_host() -> AsyncIterator[ContractHost]:
    config = fake_config("--echo-prefix", ANSWER_PREFIX, "--hold-text", HOLD_PROMPT)
    async with scripted_host(
        "subagent", "subagent-acp", modules=MODULES, config={"subagent-acp": config}
    ) as host:
        handle = await host.create_agent(meta=SessionMeta(cwd=os.getcwd()))
        yield ContractHost(host=host, parent=handle.agent, provider_name="acp")
        await handle.dispose()


class TestAcpContract(ProviderContract):
    """The ``acp`` provider against the shared contract (a fake agent process per run)."""

    def contract_host(self) -> contextlib.AbstractAsyncContextManager[ContractHost]:
        return _contract_host()
