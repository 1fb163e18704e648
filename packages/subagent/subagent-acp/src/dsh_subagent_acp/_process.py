"""The child process under an ACP run: a scrubbed environment, stderr relayed line by line,
and the disposal ladder (ACP-7, ACP-8).

The child leads a process group of its own, so the ladder reaches the whole tree it started:
stdin EOF, then up to ``eof_grace`` for the tree to leave; SIGTERM to the group, then up to
``grace``; SIGKILL to the group; then a wait for the child's exit without bound (the kernel
ends a SIGKILLed process, so that wait ends). POSIX only.

The ladder runs only while the host process lives: every group is also registered with this
process's watchdog (``_watchdog``) as soon as it is spawned, and unregistered once its ladder
has finished, so a host that dies without running it still has it run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import Iterable, Mapping

from ._watchdog import WATCHDOG

__all__ = ["ChildProcess", "child_environment", "is_credential_name", "is_credential_value"]

#: Name parts that mark a variable as credential-shaped wherever they appear.
_SECRET_WORDS = (
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "PRIVATE_KEY", "APIKEY",
    "CONNECTION_STRING",
)  # fmt: skip
#: Name parts that mark a variable only as a whole ``_``-separated word (``API_KEY``, not
#: ``MONKEY``; ``MYSQL_PWD``, not ``OLDPWD``).
_SECRET_PARTS = frozenset(
    {"KEY", "AUTH", "PASS", "PAT", "PWD", "JWT", "COOKIE", "SESSIONID", "DSN"}
)
#: Names a part would mark, that are no credential: the shell's working directory.
_NOT_SECRETS = frozenset({"PWD"})
#: How much of a line without a newline the relay keeps before writing it out anyway.
_LINE_LIMIT = 8192
#: How often the ladder looks whether the rest of the group has gone (a group has no waitable
#: handle), while its graces run.
_POLL_S = 0.01


def is_credential_name(name: str) -> bool:
    """Whether an environment variable's name looks like it holds a credential (ACP-8)."""
    upper = name.upper()
    if any(word in upper for word in _SECRET_WORDS):
        return True
    return upper not in _NOT_SECRETS and any(part in _SECRET_PARTS for part in upper.split("_"))


#: Values that carry a credential whatever the variable is called (ACPC-7): a URL with
#: userinfo (``postgres://user:pw@host``, ``https://token@host``, a proxy with a password),
#: an HTTP ``Authorization`` value, a private key, and tokens of well-known shapes.
_SECRET_VALUE = re.compile(
    r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s]+@"  # scheme://userinfo@
    r"|\b(?:Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}"  # an Authorization value
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[abpr]-[A-Za-z0-9-]{10,}|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16})"
)


def is_credential_value(value: str) -> bool:
    """Whether a variable's value holds a credential, whatever its name (ACPC-7)."""
    return _SECRET_VALUE.search(value) is not None


def child_environment(
    explicit: Mapping[str, str],
    parent: Mapping[str, str] | None = None,
    passed: Iterable[str] = (),
) -> dict[str, str]:
    """ACP-8, ACPC-7: the parent's environment without ``DSH_*`` variables, credential-shaped
    names and values that hold a credential; the names in ``passed`` are kept as they are
    (the config's ``pass_env``); then ``explicit`` merged over it (explicit entries win,
    whatever their names or values)."""
    source = os.environ if parent is None else parent
    keep = frozenset(passed)
    env = {
        k: v
        for k, v in source.items()
        if k in keep
        or not (k.startswith("DSH_") or is_credential_name(k) or is_credential_value(v))
    }
    env.update(explicit)
    return env


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """The stream protocol of ``create_subprocess_exec``, which also says when the process
    exits. ``Process.wait()`` resolves only once every pipe has closed too, which a descendant
    that left the process group and kept the child's stdout or stderr never lets happen."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exit: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exit.done():
            self.exit.set_result(None)


class ChildProcess:
    """One spawned ACP agent: its pipes, its stderr relay and its disposal ladder."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        label: str,
        transport: asyncio.SubprocessTransport,
        exited: asyncio.Future[None],
    ) -> None:
        self.process = process
        self.pid = process.pid
        self._label = label
        self._transport = transport
        self._exited = asyncio.ensure_future(self._exit_status(exited))
        assert process.stderr is not None
        self._relay = asyncio.ensure_future(self._relay_stderr(process.stderr))
        self._terminated: asyncio.Future[None] | None = None
        #: Whether the ladder had to signal the group (the exit status is then ours).
        self.signalled = False

    @classmethod
    async def spawn(
        cls,
        command: str,
        args: list[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        label: str,
        eof_grace: float,
        grace: float,
    ) -> ChildProcess:
        """Start ``command`` in its own process group with piped stdio (OSError if it cannot),
        registered with the watchdog under the ladder's graces (ACPC-82) before it is
        returned."""
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.subprocess_exec(
            lambda: _ExitProtocol(limit=1 << 20, loop=loop),
            command,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
        )
        process = asyncio.subprocess.Process(transport, protocol, loop)
        WATCHDOG.register(process.pid, eof_grace, grace)
        return cls(process, label, transport, protocol.exit)

    async def _exit_status(self, exited: asyncio.Future[None]) -> int:
        await exited
        status = self._transport.get_returncode()
        assert status is not None
        return status

    @property
    def exited(self) -> asyncio.Future[int]:
        """Resolves with the exit status once the child has exited (and been reaped), whether
        or not its pipes have closed."""
        return self._exited

    async def _relay_stderr(self, stream: asyncio.StreamReader) -> None:
        """Copy the child's stderr to ours, each line prefixed with who wrote it. Always
        reading, so a child that floods stderr never blocks on a full pipe."""
        prefix = f"[{self._label} {self.pid}] "
        pending = b""
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                break
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            if len(pending) > _LINE_LIMIT:
                lines.append(pending)
                pending = b""
            if lines:
                out = sys.stderr
                out.write(
                    "".join(prefix + line.decode("utf-8", "replace") + "\n" for line in lines)
                )
                out.flush()
        if pending:
            sys.stderr.write(prefix + pending.decode("utf-8", "replace") + "\n")
            sys.stderr.flush()

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # a member we may not signal: treat it as gone
            return False
        return True

    def _signal_group(self, sig: signal.Signals) -> None:
        self.signalled = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    async def _tree_gone_within(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the child to exit and its group to empty."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        if not self._exited.done():
            await asyncio.wait({self._exited}, timeout=seconds)
            if not self._exited.done():
                return False
        while self._group_alive():
            left = deadline - loop.time()
            if left <= 0:
                return False
            await asyncio.sleep(min(_POLL_S, left))
        return True

    def terminate(self, *, eof_grace: float, grace: float) -> asyncio.Future[None]:
        """ACP-7: the disposal ladder (idempotent: every call shares the first one's run)."""
        if self._terminated is None:
            self._terminated = asyncio.ensure_future(self._ladder(eof_grace, grace))
        return self._terminated

    async def _ladder(self, eof_grace: float, grace: float) -> None:
        stdin = self.process.stdin
        if stdin is not None:
            with contextlib.suppress(Exception):
                stdin.close()
        if not await self._tree_gone_within(eof_grace):
            self._signal_group(signal.SIGTERM)
            if not await self._tree_gone_within(grace):
                self._signal_group(signal.SIGKILL)
        await self._exited
        # The group is empty, or SIGKILLed: the watchdog has nothing left to do for it.
        WATCHDOG.unregister(self.pid)
        # The relay ends at EOF; a grandchild still holding stderr open must not keep it.
        if not self._relay.done():
            await asyncio.wait({self._relay}, timeout=0.2)
            self._relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._relay
        # Release our ends of the pipes, which a descendant outside the group may still hold.
        self._transport.close()

    def exit_status(self) -> int | None:
        """The status the child exited with by itself (``None``: running, or ended by us)."""
        if self.signalled or not self._exited.done():
            return None
        return self._exited.result()
