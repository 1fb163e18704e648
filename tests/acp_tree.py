"""What the continuable ACP tests (tests/test_acp_continuable.py, the interop tier's
tests/test_acp_interop_continuable.py) and benchmarks/acp_continuable.py share: a parent host on
a JSONL store whose `acp` row is a given config, a watcher of the children's `subagent/end`
events, and a child's start, follow-up and process. Every wait is bounded by ``bound``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import dsh_subagent.plugin
import dsh_subagent_acp.plugin
from dsh_core import blocks_text, text_blocks
from dsh_core.testing import TestHost, scripted_host
from dsh_subagent import (
    SUBAGENTS,
    ContinuableStartSpec,
    CoordinatorMessageSource,
    SubagentFollowupOptions,
    SubagentRunEndInfo,
)
from dsh_subagent_acp._continuable import AcpSessions
from dsh_subagent_acp._process import ChildProcess

FIXTURES = Path(__file__).parent / "fixtures" / "acp"
MODULES = {"subagent": dsh_subagent.plugin, "subagent-acp": dsh_subagent_acp.plugin}


class Ends:
    """The host's `subagent/end` events, in order; ``answer(n)`` waits for the n-th."""

    def __init__(self, host: TestHost, bound: float) -> None:
        self.ends: list[SubagentRunEndInfo] = []
        self.changed = asyncio.Event()
        self.bound = bound
        host.ctx.on("subagent/end", self._end)

    def _end(self, info: SubagentRunEndInfo) -> None:
        self.ends.append(info)
        self.changed.set()

    async def answer(self, count: int) -> str:
        """The answer of the ``count``-th epoch to end, which must have completed."""
        async with asyncio.timeout(self.bound):
            while len(self.ends) < count:
                self.changed.clear()
                await self.changed.wait()
        end = self.ends[count - 1]
        assert end.stop_reason == "completed", end
        return blocks_text(end.last_assistant_message or ())


@contextlib.asynccontextmanager
async def jsonl_host(store: Path, config: dict[str, Any]) -> AsyncIterator[TestHost]:
    """A host on a JSONL store under ``store`` whose `acp` provider row is ``config``."""
    async with scripted_host(
        "subagent",
        "subagent-acp",
        modules=MODULES,
        config={"subagent-acp": config},
        store="jsonl",
        store_root=store,
    ) as host:
        yield host


def child_process(host: TestHost, child_id: str) -> ChildProcess:
    """The agent process that serves the continuable child ``child_id`` now."""
    provider = host.ctx[SUBAGENTS].get_provider("acp")
    sessions = provider.sessions  # type: ignore[union-attr]
    assert isinstance(sessions, AcpSessions)
    return sessions.held[child_id].opened.child


async def start_child(host: TestHost, parent: Any, prompt: str, bound: float) -> str:
    """A continuable `acp` child of ``parent`` (label ``remote``) asked ``prompt``: its id."""
    spec = ContinuableStartSpec(
        provider="acp", label="remote", prompt=text_blocks(prompt), parent=parent
    )
    async with asyncio.timeout(bound):
        return (await host.ctx[SUBAGENTS].start_continuable(spec)).child_id


async def followup(parent: Any, child_id: str, text: str, bound: float) -> None:
    """``text`` to the child ``child_id`` as its parent's follow-up."""
    source = CoordinatorMessageSource(sender_session_id=parent.id)
    async with asyncio.timeout(bound):
        await parent.ctx[SUBAGENTS].followup(
            parent, child_id, text_blocks(text), SubagentFollowupOptions(source=source)
        )
