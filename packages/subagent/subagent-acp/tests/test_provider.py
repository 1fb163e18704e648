"""The ``acp`` provider (contract §3, ACP-1..8) against a fake ACP agent process."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import dsh_subagent.plugin
import dsh_subagent_acp.plugin
from dsh_core import (
    AbortController,
    AbortedError,
    AbortSignal,
    Agent,
    PluginError,
    ReasoningBlock,
    SessionMeta,
    TextBlock,
    blocks_text,
    text_blocks,
)
from dsh_core.testing import TestHost, scripted_host
from dsh_subagent import SUBAGENTS, SubagentRun, SubagentService, SubagentStartRequest
from dsh_subagent.testing import ANSWER_PREFIX, HOLD_PROMPT, ContractHost, ProviderContract
from dsh_subagent_acp import (
    ABORTED_BEFORE_START,
    MAX_TIMER_DELAY_MS,
    AcpError,
    child_environment,
    is_credential_name,
    is_credential_value,
    resolve_config_cwd,
)
from dsh_subagent_acp._process import ChildProcess

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


def _read_pid(path: Path) -> int:
    return int(path.read_text())


class _StderrWatch(io.StringIO):
    """A stand-in for ``sys.stderr`` that sets ``seen`` once ``text`` was written to it."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = asyncio.Event()

    def write(self, s: str) -> int:
        if self.text in s:
            self.seen.set()
        return super().write(s)


def _ended(pid: int) -> asyncio.Event:
    """An event set when ``pid`` (any process, not only our child) has ended."""
    if not hasattr(os, "pidfd_open"):
        pytest.skip("needs pidfd_open to watch a process that is not our child")
    fd = os.pidfd_open(pid)
    ended = asyncio.Event()
    loop = asyncio.get_running_loop()

    def done() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        ended.set()

    loop.add_reader(fd, done)
    return ended


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


# -- ACP-1: start ---------------------------------------------------------------------------------


async def _report(run: SubagentRun) -> dict[str, Any]:
    """The fake's ``--prompt env`` report: what it saw and where it ran."""
    async with asyncio.timeout(10):
        result = await run.result
    assert result.stop_reason == "completed"
    return json.loads(blocks_text(result.output))


def _any_true(value: object) -> bool:
    if isinstance(value, dict):
        return any(_any_true(v) for v in value.values())
    return bool(value)


async def test_start_initializes_then_creates_a_session() -> None:
    """ACP-1: start = spawn, initialize (no client capabilities), session/new {cwd, no MCP};
    the run id is fresh, not the ACP session id, and local_agent is None."""
    async with acp_host("--prompt", "env") as b:
        first = await b.start()
        second = await b.start()
        try:
            assert first.local_agent is None and second.local_agent is None
            assert first.id != second.id
            report = await _report(first)
            assert first.id != "fake-session-1"
            init = report["seen"]["initialize"]
            assert init["protocolVersion"] == 1
            assert not _any_true(init.get("clientCapabilities", {}))
            assert init["clientInfo"]["name"] == "dsh-subagent-acp"
            assert report["seen"]["session/new"] == {"cwd": os.getcwd(), "mcpServers": []}
        finally:
            await asyncio.gather(first.dispose(), second.dispose())
        assert_reaped(first.pid)  # type: ignore[attr-defined]
        assert_reaped(second.pid)  # type: ignore[attr-defined]


async def test_acp_runs_never_appear_as_agents() -> None:
    """ACP-1: an ACP child is no local agent: the host's agents are only the parent."""
    async with acp_host() as b:
        run = await b.start()
        try:
            assert [a.id for a in b.host.ctx.agents.list()] == [b.parent.id]
            await run.result
        finally:
            await run.dispose()


# -- ACP-2: failures before publication -----------------------------------------------------------


async def test_pre_aborted_signal_never_spawns(tmp_path: Path) -> None:
    """ACP-2: a pre-aborted signal rejects with the documented text, before any spawn."""
    pidfile = tmp_path / "pid"
    async with acp_host(env={"FAKE_ACP_PIDFILE": str(pidfile)}) as b:
        controller = AbortController()
        controller.abort("nope")
        with pytest.raises(AbortedError) as caught:
            await b.start(signal=controller.signal)
        assert str(caught.value) == ABORTED_BEFORE_START
        assert caught.value.reason == "nope"
    assert not pidfile.exists()


async def test_abort_during_session_new_reaps_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACP-2: an abort while session/new is pending rejects with the same text, after the
    child was reaped."""
    pidfile = tmp_path / "pid"
    at_new = _StderrWatch("waiting in session/new")
    monkeypatch.setattr(sys, "stderr", at_new)
    async with acp_host("--hang-new", env={"FAKE_ACP_PIDFILE": str(pidfile)}) as b:
        controller = AbortController()
        starting = asyncio.ensure_future(b.start(signal=controller.signal))
        async with asyncio.timeout(10):
            await at_new.seen.wait()
        controller.abort("late")
        with pytest.raises(AbortedError) as caught:
            async with asyncio.timeout(10):
                await starting
        assert str(caught.value) == ABORTED_BEFORE_START
    assert_reaped(_read_pid(pidfile))


async def test_abort_during_initialize_reaps_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACP-2: an abort while initialize is pending rejects with the documented text, after
    the child (ignoring EOF and SIGTERM) was reaped."""
    pidfile = tmp_path / "pid"
    at_init = _StderrWatch("at initialize")
    monkeypatch.setattr(sys, "stderr", at_init)
    async with acp_host(
        "--no-init", "--say", "at initialize", "--hold-eof", "--trap-term",
        env={"FAKE_ACP_PIDFILE": str(pidfile)}, dispose_eof_grace_ms=50, dispose_grace_ms=50,
    ) as b:  # fmt: skip
        controller = AbortController()
        starting = asyncio.ensure_future(b.start(signal=controller.signal))
        async with asyncio.timeout(10):
            await at_init.seen.wait()
        controller.abort("early")
        with pytest.raises(AbortedError) as caught:
            async with asyncio.timeout(10):
                await starting
        assert (str(caught.value), caught.value.reason) == (ABORTED_BEFORE_START, "early")
    assert_reaped(_read_pid(pidfile))


async def test_a_start_cancelled_during_session_new_reaps_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACP-2, hardening: a caller cancelled while session/new is pending gets its
    CancelledError, and the child is reaped."""
    pidfile = tmp_path / "pid"
    at_new = _StderrWatch("waiting in session/new")
    monkeypatch.setattr(sys, "stderr", at_new)
    async with acp_host("--hang-new", env={"FAKE_ACP_PIDFILE": str(pidfile)}) as b:
        starting = asyncio.ensure_future(b.start())
        async with asyncio.timeout(10):
            await at_new.seen.wait()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(10):
                await starting
    assert_reaped(_read_pid(pidfile))


async def test_no_session_id_is_refused_after_reaping(tmp_path: Path) -> None:
    """ACP-2: a session/new answer without a session id rejects with the documented text."""
    pidfile = tmp_path / "pid"
    async with acp_host("--no-session-id", env={"FAKE_ACP_PIDFILE": str(pidfile)}) as b:
        with pytest.raises(AcpError) as caught:
            await b.start()
        assert caught.value.code == "ACP_NO_SESSION_ID"
        assert str(caught.value) == "ACP child published without a session id"
    assert_reaped(_read_pid(pidfile))


async def test_missing_binary_fails_start() -> None:
    """ACP-2: a command that cannot be spawned rejects (ACP_SPAWN_FAILED), nothing published."""
    async with acp_host(command="/nonexistent/acp-agent") as b:
        seen: list[object] = []
        b.parent.ctx.on("subagent/start", seen.append)
        with pytest.raises(AcpError) as caught:
            await b.start()
        assert caught.value.code == "ACP_SPAWN_FAILED"
        assert seen == []


async def test_child_that_never_answers_initialize_times_out(tmp_path: Path) -> None:
    """acp 16.1: a child that never answers initialize fails start() after start_timeout_ms
    (ACP_START_TIMEOUT), and is reaped, even when it ignores EOF and SIGTERM."""
    pidfile = tmp_path / "pid"
    async with acp_host(
        "--no-init",
        "--hold-eof",
        "--trap-term",
        env={"FAKE_ACP_PIDFILE": str(pidfile)},
        start_timeout_ms=300,
        dispose_eof_grace_ms=50,
        dispose_grace_ms=50,
    ) as b:
        with pytest.raises(AcpError) as caught:
            async with asyncio.timeout(10):
                await b.start()
        assert caught.value.code == "ACP_START_TIMEOUT"
        assert "did not answer initialize within 300 ms" in str(caught.value)
    assert_reaped(_read_pid(pidfile))


async def test_a_cancelled_start_still_reaps_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACP-2, hardening: a caller cancelled while start() waits on initialize gets its
    CancelledError, and the child it spawned is reaped, not left behind."""
    pidfile = tmp_path / "pid"
    started = _StderrWatch("at initialize")
    monkeypatch.setattr(sys, "stderr", started)
    async with acp_host(
        "--no-init", "--say", "at initialize", env={"FAKE_ACP_PIDFILE": str(pidfile)}
    ) as b:
        starting = asyncio.ensure_future(b.start())
        async with asyncio.timeout(10):
            await started.seen.wait()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(10):
                await starting
    assert_reaped(_read_pid(pidfile))


async def test_child_exiting_during_initialize_fails_start(tmp_path: Path) -> None:
    """ACP-2: a child that exits during initialize rejects with ACP_START_FAILED."""
    async with acp_host("--exit-at-init") as b:
        with pytest.raises(AcpError) as caught:
            async with asyncio.timeout(10):
                await b.start()
        assert caught.value.code == "ACP_START_FAILED"
        assert "exited with status 5" in str(caught.value)


# -- ACP-3: prompt and output ---------------------------------------------------------------------


async def test_only_text_blocks_are_sent() -> None:
    """ACP-3: only the prompt's text blocks reach the child."""
    async with acp_host("--prompt", "env") as b:
        blocks = (ReasoningBlock(text="private"), TextBlock(text="task"))
        run = await b.start(blocks=blocks)
        try:
            assert (await _report(run))["blocks"] == ["text"]
        finally:
            await run.dispose()


async def test_only_agent_message_text_is_output() -> None:
    """ACP-3: thoughts, tool cards and non-text chunks are ignored; message text is output."""
    async with acp_host("--extras") as b:
        run = await b.start("hello")
        try:
            result = await run.result
        finally:
            await run.dispose()
        assert result.stop_reason == "completed"
        assert result.output == (TextBlock(text="echo: hello"),)


@pytest.mark.parametrize(
    ("acp_reason", "stop_reason"),
    [
        ("end_turn", "completed"),
        ("max_tokens", "max-tokens"),
        ("refusal", "refusal"),
        ("cancelled", "aborted"),
        ("max_turn_requests", "max-steps"),
        ("something_new", "error"),
    ],
)
async def test_stop_reasons_map(acp_reason: str, stop_reason: str) -> None:
    """ACP-3, ROB-13: each ACP stop reason maps to the seam's (max_turn_requests: max-steps,
    an unknown one: error)."""
    async with acp_host("--stop", acp_reason) as b:
        run = await b.start()
        try:
            async with asyncio.timeout(10):
                result = await run.result
        finally:
            await run.dispose()
        assert result.stop_reason == stop_reason


# -- ACP-4: working directory ---------------------------------------------------------------------


async def test_configured_cwd_is_process_and_session_cwd(tmp_path: Path) -> None:
    """ACP-4: the configured directory is both the process cwd and the session cwd."""
    async with acp_host("--prompt", "env", cwd=str(tmp_path)) as b:
        run = await b.start()
        try:
            report = await _report(run)
        finally:
            await run.dispose()
    assert report["cwd"] == str(tmp_path)
    assert report["seen"]["session/new"]["cwd"] == str(tmp_path)


async def test_parent_cwd_is_used_without_config(tmp_path: Path) -> None:
    """ACP-4: with no configured cwd the parent header's cwd is used."""
    async with acp_host("--prompt", "env", parent_cwd=str(tmp_path)) as b:
        run = await b.start()
        try:
            assert (await _report(run))["cwd"] == str(tmp_path)
        finally:
            await run.dispose()


@pytest.mark.parametrize(
    ("parent_cwd", "code"),
    [(None, "ACP_NO_CWD"), ("/nonexistent/dir", "ACP_CWD_INVALID"), (__file__, "ACP_CWD_INVALID")],
)
async def test_unusable_parent_cwd_fails_before_spawn(
    tmp_path: Path, parent_cwd: str | None, code: str
) -> None:
    """ACP-4: no parent cwd, a missing directory or a file path fails start before spawn."""
    pidfile = tmp_path / "pid"
    async with acp_host(parent_cwd=parent_cwd, env={"FAKE_ACP_PIDFILE": str(pidfile)}) as b:
        with pytest.raises(AcpError) as caught:
            await b.start()
        assert caught.value.code == code
    assert not pidfile.exists()


def test_config_cwd_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ACP-4: a configured cwd must not be empty, resolves against the launch directory and
    must be an enterable directory."""
    with pytest.raises(ValueError, match="must not be empty — omit the key"):
        resolve_config_cwd("")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_config_cwd("sub") == str(tmp_path / "sub")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is not an accessible directory"):
        resolve_config_cwd("file")
    with pytest.raises(ValueError, match="is not an accessible directory"):
        resolve_config_cwd("missing")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cwd": ""}, "must not be empty"),
        ({"dispose_grace_ms": 0}, "dispose_grace_ms must be a positive finite number"),
        ({"dispose_eof_grace_ms": -1}, "dispose_eof_grace_ms must be a positive finite"),
        ({"dispose_grace_ms": float("inf")}, "no greater than 2147483647"),
        ({"dispose_grace_ms": MAX_TIMER_DELAY_MS + 1}, "no greater than 2147483647"),
        ({"start_timeout_ms": float("nan")}, "start_timeout_ms must be a positive"),
        ({"permission": "sometimes"}, "permission must be 'reject' or 'allow'"),
        ({"command": ""}, "command must name the ACP agent"),
        ({"args": "not a list"}, "key 'args' (list[str])"),
        ({"command": "ag\0ent"}, "command must not contain NUL"),
        ({"args": ["--ok", "a\0b"]}, "args[1] must not contain NUL"),
        ({"env": {"A=B": "1"}}, "env names must be non-empty, without '=' or NUL, got 'A=B'"),
        ({"env": {"": "1"}}, "env names must be non-empty, without '=' or NUL, got ''"),
        ({"env": {"A\0": "1"}}, "env names must be non-empty, without '=' or NUL"),
        ({"env": {"A": "x\0y"}}, "env.A must not contain NUL"),
    ],
)
async def test_bad_config_fails_the_boot(changes: dict[str, Any], message: str) -> None:
    """ACP surface: graces must be positive, finite and at most MAX_TIMER_DELAY_MS; what the
    child's execve would refuse (NUL, an env name with '=' or empty) is refused up front; a bad
    key fails loading (PLUGIN_CONFIG) with the documented text."""
    with pytest.raises(PluginError) as caught:
        async with scripted_host(
            "subagent",
            "subagent-acp",
            modules=MODULES,
            config={"subagent-acp": fake_config(**changes)},
        ):
            pass
    assert caught.value.code == "PLUGIN_CONFIG"
    assert message in str(caught.value)


# -- ACP-5: cancellation and failures after publication -------------------------------------------


async def test_abort_settles_at_once_even_if_the_child_ignores_cancel() -> None:
    """ACP-5, acp 16.3: an abort after publication settles aborted without waiting for a child
    that ignores session/cancel; dispose then reaps it."""
    async with acp_host("--prompt", "ignore-cancel", "--hold-eof", dispose_eof_grace_ms=50) as b:
        controller = AbortController()
        run = await b.start(signal=controller.signal)
        controller.abort("enough")
        assert run.result.done()
        assert (await run.result).stop_reason == "aborted"
        async with asyncio.timeout(10):
            await run.dispose()
        assert_reaped(run.pid)  # type: ignore[attr-defined]


async def test_slow_child_cancelled_keeps_partial_text() -> None:
    """ACP-5: a slow child answers the cancel; the run is aborted with what it streamed."""
    async with acp_host("--prompt", "slow") as b:
        run = await b.start()
        async with asyncio.timeout(10):
            await run.dispose()
        result = await run.result
        assert result.stop_reason == "aborted"
        assert_reaped(run.pid)  # type: ignore[attr-defined]


async def test_crash_without_cancel_is_an_error(caplog: pytest.LogCaptureFixture) -> None:
    """ACP-5, acp 16.3: a child dying mid-prompt settles error with a bounded diagnostic and a
    logged warning; result never rejects."""
    async with acp_host("--prompt", "crash") as b:
        run = await b.start()
        try:
            async with asyncio.timeout(10):
                result = await run.result
        finally:
            await run.dispose()
        assert result.stop_reason == "error"
        assert result.diagnostic is not None
        assert len(result.diagnostic.encode()) <= 4096
        assert "exited with status 3" in result.diagnostic or "closed" in result.diagnostic
        assert_reaped(run.pid)  # type: ignore[attr-defined]
    assert any(
        r.levelname == "WARNING" and 'subagent-acp "acp": child run failed (error): ' in r.message
        for r in caplog.records
    )


async def test_crash_after_cancel_is_aborted() -> None:
    """ACP-5: a child that crashes after a cancel still gives aborted."""
    async with acp_host("--prompt", "slow") as b:
        controller = AbortController()
        run = await b.start(signal=controller.signal)
        controller.abort("stop")
        os.kill(run.pid, signal.SIGKILL)  # type: ignore[attr-defined]
        async with asyncio.timeout(10):
            await run.dispose()
        assert (await run.result).stop_reason == "aborted"


async def test_dispose_after_the_child_died_under_a_cancel() -> None:
    """ACP-5/7: a child killed before the cancel reached it leaves a broken pipe; dispose
    still completes and the run is aborted."""
    async with acp_host("--prompt", "slow") as b:
        controller = AbortController()
        run = await b.start(signal=controller.signal)
        ended = _ended(run.pid)  # type: ignore[attr-defined]
        os.kill(run.pid, signal.SIGKILL)  # type: ignore[attr-defined]
        async with asyncio.timeout(10):
            await ended.wait()
        controller.abort("stop")  # session/cancel now goes to a dead pipe
        async with asyncio.timeout(10):
            await run.dispose()
        assert (await run.result).stop_reason == "aborted"


async def test_a_child_that_answers_then_exits_at_once_completed() -> None:
    """ACP-3/5: a one-shot child that answers the prompt and exits at once is completed: its
    answer, written before it left, is read even when its exit is seen first."""
    async with acp_host("--prompt", "answer-exit") as b:
        run = await b.start()
        try:
            async with asyncio.timeout(10):
                result = await run.result
        finally:
            await run.dispose()
        assert (result.stop_reason, blocks_text(result.output)) == ("completed", "done")
        assert_reaped(run.pid)  # type: ignore[attr-defined]


async def test_a_descendant_keeping_the_pipes_hangs_neither_result_nor_dispose(
    tmp_path: Path,
) -> None:
    """ACP-5/7: a child that crashes while a descendant outside its process group keeps its
    stdout and stderr open still settles error with its exit status, and dispose still ends
    (the child's exit, not its pipes' end, is waited for); the child is reaped."""
    pidfile = tmp_path / "pid"
    async with acp_host(
        "--prompt", "crash", "--daemon", env={"FAKE_ACP_PIDFILE": str(pidfile)},
        dispose_eof_grace_ms=100, dispose_grace_ms=100,
    ) as b:  # fmt: skip
        run = await b.start()
        daemon = _read_pid(Path(str(pidfile) + ".daemon"))
        try:
            async with asyncio.timeout(10):
                result = await run.result
            async with asyncio.timeout(10):
                await run.dispose()
        finally:
            os.kill(daemon, signal.SIGKILL)
        assert result.stop_reason == "error"
        assert result.diagnostic == "the ACP child exited with status 3"
        assert_reaped(run.pid)  # type: ignore[attr-defined]


async def test_refused_prompt_is_an_error() -> None:
    """ACP-5: a prompt the child answers with a JSON-RPC error settles error; the diagnostic
    has the code and one bounded line of the message, never the error's data."""
    async with acp_host("--prompt", "refuse") as b:
        run = await b.start()
        try:
            result = await run.result
        finally:
            await run.dispose()
        assert result.stop_reason == "error"
        assert result.diagnostic is not None
        assert result.diagnostic.startswith("the ACP child answered with error -32603: no because")
        assert "\n" not in result.diagnostic and "SECRET-DATA" not in result.diagnostic
        assert len(result.diagnostic) < 300


async def test_garbage_on_stdout_is_skipped() -> None:
    """acp 16.3: lines that are not JSON-RPC are skipped; the run still completes."""
    async with acp_host("--garbage") as b:
        run = await b.start("still here")
        try:
            async with asyncio.timeout(10):
                result = await run.result
        finally:
            await run.dispose()
        assert result.stop_reason == "completed"
        assert blocks_text(result.output) == "echo: still here"


@pytest.mark.parametrize(
    ("mode", "text"),
    [
        ("foreign-ids", "after foreign ids"),
        ("other-session", "for you"),
        ("non-utf8", "caf\u00e9"),
        ("big", "y" * (3 << 20)),
        ("malformed", "after malformed"),
    ],
)
async def test_a_hostile_peer_still_completes(mode: str, text: str) -> None:
    """ACP-3, acp 16.3, ROB-30: answers to ids never requested are dropped, updates for
    another session are not output, a line that is not UTF-8 is skipped, a message larger
    than the stream limit (1 MiB) is read whole, and JSON that is no JSON-RPC message (an
    array, an id that is an array) is refused without closing the connection (it settled
    error); the run completes with exactly its own text."""
    async with acp_host("--prompt", mode) as b:
        run = await b.start()
        try:
            async with asyncio.timeout(10):
                result = await run.result
        finally:
            await run.dispose()
        assert (result.stop_reason, blocks_text(result.output)) == ("completed", text)
        assert_reaped(run.pid)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("mode", "diagnostic"),
    [
        ("exit0", "the ACP child exited with status 0"),
        ("close-stdout", "the connection to the ACP child closed"),
        ("long-stop", "the ACP child's answer does not fit the protocol"),
        ("bad-error", "the ACP child answered with error -32603: Malformed error response"),
    ],
)
async def test_a_broken_peer_settles_error(mode: str, diagnostic: str) -> None:
    """ACP-5, ROB-34: a child that exits 0 without answering, closes its stdout but keeps
    running, answers a stop reason off the protocol, or answers with an error that is no
    error object (which ended the SDK's message loop) settles error with a diagnostic of at
    most 4096 bytes; dispose reaps it, even the one still running with its stdin unread."""
    async with acp_host("--prompt", mode, dispose_eof_grace_ms=100, dispose_grace_ms=3000) as b:
        run = await b.start()
        try:
            async with asyncio.timeout(10):
                result = await run.result
        finally:
            async with asyncio.timeout(10):
                await run.dispose()
        assert (result.stop_reason, result.diagnostic) == ("error", diagnostic)
        assert len(diagnostic.encode()) <= 4096
        assert_reaped(run.pid)  # type: ignore[attr-defined]


class _Logs(logging.Handler):
    """Every record logged anywhere while it is installed on the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def warnings(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= logging.WARNING]

    def assert_no_traceback(self) -> None:
        """No record carries a traceback, and nothing reached the root logger itself."""
        assert [r for r in self.records if r.exc_info] == []
        assert [r for r in self.records if r.name == "root"] == []


@pytest.fixture
def logs() -> Iterator[_Logs]:
    handler = _Logs()
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


async def _completed(b: Booted, prompt: str = "hi") -> tuple[SubagentRun, str]:
    run = await b.start(prompt)
    try:
        async with asyncio.timeout(10):
            result = await run.result
    finally:
        await run.dispose()
    assert result.stop_reason == "completed", result.diagnostic
    return run, blocks_text(result.output)


async def test_junk_from_the_child_is_answered_and_the_run_completes(
    logs: _Logs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ROB-30: each line of JSON that is no JSON-RPC object the child writes (a number, a
    string, an array, null, a batch array, an object with neither method nor id, an id that
    is an array) is answered -32600 with id null, a line that is not JSON -32700, each logged
    once in one line naming the child's pid; `$/cancel_request` and notifications the SDK
    cannot route are quiet; the run completes (the child settled error a second later)."""
    monkeypatch.syspath_prepend(str(Path(FAKE_AGENT).parent))
    from fake_acp_agent import JUNK

    async with acp_host("--prompt", "junk") as b:
        run, text = await _completed(b)
    expected = [f"None:{code}" for _, code in JUNK if code is not None]
    assert text.split() == expected
    logs.assert_no_traceback()
    bad = [w for w in logs.warnings() if "answered" in w]
    assert len(bad) == len(expected)
    assert all(f"child (pid {run.pid})" in w for w in bad)  # type: ignore[attr-defined]
    assert all("\n" not in w for w in logs.warnings())
    assert not [w for w in logs.warnings() if "cancel_request" in w]


async def test_a_prompt_the_wire_cannot_carry_reaches_the_child_repaired(logs: _Logs) -> None:
    """ROB-32: a prompt holding a lone surrogate reaches the child as valid UTF-8 with U+FFFD
    in its place, never a `\\ud800` escape; one warning for the connection."""
    async with acp_host("--prompt", "raw-prompt") as b:
        _, line = await _completed(b, "one \ud800 two")
    assert "\\ud800" not in line.lower() and "one \ufffd two" in line
    logs.assert_no_traceback()
    assert len([w for w in logs.warnings() if "U+FFFD" in w]) == 1


async def test_lone_surrogates_from_the_child_are_read_as_replacement_characters(
    logs: _Logs,
) -> None:
    """ROB-33: a chunk whose text escapes a lone surrogate (`"\\ud800"`) is read with U+FFFD
    in its place: the output can go anywhere (a model request, the terminal); one warning."""
    async with acp_host("--prompt", "surrogate-in") as b:
        _, text = await _completed(b)
    assert text == "in \ufffd put"
    text.encode("utf-8")
    logs.assert_no_traceback()
    assert len([w for w in logs.warnings() if "U+FFFD" in w]) == 1


# -- ACP-6: permission ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("permission", "no_allow", "stop_reason", "text"),
    [
        ("reject", False, "aborted", "permission: cancelled"),
        ("allow", False, "completed", "permission: selected yes"),
        ("allow", True, "aborted", "permission: cancelled"),
        ("allow", None, "aborted", "permission: cancelled"),
    ],
)
async def test_permission_is_answered_by_policy(
    permission: str, no_allow: bool | None, stop_reason: str, text: str
) -> None:
    """ACP-6: reject answers cancelled (the turn ends aborted); allow picks the first allow
    option, or answers cancelled when none is offered (``None``: no option at all)."""
    env = {"FAKE_ACP_NO_ALLOW": "1"} if no_allow else {}
    mode = "no-options" if no_allow is None else "permission"
    async with acp_host("--prompt", mode, permission=permission, env=env) as b:
        run = await b.start()
        try:
            async with asyncio.timeout(10):
                result = await run.result
        finally:
            await run.dispose()
        assert result.stop_reason == stop_reason
        assert blocks_text(result.output) == text


# -- ACP-7: disposal ------------------------------------------------------------------------------


async def test_dispose_is_idempotent() -> None:
    """ACP-7: concurrent and repeated dispose calls share one disposal."""
    async with acp_host("--prompt", "slow") as b:
        run = await b.start()
        async with asyncio.timeout(10):
            await asyncio.gather(run.dispose(), run.dispose())
            await run.dispose()
        assert_reaped(run.pid)  # type: ignore[attr-defined]


async def test_sigterm_trap_gets_sigkill_within_the_graces(tmp_path: Path) -> None:
    """ACP-7, §7: a child that ignores EOF and traps SIGTERM is SIGKILLed after the graces,
    and so is a SIGTERM-proof grandchild in its process group."""
    pidfile = tmp_path / "pid"
    async with acp_host(
        "--prompt",
        "ignore-cancel",
        "--hold-eof",
        "--trap-term",
        "--grandchild",
        env={"FAKE_ACP_PIDFILE": str(pidfile)},
        dispose_eof_grace_ms=100,
        dispose_grace_ms=100,
    ) as b:
        run = await b.start()
        grandchild = _read_pid(Path(str(pidfile) + ".grandchild"))
        ended = _ended(grandchild)
        async with asyncio.timeout(10):
            await run.dispose()
        assert (await run.result).stop_reason == "aborted"
        assert_reaped(run.pid)  # type: ignore[attr-defined]
        async with asyncio.timeout(10):  # not our child: its end is seen through a pidfd
            await ended.wait()


async def test_the_eof_window_lets_a_child_flush(capfd: pytest.CaptureFixture[str]) -> None:
    """ACP-7, §7: the EOF grace, not the SIGTERM grace, bounds a child finishing its work
    after stdin closed: it flushes and exits by itself, unsignalled."""
    async with acp_host("--linger-ms", "300", dispose_eof_grace_ms=5000, dispose_grace_ms=50) as b:
        run = await b.start()
        assert (await run.result).stop_reason == "completed"
        async with asyncio.timeout(10):
            await run.dispose()
        assert_reaped(run.pid)  # type: ignore[attr-defined]
    assert f"[acp {run.pid}] flushed after EOF" in capfd.readouterr().err  # type: ignore[attr-defined]


async def test_completed_child_exits_at_eof(monkeypatch: pytest.MonkeyPatch) -> None:
    """ACP-7: dispose closes stdin first; a polite child leaves by itself (exit status 0)
    within the EOF grace: no signal is ever sent to it or its process group."""
    sent: list[tuple[str, int, int]] = []
    kill, killpg = os.kill, os.killpg

    def spy_kill(pid: int, sig: int) -> None:
        if sig:  # signal 0 only probes whether the group is alive
            sent.append(("kill", pid, sig))
        kill(pid, sig)

    def spy_killpg(pgid: int, sig: int) -> None:
        if sig:
            sent.append(("killpg", pgid, sig))
        killpg(pgid, sig)

    children: list[ChildProcess] = []
    spawn = ChildProcess.spawn

    async def recording_spawn(*args: Any, **kwargs: Any) -> ChildProcess:
        child = await spawn(*args, **kwargs)
        children.append(child)
        return child

    monkeypatch.setattr(ChildProcess, "spawn", recording_spawn)
    monkeypatch.setattr(os, "kill", spy_kill)
    monkeypatch.setattr(os, "killpg", spy_killpg)
    async with acp_host(dispose_eof_grace_ms=30_000, dispose_grace_ms=5000) as b:
        run = await b.start()
        assert (await run.result).stop_reason == "completed"
        async with asyncio.timeout(60):  # a bound, not the proof: the proof is below
            await run.dispose()
        assert_reaped(run.pid)  # type: ignore[attr-defined]
    (child,) = children
    assert child.pid == run.pid  # type: ignore[attr-defined]
    assert sent == []
    assert (child.signalled, child.exit_status()) == (False, 0)


# -- ACP-8: environment and stderr ----------------------------------------------------------------


def test_credential_names() -> None:
    """ACP-8: credential-shaped names are recognised; ordinary ones are not."""
    for name in ("DEEPSEEK_API_KEY", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "PGPASSWORD",
                 "SSH_AUTH_SOCK", "MY_PASS", "OPENAI_APIKEY", "MYSQL_PWD", "GPG_PASSPHRASE",
                 "CI_JOB_JWT", "AZURE_STORAGE_CONNECTION_STRING"):  # fmt: skip
        assert is_credential_name(name), name
    for name in ("PATH", "HOME", "MONKEY_BUSINESS", "KEYBOARD", "LANG", "TERM", "PWD", "OLDPWD"):
        assert not is_credential_name(name), name


async def test_child_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    """ACP-8: ambient credentials and DSH_* are scrubbed; explicit env (even credentials and
    DSH_*) is merged after the scrub."""
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "ambient-secret")
    monkeypatch.setenv("DSH_AMBIENT", "ambient")
    monkeypatch.setenv("PLAIN_SETTING", "kept")
    explicit = {"DEEPSEEK_API_KEY": "given", "DSH_CHILD": "given"}
    async with acp_host("--prompt", "env", env=explicit) as b:
        run = await b.start()
        try:
            env = (await _report(run))["env"]
        finally:
            await run.dispose()
    assert "SOME_SERVICE_TOKEN" not in env and "DSH_AMBIENT" not in env
    assert env["PLAIN_SETTING"] == "kept"
    assert env["DEEPSEEK_API_KEY"] == "given" and env["DSH_CHILD"] == "given"


async def test_stderr_is_relayed_line_prefixed(capfd: pytest.CaptureFixture[str]) -> None:
    """ACP-8: the child's stderr reaches ours, each line prefixed with the provider and pid."""
    async with acp_host("--say", "hello from the child") as b:
        run = await b.start()
        try:
            await run.result
        finally:
            await run.dispose()
    err = capfd.readouterr().err
    assert f"[acp {run.pid}] hello from the child\n" in err  # type: ignore[attr-defined]


async def test_stderr_flood_never_blocks_the_child(capfd: pytest.CaptureFixture[str]) -> None:
    """acp 16.3: a child writing far more stderr than a pipe holds still completes."""
    async with acp_host("--flood-stderr", "3000") as b:
        run = await b.start("after the flood")
        try:
            async with asyncio.timeout(10):
                result = await run.result
        finally:
            await run.dispose()
        assert result.stop_reason == "completed"
    assert capfd.readouterr().err.count("x" * 200) == 3000


# -- ACPC-3, 4, 7, 8, 9: the protocol gaps interop found ---------------------------------------


async def test_no_cancel_is_sent_to_a_child_whose_turn_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACPC-3: disposing a child whose prompt was answered sends no session/cancel (a
    long-lived child would take it for its next turn's); aborting a running one still does."""
    log = tmp_path / "methods"
    monkeypatch.setenv("FAKE_ACP_METHODS", str(log))
    async with acp_host() as b:
        run = await b.start()
        async with asyncio.timeout(10):
            assert (await run.result).stop_reason == "completed"
            await run.dispose()
    assert log.read_text().split() == ["initialize", "session/new", "session/prompt"]
    log.unlink()
    async with acp_host("--prompt", "slow") as b:
        run = await b.start()
        async with asyncio.timeout(10):
            await run.dispose()
        assert (await run.result).stop_reason == "aborted"
    assert log.read_text().split()[-1] == "session/cancel"


async def test_terminal_requests_are_method_not_found() -> None:
    """ACPC-4: the client advertises no terminal, so a child's terminal/create is answered
    -32601 "Method not found" (not the SDK's default null result)."""
    async with acp_host("--prompt", "terminal") as b:
        run = await b.start()
        try:
            async with asyncio.timeout(10):
                result = await run.result
        finally:
            await run.dispose()
    error = json.loads(blocks_text(result.output))
    assert error["code"] == -32601
    assert error["message"] == "Method not found"


@pytest.mark.parametrize(("mode", "output"), [("turns", "final answer"), ("message-ids", "two")])
async def test_a_prompt_spanning_several_messages_outputs_the_last(mode: str, output: str) -> None:
    """ACPC-8: when one prompt spans several turns or messages of the child (a user message
    between them, or a new messageId), the output is the last message's text, not all of
    them run together."""
    async with acp_host("--prompt", mode) as b:
        run = await b.start()
        try:
            async with asyncio.timeout(10):
                result = await run.result
        finally:
            await run.dispose()
    assert result.stop_reason == "completed"
    assert result.output == (TextBlock(text=output),)


def test_credential_values_are_recognised() -> None:
    """ACPC-7: values that hold a credential are recognised whatever their variable is
    called; ordinary values (a proxy without a password, a path, an e-mail) are not."""
    for value in (
        "postgres://u:pw@db.internal:5432/app",
        "http://proxyuser:hunter2@proxy:3128",
        "https://x-access-token@github.com/org/repo.git",
        "Bearer abcdefghijklmnop",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA",
        "ghp_" + "a" * 36,
        "sk-" + "b" * 40,
        "AKIA" + "C" * 16,
    ):
        assert is_credential_value(value), value
    for value in ("http://proxy:3128", "/usr/bin:/bin", "https://example.com/a@b",
                  "git@github.com:org/repo.git", "someone@example.com", "en_US.UTF-8",
                  "/run/user/1000/ssh-agent.socket"):  # fmt: skip
        assert not is_credential_value(value), value


async def test_credentials_inside_values_are_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    """ACPC-7: a variable whose value holds a credential (a database URL with a password, a
    proxy URL with one) does not reach the child; SSH_AUTH_SOCK is dropped unless pass_env
    names it; explicit env is given as it is."""
    monkeypatch.setenv("DATABASE_URL", "postgres://u:pw@db.internal/app")
    monkeypatch.setenv("HTTPS_PROXY", "http://me:hunter2@proxy:3128")
    monkeypatch.setenv("NO_PROXY", "localhost")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/run/agent.sock")
    explicit = {"DATABASE_URL": "postgres://child:given@db/app"}
    async with acp_host("--prompt", "env", env=explicit) as b:
        run = await b.start()
        try:
            env = (await _report(run))["env"]
        finally:
            await run.dispose()
    assert "HTTPS_PROXY" not in env and "SSH_AUTH_SOCK" not in env
    assert env["DATABASE_URL"] == "postgres://child:given@db/app"
    assert env["NO_PROXY"] == "localhost"
    async with acp_host("--prompt", "env", pass_env=["SSH_AUTH_SOCK"]) as b:
        run = await b.start()
        try:
            env = (await _report(run))["env"]
        finally:
            await run.dispose()
    assert env["SSH_AUTH_SOCK"] == "/run/agent.sock"
    assert "DATABASE_URL" not in env
    assert child_environment({}, {"A": "ftp://x:y@h"}, passed=["A"]) == {"A": "ftp://x:y@h"}


async def test_disposing_a_child_that_already_exited_sends_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACPC-9: a child that answered and left by itself is disposed without a cancel and
    without a signal: there is nothing to wait out."""
    sent: list[int] = []
    killpg = os.killpg

    def spy(pgid: int, sig: int) -> None:
        if sig:
            sent.append(sig)
        killpg(pgid, sig)

    monkeypatch.setattr(os, "killpg", spy)
    log = tmp_path / "methods"
    monkeypatch.setenv("FAKE_ACP_METHODS", str(log))
    async with acp_host("--prompt", "answer-exit", dispose_eof_grace_ms=60_000) as b:
        run = await b.start()
        async with asyncio.timeout(10):
            assert (await run.result).stop_reason == "completed"
            await run.dispose()
        assert_reaped(run.pid)  # type: ignore[attr-defined]
    assert sent == []
    assert "session/cancel" not in log.read_text().split()
