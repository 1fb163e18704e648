"""Continuable ACP children (ACPC-10..19): a local child agent whose turns an ACP session of a
live agent process answers.

To the seam a continuable ACP child is a child like any other: the continuation manager
creates a local agent (its descriptor, its transcript in the parent's store, its Activation,
follow-ups, notices, interrupts, drains and depth are the seam's own). ``prepare_continuable``
starts the agent process (``initialize``, ``session/new``) and gives the child the model route
``subagent-acp/<provider name>`` with the model ``{"acp_session": ..., "cwd": ...}``: the
descriptor keeps it, so a cold resume takes the same route. Every turn of the child is one
``session/prompt`` of that ACP session, carrying the user messages of the turn; the answer
is the text of the prompt's last agent message.

The process is held by the child's session id. A turn finds it live (a follow-up: a new
prompt in the same ACP session), or starts the command again and loads the session
(``session/load``, or ``session/resume`` where only that is advertised); what a load replays
is the past, never output. An agent that can do neither refuses the turn with
``ACP_NOT_RESUMABLE``. A process idle for ``idle_release_ms`` is released with the disposal
ladder, and so is every process of a parent agent that is disposed, the process of a child a
drain releases (within the child's own release, ACPC-38), and every process when the plugin
unloads (after draining the children whose turn runs, ACPC-39). A start or a cold resume
takes a process from the row's warm pool when it has one (``_pool``). The command that runs
is always the configured one: the store names the provider row, never a command.

The SDK is imported on the first use, not when the plugin loads.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from dsh_core import (
    AbortedError,
    AbortSignal,
    Agent,
    Context,
    Finish,
    LlmFailure,
    Message,
    PluginSource,
    StreamChunk,
    TextBlock,
    TextDelta,
)
from dsh_subagent import SUBAGENTS

from ._config import AcpConfig
from ._errors import ABORTED_BEFORE_START, AcpError
from ._pool import AcpPool

if TYPE_CHECKING:
    from dsh_core import GenerateOptions

    from ._client import Opened, Warm

__all__ = ["ROUTE_PREFIX", "AcpSessions", "decode_model", "encode_model", "new_input"]

_log = logging.getLogger("dsh.subagent.acp")

#: The model route provider of a continuable child of the provider row ``<name>``.
ROUTE_PREFIX = "subagent-acp/"
#: ACP stop reasons as the finish of the child's turn: (finish reason, failure code).
_FINISHES: dict[str, tuple[str, str | None]] = {
    "end_turn": ("stop", None),
    "max_tokens": ("max-tokens", None),
    "cancelled": ("aborted", "ABORTED"),
    "max_turn_requests": ("error", "ACP_MAX_TURN_REQUESTS"),
    "refusal": ("error", "ACP_REFUSAL"),
}
#: How long an exited child's last lines may still take to be read (see ``_client``).
_DRAIN_S = 1.0


def encode_model(session_id: str, cwd: str) -> str:
    """The model string a continuable ACP child's descriptor keeps (ACPC-12)."""
    return json.dumps({"acp_session": session_id, "cwd": cwd}, separators=(",", ":"))


def decode_model(model: str) -> tuple[str, str] | None:
    """``(ACP session id, cwd)`` of a stored model string; ``None`` if it is not one (a
    store is a boundary: its value is checked, not trusted)."""
    try:
        value = json.loads(model)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    session, cwd = value.get("acp_session"), value.get("cwd")
    if isinstance(session, str) and session and isinstance(cwd, str) and cwd.startswith("/"):
        return session, cwd
    return None


@functools.lru_cache(maxsize=64)
def _decoded(model: str) -> tuple[str, str] | None:
    """``decode_model``, once per model string: every turn of a child passes the same one
    (its descriptor's), and the result is an immutable pair."""
    return decode_model(model)


def new_input(messages: Sequence[Message], sent: str | None = None) -> str:
    """The text of the user messages after the child's last answer, or after the message
    ``sent`` (the last one a prompt already carried: a turn given up on left no answer):
    what this turn asks. Runtime-context snapshots (the local child's own prompt context,
    such as the delegation statement) stay on this side, as the system prompt does."""
    parts: list[str] = []
    for message in reversed(messages):
        if message.role == "assistant" or message.id == sent:
            break
        source = message.source
        if isinstance(source, PluginSource) and source.form == "snapshot":
            continue
        if message.role == "user":
            text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
            if text:
                parts.append(text)
    return "\n\n".join(reversed(parts))


def _failed(code: str, message: str) -> Finish:
    return Finish(reason="error", failure=LlmFailure(message=message, code=code))


_ABORTED = Finish(reason="aborted", failure=LlmFailure(message="request aborted", code="ABORTED"))


class _Held:
    """One live agent process serving the ACP session of one continuable child."""

    __slots__ = ("busy", "child_id", "idle", "idle_until", "opened", "parent_id", "unwinding")

    def __init__(self, opened: Opened, child_id: str, parent_id: str | None) -> None:
        self.opened = opened
        self.child_id = child_id
        self.parent_id = parent_id
        self.busy = False
        #: The idle release's timer, and the loop time it releases at (a turn's end moves
        #: the time on; the timer, when it fires early, waits for the rest).
        self.idle: asyncio.TimerHandle | None = None
        self.idle_until = 0.0
        #: A prompt whose turn was given up on, while the child winds it down.
        self.unwinding: asyncio.Future[None] | None = None


class AcpSessions:
    """The live processes of one provider row's continuable children, and the model adapter
    of their route (``ctx.llm``: provider ``subagent-acp/<name>``)."""

    def __init__(
        self,
        *,
        name: str,
        config: AcpConfig,
        ctx: Context,
        env: dict[str, str],
        pool: AcpPool | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.ctx = ctx
        self.env = env
        #: The row's warm pool (ACPC-31): a start or a cold resume takes a process from it.
        self.pool = pool
        self.held: dict[str, _Held] = {}
        #: By child: the id of the last message a prompt carried (in this process).
        self.sent: dict[str, str] = {}
        self.releasing: set[asyncio.Future[None]] = set()
        self.closed = False

    @property
    def route(self) -> str:
        return ROUTE_PREFIX + self.name

    # -- processes ------------------------------------------------------------------------------

    async def prepare(self, child_id: str, parent: Agent, cwd: str, signal: AbortSignal) -> str:
        """ACPC-10: start the process and its session for a child about to be created; the
        model string its descriptor keeps."""
        if signal.aborted:
            raise AbortedError(signal.reason, ABORTED_BEFORE_START)
        from ._client import new_session_step, open_child

        opened = await open_child(
            name=self.name,
            config=self.config,
            cwd=cwd,
            env=self.env,
            signal=signal,
            step=new_session_step(cwd),
            warm=self._warm(cwd),
        )
        self._hold(_Held(opened, child_id, parent.id))
        return encode_model(opened.session_id, cwd)

    def _warm(self, cwd: str) -> Warm | None:
        return None if self.pool is None else self.pool.take(cwd)

    def _hold(self, held: _Held) -> None:
        old = self.held.pop(held.child_id, None)
        if old is not None:
            self._release(old)
        if self.closed:
            self._release(held)
            raise AcpError(f"subagent-acp {self.name!r} is unloading", code="ACP_START_FAILED")
        self.held[held.child_id] = held
        self._arm(held)

    def _arm(self, held: _Held) -> None:
        """ACPC-15: release the process once it has been idle for ``idle_release_ms``.

        A timer already set stays: it fires at the old time, finds the process busy or the
        time moved on, and waits again (ACPC-81). A follow-up's turn neither cancels a timer
        nor sets a new one."""
        loop = asyncio.get_running_loop()
        held.idle_until = loop.time() + self.config.idle_release_ms / 1000
        if held.idle is None:
            held.idle = loop.call_at(held.idle_until, self._idle, held)

    @staticmethod
    def _disarm(held: _Held) -> None:
        if held.idle is not None:
            held.idle.cancel()
            held.idle = None

    def _idle(self, held: _Held) -> None:
        held.idle = None
        if held.busy or self.held.get(held.child_id) is not held:
            return  # a turn runs (its end sets the timer again) or the process is gone
        loop = asyncio.get_running_loop()
        if loop.time() < held.idle_until:  # a turn ended since the timer was set
            held.idle = loop.call_at(held.idle_until, self._idle, held)
            return
        self._drop(held)

    def _drop(self, held: _Held) -> asyncio.Future[None]:
        if self.held.get(held.child_id) is held:
            del self.held[held.child_id]
        return self._release(held)

    def _release(self, held: _Held) -> asyncio.Future[None]:
        """End the process with the disposal ladder, in a task the sessions keep (and the
        plugin's unload awaits)."""
        from ._client import reap

        self._disarm(held)
        task = asyncio.ensure_future(reap(held.opened.child, held.opened.conn, self.config))
        self.releasing.add(task)
        task.add_done_callback(self.releasing.discard)
        return task

    def on_agent_disposed(self, agent: Agent) -> None:
        """ACPC-16: a disposed parent's children's processes end now (a disposed child's own
        process stays until its idle time, unless a drain released it: a follow-up may come
        back to it)."""
        for held in [h for h in self.held.values() if h.parent_id == agent.id]:
            self._drop(held)
            self.sent.pop(held.child_id, None)

    def setup(self, child: Context) -> None:
        """The continuable setup of every child (ACPC-38): its scope's release asks whether a
        drain released it, and if so ends its process before the release goes on."""
        agent = child.agent
        if agent is not None:
            child.fiber.add(functools.partial(self._released, agent))

    async def _released(self, agent: Agent) -> None:
        """ACPC-38: a child released by a drain (not settling) has its process ended with the
        disposal ladder and waited for, within the child's own release: child-first."""
        held = self.held.get(agent.id)
        if held is None or not self.ctx[SUBAGENTS].drained(agent):
            return
        self.sent.pop(held.child_id, None)
        await asyncio.wait({self._drop(held)})

    async def close(self) -> None:
        """The plugin unloads: the children whose turns a process answers are drained first
        (ACPC-39: each turn is cancelled, each child released, its process ended child-first);
        then every other process is released, and each waited for."""
        self.closed = True
        registry = self.ctx.get("agents")
        service = self.ctx.get(SUBAGENTS)
        if registry is not None and service is not None:
            by_parent: dict[str, list[str]] = {}
            for held in self.held.values():
                if held.parent_id is not None and registry.get(held.child_id) is not None:
                    by_parent.setdefault(held.parent_id, []).append(held.child_id)
            drains = []
            for parent_id, child_ids in by_parent.items():
                parent = registry.get(parent_id)
                if parent is not None:
                    with contextlib.suppress(Exception):
                        drains.append(service.drain_continuable_children(parent, child_ids))
            for drain in drains:
                try:
                    await drain
                except Exception as exc:
                    _log.warning('subagent-acp "%s": draining at unload: %s', self.name, exc)
        for held in list(self.held.values()):
            self._drop(held)
        while self.releasing:
            await asyncio.gather(*tuple(self.releasing), return_exceptions=True)

    async def _resume(self, child_id: str, session_id: str, cwd: str, signal: AbortSignal) -> _Held:
        """ACPC-13/14: start the command again and load (or resume) the stored ACP session."""
        from ._client import load_session_step, open_child

        agent = self.ctx.agents.get(child_id)
        parent_id = agent.session.header.parent_session if agent is not None else None
        opened = await open_child(
            name=self.name,
            config=self.config,
            cwd=cwd,
            env=self.env,
            signal=signal,
            step=load_session_step(self.name, child_id, session_id, cwd),
            warm=self._warm(cwd),  # ACPC-36: a cold resume may take a pooled process
        )
        held = _Held(opened, child_id, parent_id)
        self._hold(held)
        return held

    # -- the model adapter ----------------------------------------------------------------------

    def stream(self, options: GenerateOptions) -> AsyncIterator[StreamChunk]:
        """One turn of a continuable ACP child: one ``session/prompt`` (ACPC-11)."""
        return self._turn(options)

    async def _turn(self, options: GenerateOptions) -> AsyncIterator[StreamChunk]:
        decoded = _decoded(options.model)
        child_id = options.session_id
        if decoded is None or child_id is None:
            yield _failed(
                "ACP_BAD_ROUTE",
                f"subagent-acp {self.name!r}: the model {options.model!r} names no ACP session",
            )
            return
        session_id, cwd = decoded
        signal = options.signal or AbortSignal()
        held = self.held.get(child_id)
        if held is not None and (
            held.opened.child.exited.done() or held.opened.session_id != session_id
        ):
            self._drop(held)
            held = None
        if held is None:
            try:
                held = await self._resume(child_id, session_id, cwd, signal)
            except AbortedError:
                yield _ABORTED
                return
            except AcpError as exc:
                _log.warning('subagent-acp "%s": %s', self.name, exc)
                yield _failed(exc.code, str(exc))
                return
        if held.unwinding is not None:  # bounded by the grace it is given
            await asyncio.shield(held.unwinding)
            if self.held.get(child_id) is not held:  # it did not wind down: start again
                async for chunk in self._turn(options):
                    yield chunk
                return
        held.busy = True  # the idle timer, should it fire meanwhile, leaves the process be
        try:
            messages = options.messages
            text = new_input(messages, self.sent.get(child_id))
            if messages:
                self.sent[child_id] = messages[-1].id
            finish, text = await self._prompt(held, text, signal)
        finally:
            if held.unwinding is None:
                held.busy = False
                if self.held.get(child_id) is held:
                    self._arm(held)
        if text:
            yield TextDelta(index=0, text=text)
        yield finish

    async def _cancel(self, held: _Held, task: asyncio.Future[Any]) -> None:
        """``session/cancel``, then up to ``dispose_grace_ms`` for the prompt's answer; a
        child that does not answer is not kept."""
        opened = held.opened
        opened.client.cancelled = True
        grace = self.config.dispose_grace_ms / 1000
        with contextlib.suppress(Exception):
            async with asyncio.timeout(grace):
                await opened.conn.cancel(session_id=opened.session_id)
        # Whichever comes first: the prompt's answer (``cancelled``) or the child's exit.
        await asyncio.wait(
            {task, opened.child.exited}, timeout=grace, return_when=asyncio.FIRST_COMPLETED
        )
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            self._drop(held)

    async def _unwind(self, held: _Held, task: asyncio.Future[Any]) -> None:
        try:
            await self._cancel(held, task)
        finally:
            held.unwinding = None
            held.busy = False
            if self.held.get(held.child_id) is held:
                self._arm(held)

    async def _prompt(self, held: _Held, text: str, signal: AbortSignal) -> tuple[Finish, str]:
        """Send the prompt; the finish and the answer (the last agent message's text)."""
        import acp

        from ._client import describe

        opened = held.opened
        client, child, conn = opened.client, opened.child, opened.conn
        client.begin()
        client.cancelled = False
        blocks = [acp.text_block(text)] if text else []
        task = asyncio.ensure_future(conn.prompt(session_id=opened.session_id, prompt=blocks))
        # Woken by whichever comes first: the answer, the child's exit or the signal (its
        # listener, not a task waiting on it: nothing to start and cancel again per turn).
        woken = asyncio.get_running_loop().create_future()

        def wake(_: object = None) -> None:
            if not woken.done():
                woken.set_result(None)

        exited = child.exited
        task.add_done_callback(wake)
        exited.add_done_callback(wake)
        unlisten = signal.add_listener(wake)
        if signal.aborted:
            wake()
        given_up = False
        try:
            await woken
            if signal.aborted and not task.done() and not exited.done():
                # ACPC-17: an interrupt cancels the child's prompt, which answers cancelled.
                await self._cancel(held, task)
                return _ABORTED, "".join(client.text)
            if not task.done():  # it exited: what it wrote before is still read
                await asyncio.wait({task}, timeout=_DRAIN_S)
        except asyncio.CancelledError:
            # The turn's reader gave up on it (the loop stops reading at an abort): the
            # child's prompt is cancelled in the background, and the next turn waits for it.
            given_up = True
            if not task.done() and not exited.done():
                held.unwinding = unwinding = asyncio.ensure_future(self._unwind(held, task))
                self.releasing.add(unwinding)
                unwinding.add_done_callback(self.releasing.discard)
            else:
                self._drop(held)
            raise
        finally:
            unlisten()
            exited.remove_done_callback(wake)  # the process outlives the turn
            task.remove_done_callback(wake)
            if not task.done() and not (given_up and held.unwinding is not None):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if task.cancelled():
            self._drop(held)
            return _failed("ACP_CHILD_EXITED", describe(ConnectionError(), child)), ""
        exc = task.exception()
        if exc is not None:
            if isinstance(exc, ConnectionError) or child.exited.done():
                self._drop(held)
            if client.cancelled:
                return _ABORTED, "".join(client.text)
            return _failed("ACP_PROMPT_FAILED", describe(exc, child)), ""
        stop = task.result().stop_reason
        finish, code = _FINISHES.get(stop, ("error", "ACP_STOP_REASON"))
        answer = "".join(client.text)
        if finish == "stop":
            return Finish(reason="stop"), answer
        if finish == "max-tokens":
            return Finish(reason="max-tokens"), answer
        if finish == "aborted":
            return _ABORTED, answer
        return _failed(code or "ACP_STOP_REASON", f"the ACP child stopped with {stop!r}"), answer
