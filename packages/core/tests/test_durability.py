"""Durability: checkpoints write a live session's lines through to the file at every
acknowledgement and side-effect boundary; the JSONL store's ``sync`` policy; fail-closed
writes; a file deleted or replaced under its writer."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh_core import PluginError, SessionError, user_message
from dsh_core._agent import Agent, RequestContext
from dsh_core._tools import ToolDefinition, ToolRunContext
from dsh_core.testing import ScriptedReply, ScriptedToolCall, TestHost, scripted_host


def lines_of(path: Path) -> list[dict[str, Any]]:
    """The file's complete lines, parsed, read from outside the store (a torn tail fails)."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), "a torn line"
    return [json.loads(line) for line in data.splitlines()]


def types_in(path: Path) -> list[str]:
    return [line.get("type", "header") for line in lines_of(path)]


def file_of(host: TestHost, agent: Agent) -> Path:
    return Path(host.ctx.session_persistence.root) / f"{agent.session.header.id}.jsonl"


def spliced_ids(path: Path) -> list[str]:
    return [
        m["id"]
        for line in lines_of(path)
        if line.get("type") == "agent/inbox/spliced"
        for m in line["data"].get("inserted", ())
    ]


def jsonl_host(tmp_path: Path, sync: str = "batch", **kw: Any) -> Any:
    return scripted_host(
        store="jsonl",
        store_root=tmp_path,
        config={"session-persistence-jsonl": {"root": str(tmp_path), "sync": sync}},
        **kw,
    )


class FailingWrites:
    """Makes ``os.write`` to chosen fds fail (``ENOSPC``), the first one after writing a few
    bytes, so a partial line is left behind; other fds write as usual."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fds: set[int] = set()
        self.partial = True
        self.failures = 0
        real = os.write

        def write(fd: int, data: Any) -> int:
            if fd in self.fds:
                self.failures += 1
                if self.partial:
                    self.partial = False
                    return real(fd, bytes(data)[:7])
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data)

        monkeypatch.setattr(os, "write", write)

    def fail(self, host: TestHost, agent: Agent) -> None:
        rec = host.ctx.session_persistence._tracked[agent.session.header.id]
        self.fds.add(rec.handle.fd)

    def heal(self) -> None:
        self.fds.clear()


def tool(name: str, body: Callable[[Any, ToolRunContext], Awaitable[Any]]) -> ToolDefinition:
    return ToolDefinition(name=name, description=f"the {name} tool", execute=body)


def call(name: str) -> ScriptedReply:
    return ScriptedReply(tool_calls=(ScriptedToolCall(name=name, id="c1"),))


# -- the call points ----------------------------------------------------------------------------


async def test_an_accepted_message_is_in_the_file_when_the_insert_returns(tmp_path: Path) -> None:
    """DUR-1: inject/followup return only once the splice that accepted the message is written."""
    async with jsonl_host(tmp_path, model=["ok"]) as h:
        agent = (await h.create_agent()).agent
        path = file_of(h, agent)
        injected = user_message("queued")
        agent.inject(injected)
        assert spliced_ids(path) == [injected.id]
        followed = user_message("go")
        agent.followup(followed)
        assert spliced_ids(path) == [injected.id, followed.id]
        await asyncio.wait_for(agent.when_idle(), 30)


async def test_the_request_is_in_the_file_before_the_model_is_called(tmp_path: Path) -> None:
    """DUR-2: the model sees a request only after its request/header and messages are written."""
    seen: list[list[str]] = []
    path: list[Path] = []

    def model(_: Any) -> str:
        seen.append(types_in(path[0]))
        return "ok"

    async with jsonl_host(tmp_path, model=model) as h:
        agent = (await h.create_agent()).agent
        path.append(file_of(h, agent))
        await asyncio.wait_for(h.run(agent, "hi"), 30)
    assert seen[0][-3:] == ["step/start", "user/message", "request/header"]


async def test_a_tool_call_is_in_the_file_before_its_body_runs(tmp_path: Path) -> None:
    """DUR-3: a tool body runs only after its tool/call line is written."""
    seen: list[list[str]] = []
    path: list[Path] = []

    async def body(_: Any, run: ToolRunContext) -> str:
        seen.append(types_in(path[0]))
        return "done"

    async with jsonl_host(tmp_path, model=[call("probe"), "ok"]) as h:
        h.ctx.tools.register(tool("probe", body))
        agent = (await h.create_agent()).agent
        path.append(file_of(h, agent))
        await asyncio.wait_for(h.run(agent, "hi"), 30)
    assert seen[0][-2:] == ["assistant/message", "tool/call"]


async def test_every_turn_end_is_in_the_file_when_the_agent_is_idle(tmp_path: Path) -> None:
    """DUR-4: each turn's turn/end is written as the turn ends, with no flush or disposal."""
    async with jsonl_host(tmp_path, model=["one", "two"]) as h:
        agent = (await h.create_agent()).agent
        path = file_of(h, agent)
        assert types_in(path) == ["header"]  # the header is written at creation
        await asyncio.wait_for(h.run(agent, "a"), 30)
        assert types_in(path).count("turn/end") == 1
        assert types_in(path)[-1] == "turn/end"
        await asyncio.wait_for(h.run(agent, "b"), 30)
        assert len(lines_of(path)) == agent.session.seq + 1  # every event, and the header


# -- sync settings ------------------------------------------------------------------------------


class Syncs:
    """Records each ``os.fsync`` (the thread it ran in) and lets a test wait for one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.seen = threading.Event()
        real = os.fsync

        def fsync(fd: int) -> None:
            self.calls.append(threading.current_thread().name)
            self.seen.set()
            if len(self.calls) == 1:  # only the first sync is held at the gate
                assert self.gate.wait(30), "the test never opened the gate"
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    async def wait(self) -> None:
        loop = asyncio.get_running_loop()
        assert await asyncio.wait_for(loop.run_in_executor(None, self.seen.wait, 30), 31)


async def test_sync_always_syncs_before_the_checkpoint_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-5: with sync = "always" a checkpoint returns after an fsync on the calling thread."""
    async with jsonl_host(tmp_path, "always") as h:
        agent = (await h.create_agent()).agent
        syncs = Syncs(monkeypatch)
        agent.inject(user_message("x"))
        assert syncs.calls and syncs.calls[-1] == threading.current_thread().name
        assert spliced_ids(file_of(h, agent))


async def test_sync_batch_writes_now_and_syncs_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-6: with sync = "batch" a checkpoint writes without syncing; a group commit in a
    worker thread syncs soon after."""
    async with jsonl_host(tmp_path) as h:
        agent = (await h.create_agent()).agent
        syncs = Syncs(monkeypatch)
        agent.inject(user_message("x"))
        assert syncs.calls == []
        assert spliced_ids(file_of(h, agent))
        await syncs.wait()
        assert syncs.calls[0] != threading.current_thread().name


async def test_sync_detach_checkpoints_write_nothing(tmp_path: Path) -> None:
    """DUR-7: with sync = "detach" checkpoints are no-ops; the lines come at disposal."""
    async with jsonl_host(tmp_path, "detach", model=["ok"]) as h:
        handle = await h.create_agent()
        agent = handle.agent
        assert agent.session._checkpointer is None
        path = file_of(h, agent)
        await asyncio.wait_for(h.run(agent, "hi"), 30)
        assert types_in(path) == ["header"]
        await handle.dispose()
        assert types_in(path)[-1] == "turn/end"


async def test_the_memory_store_does_not_checkpoint() -> None:
    """DUR-8: the memory store sets no checkpointer: checkpoint() does nothing."""
    async with scripted_host(model=["ok"]) as h:
        agent = (await h.create_agent()).agent
        assert agent.session._checkpointer is None
        agent.session.checkpoint()


@pytest.mark.parametrize("bad", ["sometimes", "", 1])
async def test_a_bad_sync_setting_is_refused_naming_row_and_key(tmp_path: Path, bad: Any) -> None:
    """DUR-9: a sync value other than always/batch/detach is PLUGIN_CONFIG naming row and key."""
    with pytest.raises(PluginError) as caught:
        async with jsonl_host(tmp_path, bad):
            pass
    assert caught.value.code == "PLUGIN_CONFIG"
    assert "session-persistence-jsonl" in str(caught.value)
    assert "'sync'" in str(caught.value)


async def test_a_flush_after_a_checkpoint_still_syncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-10: a flush returns only after an fsync, even when a checkpoint wrote every line."""
    async with jsonl_host(tmp_path) as h:
        h.ctx.session_persistence._commit_window = 3600  # no group commit during the test
        agent = (await h.create_agent()).agent
        syncs = Syncs(monkeypatch)
        agent.inject(user_message("x"))
        assert syncs.calls == []
        assert await asyncio.wait_for(h.ctx.sessions.flush(agent.session), 30)
        assert syncs.calls  # the first flush of a new file
        syncs.calls.clear()
        agent.inject(user_message("y"))
        assert syncs.calls == []
        assert await asyncio.wait_for(h.ctx.sessions.flush(agent.session), 30)
        assert syncs.calls  # and every later one


async def test_host_close_waits_for_the_group_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-11: closing the host waits until a group commit's fsync under way has finished."""
    h = await TestHost.start(
        store="jsonl",
        store_root=tmp_path,
        config={"session-persistence-jsonl": {"root": str(tmp_path)}},
    )
    agent = (await h.create_agent()).agent
    syncs = Syncs(monkeypatch)
    syncs.gate.clear()
    agent.inject(user_message("x"))
    await syncs.wait()  # the group commit's sync has started and is held
    closing = asyncio.ensure_future(h.aclose())
    done, _ = await asyncio.wait({closing}, timeout=0.2)
    assert not done
    syncs.gate.set()
    await asyncio.wait_for(closing, 30)


# -- fail-closed --------------------------------------------------------------------------------


async def test_a_failed_acceptance_is_refused_and_never_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-12: a full disk at acceptance: followup raises SESSION_IO, the model is not called,
    the message is not pending; once the disk recovers nothing is doubled or torn."""
    async with jsonl_host(tmp_path, model=["ok"]) as h:
        agent = (await h.create_agent()).agent
        writes = FailingWrites(monkeypatch)
        writes.fail(h, agent)
        lost = user_message("lost")
        for _ in range(2):  # fail-closed: the next one fails too, it does not skip lines
            with pytest.raises(SessionError) as caught:
                agent.followup(lost)
            assert caught.value.code == "SESSION_IO"
            assert not agent.inbox.contains(lost.id)
        assert h.model.requests == []
        assert agent.status == "idle"
        writes.heal()
        kept = user_message("kept")
        agent.followup(kept)
        await asyncio.wait_for(agent.when_idle(), 30)
        path = file_of(h, agent)
        stored = lines_of(path)  # complete lines only: the partial one was cut off
        assert [line["seq"] for line in stored[1:]] == list(range(agent.session.seq))
        assert [m.text for m in h.model.requests[0].messages if m.role == "user"] == ["kept"]


async def test_a_failed_checkpoint_before_a_request_keeps_the_model_from_being_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-13: the request's checkpoint fails: the turn ends `error` naming the SessionError
    (SESSION_IO) and the model is never called."""
    async with jsonl_host(tmp_path, model=["ok"]) as h:
        agent = (await h.create_agent()).agent
        writes = FailingWrites(monkeypatch)

        async def route(req: RequestContext, next_: Callable[[], Awaitable[Any]]) -> Any:
            writes.fail(h, agent)  # the disk fills after the message was accepted
            return await next_()

        h.ctx.on("agent/request", route)
        agent.followup(user_message("hi"))
        await asyncio.wait_for(agent.when_idle(), 30)
        assert h.model.requests == []
        end = [e for e in agent.session.events if e.type == "turn/end"][-1]
        assert end.data.reason.kind == "error"
        assert "SessionError [SESSION_IO]" in end.data.reason.error.message
        writes.heal()


async def test_a_failed_checkpoint_before_a_tool_body_gives_an_error_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-14: the tool call's checkpoint fails: the body never runs, the call gets exactly
    one error result (SESSION_IO), and the turn ends."""
    ran: list[str] = []
    state: dict[str, Any] = {}

    async def body(_: Any, run: ToolRunContext) -> str:
        ran.append("probe")
        return "done"

    def model(_: Any) -> ScriptedReply | str:
        if "writes" in state:
            state["writes"].fail(state["host"], state["agent"])  # fails after the request
            del state["writes"]
            return call("probe")
        return "unreachable"

    async with jsonl_host(tmp_path, model=model) as h:
        h.ctx.tools.register(tool("probe", body))
        agent = (await h.create_agent()).agent
        state.update(writes=FailingWrites(monkeypatch), host=h, agent=agent)
        agent.followup(user_message("hi"))
        await asyncio.wait_for(agent.when_idle(), 30)
    assert ran == []
    results = [e for e in agent.session.events if e.type == "tool/result"]
    assert len(results) == 1
    assert results[0].data.error.code == "SESSION_IO"
    assert [e.type for e in agent.session.events].count("tool/call") == 1
    assert [e for e in agent.session.events if e.type == "turn/end"][-1].data.reason.kind == "error"


# -- a file deleted or replaced under its writer ---------------------------------------------


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_a_file_deleted_or_replaced_under_its_writer_fails_every_write(
    tmp_path: Path, how: str
) -> None:
    """DUR-15: a session file deleted or replaced while live: the next checkpoint (and every
    later one) is SESSION_IO naming the file; nothing is written to the lost or the new file."""
    async with jsonl_host(tmp_path) as h:
        agent = (await h.create_agent()).agent
        path = file_of(h, agent)
        agent.inject(user_message("one"))
        path.unlink()
        if how == "replaced":
            path.write_text('{"planted": true}\n')
        for _ in range(2):
            with pytest.raises(SessionError) as caught:
                agent.inject(user_message("two"))
            assert caught.value.code == "SESSION_IO"
            assert str(path) in str(caught.value)
            assert "deleted or replaced" in str(caught.value)
        if how == "replaced":
            assert path.read_text() == '{"planted": true}\n'
        else:
            assert not path.exists()
        assert len(agent.inbox) == 1


# -- a real crash -------------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from dsh_core import user_message
    from dsh_core.testing import scripted_host

    async def main(root):
        async with scripted_host(model=["answered"], store="jsonl", store_root=Path(root)) as h:
            agent = (await h.create_agent(session_id="victim")).agent
            await h.run(agent, "first")
            message = user_message("acknowledged")
            agent.inject(message)
            print("ACK", message.id, flush=True)
            await asyncio.Event().wait()  # killed here

    asyncio.run(main(sys.argv[1]))
    """
)


@pytest.fixture
def child_process(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        assert proc.stdout is not None
        proc.stdout.close()


async def test_what_was_acknowledged_survives_kill_9(
    tmp_path: Path, child_process: subprocess.Popen[str]
) -> None:
    """DUR-16: a process killed with SIGKILL right after an acknowledgement: its file holds
    the answered turn and the acknowledged message."""
    assert child_process.stdout is not None
    loop = asyncio.get_running_loop()
    line = await asyncio.wait_for(loop.run_in_executor(None, child_process.stdout.readline), 60)
    assert line.startswith("ACK "), line
    child_process.send_signal(signal.SIGKILL)
    await asyncio.wait_for(loop.run_in_executor(None, child_process.wait), 30)
    path = tmp_path / "victim.jsonl"
    assert "turn/end" in types_in(path)
    assert spliced_ids(path)[-1] == line.split()[1]
    async with jsonl_host(tmp_path, model=["again"]) as h:
        agent = (await h.resume_agent("victim")).agent
        assert agent.inbox.contains(line.split()[1])


# -- listing a folder while sessions are created; bounded scans -------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="the lock test is POSIX-only")
async def test_a_file_being_created_is_not_reported_as_never_created(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """DUR-17: a listing that meets a session file mid-creation (empty, or its header line
    unfinished while its creator holds the lock) leaves it out without a warning; an
    unlocked file cut inside its header (a crash's remnant) is still reported."""
    import fcntl

    from dsh_core import Context, EventTypeRegistry, Host, SessionStoreService
    from dsh_core._persistence import install_jsonl_persistence

    host = Host()
    ctx = Context(host, host.root)
    ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
    root = tmp_path / "sessions"
    root.mkdir(mode=0o700)
    persistence = install_jsonl_persistence(ctx, root)
    (root / "empty.jsonl").write_bytes(b"")
    creating = root / "creating.jsonl"
    creating.write_bytes(b'{"id":"creating","created_at":1,')
    fd = os.open(creating, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the creator's hold
    try:
        caplog.set_level("WARNING", logger="dsh.sessions")
        found = await asyncio.wait_for(persistence.listing(), 30)
        assert found.headers == () and found.damaged == ()
        assert not [r for r in caplog.records if "never created" in r.getMessage()]
    finally:
        os.close(fd)
    found = await asyncio.wait_for(persistence.listing(), 30)  # now a remnant: reported
    assert found.headers == () and found.damaged == ()
    assert [r for r in caplog.records if "creating.jsonl" in r.getMessage()]
    await ctx.dispose()


class ReadBytes:
    """Counts the bytes ``os.pread`` returns for files under ``root``'s sessions."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.total = 0
        real = os.pread

        def pread(fd: int, size: int, offset: int) -> bytes:
            data = real(fd, size, offset)
            self.total += len(data)
            return data

        monkeypatch.setattr(os, "pread", pread)


async def test_a_bounded_scan_stops_at_the_first_stop_event_of_the_own_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-18: scan(..., until=...) reads a log only up to its first stop event at or after
    its seed_length: a long tail after it is neither read nor returned."""
    from dsh_core import (
        Context,
        EndSeedData,
        EventTypeRegistry,
        Host,
        SessionHeader,
        SessionStoreService,
    )
    from dsh_core._persistence import install_jsonl_persistence
    from dsh_core.testing.strategies import LogBuilder

    host = Host()
    ctx = Context(host, host.root)
    ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
    persistence = install_jsonl_persistence(ctx, tmp_path / "sessions")
    log = LogBuilder()
    log.turn_start()
    log.turn_end()  # in the seed: does not stop the read
    log.add("session/end-seed", EndSeedData())
    log.add("x/mark", {"n": 1}, ignorable=True)
    log.turn_start()
    log.turn_end()
    for n in range(2, 400):
        log.add("x/mark", {"n": n, "pad": "x" * 20_000}, ignorable=True)
    await persistence.create(SessionHeader(id="long", created_at=1, seed_length=2))
    await persistence.append("long", log.events)
    size = (tmp_path / "sessions" / "long.jsonl").stat().st_size
    assert size > 7_000_000
    reads = ReadBytes(monkeypatch)
    [found] = await persistence.scan(["long"], {"x/mark"}, until={"turn/end"})
    assert [e.data["n"] for e in found.events] == [1]
    assert reads.total < 200_000
    [whole] = await persistence.scan(["long"], {"x/mark"})
    assert len(whole.events) == 399
    await ctx.dispose()


@pytest.mark.skipif(sys.platform == "win32", reason="the lock test is POSIX-only")
async def test_a_disposal_never_waits_for_a_group_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-20: while a group commit's sync is under way (held here), disposing the session
    returns and lets go of its file (another holder can lock it); the held sync then
    finishes on a descriptor of its own."""
    import fcntl

    h = await TestHost.start(
        store="jsonl",
        store_root=tmp_path,
        config={"session-persistence-jsonl": {"root": str(tmp_path)}},
    )
    handle = await h.create_agent(session_id="s")
    syncs = Syncs(monkeypatch)
    syncs.gate.clear()
    handle.agent.inject(user_message("x"))
    await syncs.wait()  # the group commit's sync has started and is held
    try:
        await asyncio.wait_for(handle.dispose(), 10)
        fd = os.open(tmp_path / "s.jsonl", os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released: not SESSION_LOCKED
        finally:
            os.close(fd)
    finally:
        syncs.gate.set()
        await asyncio.wait_for(h.aclose(), 30)
    assert spliced_ids(tmp_path / "s.jsonl")


# -- syncs of disposed sessions and folders, batched --------------------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="the lock test is POSIX-only")
async def test_disposals_sync_in_the_group_commit_and_a_bounded_number_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-41: with sync = "batch" a disposed session's last sync waits for the next group
    commit (the disposal returns with its file unlocked); at most the bound of disposals wait
    (each holds a descriptor), past it a disposal syncs on its own; closing the host syncs
    every one that waits."""
    import fcntl

    h = await TestHost.start(
        store="jsonl",
        store_root=tmp_path,
        config={"session-persistence-jsonl": {"root": str(tmp_path)}},
    )
    persistence = h.ctx.session_persistence
    persistence._owed_limit = 2
    keeper = await h.create_agent(session_id="keeper")
    handles = [await h.create_agent(session_id=f"s{i}") for i in range(3)]
    syncs = Syncs(monkeypatch)
    syncs.gate.clear()
    keeper.agent.inject(user_message("x"))
    await syncs.wait()  # a group commit's sync is held: the next one waits for it
    try:
        for handle in handles:
            handle.agent.inject(user_message("y"))
            await asyncio.wait_for(handle.dispose(), 10)
            fd = os.open(tmp_path / f"{handle.agent.session.header.id}.jsonl", os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released: not SESSION_LOCKED
            finally:
                os.close(fd)
        assert [owed.id for owed, _, _ in persistence._owed] == ["s0", "s1"]
    finally:
        syncs.gate.set()
        await asyncio.wait_for(h.aclose(), 30)
    assert not persistence._owed and not persistence._syncs
    for i in range(3):
        assert spliced_ids(tmp_path / f"s{i}.jsonl")


async def test_a_group_commit_syncs_a_folder_once_for_the_files_created_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-42: with sync = "batch" one group commit syncs each new file it covers, spread over
    its jobs, and the folder they were created in once."""
    import stat

    async with jsonl_host(tmp_path) as h:
        persistence = h.ctx.session_persistence
        persistence._commit_window = 3600  # the test runs the commit itself
        persistence._commit_jobs = 2
        agents = [(await h.create_agent()).agent for _ in range(4)]
        calls: list[str] = []
        real = os.fsync

        def counting(fd: int) -> None:
            calls.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
            real(fd)

        monkeypatch.setattr(os, "fsync", counting)
        for agent in agents:
            agent.inject(user_message("x"))
        persistence._commit_timer.cancel()
        persistence._group_commit()
        job = persistence._committing
        assert job is not None
        done, _ = await asyncio.wait({job}, timeout=30)
        assert done
        assert sorted(calls) == ["dir", "file", "file", "file", "file"]
        tracked = persistence._tracked
        assert not any(persistence._dirty(tracked[a.session.header.id].handle) for a in agents)
