"""The host's side of the watchdog process (ACPC-82..86): what ends the ACP agent process
groups of a host process that died without running their disposal ladder.

The ladder of ``_process`` runs only while the host lives. A host killed with SIGKILL (or one
that crashes hard) leaves each agent only an EOF on its stdin, which many agents ignore. So
the first agent process a host process starts also starts one watchdog for the whole process
(``_watchdog_main``, a standard-library program in a session of its own), shared by every
provider row and event loop of the process. The host writes it ``+PGID EOF_GRACE GRACE``
right after each spawn, before the process is handed out, and ``-PGID`` once its own ladder
has finished with the group. When the host process ends, however it ends, the watchdog's stdin
reaches EOF and it runs the ladder on every group still registered.

Nothing here may fail or hold up a spawn: the pipe's write end is non-blocking (a line the
pipe cannot take now is queued, and a thread writes it as the pipe takes it); a watchdog that
cannot be started leaves the agent unguarded, as before, with one warning; one that has died
is started again and told every group still registered. A forked child of the host closes its
copy of the pipe (the watchdog's EOF must not wait for it) and starts its own watchdog when it
spawns an agent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

__all__ = ["WATCHDOG", "Watchdog"]

_log = logging.getLogger("dsh.subagent.acp")

#: How often queued lines are offered to a pipe that was full.
_FLUSH_S = 0.05
#: The watchdog program, run by path (``ps`` then shows what it is).
PROGRAM = str(Path(__file__).with_name("_watchdog_main.py"))


class _Process(subprocess.Popen[bytes]):
    """The watchdog process: it outlives the host by design, so the "still running" warning
    ``Popen`` gives when collected is not given, and it is not queued to be reaped later."""

    def __del__(self) -> None:
        pass


class Watchdog:
    """The watchdog of this process's agent process groups (one per process: ``WATCHDOG``).

    ``registered`` maps each group the host has not finished with to its line. ``trace``, set
    before the watchdog starts, is a file the watchdog appends what it does to (tests)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: _Process | None = None
        self._fd: int | None = None
        self._pending = bytearray()
        self._warned = False
        self._flusher: threading.Thread | None = None
        self.registered: dict[int, bytes] = {}
        self.trace: str | None = None
        _INSTANCES.add(self)

    @property
    def pid(self) -> int | None:
        """The running watchdog's process id, if one was started."""
        process = self._process
        return None if process is None else process.pid

    def register(self, pgid: int, eof_grace: float, grace: float) -> None:
        """ACPC-82: guard the group ``pgid`` with the ladder's graces (in seconds), starting
        the watchdog if it is not running. Never raises."""
        line = f"+{pgid} {eof_grace!r} {grace!r}\n".encode()
        with self._lock:
            self.registered[pgid] = line
            try:
                if not (self._running() and self._write(line)):
                    self._start()
            except Exception as exc:  # a spawn never fails for its guard
                self._warn(f"the watchdog could not be told: {type(exc).__name__}: {exc}")

    def unregister(self, pgid: int) -> None:
        """ACPC-83: the host's ladder has finished with ``pgid``. Never raises, never starts a
        watchdog (one started later is told only of the groups still registered)."""
        with self._lock:
            if self.registered.pop(pgid, None) is None:
                return
            try:
                if self._running():
                    self._write(f"-{pgid}\n".encode())
            except Exception as exc:
                self._warn(f"the watchdog could not be told: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Close the pipe, as the end of this process would: the watchdog runs the ladder on
        every group still registered, then exits. The next registration starts another."""
        with self._lock:
            self._discard()
            self.registered = {}

    # -- under the lock -------------------------------------------------------------------------

    def _running(self) -> bool:
        """Whether a watchdog runs and reads; one that has exited is reaped and forgotten."""
        process = self._process
        if process is None:
            return False
        if process.poll() is None:
            return True
        self._discard()
        self._warn(
            f"the watchdog process (pid {process.pid}) exited with status "
            f"{process.returncode}; starting another"
        )
        return False

    def _start(self) -> None:
        """Start a watchdog and tell it every registered group (ACPC-86)."""
        argv = [sys.executable, "-I", "-S", PROGRAM, str(os.getpid())]
        if self.trace is not None:
            argv.append(self.trace)
        read, write = os.pipe()
        try:
            self._process = _Process(
                argv,
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                start_new_session=True,
            )
        except (OSError, ValueError) as exc:
            os.close(write)
            self._warn(f"the watchdog process could not be started: {exc}")
            return
        finally:
            os.close(read)
        os.set_blocking(write, False)
        self._fd = write
        self._pending = bytearray()
        self._write(b"".join(self.registered.values()))

    def _write(self, data: bytes) -> bool:
        """Write what the pipe takes now and queue the rest, which a thread writes as the pipe
        takes it (a watchdog that reads, as it always does, leaves the pipe empty); ``False``
        if the watchdog has died."""
        assert self._fd is not None
        self._pending += data
        try:
            written = os.write(self._fd, self._pending)
        except BlockingIOError:
            written = 0
        except BrokenPipeError:
            self._warn(f"the watchdog process (pid {self.pid}) has exited; starting another")
            self._discard()
            return False
        del self._pending[:written]
        if self._pending:
            self._warn("the watchdog process reads slowly; its lines are queued")
            if self._flusher is None:
                self._flusher = threading.Thread(
                    target=self._flush, name="dsh-acp-watchdog-flush", daemon=True
                )
                self._flusher.start()
        return True

    def _flush(self) -> None:
        """In a thread of its own while lines are queued: write them as the pipe takes them
        (the loop's thread never waits for the watchdog)."""
        while True:
            with self._lock:
                if self._fd is None or not self._pending or not self._write(b""):
                    self._flusher = None
                    return
                if not self._pending:
                    self._flusher = None
                    return
            time.sleep(_FLUSH_S)

    def _discard(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None
        self._pending = bytearray()
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(OSError):
                process.poll()

    def _warn(self, what: str) -> None:
        """One warning per process: after it, agents may run unguarded, as they did before."""
        if not self._warned:
            self._warned = True
            _log.warning(
                "subagent-acp: %s (ACP agent processes may outlive a killed host: "
                "docs/acp.md, when the host process is killed)",
                what,
            )

    def _forked(self) -> None:
        """In a forked child: close the inherited pipe (the parent's watchdog must see EOF
        when the parent ends) and forget the parent's groups and watchdog."""
        self._lock = threading.Lock()
        self._flusher = None
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None
        self._pending = bytearray()
        self._process = None
        self.registered = {}


def _forked() -> None:
    for watchdog in list(_INSTANCES):
        watchdog._forked()


_INSTANCES: weakref.WeakSet[Watchdog] = weakref.WeakSet()
os.register_at_fork(after_in_child=_forked)
#: The watchdog of this process: every provider row and event loop shares it.
WATCHDOG = Watchdog()
