"""A host in a process of its own, for the watchdog's kill -9 tests (test_watchdog.py).

Usage: ``python watchdog_host.py MODE DIR``. It sets the watchdog's trace to ``DIR/trace``,
then boots a host on the fake agent with three ``acp`` rows: ``eof`` (an agent mid-prompt that
ignores stdin EOF), ``term`` (one that also ignores SIGTERM and has a SIGTERM-proof
grandchild in its group) and ``pooled`` (``pool = 1``, an agent that ignores EOF). It starts a
one-shot child on ``eof`` and on ``term`` and waits for the pool to be full. In mode
``orphan`` it then prints one JSON line: ``{"watchdog": pid, "pids": [...]}`` (the agents,
the grandchild and the pooled process) and waits to be killed. In mode ``disposed`` it first
disposes both children and closes the host (which ends the pooled process), each with the
host's own ladder, then prints the same line and waits to be killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import dsh_subagent.plugin
import dsh_subagent_acp.plugin
from dsh_core import PluginRow, SessionMeta, text_blocks
from dsh_core.testing import scripted_host
from dsh_subagent import SUBAGENTS, SubagentStartRequest
from dsh_subagent_acp._watchdog import WATCHDOG

MODULES = {"subagent": dsh_subagent.plugin, "subagent-acp": dsh_subagent_acp.plugin}
FAKE_AGENT = str(Path(__file__).with_name("fake_acp_agent.py"))
#: Short graces: the watchdog's ladder after the kill takes at most their sum.
GRACES = {"dispose_eof_grace_ms": 100, "dispose_grace_ms": 100, "start_timeout_ms": 10_000}


def _row(name: str, *flags: str, **changes: object) -> PluginRow:
    config = {
        "provider_name": name,
        "command": sys.executable,
        "args": [FAKE_AGENT, *flags],
        **GRACES,
        **changes,
    }
    return PluginRow(plugin="subagent-acp", config=config)


def _read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read())


async def report(pids: list[int]) -> None:
    """Print what the test needs, then wait to be killed."""
    sys.stdout.write(json.dumps({"watchdog": WATCHDOG.pid, "pids": pids}) + "\n")
    sys.stdout.flush()
    await asyncio.sleep(600)  # not a synchronisation: the test kills this process


async def main(mode: str, folder: Path) -> None:
    WATCHDOG.trace = str(folder / "trace")
    pidfile = str(folder / "term.pid")
    rows = (
        _row("eof", "--prompt", "slow", "--hold-eof"),
        _row(
            "term",
            *("--prompt", "slow", "--hold-eof", "--trap-term", "--grandchild"),
            env={"FAKE_ACP_PIDFILE": pidfile},
        ),
        _row("pooled", "--hold-eof", pool=1),
    )
    async with scripted_host("subagent", *rows, modules=MODULES) as host:
        handle = await host.create_agent(meta=SessionMeta(cwd=os.getcwd()))
        svc = handle.agent.ctx[SUBAGENTS]
        runs = []
        async with asyncio.timeout(60):
            for name in ("eof", "term"):
                request = SubagentStartRequest(prompt=text_blocks("work"), parent=handle.agent)
                runs.append(await svc.start(name, request))
            pids = [run.pid for run in runs]  # type: ignore[attr-defined]
            pids.append(_read_int(pidfile + ".grandchild"))
            pool = svc.get_provider("pooled").sessions.pool  # type: ignore[union-attr]
            await pool.filled()
            pids.extend(warm.child.pid for warm in pool.ready)
        if mode == "orphan":
            await report(pids)
        await asyncio.gather(*(run.dispose() for run in runs))
        await handle.dispose()
    await report(pids)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
