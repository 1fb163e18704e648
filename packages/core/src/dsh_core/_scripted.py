"""The scripted model: an offline LLM adapter that replays replies (demo and test default).

Replies come from a Python callable given each request, or from a JSON/TOML script of rules.
A reply becomes a small, deterministic chunk stream; it can hold the model "in a request"
(``wait``) and honours the request's abort signal there, finishing ``aborted``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import tomllib
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from pathlib import Path
from typing import Any, TypeAlias, get_args

import attrs

from ._abort import AbortSignal
from ._content import (
    Finish,
    FinishReason,
    LlmError,
    LlmFailure,
    Message,
    PluginSource,
    ReasoningDelta,
    StreamChunk,
    TextDelta,
    TokenUsage,
    ToolCallDelta,
    ToolResultBlock,
    UsageChunk,
    blocks_text,
    new_id,
)
from ._errors import DshError
from ._events import ToolSchema
from ._frozen import builder, speed_up_inits
from ._json import dumps
from ._llm import GenerateOptions

__all__ = [
    "ScriptError",
    "ScriptedAdapter",
    "ScriptedReply",
    "ScriptedRequest",
    "ScriptedToolCall",
]


class ScriptError(DshError, ValueError):
    """A model script is malformed (``SCRIPT_INVALID``)."""

    code = "SCRIPT_INVALID"


@attrs.frozen(kw_only=True)
class ScriptedToolCall:
    """A tool call the model makes; ``arguments`` is an object or raw JSON text."""

    name: str
    arguments: Any = attrs.field(factory=dict)
    id: str | None = None

    def raw_arguments(self) -> str:
        """The arguments as the raw JSON text a model would send."""
        return self.arguments if isinstance(self.arguments, str) else dumps(self.arguments)


@attrs.frozen(kw_only=True)
class ScriptedReply:
    """One model response.

    ``finish`` defaults to ``tool-calls`` with calls, else ``stop``. ``failure`` ends the stream
    with an ``error`` finish (or raises :class:`LlmError` when ``raise_failure``). ``wait`` is
    awaited after the text and before the finish, racing the request's abort signal.
    ``chunks`` replaces everything with an exact chunk list.
    """

    text: str | None = None
    reasoning: str | None = None
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    finish: FinishReason | None = None
    usage: TokenUsage | None = None
    failure: LlmFailure | None = None
    raise_failure: bool = False
    wait: Callable[[], Awaitable[object]] | None = attrs.field(default=None, eq=False)
    chunks: tuple[StreamChunk, ...] | None = None


ReplyLike: TypeAlias = "ScriptedReply | str"
Script: TypeAlias = Callable[["ScriptedRequest"], "ReplyLike | Awaitable[ReplyLike]"]


@attrs.frozen(kw_only=True)
class ScriptedRequest:
    """One request the scripted model served: what a script sees, and what
    :attr:`ScriptedAdapter.requests` records. ``options`` is the raw :class:`GenerateOptions`;
    its fields read through (``model``, ``tools``, ``max_tokens``, ...), and ``system`` is
    ``''`` rather than ``None`` when there is none."""

    options: GenerateOptions
    index: int

    @property
    def provider(self) -> str:
        """The provider the request was routed to."""
        return self.options.provider

    @property
    def model(self) -> str:
        """The model asked for."""
        return self.options.model

    @property
    def tools(self) -> tuple[ToolSchema, ...] | None:
        """The tool schemas offered (``None``: none)."""
        return self.options.tools

    @property
    def max_tokens(self) -> int | None:
        """The output token limit, if any."""
        return self.options.max_tokens

    @property
    def temperature(self) -> float | None:
        """The sampling temperature, if any."""
        return self.options.temperature

    @property
    def stop(self) -> tuple[str, ...] | None:
        """The stop sequences, if any."""
        return self.options.stop

    @property
    def signal(self) -> AbortSignal | None:
        """The request's abort signal."""
        return self.options.signal

    @property
    def loop_request(self) -> bool:
        """Whether the agent loop built the request from its log."""
        return self.options.loop_request

    @property
    def messages(self) -> Sequence[Message]:
        """The conversation sent to the model (a tuple-like immutable sequence)."""
        return self.options.messages

    @property
    def system(self) -> str:
        """The system text ('' if none)."""
        return self.options.system or ""

    @property
    def session_id(self) -> str | None:
        """The requesting session, for loop-built requests."""
        return self.options.session_id

    @property
    def tool_names(self) -> tuple[str, ...]:
        """The tools offered to the model."""
        return tuple(t.name for t in self.options.tools or ())

    @property
    def last(self) -> Message | None:
        """The latest message."""
        try:  # one look-up: the loop's messages are a view whose every access is a call
            return self.options.messages[-1]
        except IndexError:
            return None

    @property
    def last_user_text(self) -> str:
        """The text of the latest user-role message that is not a runtime-context snapshot."""
        for m in reversed(self.options.messages):
            if m.role == "user" and not (
                isinstance(m.source, PluginSource) and m.source.form == "snapshot"
            ):
                return m.text
        return ""

    @property
    def last_tool_result(self) -> str | None:
        """The text of the latest tool result, if the latest message is one."""
        last = self.last
        if last is None or last.role != "tool":
            return None
        for block in last.content:
            if isinstance(block, ToolResultBlock):
                return blocks_text(block.content)
        return None


class ScriptedAdapter:
    """Replays replies from ``script``; records every request it served in ``requests``, as the
    :class:`ScriptedRequest` the script saw (``request.options`` is the raw request).

    ``record=False`` keeps ``requests`` empty: a long-running host (the ``llm-scripted``
    plugin, a benchmark) should not hold every request, and the history each one carries,
    for its whole life. Request indexes count either way.
    """

    def __init__(self, script: Script, *, record: bool = True) -> None:
        self._script = script
        self._record = record
        self._served = 0
        self.requests: list[ScriptedRequest] = []

    # -- constructors ------------------------------------------------------------------------

    @classmethod
    def replies(cls, *replies: ReplyLike, record: bool = True) -> ScriptedAdapter:
        """Serve ``replies`` in order (one per request); running out is an error finish."""
        queue = list(replies)

        def script(request: ScriptedRequest) -> ReplyLike:
            if not queue:
                return ScriptedReply(
                    failure=LlmFailure(
                        message="the script has no more replies", code="SCRIPT_EXHAUSTED"
                    )
                )
            return queue.pop(0)

        return cls(script, record=record)

    @classmethod
    def echo(cls, prefix: str = "", *, record: bool = True) -> ScriptedAdapter:
        """Answer every request with ``prefix`` + the latest user text."""
        return cls(lambda request: prefix + request.last_user_text, record=record)

    @classmethod
    def from_data(cls, data: Mapping[str, Any], *, record: bool = True) -> ScriptedAdapter:
        """Build from a script mapping (see :meth:`from_file` for the format)."""
        rules = [_parse_rule(r, i) for i, r in enumerate(data.get("rules", ()))]
        default = data.get("default")
        fallback = _parse_reply(default, "default") if default is not None else None
        unknown = set(data) - {"rules", "default"}
        if unknown:
            raise ScriptError(f"unknown script keys {sorted(unknown)}")

        def script(request: ScriptedRequest) -> ReplyLike:
            for when, reply in rules:
                if when(request):
                    return _render(reply, request)
            if fallback is not None:
                return _render(fallback, request)
            return ScriptedReply(
                failure=LlmFailure(
                    message="no scripted reply matched the request", code="SCRIPT_NO_MATCH"
                )
            )

        return cls(script, record=record)

    @classmethod
    def from_file(cls, path: str | Path, *, record: bool = True) -> ScriptedAdapter:
        """Build from a JSON or TOML script file.

        Format: ``rules``, a list of ``{when = {...}, reply = {...}}`` tried in order, and an
        optional ``default`` reply. ``when`` keys (all must hold): ``last_user`` (regex searched
        in the latest user text), ``last_role`` (``user``/``tool``/``assistant``), ``system``
        (regex), ``tool`` (a tool the model is offered). ``reply`` keys: ``text``,
        ``reasoning``, ``tool_calls`` (``[{name, arguments}]``), ``finish``, ``error``
        (``{message, code}``). In reply text, ``{{last_user}}`` and ``{{last_tool_result}}`` are
        replaced by the request's values.
        """
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
            data = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
        except (OSError, ValueError) as exc:
            raise ScriptError(f"cannot read model script {p}: {exc}") from exc
        if not isinstance(data, Mapping):
            raise ScriptError(f"model script {p} must be an object")
        return cls.from_data(data, record=record)

    # -- the adapter -------------------------------------------------------------------------

    def stream(self, options: GenerateOptions) -> AsyncIterator[StreamChunk]:
        """Produce the scripted reply for ``options`` as chunks.

        A synchronous script answers when the stream is opened and its chunks are replayed
        from a list; an awaitable script, or a reply that ``wait``s, streams from a generator.
        Either way a failure to raise surfaces on the first read.
        """
        index = self._served
        self._served = index + 1
        request = _request(options=options, index=index)
        if self._record:
            self.requests.append(request)
        produced = self._script(request)
        plain = produced.__class__ is str or produced.__class__ is ScriptedReply
        if not plain and inspect.isawaitable(produced):  # the usual reply skips the ABC check
            return self._awaited(options, produced)
        reply = _as_reply(produced)  # type: ignore[arg-type]
        if reply.wait is not None:
            return self._waiting(options, reply)
        return _Replay(reply)

    async def _awaited(
        self, options: GenerateOptions, produced: Awaitable[ReplyLike]
    ) -> AsyncIterator[StreamChunk]:
        reply = _as_reply(await produced)
        source = self._waiting(options, reply) if reply.wait is not None else _Replay(reply)
        async for chunk in source:
            yield chunk

    async def _waiting(
        self, options: GenerateOptions, reply: ScriptedReply
    ) -> AsyncIterator[StreamChunk]:
        """A reply that awaits ``reply.wait`` (racing the request's signal) before its finish."""
        head, tail = _chunks(reply)
        for chunk in head:
            yield chunk
        if reply.chunks is not None:
            return
        wait = reply.wait
        assert wait is not None
        signal = options.signal
        waiting = asyncio.ensure_future(wait())
        try:  # the wait task is owned here: a consumer that stops reading cancels it
            if signal is not None:
                aborted = asyncio.ensure_future(signal.wait())
                try:
                    done, _ = await asyncio.wait(
                        (waiting, aborted), return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    aborted.cancel()
                if waiting not in done:
                    waiting.cancel()
                    yield Finish(
                        reason="aborted",
                        failure=LlmFailure(message="request aborted", code="ABORTED"),
                    )
                    return
            await waiting
        finally:
            waiting.cancel()
        for chunk in tail:
            yield chunk


def _as_reply(produced: ReplyLike) -> ScriptedReply:
    return _reply(text=produced) if isinstance(produced, str) else produced


def _chunks(reply: ScriptedReply) -> tuple[list[StreamChunk], list[StreamChunk]]:
    """The chunks of ``reply`` before and after its ``wait``. Raises the failure of a reply
    that ``raise_failure``s."""
    if reply.chunks is not None:
        return list(reply.chunks), []
    if reply.raise_failure and reply.failure is not None:
        raise LlmError(reply.failure)
    head: list[StreamChunk] = []
    index = 0
    if reply.reasoning:
        head.append(ReasoningDelta(index=index, text=reply.reasoning))
        index += 1
    if reply.text:
        head.append(_text_delta(index=index, text=reply.text))
        index += 1
    for call in reply.tool_calls:
        head.append(
            _call_delta(
                index=index,
                id=call.id or f"call-{new_id()}",  # the whole id: its head is per process
                name=call.name,
                arguments_delta=call.raw_arguments(),
            )
        )
        index += 1
    tail: list[StreamChunk] = []
    if reply.usage is not None:
        tail.append(UsageChunk(usage=reply.usage))
    if reply.failure is not None:
        tail.append(Finish(reason="error", failure=reply.failure))
    else:
        tail.append(_FINISHES[reply.finish or ("tool-calls" if reply.tool_calls else "stop")])
    return head, tail


class _Replay:
    """The chunks of a reply that needs no waiting, as a plain async iterator (no generator:
    nothing to schedule, finalise or close). Building them, and raising a ``raise_failure``,
    happen on the first read, as they would in a generator."""

    __slots__ = ("_chunks", "_reply")

    def __init__(self, reply: ScriptedReply) -> None:
        self._reply: ScriptedReply | None = reply
        self._chunks: Iterator[StreamChunk] = iter(())

    def __aiter__(self) -> _Replay:
        return self

    async def __anext__(self) -> StreamChunk:
        reply = self._reply
        if reply is not None:
            self._reply = None
            head, tail = _chunks(reply)
            self._chunks = iter(head + tail)
        for chunk in self._chunks:
            return chunk
        raise StopAsyncIteration


#: Failure-free finishes are immutable values: one of each serves every reply.
_FINISHES: dict[str, Finish] = {r: Finish(reason=r) for r in get_args(FinishReason)}


# -- script files ----------------------------------------------------------------------------------

_WHEN_KEYS = frozenset({"last_user", "last_role", "system", "tool"})
_REPLY_KEYS = frozenset({"text", "reasoning", "tool_calls", "finish", "error"})
_ROLES = frozenset({"user", "tool", "assistant"})


def _parse_rule(raw: object, i: int) -> tuple[Callable[[ScriptedRequest], bool], ScriptedReply]:
    if not isinstance(raw, Mapping) or set(raw) - {"when", "reply"} or "reply" not in raw:
        raise ScriptError(f"rule {i} must be {{when, reply}}")
    when = raw.get("when", {})
    if not isinstance(when, Mapping) or set(when) - _WHEN_KEYS:
        raise ScriptError(f"rule {i}: `when` keys are {sorted(_WHEN_KEYS)}")
    tests: list[Callable[[ScriptedRequest], bool]] = []
    try:
        if "last_user" in when:
            pat = re.compile(str(when["last_user"]))
            tests.append(lambda r: pat.search(r.last_user_text) is not None)
        if "system" in when:
            spat = re.compile(str(when["system"]))
            tests.append(lambda r: spat.search(r.system) is not None)
    except re.error as exc:
        raise ScriptError(f"rule {i}: bad regex: {exc}") from exc
    if "last_role" in when:
        role = when["last_role"]
        if role not in _ROLES:
            raise ScriptError(f"rule {i}: `last_role` is one of {sorted(_ROLES)}")
        tests.append(lambda r: r.last is not None and r.last.role == role)
    if "tool" in when:
        tool = when["tool"]
        tests.append(lambda r: tool in r.tool_names)
    return (lambda r: all(t(r) for t in tests)), _parse_reply(raw["reply"], f"rule {i}")


def _parse_reply(raw: object, where: str) -> ScriptedReply:
    if isinstance(raw, str):
        return ScriptedReply(text=raw)
    if not isinstance(raw, Mapping) or set(raw) - _REPLY_KEYS:
        raise ScriptError(f"{where}: a reply is a string or an object with {sorted(_REPLY_KEYS)}")
    calls: list[ScriptedToolCall] = []
    for c in raw.get("tool_calls", ()):
        if not isinstance(c, Mapping) or "name" not in c or set(c) - {"name", "arguments", "id"}:
            raise ScriptError(f"{where}: a tool call is {{name, arguments?}}")
        call_id = c.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise ScriptError(f"{where}: a tool call id is a string")
        calls.append(
            ScriptedToolCall(name=str(c["name"]), arguments=c.get("arguments", {}), id=call_id)
        )
    error = raw.get("error")
    failure = None
    if error is not None:
        if not isinstance(error, Mapping):
            raise ScriptError(f"{where}: error is {{message, code}}")
        failure = LlmFailure(
            message=str(error.get("message", "scripted failure")),
            code=str(error.get("code", "SCRIPTED")),
        )
    for key in ("text", "reasoning"):
        if not isinstance(raw.get(key, ""), str):
            raise ScriptError(f"{where}: `{key}` is a string")
    finish = raw.get("finish")
    if finish not in (None, "stop", "tool-calls", "max-tokens"):
        raise ScriptError(f"{where}: finish must be stop, tool-calls or max-tokens")
    return ScriptedReply(
        text=raw.get("text"),
        reasoning=raw.get("reasoning"),
        tool_calls=tuple(calls),
        finish=finish,
        failure=failure,
    )


def _render(reply: ScriptedReply, request: ScriptedRequest) -> ScriptedReply:
    if reply.text is None or "{{" not in reply.text:
        return reply
    text = reply.text.replace("{{last_user}}", request.last_user_text).replace(
        "{{last_tool_result}}", request.last_tool_result or ""
    )
    return attrs.evolve(reply, text=text)


def _names(items: Iterable[object]) -> list[str]:
    return [str(i) for i in items]


speed_up_inits(globals())

# Built for every scripted request: plain-function builders (see dsh_core._frozen.builder).
_request = builder(ScriptedRequest)
_reply = builder(ScriptedReply)
_text_delta = builder(TextDelta)
_call_delta = builder(ToolCallDelta)
