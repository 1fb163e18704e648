"""The watchdog of one host process's ACP agent process groups: a program of its own, run as
``python -I -S _watchdog_main.py HOST_PID [TRACE]`` in a session of its own (ACPC-82..86).

It imports the standard library only (no dsh module, no site-packages: ``-S``), so it starts
in a few milliseconds. The host writes it one line per event on its stdin:

- ``+PGID EOF_GRACE GRACE`` (seconds): an agent process group started;
- ``-PGID``: the host's own disposal ladder has finished with that group.

While its stdin is open it checks the registered groups every ``IDLE_POLL_S`` and forgets one
it finds empty, so it only ever signals a group it saw alive moments before (a pgid is a pid,
and the system may give a free pid to a new process, which may lead a group of its own). When
its stdin reaches EOF (the host exited, or was killed: no ladder of its own ran), it runs the
host's disposal ladder on every group still registered, all at once: up to ``EOF_GRACE`` for
the group to leave (each agent saw EOF on its own stdin at the same moment), SIGTERM to the
group, up to ``GRACE``, SIGKILL to the group. Then it exits; with nothing registered, at once.

``HOST_PID`` only names the host in ``ps``. ``TRACE``, a file path, makes it append one line
per thing it does (``+PGID``, ``-PGID``, ``gone PGID``, ``eof N``, ``term PGID``,
``kill PGID``, ``exit``): the tests read it.
"""

from __future__ import annotations

import os
import select
import sys
import time

#: SIGTERM and SIGKILL: their numbers are fixed by POSIX, and the ``signal`` module's import
#: (its enums) would be a fifth of this program's start.
SIGTERM, SIGKILL = 15, 9
#: While the host lives: how often the registered groups are looked at (empty ones forgotten).
IDLE_POLL_S = 1.0
#: While a ladder runs: how often a group is looked at (a group has no waitable handle).
LADDER_POLL_S = 0.01

_trace_path: str | None = None


def trace(line: str) -> None:
    if _trace_path is not None:
        with open(_trace_path, "a") as f:
            f.write(line + "\n")


def alive(pgid: int) -> bool:
    """Whether the group has a member we may signal (one we may not is as good as gone)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def forget_gone(groups: dict[int, tuple[float, float]]) -> None:
    for pgid in [p for p in groups if not alive(p)]:
        del groups[pgid]
        trace(f"gone {pgid}")


def apply(line: bytes, groups: dict[int, tuple[float, float]]) -> None:
    """One line of the host's; a line that does not parse is ignored."""
    words = line.split()
    if not words:
        return
    try:
        pgid = int(words[0][1:])
        if words[0][:1] == b"+" and len(words) == 3:
            eof_grace, grace = float(words[1]), float(words[2])
            if pgid > 1 and alive(pgid):
                groups[pgid] = (eof_grace, grace)
                trace(f"+{pgid}")
            else:
                trace(f"gone {pgid}")
        elif words[0][:1] == b"-" and len(words) == 1 and groups.pop(pgid, None) is not None:
            trace(f"-{pgid}")
    except ValueError:
        return


def watch(groups: dict[int, tuple[float, float]]) -> None:
    """Read the host's lines until EOF, forgetting groups that empty meanwhile."""
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], IDLE_POLL_S)
        if not ready:
            forget_gone(groups)
            continue
        try:
            chunk = os.read(0, 65536)
        except InterruptedError:  # pragma: no cover - PEP 475 retries it
            continue
        except OSError:
            return
        if not chunk:
            return
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            apply(line, groups)


def ladder(groups: dict[int, tuple[float, float]]) -> None:
    """The disposal ladder on every group, concurrently: EOF_GRACE, SIGTERM, GRACE, SIGKILL."""
    start = time.monotonic()
    #: pgid -> [signalled SIGTERM yet, deadline of the current stage, grace after SIGTERM]
    steps = {pgid: [False, start + eof, grace] for pgid, (eof, grace) in groups.items()}
    while steps:
        now = time.monotonic()
        for pgid, step in list(steps.items()):
            if not alive(pgid):
                del steps[pgid]
                trace(f"gone {pgid}")
            elif now >= step[1]:
                if not step[0]:
                    step[0], step[1] = True, now + step[2]
                    trace(f"term {pgid}")
                    signal_group(pgid, SIGTERM)
                else:
                    del steps[pgid]
                    trace(f"kill {pgid}")
                    signal_group(pgid, SIGKILL)
        if steps:
            wake = min(step[1] for step in steps.values())
            time.sleep(max(0.0, min(LADDER_POLL_S, wake - time.monotonic())))


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str]) -> None:
    global _trace_path
    _trace_path = argv[2] if len(argv) > 2 else None
    groups: dict[int, tuple[float, float]] = {}
    watch(groups)
    trace(f"eof {len(groups)}")
    ladder(groups)
    trace("exit")


if __name__ == "__main__":
    main(sys.argv)
