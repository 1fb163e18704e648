"""A booted dsh host served as an ACP agent (protocol version 1).

One ACP session is one dsh agent (the session ids are the same). ``session/prompt`` is a
follow-up: the turn's text is streamed as ``agent_message_chunk`` (reasoning as
``agent_thought_chunk``), its tool calls as ``tool_call`` / ``tool_call_update``, and the
turn's end answers the prompt with an ACP stop reason. ``session/cancel`` cancels the turn;
the prompt then answers ``cancelled``. With a durable store, ``session/load`` resumes a
session from it and replays its history as updates; a prompt is answered only once its turn
is written to the store (a turn that cannot be written fails the prompt), so a process killed
after an answer keeps every answered turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import acp
from acp import helpers
from acp.agent.connection import AgentSideConnection
from acp.schema import (
    AgentCapabilities,
    AgentMessageChunk,
    AgentThoughtChunk,
    Implementation,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    ResourceContentBlock,
    TextContentBlock,
    UserMessageChunk,
)

from dsh_core import (
    AgentCancelCause,
    AgentHandle,
    AgentOptions,
    Context,
    CreateAgentOptions,
    PluginError,
    ReasoningBlock,
    ReasoningDelta,
    ResumeAgentOptions,
    SessionError,
    SessionEvent,
    SessionMeta,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallData,
    ToolResultBlock,
    ToolResultData,
    TurnEndData,
    blocks_text,
    boot_host,
    make_plugin_manager,
    user_message,
)
from dsh_core import plugin as core_plugin

from .__about__ import __version__
from ._config import AgentServerConfig
from ._wire import GuardedTransport, quiet_notifications

__all__ = ["DshAcpAgent", "open_agent", "serve_connection"]

_log = logging.getLogger("dsh.acp_agent")

#: A dsh turn's end, as an ACP stop reason (``error`` has none: the prompt fails instead).
_STOP_REASONS = {
    "completed": "end_turn",
    "max-tokens": "max_tokens",
    "max-steps": "max_turn_requests",
    "aborted": "cancelled",
    "blocked": "refusal",
}
#: How the SDK serializes a request's result when it is a model (``acp.connection``).
_SDK_DUMP: dict[str, Any] = {
    "mode": "json", "by_alias": True, "exclude_none": True, "exclude_unset": True,
}  # fmt: skip


class _Answer(PromptResponse):
    """A prompt answer that gives the SDK its frame as a dict (PERF-25).

    The SDK serializes a handler's model result with pydantic for each answer, about 2 % of
    a prompt's instructions; an answer holds its stop reason alone, so its frame is that one
    key. Any other dump is pydantic's own. Only the answers built here are of this class."""

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        if kwargs == _SDK_DUMP:
            return {"stopReason": self.stop_reason}
        return super().model_dump(**kwargs)


#: The prompt answers, built once: a turn's end picks one (the SDK only serializes them).
_ANSWERS: dict[str, PromptResponse] = {
    kind: _Answer(stop_reason=stop)  # type: ignore[arg-type]
    for kind, stop in _STOP_REASONS.items()
}
_CANCELLED = _ANSWERS["aborted"]
#: The event kinds a running prompt reads: its turn's end and what streams as updates.
_WATCHED = frozenset({"turn/end", "assistant/chunk", "tool/call", "tool/result"})
_USER_CANCEL = AgentCancelCause(kind="user", reason="session/cancel")


#: What ``pending`` holds: a built update, or streamed text not built into one yet.
_Pending = Any


#: The kinds of text update, by their ``sessionUpdate``: an answer's, its reasoning's, and (in
#: a load's replay) the user's.
_MESSAGE, _THOUGHT, _USER = "agent_message_chunk", "agent_thought_chunk", "user_message_chunk"
_CHUNKS: dict[str, Any] = {
    _MESSAGE: AgentMessageChunk,
    _THOUGHT: AgentThoughtChunk,
    _USER: UserMessageChunk,
}


class _Text:
    """Text of one kind (``_MESSAGE``, ``_THOUGHT`` or ``_USER``) not sent yet: the deltas
    that arrive while the prompt is busy sending go out as one update."""

    __slots__ = ("kind", "parts")

    def __init__(self, kind: str, text: str) -> None:
        self.kind = kind
        self.parts = [text]

    def update(self) -> Any:
        parts = self.parts
        block = TextContentBlock(type="text", text=parts[0] if len(parts) == 1 else "".join(parts))
        return _CHUNKS[self.kind](session_update=self.kind, content=block)

    def params(self, session_id: str) -> dict[str, Any]:
        """The ``session/update`` params of :meth:`update`, as the SDK serializes them, built
        without its models (ACPC-70: the same frame; the text is ours, a ``str`` already)."""
        parts = self.parts
        text = parts[0] if len(parts) == 1 else "".join(parts)
        return {
            "sessionId": session_id,
            "update": {"content": {"text": text, "type": "text"}, "sessionUpdate": self.kind},
        }


def _add_text(pending: list[_Pending], kind: str, text: str) -> None:
    last = pending[-1] if pending else None
    if last.__class__ is _Text and last.kind is kind:
        last.parts.append(text)
    else:
        pending.append(_Text(kind, text))


#: ACP-side error code of a ``session/load`` whose session another live process holds (ACPC-1):
#: the session exists, so it is not ``-32002`` (resource not found), which clients take as gone.
SESSION_LOCKED_CODE = -32042


def raw_input(arguments: str) -> Any:
    """A tool call's arguments as ``rawInput``: the parsed JSON value (ACPC-6); text that is
    not JSON (a model's broken arguments) stays the string it is."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _updates(event: SessionEvent) -> list[Any]:
    """The ACP updates a ``tool/call`` or ``tool/result`` streams as."""
    if event.type == "tool/call":
        call: ToolCallData = event.data
        return [
            helpers.start_tool_call(
                call.call_id,
                call.name,
                kind="other",
                status="in_progress",
                raw_input=raw_input(call.arguments),
            )
        ]
    result: ToolResultData = event.data
    return [
        _tool_done(block) for block in result.message.content if isinstance(block, ToolResultBlock)
    ]


def _tool_done(block: ToolResultBlock) -> Any:
    return helpers.update_tool_call(
        block.tool_call_id,
        status="failed" if block.is_error else "completed",
        content=[helpers.tool_content(helpers.text_block(blocks_text(block.content)))],
    )


class _Live:
    """One served session: its agent, and what the prompt running on it has to send.

    The prompt runs its turn in its own task (``Agent.run_followup``): a turn that never
    suspends ends before anything is sent, and its updates go out after it, with no other
    task. Once the turn suspends with updates waiting (a model streaming over the network), a
    streamer task sends them as they come, until the turn's end.
    """

    __slots__ = (
        "agent",
        "busy",
        "cancelled",
        "end",
        "finished",
        "handle",
        "id",
        "kicked",
        "loop",
        "pending",
        "send",
        "streamer",
        "unwatch",
        "wake",
    )

    def __init__(
        self, handle: AgentHandle, send: Callable[[str, _Pending], Awaitable[None]]
    ) -> None:
        self.handle = handle
        self.agent = handle.agent
        self.id = handle.agent.id
        self.send = send
        self.loop = asyncio.get_running_loop()
        self.busy = False  # a prompt runs: its session's events stream
        self.cancelled = False
        self.pending: list[_Pending] = []  # updates not sent yet (text not built yet)
        self.end: TurnEndData | None = None  # the turn/end the prompt waits for
        self.kicked = False  # a kick is scheduled
        self.streamer: asyncio.Task[None] | None = None  # sends while the turn runs
        self.wake: asyncio.Future[None] | None = None  # the streamer waiting for updates
        # Set when the running prompt is over: a prompt that came while a cancelled one
        # unwinds waits on it (ACPC-2).
        self.finished: asyncio.Event | None = None
        # The session's events of the kinds a prompt streams come to on_event, and no other:
        # a plain turn logs ten events, three of which stream.
        self.unwatch = handle.agent.session.watch(_WATCHED, self.on_event)

    def on_event(self, event: SessionEvent) -> None:
        """Collect what the running prompt sends (nothing while no prompt runs)."""
        if not self.busy:
            return
        kind = event.type
        if kind == "assistant/chunk":
            chunk = event.data.chunk
            if isinstance(chunk, TextDelta):
                if not chunk.text:
                    return
                _add_text(self.pending, _MESSAGE, chunk.text)
            elif isinstance(chunk, ReasoningDelta) and chunk.text:
                _add_text(self.pending, _THOUGHT, chunk.text)
            else:
                return
        elif kind == "turn/end":
            self.end = event.data
        else:
            updates = _updates(event)
            if not updates:
                return
            self.pending += updates
        wake = self.wake
        if wake is not None:
            self.wake = None  # woken once: the streamer makes a new one if it waits again
            if not wake.done():
                wake.set_result(None)
        elif self.streamer is None and not self.kicked:
            self.kicked = True
            self.loop.call_soon(self.kick)

    def kick(self) -> None:
        """One loop pass after updates began to wait: a turn still running has suspended, so
        a streamer sends them from now on."""
        self.kicked = False
        if self.busy and self.end is None and self.streamer is None:
            self.streamer = self.loop.create_task(self.stream())

    async def stream(self) -> None:
        """Send the updates as they come, until the turn has ended and nothing waits."""
        while True:
            if self.pending:
                batch, self.pending = self.pending, []
                for update in batch:
                    await self.send(self.id, update)
            elif self.end is not None:
                return
            else:
                self.wake = wake = self.loop.create_future()
                await wake

    def begin(self) -> None:
        """A prompt starts: stream its turn (set here, so a prompt's own reads of ``end`` are
        not narrowed to the ``None`` it starts with)."""
        self.busy = True
        self.cancelled = False
        self.end = None

    def finish(self) -> None:
        """The prompt is over (answered or failed): stop streaming."""
        streamer, self.streamer = self.streamer, None
        if streamer is not None and not streamer.done():
            streamer.cancel()
        self.busy = False
        self.pending = []
        self.wake = None
        finished, self.finished = self.finished, None
        if finished is not None:
            finished.set()

    async def unwound(self) -> None:
        """Wait until the running prompt is over (a cancelled turn unwinding ends soon)."""
        if self.finished is None:
            self.finished = asyncio.Event()
        await self.finished.wait()


class DshAcpAgent:
    """The ACP agent over a booted host (see the module docstring)."""

    def __init__(self, ctx: Context, options: AgentOptions, *, durable: bool) -> None:
        self.ctx = ctx
        self.options = options
        self.durable = durable
        self.conn: Any = None
        self.notify: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None
        self.sessions: dict[str, _Live] = {}
        # The guarded transport it is served on (serve_connection), which can write a
        # prompt's last updates with its answer.
        self.wire: GuardedTransport | None = None

    def on_connect(self, conn: Any) -> None:
        self.conn = conn
        # The SDK connection's own notification sender (its transport and observers), where
        # the SDK has one: streamed text is sent through it as params (see ``_send``).
        inner = getattr(conn, "_conn", None)
        self.notify = getattr(inner, "send_notification", None)

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: Any = None,
        client_info: Any = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        """Protocol version 1; ``loadSession`` only with a durable store; text prompts."""
        return InitializeResponse(
            protocol_version=acp.PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(
                load_session=self.durable,
                prompt_capabilities=PromptCapabilities(
                    image=False, audio=False, embedded_context=False
                ),
            ),
            agent_info=Implementation(name="dsh-acp-agent", version=__version__),
            auth_methods=[],
        )

    async def new_session(
        self, cwd: str, mcp_servers: Any = None, **kwargs: Any
    ) -> NewSessionResponse:
        """A fresh dsh agent working in ``cwd`` (absolute)."""
        if not os.path.isabs(cwd):
            raise acp.RequestError.invalid_params({"cwd": "must be an absolute path"})
        handle = await self.ctx.agents.create(
            CreateAgentOptions(meta=SessionMeta(cwd=cwd), agent_options=self.options)
        )
        self.sessions[handle.agent.id] = _Live(handle, self._send)
        return NewSessionResponse(session_id=handle.agent.id)

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: Any = None, **kwargs: Any
    ) -> LoadSessionResponse:
        """Resume ``session_id`` from the store and replay its conversation as updates."""
        if not self.durable:
            raise acp.RequestError.method_not_found("session/load")
        live = self.sessions.get(session_id)
        if live is None:
            try:
                handle = await self.ctx.agents.resume(
                    ResumeAgentOptions(resume_session_id=session_id, agent_options=self.options)
                )
            except Exception as exc:
                _log.warning("session/load of %r failed: %s", session_id, exc)
                if getattr(exc, "code", None) == "SESSION_LOCKED":
                    raise acp.RequestError(
                        SESSION_LOCKED_CODE,
                        "Session locked",
                        {"sessionId": session_id, "reason": "held by another live process"},
                    ) from None
                raise acp.RequestError.resource_not_found(session_id) from None
            live = self.sessions[session_id] = _Live(handle, self._send)
        for message in live.agent.session.derive_messages():
            for update in self._replay(message):
                await self._send(session_id, update)
        return LoadSessionResponse()

    @staticmethod
    def _replay(message: Any) -> list[Any]:
        out: list[Any] = []
        for block in message.content:
            if isinstance(block, TextBlock) and block.text:
                if message.role == "user":
                    out.append(_Text(_USER, block.text))
                elif message.role == "assistant":
                    out.append(_Text(_MESSAGE, block.text))
            elif isinstance(block, ReasoningBlock) and block.text:
                out.append(_Text(_THOUGHT, block.text))
            elif isinstance(block, ToolCallBlock):
                out.append(
                    helpers.start_tool_call(
                        block.id, block.name, kind="other", status="in_progress",
                        raw_input=raw_input(block.arguments),
                    )
                )  # fmt: skip
            elif isinstance(block, ToolResultBlock):
                out.append(_tool_done(block))
        return out

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        """One follow-up turn; its updates stream while it runs (see the module docstring)."""
        live = self.sessions.get(session_id)
        if live is None:
            raise acp.RequestError.resource_not_found(session_id)
        # ACPC-2: a prompt that comes while a cancelled turn unwinds (a client's "cancel, then
        # ask") waits for it; one on a turn that still runs is refused. Each waiter re-checks:
        # another waiter may have started its own prompt first.
        while live.busy:
            if not live.cancelled:
                raise acp.RequestError.invalid_request({"sessionId": "a prompt is already running"})
            await live.unwound()
        parts: list[str] = []
        for block in prompt:
            # The class test first: the SDK's models answer isinstance through ABCMeta's
            # Python-level hook, and nearly every block is text.
            if block.__class__ is TextContentBlock or isinstance(block, TextContentBlock):
                parts.append(block.text)
            elif isinstance(block, ResourceContentBlock):
                parts.append(f"[{block.name}]({block.uri})")
        live.begin()
        wire = None
        try:
            await live.agent.run_followup(user_message("".join(parts)))
            if live.streamer is not None:  # the turn suspended: the streamer sends to its end
                await live.streamer
            if live.pending:
                # Sent with the answer, which follows without another wait (PERF-24): one
                # write for the turn's last updates and the answer.
                wire = self.wire
                if wire is not None:
                    wire.hold()
                for update in live.pending:
                    await self._send(session_id, update)
        except BaseException:
            if wire is not None:
                wire.release()
            raise
        finally:
            live.finish()
        # The answer, or an error answer (the SDK sends one for what this raises): either
        # writes the frames held.
        return self._answer(live, session_id)

    def _answer(self, live: _Live, session_id: str) -> PromptResponse:
        """The prompt's answer once its turn is over, or the error it fails with."""
        try:
            # The turn's lines reach the OS before the answer (the turn's end wrote them on a
            # store that writes through; this retries a write that failed there): a prompt is
            # answered only once a crash can no longer lose it.
            live.agent.session.checkpoint()
        except SessionError as exc:
            _log.warning("session %s: the turn could not be written: %s", session_id, exc)
            raise acp.RequestError.internal_error(
                {"message": f"the turn could not be written to the session store: {exc}"}
            ) from exc
        end = live.end  # None only if no turn ran (an agent being disposed)
        if live.cancelled:
            return _CANCELLED
        kind = end.reason.kind if end is not None else "error"
        answer = _ANSWERS.get(kind)
        if answer is None:
            failure = end.reason.error if end is not None else None
            message = failure.message if failure is not None else f"the turn ended {kind!r}"
            _log.warning("session %s: the turn ended %s: %s", session_id, kind, message)
            raise acp.RequestError.internal_error({"turnEnd": kind, "message": message})
        return answer

    def _send(self, session_id: str, update: _Pending) -> Any:
        """Send one ``session/update`` (building it first if it is streamed text). Streamed
        text, nearly every update, goes out as its params (ACPC-70): the SDK's models would
        validate our own values and serialize them back to this very dict."""
        if update.__class__ is _Text:
            notify = self.notify
            if notify is not None:
                return notify("session/update", update.params(session_id))
            update = update.update()
        return self.conn.session_update(session_id=session_id, update=update)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        """``session/cancel``: stop the running turn (its prompt answers ``cancelled``)."""
        live = self.sessions.get(session_id)
        if live is not None and live.busy:
            live.cancelled = True
            live.agent.cancel(_USER_CANCEL)

    async def close(self) -> None:
        """Dispose every served agent (the host itself is disposed by its owner)."""
        sessions, self.sessions = self.sessions, {}
        for live in sessions.values():
            live.unwatch()
            live.agent.cancel(AgentCancelCause(kind="disposed"))
        for live in sessions.values():
            with contextlib.suppress(Exception):
                await live.handle.dispose()


async def serve_connection(
    agent: DshAcpAgent, input_stream: Any, output_stream: Any = None, *, peer: str = "client"
) -> None:
    """Serve ``agent`` until the client closes the connection.

    On a pair of byte streams (``input_stream`` the writer, ``output_stream`` the reader), the
    lines are guarded (``_wire``): a frame the SDK cannot route is answered and logged as
    coming from ``peer``, never handed on. One SDK ``Transport`` as ``input_stream`` alone
    carries messages, not lines, and is used as it is. Either way a notification the SDK
    cannot route costs a log line at most.
    """
    transport: Any = input_stream
    if output_stream is not None:
        transport = GuardedTransport(output_stream, input_stream, peer=peer, log=_log)
        agent.wire = transport
    conn = AgentSideConnection(cast("acp.Agent", agent), transport, listening=False)
    quiet_notifications(conn, peer=peer, log=_log)
    try:
        await conn.listen()
    finally:
        await asyncio.shield(conn.close())


_ROW = re.compile(r"plugins\[(\d+)\]")


def _in_file(exc: PluginError, config: AgentServerConfig) -> PluginError:
    """``exc`` naming the config file's own row: the host counts the rows it is booted with,
    the core ones this server puts before the file's included."""
    message = str(exc)
    found = _ROW.match(message)
    first = config.first_file_row
    if config.source is None or found is None:
        return exc
    index = int(found.group(1)) - first
    if not 0 <= index < len(config.plugins):
        return exc  # a row of the server's own (the [model] route's `acp-agent`, say)
    return PluginError(f"{config.source}: plugins[{index}]{message[found.end() :]}", code=exc.code)


@contextlib.asynccontextmanager
async def open_agent(config: AgentServerConfig) -> AsyncIterator[DshAcpAgent]:
    """Boot the host ``config`` describes (with the ``acp-agent`` plugin) and yield its ACP
    agent; on exit, dispose every served session, then the host.

    Only dsh-core, this distribution, the entry points ``config.load`` names and
    ``config.modules`` are loaded: no scan of every installed plugin.
    """
    from . import plugin as acp_agent_plugin

    modules: dict[str, Any] = {"core": core_plugin, "acp-agent": acp_agent_plugin}
    for name, path in config.modules.items():
        modules[name] = importlib.import_module(path)
    pm = make_plugin_manager(autoload=False, plugins=modules)
    if config.load:
        pm.load_entry_points(only=config.load)
        for failure in pm.failures:
            _log.error("%s", failure.describe())
    try:
        runtime = await boot_host(config.rows(), pm=pm)
    except PluginError as exc:
        raise _in_file(exc, config) from exc
    async with runtime:
        agent = runtime.ctx.acp_agent.agent()
        try:
            yield agent
        finally:
            await agent.close()
