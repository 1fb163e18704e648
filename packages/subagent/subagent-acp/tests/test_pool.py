"""The warm pool of an ``acp`` provider row (ACPC-30..37) against the fake agent process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import types
from pathlib import Path
from typing import Any

import pytest

import dsh_subagent.plugin
import dsh_subagent_acp.plugin
from dsh_core import PluginError, SessionMeta, blocks_text, text_blocks
from dsh_subagent import (
    SubagentStartRequest,
)
from dsh_subagent_acp import MAX_POOL, AcpConfig, AcpError, _pool, check_config
from dsh_subagent_acp._pool import MAX_FAILURES
from dsh_subagent_acp._process import ChildProcess

FAKE_AGENT = str(Path(__file__).with_name("fake_acp_agent.py"))
MODULES = {"subagent": dsh_subagent.plugin, "subagent-acp": dsh_subagent_acp.plugin}
BOUND = 20


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def _exited(process: ChildProcess) -> None:
    async with asyncio.timeout(BOUND):
        await process.exited
    assert _gone(process.pid)


def _methods(log: Path, pid: int) -> list[str]:
    return Path(str(log).replace("{pid}", str(pid))).read_text().split()


@pytest.mark.parametrize("value", [-1, MAX_POOL + 1, True, 2.0])
def test_a_bad_pool_size_is_a_config_error(value: Any) -> None:
    """ACPC-30: pool is a whole number from 0 to MAX_POOL; anything else is PLUGIN_CONFIG,
    naming the key (a bool is no number here)."""
    with pytest.raises(PluginError) as caught:
        check_config(AcpConfig(command="agent", pool=value))
    assert caught.value.code == "PLUGIN_CONFIG"
    assert f"pool must be a whole number from 0 to {MAX_POOL}" in str(caught.value)


async def test_the_pool_is_off_by_default_and_a_bad_size_fails_the_boot(acp: Any) -> None:
    """ACPC-30: without `pool` no process is started ahead of need; `pool` above the cap
    fails the boot with PLUGIN_CONFIG."""
    async with acp.tree(pool=0) as p:
        assert p.sessions.pool is None
        assert p.svc.get_provider("acp").pool is None  # type: ignore[union-attr]
    with pytest.raises(PluginError) as caught:
        async with acp.tree(pool=MAX_POOL + 1):
            pass
    assert caught.value.code == "PLUGIN_CONFIG"


async def test_a_child_gets_a_fresh_pooled_process_and_the_pool_refills(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    acp: Any,
) -> None:
    """ACPC-31, ACPC-32: N processes are started and initialized ahead of need (initialize
    was their only traffic); a new child takes one, the pool refills with a new process, and
    a process is handed out once: two children get two processes, and a released one never
    comes back to the pool."""
    log = tmp_path / "{pid}"
    monkeypatch.setenv("FAKE_ACP_METHODS", str(log))
    async with acp.tree(idle_release_ms=600_000, pool=2) as p:
        first_pool = await p.filled()
        assert len(first_pool) == 2 and p.pool.attempts == 2
        assert all(_methods(log, pid) == ["initialize"] for pid in first_pool)
        child = await p.start("first")
        end = await p.ended(1)
        assert blocks_text(end.last_assistant_message or ()) == "echo: first"
        pid = p.process(child).pid
        assert pid in first_pool
        assert _methods(log, pid) == ["initialize", "session/new", "session/prompt"]
        second_pool = await p.filled()
        assert pid not in second_pool and p.pool.attempts == 3
        other = await p.start("second")
        await p.ended(2)
        other_pid = p.process(other).pid
        assert other_pid != pid and other_pid in second_pool
        process = p.process(child)
        p.sessions._drop(p.sessions.held[child])  # released: never back in the pool
        await _exited(process)
        assert pid not in await p.filled()


async def test_a_one_shot_child_gets_a_pooled_process(acp: Any) -> None:
    """ACPC-31: a one-shot start takes a pooled process too."""
    async with acp.tree(pool=2) as p:
        pids = await p.filled()
        request = SubagentStartRequest(prompt=text_blocks("once"), parent=p.parent)
        async with asyncio.timeout(BOUND):
            run = await p.svc.start("acp", request)
            try:
                result = await run.result
            finally:
                await run.dispose()
        assert blocks_text(result.output) == "echo: once"
        assert run.pid in pids  # type: ignore[attr-defined]


async def test_a_dead_or_closed_pooled_process_is_never_handed_out(acp: Any) -> None:
    """ACPC-33: a pooled process killed while it waits is reaped and replaced; one whose
    pipe closed (it keeps running) is found at hand-out, discarded and never handed out."""
    async with acp.tree("--hold-eof", dispose_eof_grace_ms=50, dispose_grace_ms=1000, pool=2) as p:
        await p.filled()
        killed = p.pool.ready[0].child
        os.kill(killed.pid, signal.SIGKILL)
        await _exited(killed)
        assert killed.pid not in await p.filled()
        closed = p.pool.ready[0].child
        assert closed.process.stdin is not None
        closed.process.stdin.close()  # our end of its stdin: it holds on after EOF
        child = await p.start("first")
        await p.ended(1)
        assert p.process(child).pid != closed.pid
        await _exited(closed)


class _BackOffClock(types.ModuleType):
    """``asyncio`` as the pool module sees it, but ``sleep`` records the back-off it was asked
    for and only yields: the schedule is checked instead of waited out."""

    def __init__(self) -> None:
        super().__init__("asyncio")
        self.delays: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


async def test_a_failing_refill_backs_off_and_stops(
    acp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACPC-34: a command whose processes fail at initialize is retried with back-off (0.1 s,
    doubling), then the pool stops trying (it never spins); a start that finds the pool empty
    allows one more try."""
    clock = _BackOffClock()
    monkeypatch.setattr(_pool, "asyncio", clock)
    async with acp.tree("--exit-at-init", pool=3) as p:
        filler = p.pool._filler
        assert filler is not None
        async with asyncio.timeout(BOUND):
            await filler
        assert p.pool.attempts == MAX_FAILURES and not p.pool.ready
        assert clock.delays == pytest.approx([0.1, 0.2, 0.4, 0.8])
        request = SubagentStartRequest(prompt=text_blocks("x"), parent=p.parent)
        with pytest.raises(AcpError):
            await p.svc.start("acp", request)
        filler = p.pool._filler
        async with asyncio.timeout(BOUND):
            await filler
        assert p.pool.attempts == MAX_FAILURES + 1
        assert clock.delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 0.8])


async def test_unloading_ends_every_pooled_process(acp: Any) -> None:
    """ACPC-35: closing the host ends every pooled process; their pids are gone."""
    async with acp.tree(pool=3) as p:
        await p.filled()
        processes = [warm.child for warm in p.pool.ready]
    for process in processes:
        assert process.exited.done() and _gone(process.pid)


async def test_a_cold_resume_takes_a_pooled_process(acp: Any) -> None:
    """ACPC-36: after kill -9 of the child, its follow-up loads the session in a pooled
    process of the same row."""
    async with acp.tree("--load", pool=1) as p:
        child = await p.start("first")
        await p.ended(1)
        process = p.process(child)
        (waiting,) = await p.filled()
        os.kill(process.pid, signal.SIGKILL)
        await _exited(process)
        await p.followup(child, "after the kill")
        second = await p.ended(2)
        assert blocks_text(second.last_assistant_message or ()) == "echo: after the kill"
        assert p.process(child).pid == waiting


async def test_pooled_processes_get_the_scrub_and_a_child_elsewhere_starts_directly(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    acp: Any,
) -> None:
    """ACPC-37: a pooled process gets the same scrubbed environment as a direct start and
    runs in the row's directory; a child working elsewhere gets a process started directly
    in its own directory, and the pool keeps its process."""
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "ambient-secret")
    monkeypatch.setenv("PROXY_URL", "http://user:pw@proxy:3128")
    monkeypatch.setenv("PLAIN_SETTING", "kept")
    async with acp.tree("--prompt", "env", pool=1, env={"GIVEN_KEY": "given"}) as p:
        (pooled_pid,) = await p.filled()
        child = await p.start()
        report = json.loads(blocks_text((await p.ended(1)).last_assistant_message or ()))
        assert p.process(child).pid == pooled_pid
        env = report["env"]
        assert "SOME_SERVICE_TOKEN" not in env and "PROXY_URL" not in env
        assert env["PLAIN_SETTING"] == "kept" and env["GIVEN_KEY"] == "given"
        assert report["cwd"] == os.getcwd()
        (waiting,) = await p.filled()
        elsewhere = await p.host.create_agent(meta=SessionMeta(cwd=str(tmp_path)))
        child = await p.start(parent=elsewhere.agent)
        report = json.loads(blocks_text((await p.ended(2)).last_assistant_message or ()))
        assert report["cwd"] == str(tmp_path)
        assert report["seen"]["session/new"]["cwd"] == str(tmp_path)
        assert p.process(child).pid != waiting
        assert [warm.child.pid for warm in p.pool.ready] == [waiting]
        await elsewhere.dispose()
