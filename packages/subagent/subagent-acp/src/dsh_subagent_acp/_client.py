"""The ACP side of a run: the client the child talks to, and one run from spawn to reaping.

Imported on the first ``start()`` only: the SDK's generated schema costs most of a second to
import, which a host that never delegates over ACP should not pay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, cast

import acp
from acp.schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    FileSystemCapabilities,
    Implementation,
    PermissionOption,
    RequestPermissionResponse,
    TextContentBlock,
    ToolCallProgress,
    ToolCallStart,
    UserMessageChunk,
)
from pydantic import ValidationError

from dsh_core import AbortedError, AbortSignal, TextBlock, new_id
from dsh_subagent import ResultFuture, SubagentResult, SubagentRun, truncate_diagnostic

from .__about__ import __version__
from ._config import AcpConfig
from ._errors import ABORTED_BEFORE_START, AcpError
from ._process import ChildProcess
from ._wire import GuardedTransport, quiet_notifications

__all__ = ["AcpSubagentRun", "Opened", "Warm", "open_child", "start_acp_run", "warm_up"]

_log = logging.getLogger("dsh.subagent.acp")

#: ACP-3: the child's stop reason, as the seam's.
_STOP_REASONS = {
    "end_turn": "completed",
    "max_tokens": "max-tokens",
    "max_turn_requests": "max-steps",
    "refusal": "refusal",
    "cancelled": "aborted",
}
_ALLOW = ("allow_once", "allow_always")
#: Updates that end an agent message once it has text (ACPC-8): the child's next turn, its
#: tool work or its next thought come between two messages.
_BOUNDARIES = (UserMessageChunk, ToolCallStart, ToolCallProgress, AgentThoughtChunk)
#: How much of a child's JSON-RPC error message a diagnostic repeats (never its ``data``).
_MESSAGE_LIMIT = 200
#: How long the answer of a child that has exited may still take to be read: its stdout's end
#: normally ends the wait at once; a descendant that kept the pipe open, this bound.
_DRAIN_S = 1.0
_CANCELLED = RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))


class AcpSubagentRun(SubagentRun):
    """A published ACP child (ACP-1): ``local_agent`` is ``None``; ``pid`` is its process."""

    __slots__ = ("pid",)

    def __init__(self, *, pid: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pid = pid


class _ParentClient:
    """What the child may ask of us: session updates and permission (ACP-3, ACP-6).

    Nothing else is advertised: ``fs/*`` and ``terminal/*`` are answered "method not found".
    """

    def __init__(self, permission: str) -> None:
        self.permission = permission
        self.session_id: str | None = None
        self.text: list[str] = []
        self.cancelled = False
        #: Updates of a ``session/load`` replay are the past, not output (ACPC-13).
        self.replaying = False
        #: A new message began (ACPC-8): the next text chunk starts the output afresh.
        self.boundary = False
        self.message_id: str | None = None
        #: Called with each text chunk as it is collected (a continuable child streams it).
        self.on_text: Callable[[str], None] | None = None

    def begin(self) -> None:
        """A new prompt: its output starts empty."""
        self.text = []
        self.boundary = False
        self.message_id = None

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        """ACP-3, ACPC-8: the output is the text of the prompt's last agent message.

        A prompt may span several turns of the child (it answered a notice of its own
        before replying, it called tools between messages): a ``user_message_chunk``, a tool
        card, a thought, or a chunk whose ``messageId`` differs from the last one ends a
        message, and the next ``agent_message_chunk`` text starts the output again.
        """
        if session_id != self.session_id or self.replaying:
            return
        if isinstance(update, AgentMessageChunk):
            message_id = update.message_id
            if message_id is not None:
                if self.message_id is not None and message_id != self.message_id:
                    self.boundary = True
                self.message_id = message_id
            if isinstance(update.content, TextContentBlock) and update.content.text:
                if self.boundary:
                    self.boundary = False
                    self.text = []
                self.text.append(update.content.text)
                if self.on_text is not None:
                    self.on_text(update.content.text)
        elif self.text and isinstance(update, _BOUNDARIES):
            self.boundary = True

    async def _not_offered(self, method: str) -> Any:
        raise acp.RequestError.method_not_found(method)

    # ACPC-4: the SDK would answer these optional methods with null or {} (which does not fit
    # CreateTerminalResponse); the capability is not advertised, so they are not found.
    async def create_terminal(self, *args: Any, **kwargs: Any) -> Any:
        return await self._not_offered("terminal/create")

    async def terminal_output(self, *args: Any, **kwargs: Any) -> Any:
        return await self._not_offered("terminal/output")

    async def release_terminal(self, *args: Any, **kwargs: Any) -> Any:
        return await self._not_offered("terminal/release")

    async def wait_for_terminal_exit(self, *args: Any, **kwargs: Any) -> Any:
        return await self._not_offered("terminal/wait_for_exit")

    async def kill_terminal(self, *args: Any, **kwargs: Any) -> Any:
        return await self._not_offered("terminal/kill")

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        """ACP-6: ``reject`` (and any request once a cancel was asked) answers ``cancelled``;
        ``allow`` picks the first allow option, or answers ``cancelled`` when there is none."""
        if self.permission == "allow" and not self.cancelled:
            for option in options:
                if option.kind in _ALLOW:
                    return RequestPermissionResponse(
                        outcome=AllowedOutcome(outcome="selected", option_id=option.option_id)
                    )
        return _CANCELLED

    def output(self) -> tuple[TextBlock, ...]:
        text = "".join(self.text)
        return (TextBlock(text=text),) if text else ()


class _Exited(Exception):
    """Internal: the child exited while we waited on it."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


async def _race(aw: Any, child: ChildProcess, signal: AbortSignal) -> Any:
    """``aw``, unless the child exits (``_Exited``) or ``signal`` fires (``AbortedError``)."""
    task = asyncio.ensure_future(aw)
    aborted = asyncio.ensure_future(signal.wait())
    try:
        await asyncio.wait({task, child.exited, aborted}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        aborted.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    if task.done() and not task.cancelled():
        return task.result()
    if signal.aborted:
        raise AbortedError(signal.reason, ABORTED_BEFORE_START)
    raise _Exited(child.exited.result())


def describe(exc: BaseException, child: ChildProcess) -> str:
    """A diagnostic naming what failed, never the payload that failed it (ACP-5)."""
    status = child.exit_status()
    if isinstance(exc, _Exited | ConnectionError) and status is not None:
        return f"the ACP child exited with status {status}"
    if isinstance(exc, _Exited):
        return "the ACP child was stopped"
    if isinstance(exc, acp.RequestError):  # its code, and a line of its message at most
        message = " ".join(str(exc).split())
        if len(message) > _MESSAGE_LIMIT:
            message = message[: _MESSAGE_LIMIT - 1] + "…"
        return f"the ACP child answered with error {exc.code}: {message}"
    if isinstance(exc, ValidationError):
        return "the ACP child's answer does not fit the protocol"
    if isinstance(exc, ConnectionError):
        return "the connection to the ACP child closed"
    return f"the ACP transport failed: {type(exc).__name__}"


async def _close(conn: Any) -> None:
    """Release the connection; a child that died under it leaves a broken pipe, not a fault."""
    try:
        await conn.close()
    except Exception as exc:
        _log.debug("closing the ACP connection: %s", type(exc).__name__)


async def reap(child: ChildProcess, conn: Any, config: AcpConfig) -> None:
    """The disposal ladder, then the connection released."""
    await child.terminate(
        eof_grace=config.dispose_eof_grace_ms / 1000, grace=config.dispose_grace_ms / 1000
    )
    await _close(conn)


class Opened:
    """A child that answered ``initialize`` and its session step: its process, connection,
    client, what it advertised, and the ACP session id."""

    __slots__ = ("child", "client", "conn", "init", "session_id")

    def __init__(
        self, child: ChildProcess, conn: Any, client: _ParentClient, init: Any, session_id: str
    ) -> None:
        self.child = child
        self.conn = conn
        self.client = client
        self.init = init
        self.session_id = session_id


#: The session step of :func:`open_child`: given the connection and what ``initialize``
#: answered, the step's name and the awaitable that yields the ACP session id.
SessionStep = Callable[[Any, Any, _ParentClient], tuple[str, Any]]


def new_session_step(cwd: str) -> SessionStep:
    """``session/new`` in ``cwd``."""

    async def create(conn: Any) -> str | None:
        try:
            created = await conn.new_session(cwd=cwd, mcp_servers=[])
        except ValidationError:
            return None
        session_id = getattr(created, "session_id", None)
        return session_id if isinstance(session_id, str) and session_id else None

    return lambda conn, init, client: ("session/new", create(conn))


def load_session_step(name: str, child_id: str, session_id: str, cwd: str) -> SessionStep:
    """ACPC-13/14: ``session/load`` of ``session_id`` (its replayed updates are the past, not
    output), or ``session/resume`` where only that is advertised; an agent that can do
    neither is refused with ``ACP_NOT_RESUMABLE``."""

    async def load(conn: Any, client: _ParentClient) -> str:
        client.session_id = session_id
        client.replaying = True
        try:
            await conn.load_session(cwd=cwd, session_id=session_id, mcp_servers=[])
        finally:
            client.replaying = False
        return session_id

    async def resume(conn: Any) -> str:
        await conn.resume_session(session_id=session_id, cwd=cwd, mcp_servers=[])
        return session_id

    def step(conn: Any, init: Any, client: _ParentClient) -> tuple[str, Any]:
        caps = getattr(init, "agent_capabilities", None)
        if caps is not None and caps.load_session:
            return "session/load", load(conn, client)
        sessions = getattr(caps, "session_capabilities", None)
        if sessions is not None and sessions.resume is not None:
            return "session/resume", resume(conn)
        raise AcpError(
            f"subagent {child_id} cannot be resumed: the process that held its ACP session "
            f"has ended, and the ACP agent of provider {name!r} advertises neither "
            "session/load nor session resume; do not retry send_message with this id",
            code="ACP_NOT_RESUMABLE",
        )

    return step


class Warm:
    """An agent process that answered ``initialize`` and nothing else yet: its process,
    connection, client and what it advertised (ACPC-31: what the warm pool holds)."""

    __slots__ = ("child", "client", "conn", "init")

    def __init__(self, child: ChildProcess, conn: Any, client: _ParentClient, init: Any) -> None:
        self.child = child
        self.conn = conn
        self.client = client
        self.init = init

    def healthy(self) -> bool:
        """ACPC-33: the process runs and both of its protocol pipes are open."""
        process = self.child.process
        stdin, stdout = process.stdin, process.stdout
        return not (
            self.child.exited.done()
            or stdin is None
            or stdin.is_closing()
            or stdout is None
            or stdout.at_eof()
            or stdout.exception() is not None
        )


async def _spawn(
    name: str, config: AcpConfig, cwd: str, env: dict[str, str]
) -> tuple[ChildProcess, Any, _ParentClient]:
    client = _ParentClient(config.permission)
    try:
        child = await ChildProcess.spawn(
            config.command,
            config.args,
            cwd=cwd,
            env=env,
            label=name,
            eof_grace=config.dispose_eof_grace_ms / 1000,
            grace=config.dispose_grace_ms / 1000,
        )
    except OSError as exc:
        raise AcpError(
            f"subagent-acp {name!r}: cannot start {config.command!r}: "
            f"{exc.strerror or type(exc).__name__}",
            code="ACP_SPAWN_FAILED",
        ) from exc
    assert child.process.stdin is not None and child.process.stdout is not None
    # The child's lines are checked before the SDK sees them, and ours made encodable (ROB-30).
    peer = f'subagent-acp "{name}": child (pid {child.pid})'
    transport = GuardedTransport(child.process.stdout, child.process.stdin, peer=peer, log=_log)
    conn = acp.connect_to_agent(cast("acp.Client", client), transport)
    quiet_notifications(conn, peer=peer, log=_log)
    return child, conn, client


def _initialize(conn: Any) -> Any:
    return conn.initialize(
        protocol_version=acp.PROTOCOL_VERSION,
        client_capabilities=ClientCapabilities(
            fs=FileSystemCapabilities(read_text_file=False, write_text_file=False),
            terminal=False,
        ),
        client_info=Implementation(name="dsh-subagent-acp", version=__version__),
    )


async def _failed(
    exc: BaseException, what: str, name: str, config: AcpConfig, child: ChildProcess, conn: Any
) -> BaseException:
    """Reap the child of a set-up that failed with ``exc``; what to raise instead of it."""
    await asyncio.shield(reap(child, conn, config))
    if isinstance(exc, AbortedError | asyncio.CancelledError | AcpError):
        return exc
    if isinstance(exc, TimeoutError):
        return AcpError(
            f"subagent-acp {name!r}: the ACP child did not answer {what} within "
            f"{config.start_timeout_ms:g} ms",
            code="ACP_START_TIMEOUT",
        )
    if isinstance(exc, Exception):
        failure = AcpError(
            f"subagent-acp {name!r}: {what} failed: {describe(exc, child)}",
            code="ACP_START_FAILED",
        )
        failure.__cause__ = exc
        return failure
    return exc


async def warm_up(*, name: str, config: AcpConfig, cwd: str, env: dict[str, str]) -> Warm:
    """ACPC-31: spawn and ``initialize`` within ``start_timeout_ms``, nothing more (a
    pooled process); any failure reaps the child first, then raises ``AcpError``."""
    child, conn, client = await _spawn(name, config, cwd, env)
    try:
        async with asyncio.timeout(config.start_timeout_ms / 1000):
            init = await _race(_initialize(conn), child, AbortSignal())
    except BaseException as exc:
        failure = await _failed(exc, "initialize", name, config, child, conn)
        if failure is exc:
            raise
        raise failure from failure.__cause__
    return Warm(child, conn, client, init)


async def open_child(
    *,
    name: str,
    config: AcpConfig,
    cwd: str,
    env: dict[str, str],
    signal: AbortSignal,
    step: SessionStep,
    warm: Warm | None = None,
) -> Opened:
    """Spawn, ``initialize``, then ``step`` (``session/new``, or a load of a stored session),
    all within ``start_timeout_ms``; any failure reaps the child first, then raises
    (``AcpError``, or ``AbortedError`` when ``signal`` fired). A ``warm`` process from the
    pool skips the spawn and ``initialize`` (ACPC-31)."""
    if warm is None:
        child, conn, client = await _spawn(name, config, cwd, env)
        init = None
    else:
        child, conn, client, init = warm.child, warm.conn, warm.client, warm.init
    what = "initialize"
    try:
        async with asyncio.timeout(config.start_timeout_ms / 1000):
            if init is None:
                init = await _race(_initialize(conn), child, signal)
            what, awaitable = step(conn, init, client)
            session_id = await _race(awaitable, child, signal)
    except BaseException as exc:
        failure = await _failed(exc, what, name, config, child, conn)
        if failure is exc:
            raise
        raise failure from failure.__cause__
    if not isinstance(session_id, str) or not session_id:
        await asyncio.shield(reap(child, conn, config))
        raise AcpError("ACP child published without a session id", code="ACP_NO_SESSION_ID")
    client.session_id = session_id
    return Opened(child, conn, client, init, session_id)


async def start_acp_run(
    *,
    name: str,
    config: AcpConfig,
    cwd: str,
    env: dict[str, str],
    text: str,
    signal: AbortSignal,
    warm: Warm | None = None,
) -> AcpSubagentRun:
    """ACP-1/2: spawn, ``initialize`` (or a ``warm`` pooled process), ``session/new``; then
    publish and prompt."""
    opened = await open_child(
        name=name,
        config=config,
        cwd=cwd,
        env=env,
        signal=signal,
        step=new_session_step(cwd),
        warm=warm,
    )
    run = _Run(
        name=name,
        config=config,
        child=opened.child,
        conn=opened.conn,
        client=opened.client,
        signal=signal,
    )
    return run.publish(text)


class _Run:
    """One published ACP child: its prompt, its settlement and its disposal (ACP-3/5/7)."""

    def __init__(
        self,
        *,
        name: str,
        config: AcpConfig,
        child: ChildProcess,
        conn: Any,
        client: _ParentClient,
        signal: AbortSignal,
    ) -> None:
        self.name = name
        self.config = config
        self.child = child
        self.conn = conn
        self.client = client
        self.signal = signal
        self.result: ResultFuture = ResultFuture()
        self.prompt: asyncio.Task[None] | None = None
        self.cancel_sent: asyncio.Future[None] | None = None
        self.disposal: asyncio.Future[None] | None = None
        self._remove: Callable[[], None] = lambda: None

    def publish(self, text: str) -> AcpSubagentRun:
        self.prompt = asyncio.ensure_future(self._prompt(text))
        if self.signal.aborted:
            self.cancel()
        else:
            self._remove = self.signal.add_listener(lambda _: self.cancel())
        return AcpSubagentRun(
            id=new_id(),
            local_agent=None,
            result=self.result,
            dispose=self.dispose,
            pid=self.child.pid,
        )

    def _settle(self, stop_reason: str, diagnostic: str | None = None) -> None:
        if not self.result.done():
            self.result.set_result(
                SubagentResult(
                    output=self.client.output(),
                    stop_reason=stop_reason,
                    diagnostic=truncate_diagnostic(diagnostic),
                )
            )

    async def _prompt(self, text: str) -> None:
        client, child = self.client, self.child
        assert client.session_id is not None
        try:
            blocks = [acp.text_block(text)] if text else []
            task = asyncio.ensure_future(
                self.conn.prompt(session_id=client.session_id, prompt=blocks)
            )
            try:
                await asyncio.wait({task, child.exited}, return_when=asyncio.FIRST_COMPLETED)
                if not task.done():  # what it wrote before leaving is still read, to its EOF
                    await asyncio.wait({task}, timeout=_DRAIN_S)
            finally:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            if task.cancelled():
                raise _Exited(child.exited.result())
            response = task.result()
        except asyncio.CancelledError:
            self._settle("aborted")
            raise
        except Exception as exc:
            if client.cancelled:
                self._settle("aborted")
                return
            if isinstance(exc, ConnectionError):  # stdout closed: its exit is near
                await asyncio.wait({child.exited}, timeout=1.0)
            diagnostic = describe(exc, child)
            _log.warning('subagent-acp "%s": child run failed (error): %s', self.name, diagnostic)
            self._settle("error", diagnostic)
            return
        reason = _STOP_REASONS.get(response.stop_reason)
        if reason is None:
            self._settle("error", f"the ACP child stopped with {response.stop_reason!r}")
        elif client.cancelled and reason != "completed":
            self._settle("aborted")
        else:
            self._settle(reason)

    def cancel(self) -> None:
        """ACP-5: settle ``aborted`` now (keeping partial text) and ask the child to stop."""
        self._remove()
        if self.client.cancelled:
            return
        self.client.cancelled = True
        self._settle("aborted")
        # ACPC-3: session/cancel only while the prompt runs; a child whose turn ended is not
        # told to cancel (a long-lived one would take it for its next turn's).
        running = self.prompt is not None and not self.prompt.done()
        if running and self.cancel_sent is None and not self.child.exited.done():
            self.cancel_sent = asyncio.ensure_future(self._send_cancel())

    async def _send_cancel(self) -> None:
        assert self.client.session_id is not None
        with contextlib.suppress(Exception):
            await self.conn.cancel(session_id=self.client.session_id)

    def dispose(self) -> asyncio.Future[None]:
        """ACP-7: idempotent; cancel, then the ladder, then release the connection."""
        if self.disposal is None:
            self.disposal = asyncio.ensure_future(self._dispose())
        return asyncio.shield(self.disposal)

    async def _dispose(self) -> None:
        self.cancel()
        if self.cancel_sent is not None:
            # A child that stopped reading could hold the notification forever.
            await asyncio.wait({self.cancel_sent}, timeout=self.config.dispose_eof_grace_ms / 1000)
            self.cancel_sent.cancel()
        await self.child.terminate(
            eof_grace=self.config.dispose_eof_grace_ms / 1000,
            grace=self.config.dispose_grace_ms / 1000,
        )
        if self.prompt is not None:
            with contextlib.suppress(BaseException):
                await self.prompt
        await _close(self.conn)
