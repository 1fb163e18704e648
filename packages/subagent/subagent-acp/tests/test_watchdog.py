"""subagent-acp: the watchdog process that ends a killed host's agent process groups
(ACPC-82..86).

The watchdog program is driven directly (its protocol: a group registered, unregistered,
gone; EOF); the host's side in this process (registration at spawn, unregistration at the end
of the ladder, a watchdog that died, cannot start or stopped reading, a fork); and a host in a
process of its own (``watchdog_host.py``) is killed with SIGKILL: every agent, grandchild and
pooled process it started is gone within the bound, and children it disposed are left alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dsh_subagent_acp import _process, _watchdog
from dsh_subagent_acp._process import ChildProcess
from dsh_subagent_acp._watchdog import PROGRAM, Watchdog

FAKE_AGENT = str(Path(__file__).with_name("fake_acp_agent.py"))
HOST = str(Path(__file__).with_name("watchdog_host.py"))
BOUND = 20
#: A process group id no system hands out (above Linux's largest ``pid_max``, 2**22).
NO_GROUP = 2**22 + 1


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended: no such process, or a zombie nobody has reaped yet (a
    killed host's orphans are its init's to reap, which may take its time)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "Z"


async def _until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` until it holds, bounded: what is waited for (another process's
    exit, a line another process writes to a file) has nothing to wait on."""
    async with asyncio.timeout(BOUND):
        while not predicate():  # noqa: ASYNC110 - a bounded poll, not a synchronisation
            await asyncio.sleep(0.01)


async def _until_gone(*pids: int) -> None:
    """Until every one of ``pids`` (not our children) has ended."""
    await _until(lambda: all(_gone(pid) for pid in pids))


def _reaped_now(pid: int) -> bool:
    """Whether our child ``pid`` has exited (and is now reaped)."""
    return os.waitpid(pid, os.WNOHANG) != (0, 0)


def _read_int(path: Path) -> int:
    return int(path.read_text())


def _trace(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def _traced(path: Path, line: str) -> list[str]:
    """Until the watchdog has traced ``line``; the trace so far."""
    await _until(lambda: line in _trace(path))
    return _trace(path)


@contextlib.contextmanager
def _agent(*flags: str, pidfile: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A fake agent leading a session and group of its own, its stdin at EOF; killed (group
    and all) and reaped on the way out."""
    env = dict(os.environ)
    if pidfile is not None:
        env["FAKE_ACP_PIDFILE"] = str(pidfile)
    process = subprocess.Popen(
        [sys.executable, FAKE_AGENT, *flags],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


async def _reaped(process: subprocess.Popen[bytes]) -> int:
    """Until our child ``process`` has exited; its status."""
    await _until(lambda: process.poll() is not None)
    return process.returncode


async def _held(path: Path) -> int:
    """Until a fake agent has written its pid file (it is past its start); the pid."""
    await _until(lambda: path.exists() and path.stat().st_size > 0)
    return _read_int(path)


@contextlib.contextmanager
def _watchdog_program(trace: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The watchdog program as the host starts it, its stdin a pipe from us."""
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", PROGRAM, str(os.getpid()), str(trace)],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        assert process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()


def _tell(watchdog: subprocess.Popen[bytes], *lines: str) -> None:
    assert watchdog.stdin is not None
    watchdog.stdin.write("".join(line + "\n" for line in lines).encode())
    watchdog.stdin.flush()


# -- the watchdog program -----------------------------------------------------------------------


async def test_at_eof_the_watchdog_runs_the_ladder_on_every_registered_group(
    tmp_path: Path,
) -> None:
    """ACPC-84: when its stdin closes, the watchdog ends every registered group with the
    ladder, concurrently: SIGTERM after the EOF grace ends an agent that ignores EOF; one that
    also ignores SIGTERM, and its SIGTERM-proof grandchild, get SIGKILL after the grace."""
    trace = tmp_path / "trace"
    pidfile = tmp_path / "agent.pid"
    with (
        _agent("--hold-eof") as held,
        _agent("--hold-eof", "--trap-term", "--grandchild", pidfile=pidfile) as trapped,
        _watchdog_program(trace) as watchdog,
    ):
        await _held(pidfile)
        grandchild = _read_int(Path(str(pidfile) + ".grandchild"))
        _tell(watchdog, f"+{held.pid} 0.05 0.2", f"+{trapped.pid} 0.05 0.2")
        await _traced(trace, f"+{trapped.pid}")
        assert watchdog.stdin is not None
        watchdog.stdin.close()
        # Reaped as they end: an unreaped zombie would still count as a member of its group.
        statuses = await asyncio.gather(_reaped(watchdog), _reaped(held), _reaped(trapped))
        assert statuses == [0, -signal.SIGTERM, -signal.SIGKILL]
        await _until_gone(grandchild)
    lines = _trace(trace)
    assert lines[:3] == [f"+{held.pid}", f"+{trapped.pid}", "eof 2"]
    assert f"term {held.pid}" in lines and f"kill {held.pid}" not in lines
    assert f"term {trapped.pid}" in lines and f"kill {trapped.pid}" in lines
    assert lines[-1] == "exit"


async def test_an_unregistered_group_is_left_alone(tmp_path: Path) -> None:
    """ACPC-83: a group the host unregistered (its own ladder finished with it) is never
    signalled: with nothing registered, the watchdog exits at EOF at once."""
    trace = tmp_path / "trace"
    with _agent("--hold-eof") as held, _watchdog_program(trace) as watchdog:
        _tell(watchdog, f"+{held.pid} 0 0", f"-{held.pid}")
        await _traced(trace, f"-{held.pid}")
        assert watchdog.stdin is not None
        watchdog.stdin.close()
        assert await _reaped(watchdog) == 0
        assert held.poll() is None  # still running: never signalled
    assert _trace(trace) == [f"+{held.pid}", f"-{held.pid}", "eof 0", "exit"]


async def test_the_watchdog_signals_only_groups_it_saw_alive(tmp_path: Path) -> None:
    """ACPC-85: a group that has emptied is forgotten, not signalled (its pgid may be a new
    process's by then): one gone before it was registered, and one gone before EOF."""
    trace = tmp_path / "trace"
    with _agent() as early, _agent("--hold-eof") as late, _watchdog_program(trace) as watchdog:
        await _reaped(early)  # its stdin is at EOF: it leaves by itself
        _tell(watchdog, f"+{early.pid} 0 0", f"+{late.pid} 5 5")
        await _traced(trace, f"+{late.pid}")
        late.kill()
        await _reaped(late)
        assert watchdog.stdin is not None
        watchdog.stdin.close()
        assert await _reaped(watchdog) == 0
    lines = _trace(trace)
    assert lines[0] == f"gone {early.pid}"
    assert f"gone {late.pid}" in lines
    assert not [line for line in lines if line.startswith(("term", "kill"))]


# -- the host's side ----------------------------------------------------------------------------


@pytest.fixture
def watchdog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Watchdog]:
    """A watchdog of the test's own in place of the process's, tracing to ``tmp_path``;
    closed at the end, and each watchdog process it started reaped (bounded)."""
    own = Watchdog()
    own.trace = str(tmp_path / "trace")
    monkeypatch.setattr(_process, "WATCHDOG", own)
    started: list[int] = []
    start = own._start

    def recording_start() -> None:
        start()
        if own.pid is not None:
            started.append(own.pid)

    monkeypatch.setattr(own, "_start", recording_start)
    try:
        yield own
    finally:
        own.close()
        deadline = time.monotonic() + BOUND
        for pid in started:
            with contextlib.suppress(ChildProcessError):  # reaped already
                while not _reaped_now(pid):
                    assert time.monotonic() < deadline, f"watchdog {pid} did not exit"
                    time.sleep(0.01)


async def _spawn(*flags: str) -> ChildProcess:
    return await ChildProcess.spawn(
        sys.executable,
        [FAKE_AGENT, *flags],
        cwd=os.getcwd(),
        env=dict(os.environ),
        label="acp",
        eof_grace=1.0,
        grace=1.0,
    )


async def test_a_spawned_group_is_registered_until_its_ladder_has_finished(
    watchdog: Watchdog, tmp_path: Path
) -> None:
    """ACPC-82, 83: a spawned agent's group is registered before the process is handed out
    (the first spawn starts the watchdog), and unregistered once the ladder has ended it."""
    child = await _spawn("--hold-eof")
    assert set(watchdog.registered) == {child.pid}
    assert watchdog.pid is not None
    await _traced(tmp_path / "trace", f"+{child.pid}")
    await child.terminate(eof_grace=0.05, grace=1.0)
    assert watchdog.registered == {}
    lines = await _traced(tmp_path / "trace", f"-{child.pid}")
    assert lines == [f"+{child.pid}", f"-{child.pid}"]


def test_every_event_loop_of_the_process_shares_one_watchdog(watchdog: Watchdog) -> None:
    """ACPC-82: a process that runs one event loop after another (``asyncio.run`` twice)
    keeps the watchdog the first one started: it belongs to the process, not to a loop."""

    async def spawn_and_dispose() -> int | None:
        child = await _spawn()
        try:
            return watchdog.pid
        finally:
            await child.terminate(eof_grace=1.0, grace=1.0)

    first = asyncio.run(spawn_and_dispose())
    second = asyncio.run(spawn_and_dispose())
    assert first is not None and first == second
    assert watchdog.registered == {}


async def test_a_watchdog_that_died_is_started_again_and_told_every_group(
    watchdog: Watchdog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ACPC-86: the next spawn after the watchdog died starts another, which is told every
    group still registered; one warning says so."""
    first = await _spawn("--hold-eof")
    old = watchdog.pid
    assert old is not None
    await _traced(tmp_path / "trace", f"+{first.pid}")
    os.kill(old, signal.SIGKILL)
    await _until(lambda: _reaped_now(old))
    with caplog.at_level(logging.WARNING, "dsh.subagent.acp"):
        second = await _spawn("--hold-eof")
    assert watchdog.pid not in (None, old)
    lines = await _traced(tmp_path / "trace", f"+{second.pid}")
    assert lines == [f"+{first.pid}", f"+{first.pid}", f"+{second.pid}"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"watchdog process (pid {old}) exited" in warnings[0]
    for child in (first, second):
        await child.terminate(eof_grace=0.05, grace=1.0)
    assert watchdog.registered == {}


async def test_a_watchdog_that_cannot_start_leaves_the_agent_unguarded_with_one_warning(
    watchdog: Watchdog, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """ACPC-86: the spawn goes on, as without a watchdog, and one warning (not one per
    spawn) says the agents may outlive a killed host."""

    def fork_fails(*args: object, **kwargs: object) -> None:
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(_watchdog, "_Process", fork_fails)
    with caplog.at_level(logging.WARNING, "dsh.subagent.acp"):
        children = [await _spawn(), await _spawn()]
    assert watchdog.pid is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "could not be started" in warnings[0]
    for child in children:
        await child.terminate(eof_grace=1.0, grace=1.0)
        assert child.exit_status() == 0


async def test_a_watchdog_that_stops_reading_never_blocks_a_registration(
    watchdog: Watchdog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ACPC-86: a watchdog that does not read (stopped) never blocks the host: once its pipe
    is full the lines are queued (one warning), and reach it, with no further registration,
    when it reads again."""
    count = 8000  # about 140 kB of lines: more than a pipe holds
    watchdog.register(NO_GROUP, 1.0, 1.0)
    pid = watchdog.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        with caplog.at_level(logging.WARNING, "dsh.subagent.acp"):
            for n in range(1, count):
                watchdog.register(NO_GROUP + n, 1.0, 1.0)
        assert watchdog._pending  # the pipe is full: the rest waits here
    finally:
        os.kill(pid, signal.SIGCONT)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "reads slowly" in warnings[0]
    lines = await _traced(tmp_path / "trace", f"gone {NO_GROUP + count - 1}")
    assert lines == [f"gone {NO_GROUP + n}" for n in range(count)]
    assert (watchdog.pid, bytes(watchdog._pending)) == (pid, b"")


def test_a_forked_child_of_the_host_closes_its_copy_of_the_pipe(watchdog: Watchdog) -> None:
    """ACPC-86: a process forked from the host (no exec) holds no copy of the watchdog's pipe,
    which would keep the watchdog from seeing the host's end, and forgets the host's groups."""
    watchdog.register(NO_GROUP, 1.0, 1.0)
    fd = watchdog._fd
    assert fd is not None
    read, write = os.pipe()
    with warnings.catch_warnings():  # forking a process with threads: the child only reports
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.fstat(fd)
            held = True
        except OSError:
            held = False
        os.write(write, f"{held} {watchdog.registered} {watchdog.pid}".encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        assert pipe.read() == "False {} None"
    assert os.waitpid(pid, 0)[1] == 0
    watchdog.unregister(NO_GROUP)


# -- a killed host --------------------------------------------------------------------------------


async def _host(mode: str, folder: Path) -> dict[str, object]:
    """Run watchdog_host.py in ``mode`` until it printed its line, then kill -9 it."""
    with (folder / "host.err").open("wb") as err:
        host = await asyncio.create_subprocess_exec(
            sys.executable, HOST, mode, str(folder), stdout=asyncio.subprocess.PIPE, stderr=err
        )
    try:
        assert host.stdout is not None
        async with asyncio.timeout(BOUND):
            line = await host.stdout.readline()
    finally:
        with contextlib.suppress(ProcessLookupError):
            host.kill()
        async with asyncio.timeout(BOUND):
            await host.wait()
    assert line, (folder / "host.err").read_text()
    report: dict[str, object] = json.loads(line)
    return report


async def test_killing_the_host_ends_every_agent_it_started(tmp_path: Path) -> None:
    """ACPC-84: after kill -9 of the host, its watchdog ends an agent that ignores stdin EOF
    (mid-prompt), one that also ignores SIGTERM with a SIGTERM-proof grandchild in its
    group, and a pooled process: each is gone within the bound, and so is the watchdog."""
    report = await _host("orphan", tmp_path)
    pids = report["pids"]
    assert isinstance(pids, list) and len(pids) == 4
    watchdog = report["watchdog"]
    assert isinstance(watchdog, int)
    try:
        await _until_gone(*pids, watchdog)
    finally:  # should it fail: no orphan outlives the test
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    lines = _trace(tmp_path / "trace")
    assert "eof 3" in lines and lines[-1] == "exit"


async def test_a_killed_host_that_disposed_its_agents_leaves_nothing_to_signal(
    tmp_path: Path,
) -> None:
    """ACPC-83: a host that disposed its children and closed its pool (its own ladder ran)
    unregistered each group: killed afterwards, its watchdog exits at EOF and signals
    nothing."""
    report = await _host("disposed", tmp_path)
    watchdog = report["watchdog"]
    assert isinstance(watchdog, int)
    await _until_gone(watchdog)
    lines = _trace(tmp_path / "trace")
    registered = [line[1:] for line in lines if line.startswith("+")]
    assert len(registered) == 3
    assert sorted(line[1:] for line in lines if line.startswith("-")) == sorted(registered)
    assert lines[-2:] == ["eof 0", "exit"]
