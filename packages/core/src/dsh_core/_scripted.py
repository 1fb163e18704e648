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
    message_text,
    new_id,
)
from ._errors import DshError
from ._events import ToolSchema
from ._frozen import attrs_eq, attrs_hash, attrs_repr, builder, speed_up_inits
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

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

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

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

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

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

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
                return message_text(m.content)
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
        raw_rules = data.get("rules", ())
        if not isinstance(raw_rules, list | tuple):
            raise ScriptError(f"`rules` is a list of {{when, reply}} tables, got {raw_rules!r:.80}")
        rules = [_parse_rule(r, i) for i, r in enumerate(raw_rules)]
        default = data.get("default")
        fallback = _parse_reply(default, "default") if default is not None else None
        fallback_templated = fallback is not None and _templated(fallback)
        unknown = set(data) - {"rules", "default"}
        if unknown:
            raise ScriptError(f"unknown script keys {sorted(unknown)}")

        def script(request: ScriptedRequest) -> ReplyLike:
            for when, reply, templated in rules:
                captured = when(request)
                if captured is not None:
                    return _render(reply, request, captured) if templated else reply
            if fallback is not None:
                return _render(fallback, request, {}) if fallback_templated else fallback
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
        (regex), ``tool`` (a tool the model is offered), ``last_tool_result`` (regex searched in
        the tool result the latest message is), ``unanswered`` (regex searched in each message
        after the latest assistant message), ``conversation`` (regex searched in every
        message's text, joined by newlines). ``reply`` keys: ``text``, ``reasoning``,
        ``tool_calls`` (``[{name, arguments}]``), ``finish``, ``error`` (``{message, code}``).
        In reply text and in the calls' string arguments, ``{{last_user}}``,
        ``{{last_tool_result}}`` and ``{{NAME}}`` (a named group the rule's regexes captured)
        are replaced by the request's values (docs/scripted-model.md).
        """
        import tomllib  # only when a file is read: a start reads none (PERF-10)

        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
            data = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
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
        if produced.__class__ is str:  # the usual reply: its chunks, without a ScriptedReply
            return _Replay.text(produced)
        plain = produced.__class__ is ScriptedReply
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

    @classmethod
    def text(cls, text: str) -> _Replay:
        """The chunks of a reply that is ``text`` alone (what ``_chunks`` makes of it)."""
        replay = cls.__new__(cls)
        replay._reply = None
        stop = _FINISHES["stop"]
        replay._chunks = iter((_text_delta(index=0, text=text), stop) if text else (stop,))
        return replay

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

_WHEN_KEYS = frozenset(
    {"last_user", "last_role", "system", "tool", "last_tool_result", "unanswered", "conversation"}
)
_REPLY_KEYS = frozenset({"text", "reasoning", "tool_calls", "finish", "error"})
_ROLES = frozenset({"user", "tool", "assistant"})
#: The placeholders every reply may use; a capture group may not take their names.
_BUILTINS = frozenset({"last_user", "last_tool_result"})
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")

#: A rule's condition: ``None`` when it fails, else the named groups its regexes captured.
_When: TypeAlias = Callable[[ScriptedRequest], "dict[str, str] | None"]
#: A parsed rule: its condition, its reply, and whether the reply holds ``{{...}}``.
_Rule: TypeAlias = "tuple[_When, ScriptedReply, bool]"
_NO_CAPTURES: dict[str, str] = {}


def _unanswered(request: ScriptedRequest) -> Iterator[Message]:
    """The messages after the latest assistant message, oldest first: what the model has not
    answered yet (tool results, user messages, notices)."""
    messages = request.messages
    i = len(messages)
    while i > 0 and messages[i - 1].role != "assistant":
        i -= 1
    return iter(messages[i:])


def _searchable(message: Message) -> str:
    """The text a condition searches: a tool result's content, else the text blocks."""
    if message.role == "assistant":
        return message.text
    if message.role != "tool":  # user and system: blocks a blank line apart, as a model reads
        return message_text(message.content)
    return "".join(
        blocks_text(b.content) for b in message.content if isinstance(b, ToolResultBlock)
    )


def _regex_test(
    key: str, pattern: re.Pattern[str]
) -> Callable[[ScriptedRequest], dict[str, str] | None]:
    """The test of one regex condition: the named groups of its match, or ``None``."""

    def groups(found: re.Match[str] | None) -> dict[str, str] | None:
        if found is None:
            return None
        return {k: v for k, v in found.groupdict().items() if v is not None}

    if key == "last_user":
        return lambda r: groups(pattern.search(r.last_user_text))
    if key == "system":
        return lambda r: groups(pattern.search(r.system))
    if key == "last_tool_result":

        def last_tool_result(r: ScriptedRequest) -> dict[str, str] | None:
            text = r.last_tool_result
            return None if text is None else groups(pattern.search(text))

        return last_tool_result

    if key == "conversation":
        return lambda r: groups(pattern.search("\n".join(_searchable(m) for m in r.messages)))

    def unanswered(r: ScriptedRequest) -> dict[str, str] | None:
        for m in _unanswered(r):
            found = pattern.search(_searchable(m))
            if found is not None:
                return groups(found)
        return None

    return unanswered


def _parse_rule(raw: object, i: int) -> _Rule:
    if not isinstance(raw, Mapping) or set(raw) - {"when", "reply"} or "reply" not in raw:
        raise ScriptError(f"rule {i} must be {{when, reply}}")
    when = raw.get("when", {})
    if not isinstance(when, Mapping) or set(when) - _WHEN_KEYS:
        raise ScriptError(f"rule {i}: `when` keys are {sorted(_WHEN_KEYS)}")
    tests: list[Callable[[ScriptedRequest], dict[str, str] | None]] = []
    for key in ("last_user", "system", "last_tool_result", "unanswered", "conversation"):
        if key not in when:
            continue
        if not isinstance(when[key], str):
            raise ScriptError(
                f"rule {i}: `{key}` is a regular expression (a string), got {when[key]!r:.80}"
            )
        try:
            pattern = re.compile(when[key])
        except re.error as exc:
            raise ScriptError(f"rule {i}: bad regex: {exc}") from exc
        taken = _BUILTINS & set(pattern.groupindex)
        if taken:
            raise ScriptError(
                f"rule {i}: `{key}` names a group {sorted(taken)[0]!r}, a built-in placeholder"
            )
        tests.append(_regex_test(key, pattern))
    if "last_role" in when:
        role = when["last_role"]
        if not isinstance(role, str) or role not in _ROLES:
            raise ScriptError(f"rule {i}: `last_role` is one of {sorted(_ROLES)}")
        tests.append(lambda r: _NO_CAPTURES if r.last is not None and r.last.role == role else None)
    if "tool" in when:
        tool = when["tool"]
        if not isinstance(tool, str):
            raise ScriptError(f"rule {i}: `tool` is a tool name (a string), got {tool!r:.80}")
        tests.append(lambda r: _NO_CAPTURES if tool in r.tool_names else None)

    def holds(r: ScriptedRequest) -> dict[str, str] | None:
        captured = _NO_CAPTURES
        for test in tests:
            found = test(r)
            if found is None:
                return None
            if found:
                captured = {**captured, **found}
        return captured

    reply = _parse_reply(raw["reply"], f"rule {i}")
    return holds, reply, _templated(reply)


def _parse_reply(raw: object, where: str) -> ScriptedReply:
    if isinstance(raw, str):
        return ScriptedReply(text=raw)
    if not isinstance(raw, Mapping) or set(raw) - _REPLY_KEYS:
        raise ScriptError(f"{where}: a reply is a string or an object with {sorted(_REPLY_KEYS)}")
    calls: list[ScriptedToolCall] = []
    raw_calls = raw.get("tool_calls", ())
    if not isinstance(raw_calls, list | tuple):
        raise ScriptError(f"{where}: `tool_calls` is a list of {{name, arguments?}} tables")
    for c in raw_calls:
        if not isinstance(c, Mapping) or "name" not in c or set(c) - {"name", "arguments", "id"}:
            raise ScriptError(f"{where}: a tool call is {{name, arguments?}}")
        name = c["name"]
        if not isinstance(name, str) or not name:
            raise ScriptError(f"{where}: a tool call's `name` is a non-empty string")
        call_id = c.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise ScriptError(f"{where}: a tool call id is a string")
        call = ScriptedToolCall(name=name, arguments=c.get("arguments", {}), id=call_id)
        if not isinstance(call.arguments, str | Mapping):
            raise ScriptError(f"{where}: tool call {name!r}: `arguments` is a table or JSON text")
        try:
            call.raw_arguments()
        except (TypeError, ValueError) as exc:  # a TOML date, say: JSON has no such value
            raise ScriptError(
                f"{where}: tool call {name!r}: `arguments` is not JSON: {exc}"
            ) from exc
        calls.append(call)
    error = raw.get("error")
    failure = None
    if error is not None:
        if not isinstance(error, Mapping) or set(error) - {"message", "code"}:
            raise ScriptError(f"{where}: error is {{message, code}}")
        message = error.get("message", "scripted failure")
        code = error.get("code", "SCRIPTED")
        if not isinstance(message, str) or not isinstance(code, str):
            raise ScriptError(f"{where}: error's `message` and `code` are strings")
        failure = LlmFailure(message=message, code=code)
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


def _templated(reply: ScriptedReply) -> bool:
    """Whether ``reply`` holds a ``{{...}}`` placeholder in its text or its calls' arguments."""
    if reply.text is not None and "{{" in reply.text:
        return True
    return any("{{" in call.raw_arguments() for call in reply.tool_calls)


def _render(
    reply: ScriptedReply, request: ScriptedRequest, captured: Mapping[str, str]
) -> ScriptedReply:
    """``reply`` with its placeholders filled: ``{{last_user}}``, ``{{last_tool_result}}`` and
    the named groups ``captured``, in the text and in string values of the calls' arguments
    (raw JSON arguments get the value JSON-escaped). An unknown placeholder stays as written."""
    values: dict[str, str] | None = None

    def value(name: str) -> str | None:
        nonlocal values
        if values is None:
            values = {
                "last_user": request.last_user_text,
                "last_tool_result": request.last_tool_result or "",
                **captured,
            }
        return values.get(name)

    def fill(text: str, escape: bool = False) -> str:
        def one(found: re.Match[str]) -> str:
            got = value(found.group(1))
            if got is None:
                return found.group(0)
            return json.dumps(got)[1:-1] if escape else got

        return _PLACEHOLDER.sub(one, text) if "{{" in text else text

    def fill_json(item: Any) -> Any:
        if isinstance(item, str):
            return fill(item)
        if isinstance(item, Mapping):
            return {k: fill_json(v) for k, v in item.items()}
        if isinstance(item, list | tuple):
            return [fill_json(v) for v in item]
        return item

    text = fill(reply.text) if reply.text is not None else None
    calls = tuple(
        attrs.evolve(
            call,
            arguments=fill(call.arguments, escape=True)
            if isinstance(call.arguments, str)
            else fill_json(call.arguments),
        )
        for call in reply.tool_calls
    )
    return attrs.evolve(reply, text=text, tool_calls=calls)


def _names(items: Iterable[object]) -> list[str]:
    return [str(i) for i in items]


speed_up_inits(globals())

# Built for every scripted request: plain-function builders (see dsh_core._frozen.builder).
_request = builder(ScriptedRequest)
_reply = builder(ScriptedReply)
_text_delta = builder(TextDelta)
_call_delta = builder(ToolCallDelta)
