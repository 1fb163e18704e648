"""The OpenAI-compatible chat-completions adapter (host-core §2, the LLM seam).

One :meth:`OpenAIAdapter.stream` call is one request (the transport's retries included): the
conversation goes out as chat-completions messages, the SSE stream comes back as the seam's
chunks. Two transports do the HTTP work (connection pooling, SSE parsing, retries with backoff
honouring ``Retry-After``, typed errors), chosen by the row's ``transport``:

* ``builtin`` (the default, :mod:`dsh_llm_openai._http`): the standard library only, so a run
  reaches its first request without importing the ``openai`` SDK (most of a second of
  start-up). This module never imports ``openai`` on that path (HTTP-1).
* ``openai-sdk``: the official ``openai`` package (the ``[sdk]`` extra). Chunks are read as
  plain JSON objects (``cast_to=object``), not as the SDK's pydantic models: building a model
  per chunk costs more than everything else the adapter does per chunk together.

Both give the same chunks and the same failures (HTTP-3): the SDK's behaviour is the
builtin transport's specification.

Every failure ends the stream with an ``error`` finish carrying an :class:`LlmFailure` (never a
raise), so a retry policy on ``agent/request-error`` sees it; the API key is never part of a
failure's text.

Text the wire cannot carry (ROB-50): the session log keeps what was said, lone surrogates
included; the request body is made well-formed UTF-8 here, at the boundary. The body is
serialised once, as the SDK would; only when encoding it fails are the lone surrogates
replaced with U+FFFD (a surrogate pair that spells a character becomes that character), with
one warning per adapter on the ``dsh.llm_openai`` logger. An API key that cannot go in a
header fails the request before anything is sent (``BAD_API_KEY``), never shown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import sys
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import attrs

from dsh_core import (
    AbortSignal,
    Finish,
    GenerateOptions,
    LlmFailure,
    Message,
    ReasoningBlock,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolCallDelta,
    ToolResultBlock,
    UsageChunk,
    message_text,
    thaw_json,
)

from . import _http
from .__about__ import __version__

__all__ = ["OpenAIAdapter", "OpenAIConfig", "request_body"]

#: Where the key is read from when the row names no other variable.
DEFAULT_KEY_ENV = "OPENAI_API_KEY"

_log = logging.getLogger("dsh.llm_openai")


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"key {attribute.name!r} must be a positive number of seconds, got {value!r}"
        )


#: The most retries a row may ask for (each retry backs off, so ten already wait minutes).
MAX_RETRIES = 10


def _retries(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 0 <= value <= MAX_RETRIES:
        raise ValueError(f"key {attribute.name!r} must be from 0 to {MAX_RETRIES}, got {value!r}")


def _url(instance: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is None:
        return
    if not re.match(r"https?://[^/\s]+", value):
        raise ValueError(f"key {attribute.name!r} must be an http(s) URL, got {value!r}")
    parts = urllib.parse.urlsplit(value)
    try:
        port_ok = parts.port != 0
    except ValueError:  # a port that is not a number, or out of 0-65535
        port_ok = False
    if not (parts.hostname and port_ok):
        raise ValueError(
            f"key {attribute.name!r} must be an http(s) URL with a host and, if any, a port "
            f"from 1 to 65535, got {value!r}"
        )


#: An HTTP field name is a token (RFC 9110 §5.1, §5.6.2).
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: A value goes out as ASCII: visible characters, space and tab (no CR, LF, NUL or other
#: control character, which would split or end the header).
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e]*")


def _headers(
    instance: object, attribute: attrs.Attribute[Mapping[str, str]], value: Mapping[str, str]
) -> None:
    for name, text in value.items():
        if not _TOKEN.fullmatch(name):
            raise ValueError(
                f"key 'headers.{name}': not an HTTP header name (letters, digits and "
                "!#$%&'*+-.^_`|~ only)"
            )
        if not _FIELD_VALUE.fullmatch(text):  # the value may be a secret: never shown
            raise ValueError(
                f"key 'headers.{name}': the value must be printable ASCII (no CR, LF, NUL or "
                "other control character)"
            )


def _one_of(*allowed: str) -> Any:
    def check(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
        if value not in allowed:
            raise ValueError(
                f"key {attribute.name!r} must be one of {list(allowed)}, got {value!r}"
            )

    return check


#: The transports a row may choose (``transport``).
TRANSPORTS = ("builtin", "openai-sdk")
_NO_SDK = (
    "key 'transport' is 'openai-sdk', but the openai package is not installed: "
    "pip install 'dsh-llm-openai[sdk]'"
)


def _transport(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    """One of :data:`TRANSPORTS`; ``openai-sdk`` needs the SDK installed (HTTP-2): found
    without importing it."""
    _one_of(*TRANSPORTS)(instance, attribute, value)
    if value == "openai-sdk" and "openai" not in sys.modules:
        import importlib.util

        if importlib.util.find_spec("openai") is None:
            raise ValueError(_NO_SDK)


def _non_empty(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not value:
        raise ValueError(f"key {attribute.name!r} must not be empty")


@attrs.frozen(kw_only=True)
class OpenAIConfig:
    """The ``llm-openai`` row's config (every key optional; docs/configuration.md).

    With nothing set it honours the ecosystem's ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``.
    ``api_key`` is never shown (not in ``repr``, errors or logs); prefer ``api_key_env``, the
    environment variable to read it from.
    """

    provider: str = attrs.field(default="openai", validator=_non_empty)
    base_url: str | None = attrs.field(default=None, validator=_url)
    api_key: str | None = attrs.field(default=None, repr=False)
    api_key_env: str = attrs.field(default=DEFAULT_KEY_ENV, validator=_non_empty)
    model: str | None = None
    timeout: float = attrs.field(default=600.0, validator=_positive)
    connect_timeout: float = attrs.field(default=10.0, validator=_positive)
    max_retries: int = attrs.field(default=2, validator=_retries)
    headers: Mapping[str, str] = attrs.field(factory=dict, validator=_headers)
    max_tokens_field: str = attrs.field(
        default="max_tokens", validator=_one_of("max_tokens", "max_completion_tokens")
    )
    send_reasoning: bool = False
    transport: str = attrs.field(default="builtin", validator=_transport)

    def resolved_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The key: ``api_key``, else the variable ``api_key_env`` names (unset or empty:
        ``None``)."""
        if self.api_key:
            return self.api_key
        return (os.environ if environ is None else environ).get(self.api_key_env) or None


# -- requests -----------------------------------------------------------------------------------


def _text(blocks: tuple[Any, ...]) -> str:
    if len(blocks) == 1:
        only = blocks[0]
        return only.text if only.__class__ is TextBlock else ""
    return "".join([b.text for b in blocks if b.__class__ is TextBlock])


def _wire_messages(
    system: str | None, messages: Sequence[Message], send_reasoning: bool
) -> list[dict[str, Any]]:
    """The conversation as chat-completions messages. Reasoning goes back only when asked
    (``reasoning_content``): DeepSeek's reasoner refuses a request that carries it."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for m in messages:
        role = m.role
        if role == "assistant":
            wire: dict[str, Any] = {"role": "assistant", "content": _text(m.content) or None}
            calls = [
                {
                    "id": b.id,
                    "type": "function",
                    "function": {"name": b.name, "arguments": b.arguments},
                }
                for b in m.content
                if b.__class__ is ToolCallBlock
            ]
            if calls:
                wire["tool_calls"] = calls
            if send_reasoning:
                reasoning = "".join(b.text for b in m.content if b.__class__ is ReasoningBlock)
                if reasoning:
                    wire["reasoning_content"] = reasoning
            if wire["content"] is None and not calls:
                continue  # only reasoning: nothing an endpoint accepts as a turn
            out.append(wire)
        elif role == "tool":
            out.extend(
                {"role": "tool", "tool_call_id": b.tool_call_id, "content": _text(b.content)}
                for b in m.content
                if isinstance(b, ToolResultBlock)
            )
        else:  # user and system messages are text, their blocks a blank line apart (ROB-83)
            out.append({"role": role, "content": message_text(m.content)})
    return out


def request_body(options: GenerateOptions, config: OpenAIConfig) -> dict[str, Any]:
    """The JSON body of the chat-completions request for ``options``."""
    body: dict[str, Any] = {
        "model": options.model,
        "messages": _wire_messages(options.system, options.messages, config.send_reasoning),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if options.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": thaw_json(t.parameters),
                },
            }
            for t in options.tools
        ]
    if options.max_tokens is not None:
        body[config.max_tokens_field] = options.max_tokens
    if options.temperature is not None:
        body["temperature"] = options.temperature
    if options.stop:
        body["stop"] = list(options.stop)
    return body


def _well_formed(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD; a surrogate pair becomes the
    character it spells (UTF-16 is the encoding whose pairs they are)."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


# -- failures -------------------------------------------------------------------------------------

#: HTTP statuses with a code of their own (anything else is ``HTTP_ERROR``; 5xx ``SERVER_ERROR``).
_STATUS_CODES = {
    400: "BAD_REQUEST",
    401: "AUTHENTICATION",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    422: "BAD_REQUEST",
    429: "RATE_LIMITED",
}


class _Redactor:
    """Removes the API key (and its head and tail, which some endpoints echo in masked form,
    ``sk-abc...wxyz``) from text leaving the adapter."""

    __slots__ = ("_pattern",)

    def __init__(self, key: str | None) -> None:
        parts = [key] if key else []
        if key and len(key) >= 16:
            parts += [key[:8], key[-6:]]
        self._pattern = (
            re.compile("|".join(r"\S*" + re.escape(p) + r"\S*" for p in parts)) if parts else None
        )

    def __call__(self, text: str) -> str:
        return self._pattern.sub("[redacted]", text) if self._pattern is not None else text


def _retry_after_ms(headers: Any) -> int | None:
    """``retry-after-ms`` or ``retry-after`` (seconds) as milliseconds, if numeric."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1), ("retry-after", 1000)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            return int(value * scale)
    return None


_TIMED_OUT = LlmFailure(message="the request timed out", code="TIMEOUT")


def _status_failure(status: int, message: str, headers: Any, redact: _Redactor) -> LlmFailure:
    """A non-2xx answer's failure, on either transport: its code by status, the endpoint's
    message, the wait it asked for."""
    code = _STATUS_CODES.get(status) or ("SERVER_ERROR" if status >= 500 else "HTTP_ERROR")
    return LlmFailure(
        message=redact(f"HTTP {status}: {message}"),
        code=code,
        status=status,
        provider_retry_after_ms=_retry_after_ms(headers),
    )


def _builtin_failure(exc: _http.HttpFailure, redact: _Redactor) -> LlmFailure:
    """The builtin transport's failures, worded as the SDK path words them (HTTP-3)."""
    if isinstance(exc, _http.StatusFailure):
        return _status_failure(exc.status, exc.message, exc.headers, redact)
    if isinstance(exc, _http.TimeoutFailure):
        return _TIMED_OUT
    if isinstance(exc, _http.StreamErrorEvent):
        return LlmFailure(message=redact(exc.message), code="PROVIDER_ERROR")
    if isinstance(exc, _http.ProxyUnsupported):
        return LlmFailure(message=redact(str(exc)), code="PROXY_UNSUPPORTED")
    cause = exc.__cause__
    detail = f": {type(cause).__name__}: {cause}" if cause is not None else f": {exc}"
    return LlmFailure(message=redact(f"Connection error.{detail}"), code="CONNECTION")


def failure_of(exc: BaseException, redact: _Redactor) -> LlmFailure:
    """The durable failure of a transport's (or an ``openai``) exception; the key is
    redacted. ``openai`` is looked at only when something imported it (the SDK transport)."""
    if isinstance(exc, _http.HttpFailure):
        return _builtin_failure(exc, redact)
    openai = sys.modules.get("openai")
    if openai is None:
        return LlmFailure(message=redact(f"{type(exc).__name__}: {exc}"), code="UNKNOWN")
    if isinstance(exc, openai.APIStatusError):
        return _status_failure(exc.status_code, exc.message, exc.response.headers, redact)
    if isinstance(exc, openai.APITimeoutError):
        return _TIMED_OUT
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        return LlmFailure(message=redact(f"{exc.message}{detail}"), code="CONNECTION")
    if isinstance(exc, openai.APIError):  # an error event inside the stream
        return LlmFailure(message=redact(exc.message), code="PROVIDER_ERROR")
    return LlmFailure(message=redact(f"{type(exc).__name__}: {exc}"), code="UNKNOWN")


#: ``finish_reason`` values that map to a seam finish; the rest are ``error`` finishes.
_FINISHES: dict[str, Finish] = {
    "stop": Finish(reason="stop"),
    "length": Finish(reason="max-tokens"),
    "tool_calls": Finish(reason="tool-calls"),
    "function_call": Finish(reason="tool-calls"),
}
_TOOL_CALLS_FINISH = _FINISHES["tool_calls"]
_CONTENT_FILTER = Finish(
    reason="error",
    failure=LlmFailure(
        message="the endpoint's content filter stopped the response", code="CONTENT_FILTER"
    ),
)
_CUT = Finish(
    reason="error",
    failure=LlmFailure(
        message="the endpoint's stream ended before a finish reason", code="INCOMPLETE_STREAM"
    ),
)
_ABORTED = Finish(reason="aborted", failure=LlmFailure(message="request aborted", code="ABORTED"))
_NO_KEY = "no API key: set {env} (or the row's `api_key_env` / `api_key`)"
_BAD_KEY = (
    "the API key ({where}) is not printable ASCII (a character outside it, an undecodable "
    "byte or a line break), so it cannot go in a header"
)


def _finish(reason: str) -> Finish:
    found = _FINISHES.get(reason)
    if found is not None:
        return found
    if reason == "content_filter":
        return _CONTENT_FILTER
    return Finish(
        reason="error",
        failure=LlmFailure(
            message=f"the endpoint finished with {reason!r}", code="UNEXPECTED_FINISH"
        ),
    )


def _usage(raw: Mapping[str, Any]) -> TokenUsage | None:
    prompt, completion = raw.get("prompt_tokens"), raw.get("completion_tokens")
    if type(prompt) is not int or type(completion) is not int:
        return None
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    if cached is None:
        cached = raw.get("prompt_cache_hit_tokens")  # DeepSeek's name
    return TokenUsage(
        input_tokens=prompt,
        output_tokens=completion,
        cache_read_tokens=cached if type(cached) is int else None,
    )


# -- the adapter ---------------------------------------------------------------------------------


class OpenAIAdapter:
    """Streams chat completions from an OpenAI-compatible endpoint (an :class:`LlmAdapter`).

    The client is made on first use (so a host boots without network or key) and closed by
    :meth:`aclose`. Reasoning deltas (``reasoning_content``, or ``reasoning`` as Ollama and
    OpenRouter name it) become a reasoning block; text and each tool call get blocks of their
    own, numbered in the order they first appear.
    """

    def __init__(self, config: OpenAIConfig | None = None) -> None:
        self.config = config or OpenAIConfig()
        self._key = self.config.resolved_key()
        self._redact = _Redactor(self._key)
        self._client: Any = None
        self._builtin = self.config.transport == "builtin"
        self._bad_key: LlmFailure | None = None
        if self._key is not None and not _FIELD_VALUE.fullmatch(self._key):
            where = "`api_key`" if self.config.api_key else f"from {self.config.api_key_env}"
            self._bad_key = LlmFailure(message=_BAD_KEY.format(where=where), code="BAD_API_KEY")
        self._replaced = False  # whether a request has had text replaced (warned once)

    def _encode(self, body: dict[str, Any]) -> bytes:
        """The body as UTF-8 JSON, serialised as the SDK does (``openapi_dumps``); lone
        surrogates are replaced only when the fast encode fails (warned once per adapter)."""
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        try:
            return text.encode()
        except UnicodeEncodeError:
            pass
        if not self._replaced:
            self._replaced = True
            _log.warning(
                "a request to %s carried text that is not valid Unicode (a lone surrogate); "
                "it was sent with U+FFFD in its place (the session log keeps the original; "
                "said once per adapter)",
                self.config.provider,
            )
        return _well_formed(text).encode()

    def _wire_headers(self) -> dict[str, str]:
        """The builtin transport's request headers, as the SDK sends the ones that matter
        (HTTP-30); the row's ``headers`` replace same-named ones."""
        headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "User-Agent": f"dsh-llm-openai/{__version__}",
            "Accept-Encoding": "identity",
            "Authorization": f"Bearer {self._key}",
        }
        for name, variable in (
            ("OpenAI-Organization", "OPENAI_ORG_ID"),
            ("OpenAI-Project", "OPENAI_PROJECT_ID"),
        ):
            value = os.environ.get(variable)
            if value and _FIELD_VALUE.fullmatch(value):
                headers[name] = value
        own = {name.lower() for name in self.config.headers}
        headers = {k: v for k, v in headers.items() if k.lower() not in own}
        headers.update(self.config.headers)
        return headers

    def _make_client(self) -> Any:
        c = self.config
        if self._builtin:
            return _http.Transport(
                url=_http.chat_completions_url(c.base_url),
                headers=self._wire_headers(),
                timeout=c.timeout,
                connect_timeout=c.connect_timeout,
                max_retries=c.max_retries,
            )
        import openai

        return openai.AsyncOpenAI(
            api_key=self._key,
            base_url=c.base_url,  # None: OPENAI_BASE_URL, else OpenAI's
            timeout=openai.Timeout(c.timeout, connect=c.connect_timeout),
            max_retries=c.max_retries,
            default_headers=dict(c.headers) or None,
        )

    async def aclose(self) -> None:
        """Close the HTTP client (its pooled connections)."""
        client, self._client = self._client, None
        if client is None:
            return
        if self._builtin:
            await client.aclose()
        else:
            await client.close()

    def stream(self, options: GenerateOptions) -> AsyncIterator[StreamChunk]:
        """One request's chunks, ending with exactly one :class:`Finish`."""
        return self._stream(options)

    async def _stream(self, options: GenerateOptions) -> AsyncIterator[StreamChunk]:
        if self._key is None:
            yield Finish(
                reason="error",
                failure=LlmFailure(
                    message=_NO_KEY.format(env=self.config.api_key_env), code="NO_API_KEY"
                ),
            )
            return
        if self._bad_key is not None:
            yield Finish(reason="error", failure=self._bad_key)
            return
        signal = options.signal
        if signal is not None and signal.aborted:
            yield _ABORTED
            return
        client = self._client
        if client is None:
            try:
                client = self._client = self._make_client()
            except Exception as exc:  # OPENAI_BASE_URL, which no row validated, say
                yield Finish(reason="error", failure=failure_of(exc, self._redact))
                return
        watch = _Watch(signal)
        stream: Any = None
        try:
            try:
                content = self._encode(request_body(options, self.config))
                watch.task = asyncio.current_task()
                watch.waiting = True
                try:
                    if self._builtin:
                        stream = await client.open(content)
                    else:
                        stream = await client.post(
                            "/chat/completions",
                            cast_to=object,
                            content=content,
                            options={"security": {"bearer_auth": True}},
                            stream=True,
                            stream_cls=_stream_cls(),
                        )
                finally:
                    watch.waiting = False
                # The stream's objects, mapped inline (one generator layer, no per-chunk call):
                # text and reasoning runs and each tool call (by its wire index) get block
                # indexes in the order they first appear; the finish waits for the usage.
                anext_ = stream.__aiter__().__anext__
                current_task = asyncio.current_task
                blocks: dict[object, int] = {}
                call_ids: dict[object, str] = {}  # the id of the call each wire key holds now
                next_index = 0
                last_kind: object = None
                finish_reason: str | None = None
                usage: TokenUsage | None = None
                saw_calls = False
                while True:
                    if signal is not None and signal.aborted:
                        raise _Aborted
                    watch.task = current_task()  # the reader may change between chunks
                    watch.waiting = True
                    try:
                        data = await anext_()
                    except StopAsyncIteration:
                        break
                    finally:
                        watch.waiting = False
                    if data.__class__ is not dict:
                        continue
                    choices = data.get("choices")
                    if choices:
                        choice = choices[0]
                        delta = choice.get("delta")
                        if delta:
                            content = delta.get("content")
                            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                            if reasoning and reasoning.__class__ is str:
                                if last_kind != "reasoning":
                                    last_kind = "reasoning"
                                    blocks["reasoning"] = next_index
                                    next_index += 1
                                yield ReasoningDelta(index=blocks["reasoning"], text=reasoning)
                            if content and content.__class__ is str:
                                if last_kind != "text":
                                    last_kind = "text"
                                    blocks["text"] = next_index
                                    next_index += 1
                                yield TextDelta(index=blocks["text"], text=content)
                            calls = delta.get("tool_calls")
                            if calls:
                                saw_calls = True
                                for call in calls:
                                    wire = call.get("index")
                                    if wire is None:  # some servers send whole calls, unindexed
                                        wire = call.get("id") or (
                                            last_kind[1] if last_kind.__class__ is tuple else 0
                                        )
                                    key = ("call", wire)
                                    index = blocks.get(key)
                                    call_id = call.get("id")
                                    if (
                                        call_id
                                        and call_id.__class__ is str
                                        and call_ids.setdefault(key, call_id) != call_id
                                    ):  # a new call under a used index (Ollama numbers every
                                        # parallel call 0): a block of its own
                                        call_ids[key] = call_id
                                        index = None
                                    if index is None:
                                        index = blocks[key] = next_index
                                        next_index += 1
                                    last_kind = key
                                    yield _call_delta(index, call)
                        reason = choice.get("finish_reason")
                        if reason and reason.__class__ is str:
                            finish_reason = reason
                    raw_usage = data.get("usage")
                    if raw_usage and raw_usage.__class__ is dict:
                        usage = _usage(raw_usage) or usage
                if usage is not None:
                    yield UsageChunk(usage=usage)
                if finish_reason is None:
                    yield _CUT
                elif saw_calls and finish_reason == "stop":
                    yield _TOOL_CALLS_FINISH  # some servers say "stop" after tool calls
                else:
                    yield _finish(finish_reason)
            except asyncio.CancelledError:
                task = watch.cancelled
                if task is None:
                    raise  # not ours: the caller's cancellation goes on
                task.uncancel()
                yield _ABORTED
            except _Aborted:
                yield _ABORTED
            except Exception as exc:
                if signal is not None and signal.aborted:
                    yield _ABORTED
                else:
                    yield Finish(reason="error", failure=failure_of(exc, self._redact))
        finally:
            watch.close()
            if stream is not None:
                await stream.close()  # the HTTP stream closes now, even on cancellation


def _call_delta(index: int, call: Mapping[str, Any]) -> ToolCallDelta:
    function = call.get("function") or {}
    name = function.get("name")
    arguments = function.get("arguments")
    call_id = call.get("id")
    return ToolCallDelta(
        index=index,
        id=call_id if call_id.__class__ is str and call_id else None,
        name=name if name.__class__ is str and name else None,
        arguments_delta=arguments if arguments.__class__ is str else "",
    )


_STREAM_CLS: Any = None


def _stream_cls() -> Any:
    global _STREAM_CLS
    if _STREAM_CLS is None:
        import openai

        _STREAM_CLS = openai.AsyncStream[object]
    return _STREAM_CLS


class _Aborted(Exception):
    """The request's signal fired between two reads."""


class _Watch:
    """Lets the request's signal stop a wait on the network.

    The stream marks the task that reads it and whether it is waiting on the network. When
    the signal fires during such a wait and nobody is cancelling that task already (the agent
    loop does, for its own requests: then the cancellation is the loop's to handle), the task
    is cancelled here and :attr:`cancelled` names it, so the stream can take the cancellation
    back and end ``aborted``. Between waits nothing but two attributes is touched.
    """

    __slots__ = ("_remove", "cancelled", "task", "waiting")

    def __init__(self, signal: AbortSignal | None) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.waiting = False
        self.cancelled: asyncio.Task[Any] | None = None
        self._remove = signal.add_listener(self._on_abort) if signal is not None else None

    def _on_abort(self, _: object) -> None:
        task = self.task
        if (
            self.waiting
            and task is not None
            and task.cancelling() == 0
            and asyncio.current_task() is not task
        ):
            self.cancelled = task
            task.cancel()

    def close(self) -> None:
        if self._remove is not None:
            self._remove()
            self._remove = None
