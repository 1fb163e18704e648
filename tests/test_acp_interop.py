"""The `acp` provider against ACP agents that dsh did not write (acp 16.3, interop tier:
`nox -s interop` installs them; a plain pytest run deselects these tests)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

import dsh_subagent.plugin
import dsh_subagent_acp.plugin
from dsh_core import SessionMeta, blocks_text, text_blocks
from dsh_core.testing import scripted_host
from dsh_subagent import SUBAGENTS, SubagentStartRequest

pytestmark = pytest.mark.interop

FIXTURES = Path(__file__).parent / "fixtures" / "acp"
MODULES = {"subagent": dsh_subagent.plugin, "subagent-acp": dsh_subagent_acp.plugin}


async def _delegate(tmp_path: Path, args: list[str], prompt: str) -> tuple[str, str, int]:
    config = {"command": sys.executable, "args": args, "start_timeout_ms": 120_000}
    async with scripted_host(
        "subagent", "subagent-acp", modules=MODULES, config={"subagent-acp": config}
    ) as host:
        handle = await host.create_agent(meta=SessionMeta(cwd=str(tmp_path)))
        request = SubagentStartRequest(prompt=text_blocks(prompt), parent=handle.agent)
        async with asyncio.timeout(180):
            run = await handle.agent.ctx[SUBAGENTS].start("acp", request)
            try:
                result = await run.result
            finally:
                await run.dispose()
        await handle.dispose()
    return result.stop_reason, blocks_text(result.output), run.pid  # type: ignore[attr-defined]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_the_sdk_example_echo_agent(tmp_path: Path) -> None:
    """acp 16.3: the SDK's own examples/echo_agent.py (from its sdist) answers our prompt."""
    examples = os.environ.get("ACP_SDK_EXAMPLES")
    if not examples:
        pytest.skip("ACP_SDK_EXAMPLES names no folder (nox -s interop fetches the SDK's sdist)")
    script = str(Path(examples) / "echo_agent.py")
    stop_reason, text, pid = await _delegate(tmp_path, [script], "ping over acp")
    assert (stop_reason, text) == ("completed", "ping over acp")
    assert _gone(pid)


async def test_deepagents_acp_with_its_own_subagent(tmp_path: Path) -> None:
    """acp 16.3: a deepagents graph served by deepagents-acp (fake model) delegates to its
    own subagent and answers our prompt."""
    pytest.importorskip("deepagents_acp")
    script = str(FIXTURES / "deepagents_child.py")
    stop_reason, text, pid = await _delegate(tmp_path, [script], "do the thing")
    assert (stop_reason, text) == ("completed", "parent got: child result")
    assert _gone(pid)
