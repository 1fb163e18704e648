"""The builtin transport (HTTP-1..HTTP-37): framing, SSE, keep-alive, retries, bounds, proxies,
TLS, and the same chunks and failures as the SDK path.

No network: every server here (a raw asyncio one scripted per test, the loopback
chat-completions server, a CONNECT proxy) listens on 127.0.0.1. No test sleeps: retry waits
go to a recording ``sleep``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import itertools
import json
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dsh_core import (
    AbortController,
    Finish,
    GenerateOptions,
    LlmFailure,
    PluginError,
    PluginRow,
    StreamChunk,
    TextDelta,
    user_message,
)
from dsh_core.testing import TestHost
from dsh_llm_openai import OpenAIAdapter, OpenAIConfig, _http
from dsh_llm_openai import plugin as openai_plugin
from dsh_llm_openai.testing import ChatCompletionsServer, Reply, chunk, sse_body, text_reply

KEY = "sk-http-test-0123456789abcdef"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(autouse=True)
def _no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture
def server() -> Iterator[ChatCompletionsServer]:
    with ChatCompletionsServer() as srv:
        yield srv


def request(**changes: Any) -> GenerateOptions:
    return GenerateOptions(provider="openai", model="m", messages=(user_message("hi"),), **changes)


def make(base_url: str, **config: Any) -> OpenAIAdapter:
    config.setdefault("api_key", KEY)
    config.setdefault("max_retries", 0)
    return OpenAIAdapter(OpenAIConfig(base_url=base_url, **config))


@contextlib.asynccontextmanager
async def opened(base_url: str, **config: Any) -> AsyncIterator[OpenAIAdapter]:
    """:func:`make`'s adapter, closed (its pool with it) when the block ends."""
    adapter = make(base_url, **config)
    try:
        yield adapter
    finally:
        await adapter.aclose()


def transport_of(adapter: OpenAIAdapter, waits: list[float] | None = None) -> _http.Transport:
    """The adapter's builtin transport, made now; its retry waits go to ``waits`` (no
    sleeping) with no jitter."""
    client = adapter._client = adapter._make_client()
    assert isinstance(client, _http.Transport)
    if waits is not None:

        async def sleep(seconds: float) -> None:
            waits.append(seconds)

        client.sleep = sleep
        client.random = lambda: 0.0
    return client


async def run(adapter: OpenAIAdapter, options: GenerateOptions | None = None) -> list[StreamChunk]:
    """One request's chunks (the adapter stays open)."""
    async with asyncio.timeout(30):
        return [c async for c in adapter.stream(options or request())]


def text(chunks: list[StreamChunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta))


def failure(chunks: list[StreamChunk]) -> LlmFailure:
    finish = chunks[-1]
    assert isinstance(finish, Finish) and finish.failure is not None, chunks
    return finish.failure


def reason(chunks: list[StreamChunk]) -> str:
    finish = chunks[-1]
    assert isinstance(finish, Finish), chunks
    return finish.reason


# -- a scripted raw server -------------------------------------------------------------------------


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    """One request: its request line, headers (lower-cased names) and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    line, *rest = head.decode("latin-1").split("\r\n")
    headers = {}
    for field in rest:
        if field:
            name, _, value = field.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return line, headers, body


class Raw:
    """A loopback asyncio server: each connection is served by ``handler``; it counts
    connections and requests (the handler calls :meth:`request`)."""

    def __init__(self, handler: Callable[..., Awaitable[None]], tls: ssl.SSLContext | None = None):
        self.handler = handler
        self.tls = tls
        self.connections = 0
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.closed = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def request(self, reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
        seen = await read_request(reader)
        self.requests.append(seen)
        return seen

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self.handler(self, reader, writer)
        except (OSError, EOFError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.closed.set()

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> Raw:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port: int = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await _end_all(self._tasks)
        await self._server.wait_closed()


async def _end_all(tasks: set[asyncio.Task[Any]]) -> None:
    """Cancel a server's connection handlers and wait for them (bounded)."""
    for task in tasks:
        task.cancel()
    async with asyncio.timeout(10):
        await asyncio.gather(*tasks, return_exceptions=True)


STREAM = sse_body([chunk(content="Hel"), chunk(content="lo"), chunk(finish_reason="stop")])


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p) + b"0\r\n\r\n"


def head(status: int = 200, *fields: str) -> bytes:
    lines = [f"HTTP/1.1 {status} X", *fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def sse_head(*fields: str) -> bytes:
    return head(200, "Content-Type: text/event-stream", *fields)


async def serve_forever(
    raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reply: bytes
) -> None:
    """Answer every request on this connection with ``reply``."""
    while True:
        await raw.request(reader)
        writer.write(reply)
        await writer.drain()


# -- framing ---------------------------------------------------------------------------------------


async def test_a_content_length_body_is_read_to_its_length() -> None:
    """HTTP-4: a stream framed by Content-Length is read to exactly that length; the
    connection, read to its end, serves the next request."""

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        reply = sse_head(f"Content-Length: {len(STREAM)}") + STREAM
        await serve_forever(raw, r, w, reply)

    async with Raw(handler) as raw, opened(raw.base_url) as a:
        assert text(await run(a)) == "Hello"
        assert text(await run(a)) == "Hello"
    assert raw.connections == 1


async def test_a_chunked_body_split_anywhere_is_reassembled() -> None:
    """HTTP-5: a chunked body whose chunks cut events and lines anywhere (with chunk
    extensions and trailers) gives the same events."""
    pieces = [STREAM[i : i + 7] for i in range(0, len(STREAM), 7)]
    body = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-T: 1\r\n\r\n"

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await serve_forever(raw, r, w, sse_head("Transfer-Encoding: chunked") + body)

    async with Raw(handler) as raw, opened(raw.base_url) as a:
        chunks = await run(a)
        assert (text(chunks), reason(chunks)) == ("Hello", "stop")
        assert text(await run(a)) == "Hello"
    assert raw.connections == 1


async def test_a_body_without_length_ends_at_the_close_and_is_not_reused() -> None:
    """HTTP-6: a body with neither length nor chunking is read until the server closes;
    such a connection is never pooled (the next request opens another)."""

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await raw.request(r)
        w.write(
            sse_head() + sse_body([chunk(content="all"), chunk(finish_reason="stop")], done=False)
        )
        await w.drain()

    async with Raw(handler) as raw, opened(raw.base_url) as a:
        assert reason(await run(a)) == "stop"
        assert reason(await run(a)) == "stop"
        assert a._client._idle == []
    assert raw.connections == 2


@pytest.mark.parametrize(
    ("status", "location", "followed"),
    [
        (307, "/v2/chat/completions", True),
        (308, "http://127.0.0.1:{port}/v3/x?y=1", True),
        (307, "http://localhost:{port}/v2/chat/completions", False),  # another host
        (301, "/v2/chat/completions", False),
        (307, "", False),
    ],
)
async def test_a_same_origin_307_or_308_is_followed(
    status: int, location: str, followed: bool
) -> None:
    """HTTP-37: a 307 or 308 to the same scheme, host and port sends the same POST there (key
    and body included); another host, another 3xx or no Location is an HTTP_ERROR failure."""

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await raw.request(r)
            if len(raw.requests) == 1:
                where = location.format(port=raw.port)
                w.write(head(status, f"Location: {where}", "Content-Length: 0"))
            else:
                w.write(sse_head(f"Content-Length: {len(STREAM)}") + STREAM)
            await w.drain()

    async with Raw(handler) as raw, opened(raw.base_url) as a:
        chunks = await run(a)
    if followed:
        assert text(chunks) == "Hello"
        first, second = raw.requests
        assert second[0].startswith("POST /v") and second[0] != first[0]
        assert second[1]["authorization"] == f"Bearer {KEY}" and second[2] == first[2]
    else:
        found = failure(chunks)
        assert (found.code, found.status) == ("HTTP_ERROR", status)
        assert len(raw.requests) == 1


async def test_a_redirect_loop_ends() -> None:
    """HTTP-37: a server that redirects for ever gets 20 redirects followed, then the 307 is
    the failure."""

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await serve_forever(
            raw, r, w, head(307, "Location: /v1/chat/completions", "Content-Length: 0")
        )

    async with Raw(handler) as raw, opened(raw.base_url) as a:
        found = failure(await run(a))
    assert (found.code, found.status, len(raw.requests)) == ("HTTP_ERROR", 307, 21)


async def test_interim_responses_are_skipped() -> None:
    """HTTP-35: 1xx interim responses (103 Early Hints) before the final one are skipped."""

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        reply = head(103, "Link: </x>") + sse_head("Transfer-Encoding: chunked") + chunked(STREAM)
        await serve_forever(raw, r, w, reply)

    async with Raw(handler) as raw, opened(raw.base_url) as a:
        assert text(await run(a)) == "Hello"


# -- SSE -------------------------------------------------------------------------------------------


def test_sse_joins_data_lines_and_ignores_comments_and_other_fields() -> None:
    """HTTP-7: data lines of one event join with LF; comments, event/id/retry and unknown
    fields are ignored; an event without data is not dispatched; CRLF, LF and CR all end a
    line; an event cut by the end of the stream is dropped."""
    decoder = _http.SSEDecoder()
    stream = (
        b": a comment\n"
        b"event: message\nid: 7\nretry: 10\nfoo: bar\n"
        b'data: {"a":\ndata:1}\n\n'
        b"event: ping\n\n"
        b"data\r\n\r\n"
        b"data: x\r\rdata: y\n\n"
        b"data: unfinished\n"
    )
    assert decoder.feed(stream) == ['{"a":\n1}', "", "x", "y"]
    assert decoder.end() == []


async def test_done_ends_the_stream_and_later_events_are_ignored() -> None:
    """HTTP-7: `[DONE]` ends the stream: an event after it is never read."""
    body = sse_body([chunk(content="a"), chunk(finish_reason="stop")]) + b'data: {"x\n\n'

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await serve_forever(raw, r, w, sse_head("Transfer-Encoding: chunked") + chunked(body))

    async with Raw(handler) as raw, opened(raw.base_url) as a:
        assert reason(await run(a)) == "stop"


_events = st.lists(
    st.lists(
        st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\r\n"), max_size=8),
        min_size=1,
        max_size=3,
    ),
    max_size=5,
)


@example(events=[["a", "b"]], newline=b"\r\n", cuts=[])
@given(
    events=_events,
    newline=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    cuts=st.lists(st.integers(0, 400), max_size=12),
)
def test_any_split_of_an_sse_stream_gives_the_same_events(
    events: list[list[str]], newline: bytes, cuts: list[int]
) -> None:
    """HTTP-8: however a valid SSE byte stream is split into reads (a CRLF cut in two
    included), the decoder yields the same events."""
    raw = b""
    for lines in events:
        raw += b": note" + newline
        for line in lines:
            raw += b"data: " + line.encode() + newline
        raw += newline
    expected = ["\n".join(lines) for lines in events]
    points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    for bounds in (points, range(len(raw) + 1)):  # the drawn cuts, then one byte a read
        decoder = _http.SSEDecoder()
        got: list[str] = []
        for start, end in itertools.pairwise(bounds):
            got += decoder.feed(raw[start:end])
        got += decoder.end()
        assert got == expected


# -- keep-alive ------------------------------------------------------------------------------------


async def test_two_requests_share_one_connection(server: ChatCompletionsServer) -> None:
    """HTTP-9: a stream read to its end leaves its connection pooled: a second request of
    the same adapter goes on it (one connection for two requests)."""
    async with opened(server.base_url) as a:
        transport = transport_of(a)
        assert reason(await run(a)) == "stop"
        assert reason(await run(a)) == "stop"
    assert transport.connections_made == 1
    assert len(server.requests) == 2


@pytest.mark.parametrize("sends_the_end", [True, False])
async def test_a_stream_ended_by_done_before_its_last_chunk(sends_the_end: bool) -> None:
    """HTTP-9: a stream whose `[DONE]` came before the chunked body's last chunk finishes at
    once; its connection serves the next request once that end arrives, and a server that
    never sends it costs a fresh connection, never a failure."""
    go = asyncio.Event()

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await raw.request(r)
            w.write(
                sse_head("Transfer-Encoding: chunked") + b"%x\r\n%s\r\n" % (len(STREAM), STREAM)
            )
            await w.drain()
            if not sends_the_end:
                await r.read()
                return
            await go.wait()
            w.write(b"0\r\n\r\n")

    async with Raw(handler) as raw, opened(raw.base_url) as a:
        assert reason(await run(a)) == "stop"  # before the body's end was sent
        go.set()
        assert reason(await run(a)) == "stop"
    assert raw.connections == (1 if sends_the_end else 2)


async def test_connection_close_is_not_reused() -> None:
    """HTTP-10: a response that says `Connection: close` does not pool its connection."""

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await raw.request(r)
        reply = sse_head("Connection: close", f"Content-Length: {len(STREAM)}") + STREAM
        w.write(reply)
        await w.drain()
        await r.read()  # the client closes it

    async with Raw(handler) as raw, opened(raw.base_url) as a:
        assert reason(await run(a)) == "stop"
        assert a._client._idle == []
        assert reason(await run(a)) == "stop"
    assert raw.connections == 2


async def test_a_stale_pooled_connection_is_retried_once_on_a_fresh_one() -> None:
    """HTTP-11: when the server has closed a pooled connection (it reads the next request
    and drops it, answering nothing), the request goes again on a fresh connection, even
    with retries off."""

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await raw.request(r)
        w.write(sse_head(f"Content-Length: {len(STREAM)}") + STREAM)
        await w.drain()
        await raw.request(r)  # the second request on this connection: dropped unanswered

    async with Raw(handler) as raw, opened(raw.base_url) as a:
        assert reason(await run(a)) == "stop"
        assert reason(await run(a)) == "stop"
    assert (raw.connections, len(raw.requests)) == (2, 3)


async def test_a_pooled_connection_that_broke_mid_response_is_not_retried() -> None:
    """HTTP-11: once any byte of the response came, a broken reused connection is a
    CONNECTION failure, never sent again."""

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await raw.request(r)
        w.write(sse_head(f"Content-Length: {len(STREAM)}") + STREAM)
        await raw.request(r)
        w.write(b"HTTP/1.1 200")
        await w.drain()

    async with Raw(handler) as raw, opened(raw.base_url) as a:
        assert reason(await run(a)) == "stop"
        assert failure(await run(a)).code == "CONNECTION"
    assert len(raw.requests) == 2


async def test_aclose_closes_pooled_connections(server: ChatCompletionsServer) -> None:
    """HTTP-34: `aclose` closes the idle connections (the server sees them go)."""
    a = make(server.base_url)
    transport = transport_of(a)
    assert reason(await run(a)) == "stop"
    await a.aclose()
    assert transport._idle == []
    assert await asyncio.to_thread(_closed_soon, server)


async def test_a_stream_that_ends_after_aclose_closes_its_connection(
    server: ChatCompletionsServer,
) -> None:
    """HTTP-34: a stream still open when its adapter is closed closes its connection when it
    ends, never pooling it in the closed adapter."""
    a = make(server.base_url)
    transport = transport_of(a)
    stream = a.stream(request())
    try:
        assert isinstance(await anext(stream), TextDelta)
        await a.aclose()
        assert reason([c async for c in stream]) == "stop"
        assert transport._idle == []
    finally:
        await stream.aclose()


def _closed_soon(server: ChatCompletionsServer) -> bool:
    """Whether the server's handler saw its keep-alive connection end (its thread gone)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        threads = [t for t in __import__("threading").enumerate() if "process_request" in t.name]
        if not threads:
            return True
        threads[0].join(0.1)
    return False


# -- retries ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "retried"),
    [(408, True), (409, True), (429, True), (500, True), (503, True),
     (400, False), (401, False), (404, False), (422, False)],
)  # fmt: skip
async def test_which_statuses_are_retried(
    server: ChatCompletionsServer, status: int, retried: bool
) -> None:
    """HTTP-12: 408, 409, 429 and 5xx are retried (`max_retries` more attempts); other
    statuses fail at once."""
    server.add(Reply(status=status, error={"message": "no"}))
    async with opened(server.base_url, max_retries=1) as a:
        waits: list[float] = []
        transport_of(a, waits)
        chunks = await run(a)
    assert len(server.requests) == (2 if retried else 1)
    assert (reason(chunks) == "stop") == retried


@pytest.mark.parametrize(
    ("flag", "status", "retried"), [("true", 400, True), ("false", 500, False)]
)
async def test_x_should_retry_decides(
    server: ChatCompletionsServer, flag: str, status: int, retried: bool
) -> None:
    """HTTP-13: `x-should-retry: true` retries any status, `false` none."""
    server.add(Reply(status=status, headers={"x-should-retry": flag}))
    async with opened(server.base_url, max_retries=1) as a:
        transport_of(a, [])
        await run(a)
    assert len(server.requests) == (2 if retried else 1)


def _in(seconds: float) -> str:
    return email.utils.formatdate(time.time() + seconds, usegmt=True)


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "3"}, 0.25),
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after": "120"}, 120.0),
        ({"retry-after": "0"}, 0.5),  # not > 0: the backoff
        ({"retry-after": "-4"}, 0.5),
        ({"retry-after": "soon"}, 0.5),
        ({"retry-after-ms": "x", "retry-after": "2"}, 2.0),
    ],
)
async def test_retry_after_sets_the_wait(
    server: ChatCompletionsServer, headers: dict[str, str], wait: float
) -> None:
    """HTTP-14: the wait is `retry-after-ms`, else `retry-after` in seconds, when more than
    0 and at most 120 s; otherwise the backoff (0.5 s for the first retry)."""
    server.add(Reply(status=429, headers=headers))
    async with opened(server.base_url, max_retries=1) as a:
        waits: list[float] = []
        transport_of(a, waits)
        assert reason(await run(a)) == "stop"
    assert waits == [pytest.approx(wait)]


async def test_retry_after_as_an_http_date(server: ChatCompletionsServer) -> None:
    """HTTP-14: `retry-after` as an HTTP date waits until then; a date more than 120 s away
    is not retried at all (as the SDK)."""
    server.add(Reply(status=503, headers={"retry-after": _in(30)}))
    async with opened(server.base_url, max_retries=1) as a:
        waits: list[float] = []
        transport_of(a, waits)
        assert reason(await run(a)) == "stop"
        assert 27 < waits[0] <= 31
        server.add(Reply(status=503, headers={"retry-after": _in(3600)}))
        assert failure(await run(a)).code == "SERVER_ERROR"
    assert len(server.requests) == 3 and len(waits) == 1


@pytest.mark.parametrize(("jitter", "scale"), [(0.0, 1.0), (1.0, 0.75)])
async def test_the_backoff_doubles_from_half_a_second_to_eight(
    server: ChatCompletionsServer, jitter: float, scale: float
) -> None:
    """HTTP-15: without a usable retry-after the waits are 0.5 s doubling per retry, at
    most 8 s, less up to 25 % jitter."""
    fail = Reply(status=500)
    server.add(*[fail] * 7)
    async with opened(server.base_url, max_retries=6) as a:
        waits: list[float] = []
        transport_of(a, waits).random = lambda: jitter
        assert failure(await run(a)).code == "SERVER_ERROR"
    assert waits == [pytest.approx(w * scale) for w in (0.5, 1, 2, 4, 8, 8)]
    assert len(server.requests) == 7


async def test_connection_errors_and_timeouts_are_retried() -> None:
    """HTTP-16: a refused connection and a read timeout are retried like the SDK's, then
    reported (CONNECTION, TIMEOUT)."""
    holder = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = holder.sockets[0].getsockname()[1]
    holder.close()
    await holder.wait_closed()
    async with opened(f"http://127.0.0.1:{port}/v1", max_retries=2) as a:
        waits: list[float] = []
        transport_of(a, waits)
        found = failure(await run(a))
    assert found.code == "CONNECTION" and found.message.startswith("Connection error.: ")
    assert waits == [0.5, 1.0]

    async def silent(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await raw.request(r)
        await r.read()

    async with Raw(silent) as raw, opened(raw.base_url, max_retries=1, timeout=0.2) as a:
        waits = []
        transport_of(a, waits)
        assert failure(await run(a)) == LlmFailure(message="the request timed out", code="TIMEOUT")
    assert len(raw.requests) == 2 and waits == [0.5]


async def test_a_stream_cut_midway_is_never_retried(server: ChatCompletionsServer) -> None:
    """HTTP-17: once a 200 stream has started, a broken connection ends it (CONNECTION)
    with what came; it is never sent again."""
    server.add(Reply(chunks=(chunk(content="Hello "), chunk(content="world")), cut=True))
    async with opened(server.base_url, max_retries=3) as a:
        transport_of(a, [])
        chunks = await run(a)
    assert failure(chunks).code == "CONNECTION"
    assert text(chunks).startswith("Hello")
    assert len(server.requests) == 1


async def test_the_abort_signal_interrupts_a_retry_wait(server: ChatCompletionsServer) -> None:
    """HTTP-18: a request waiting to retry (a minute's retry-after) ends `aborted` as soon
    as its signal fires."""
    server.add(Reply(status=429, headers={"retry-after": "60"}))
    a = make(server.base_url, max_retries=1)
    started = asyncio.Event()
    transport = transport_of(a)

    async def sleep(seconds: float) -> None:
        started.set()
        await asyncio.sleep(seconds)

    transport.sleep = sleep
    ctl = AbortController()
    try:
        reading = asyncio.ensure_future(run(a, request(signal=ctl.signal)))
        async with asyncio.timeout(10):
            await started.wait()
        ctl.abort("user")
        async with asyncio.timeout(10):
            chunks = await reading
    finally:
        await a.aclose()
    assert reason(chunks) == "aborted"
    assert len(server.requests) == 1


# -- bounds ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        head(200, *[f"X-{i}: {'v' * 1000}" for i in range(70)]),  # a head over 64 KiB
        head(200, *[f"X-{i}: v" for i in range(150)]),  # too many fields
        head(200, f"X-Long: {'v' * 20000}"),  # one line over the line bound
        sse_head("Transfer-Encoding: chunked") + b"1" * 2000 + b"\r\n",  # a chunk-size line
        sse_head("Transfer-Encoding: chunked") + b"zz\r\n",  # not a size
        b"HTTP/2 200\r\n\r\n",  # not HTTP/1.x
    ],
    ids=["head-size", "header-count", "line", "chunk-line", "chunk-size", "version"],
)
async def test_oversized_or_malformed_heads_fail_as_connection_errors(reply: bytes) -> None:
    """HTTP-19, HTTP-20: a head over 64 KiB or 100 fields, a line over 16 KiB, a chunk-size
    line over 1 KiB or not a size, a status line that is not HTTP/1.x: a CONNECTION failure,
    the connection closed."""

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await raw.request(r)
        w.write(reply)
        await w.drain()
        await r.read()

    async with Raw(handler) as raw, opened(raw.base_url) as a:
        assert failure(await run(a)).code == "CONNECTION"
        assert a._client._idle == []


async def test_a_compressed_stream_is_refused_clearly() -> None:
    """HTTP-36: the request asks for no content coding; a stream sent compressed anyway is a
    CONNECTION failure naming the coding, never garbage parsed as events."""

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await serve_forever(raw, r, w, sse_head("Content-Encoding: gzip", "Content-Length: 0"))

    async with Raw(handler) as raw, opened(raw.base_url, max_retries=2) as a:
        found = failure(await run(a))
    assert found.code == "CONNECTION" and "Content-Encoding: gzip" in found.message
    assert len(raw.requests) == 1
    assert raw.requests[0][1]["accept-encoding"] == "identity"


async def test_an_error_body_is_read_up_to_a_mebibyte() -> None:
    """HTTP-21: an error body is read up to 1 MiB, never further: a longer one is cut and
    its connection closed (the server cannot write the rest)."""
    sent = 0
    total = 64 * 1024 * 1024

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal sent
        await raw.request(r)
        w.write(head(500, f"Content-Length: {total}"))
        block = b"x" * 65536
        while sent < total:
            w.write(block)
            await w.drain()
            sent += len(block)

    async with Raw(handler) as raw:
        async with opened(raw.base_url) as a:
            found = failure(await run(a))
        async with asyncio.timeout(10):
            await raw.closed.wait()
    assert (found.code, found.message) == ("SERVER_ERROR", "HTTP 500: Error code: 500")
    assert sent < total // 2


async def test_an_event_over_the_bound_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP-22: one event longer than the bound (data lines together, or one line not yet
    ended) fails the stream (CONNECTION) instead of growing without end."""
    monkeypatch.setattr(_http, "MAX_EVENT", 1000)
    body = b"data: " + b"x" * 600 + b"\ndata: " + b"y" * 600 + b"\n\n"

    async def handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await serve_forever(raw, r, w, sse_head("Transfer-Encoding: chunked") + chunked(body))

    async with Raw(handler) as raw, opened(raw.base_url) as a:
        assert failure(await run(a)).code == "CONNECTION"
    with pytest.raises(_http.ConnectFailure):
        _http.SSEDecoder().feed(b"data: " + b"z" * 2000)


async def test_an_abort_mid_stream_pools_nothing(server: ChatCompletionsServer) -> None:
    """HTTP-23: a stream aborted while it waits for the next event closes its connection at
    once; nothing goes back to the pool."""
    server.add(Reply(chunks=(chunk(content="first"),), hold=30))
    a = make(server.base_url)
    transport = transport_of(a)
    ctl = AbortController()
    stream = a.stream(request(signal=ctl.signal))
    try:
        async with asyncio.timeout(10):
            while not isinstance(await anext(stream), TextDelta):
                pass
            pending = asyncio.ensure_future(anext(stream))
            await asyncio.to_thread(server.responding.wait, 10)
            ctl.abort("user")
            finish = await pending
        assert isinstance(finish, Finish) and finish.reason == "aborted"
        assert transport._idle == []
        assert await asyncio.to_thread(server.disconnected.wait, 10)
    finally:
        await stream.aclose()
        await a.aclose()


# -- failures as the SDK words them ----------------------------------------------------------------


def _sdk_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("openai") is not None


ORACLE = [
    text_reply("Hello there", pieces=3),
    Reply(
        chunks=(
            chunk(reasoning_content="hmm"),
            chunk(
                tool_calls=[{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{"}}]
            ),
            chunk(tool_calls=[{"index": 0, "function": {"arguments": "}"}}]),
            chunk(finish_reason="tool_calls"),
        )
    ),
    Reply(status=400, error={"message": "bad thing", "type": "invalid_request_error"}),
    Reply(status=401, error={"message": f"Incorrect API key provided: {KEY}"}),
    Reply(status=404, error={"message": ""}),
    Reply(status=418, error={"code": "teapot"}),
    Reply(status=429, headers={"retry-after": "7"}, error={"message": "slow down"}),
    Reply(status=503, headers={"retry-after-ms": "1500"}, error={"message": "later"}),
    Reply(chunks=(chunk(content="so far"), {"error": {"message": "overloaded"}})),
    Reply(chunks=(chunk(content="so far"), {"error": {"code": 1}})),
    Reply(chunks=(chunk(content="a"),)),
    Reply(chunks=(chunk(content="a"),), cut=True),
]


@pytest.mark.skipif(
    not _sdk_installed(), reason="the openai SDK (the [sdk] extra) is not installed"
)
@pytest.mark.parametrize("reply", ORACLE, ids=[f"reply{i}" for i in range(len(ORACLE))])
async def test_both_transports_give_the_same_chunks_and_failures(
    server: ChatCompletionsServer, reply: Reply
) -> None:
    """HTTP-3, HTTP-32, HTTP-33: for streams, status errors (message from the body's
    `error.message`, the key redacted, retry-after) and error events (PROVIDER_ERROR), the
    builtin transport gives exactly the SDK path's chunks and failures; a cut stream is
    CONNECTION on both (the cause's wording differs)."""
    results = []
    for transport in ("builtin", "openai-sdk"):
        server.add(reply)
        async with opened(server.base_url, transport=transport) as a:
            results.append(await run(a))
    builtin, sdk = results
    if reply.cut:
        assert failure(builtin).code == failure(sdk).code == "CONNECTION"
        assert builtin[:-1] == sdk[:-1]
    else:
        assert builtin == sdk
    assert KEY not in repr(builtin)


async def test_the_request_carries_the_sdks_headers(
    server: ChatCompletionsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP-30: bearer key, JSON content type and accept, a User-Agent naming
    dsh-llm-openai and its version, OpenAI-Organization/-Project from OPENAI_ORG_ID and
    OPENAI_PROJECT_ID; the row's headers replace same-named ones."""
    from dsh_llm_openai import __version__

    monkeypatch.setenv("OPENAI_ORG_ID", "org-1")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-1")
    async with opened(
        server.base_url, headers={"x-extra": "1", "accept": "text/event-stream"}
    ) as a:
        await run(a)
    (seen,) = server.requests
    h = seen.headers
    assert h["authorization"] == f"Bearer {KEY}"
    assert h["content-type"] == "application/json"
    assert h["accept"] == "text/event-stream"
    assert h["user-agent"] == f"dsh-llm-openai/{__version__}"
    assert (h["openai-organization"], h["openai-project"], h["x-extra"]) == ("org-1", "proj-1", "1")
    assert seen.path == "/v1/chat/completions"
    assert json.loads(seen.raw)["stream"] is True


@pytest.mark.parametrize(
    ("base", "env", "url"),
    [
        ("http://h:1/v1", None, "http://h:1/v1/chat/completions"),
        ("http://h:1/v1/", None, "http://h:1/v1/chat/completions"),
        ("http://h:1", None, "http://h:1/chat/completions"),
        ("http://h:1/a/b?x=1", None, "http://h:1/a/b/chat/completions?x=1"),
        (None, "http://e:2/v9", "http://e:2/v9/chat/completions"),
        (None, None, "https://api.openai.com/v1/chat/completions"),
    ],
)
def test_the_url_joins_as_the_sdks(base: str | None, env: str | None, url: str) -> None:
    """HTTP-31: the row's base URL, else OPENAI_BASE_URL, else OpenAI's, with a trailing
    slash enforced and `chat/completions` appended."""
    environ = {"OPENAI_BASE_URL": env} if env else {}
    assert _http.chat_completions_url(base, environ) == url


@pytest.mark.parametrize("env", ["", "ftp://h/v1", "http://h:99999/v1", "http:///v1"])
async def test_a_bad_openai_base_url_fails_the_request_not_the_caller(
    monkeypatch: pytest.MonkeyPatch, env: str
) -> None:
    """HTTP-31: an OPENAI_BASE_URL that is not an http(s) URL with a host (no row checked it)
    ends the request with a CONNECTION failure naming it; nothing raises."""
    monkeypatch.setenv("OPENAI_BASE_URL", env)
    a = OpenAIAdapter(OpenAIConfig(api_key=KEY))
    try:
        found = failure(await run(a))
    finally:
        await a.aclose()
    assert found.code == "CONNECTION" and "base URL" in found.message


async def test_the_sdk_is_never_imported_on_the_builtin_path(tmp_path: Path) -> None:
    """HTTP-1: a request on the builtin transport (the default) leaves `openai` out of
    `sys.modules`, in a fresh interpreter."""
    script = (
        "import asyncio, sys\n"
        "from dsh_core import GenerateOptions, user_message\n"
        "from dsh_llm_openai import OpenAIAdapter, OpenAIConfig\n"
        "from dsh_llm_openai.testing import ChatCompletionsServer\n"
        "async def main():\n"
        "    with ChatCompletionsServer() as s:\n"
        "        a = OpenAIAdapter(OpenAIConfig(base_url=s.base_url, api_key='k'))\n"
        "        m = (user_message('hi'),)\n"
        "        o = GenerateOptions(provider='openai', model='m', messages=m)\n"
        "        chunks = [c async for c in a.stream(o)]\n"
        "        await a.aclose()\n"
        "    return chunks[-1].reason\n"
        "print(asyncio.run(main()), 'openai' in sys.modules)\n"
    )
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.split() == ["stop", "False"], done.stderr


async def test_the_sdk_transport_without_the_sdk_fails_the_boot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP-2: `transport = "openai-sdk"` without the openai package installed fails the
    row at boot (PLUGIN_CONFIG) naming the extra to install; an unknown transport too."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.delitem(sys.modules, "openai", raising=False)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "openai" else real(name, *a)
    )
    for transport, words in (
        ("openai-sdk", ["transport", "pip install 'dsh-llm-openai[sdk]'"]),
        ("curl", ["transport", "builtin"]),
    ):
        with pytest.raises(PluginError) as caught:
            await TestHost.start(
                PluginRow(plugin="llm-openai", config={"transport": transport}),
                modules={"llm-openai": openai_plugin},
            )
        assert caught.value.code == "PLUGIN_CONFIG"
        for word in words:
            assert word in str(caught.value)


# -- proxies ---------------------------------------------------------------------------------------


class Proxy:
    """A loopback http:// proxy: CONNECT tunnels, absolute-form requests forwarded; it
    records each request line and its Proxy-Authorization."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []
        self.silent = False  # answer CONNECT never (a connect timeout)
        self._tasks: set[asyncio.Task[Any]] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head_ = await reader.readuntil(b"\r\n\r\n")
            line, *fields = head_.decode("latin-1").split("\r\n")
            auth = next(
                (f.split(":", 1)[1].strip() for f in fields if f.lower().startswith("proxy-auth")),
                None,
            )
            self.seen.append((line, auth))
            method, target, _ = line.split(" ")
            if method == "CONNECT":
                if self.silent:
                    await reader.read()
                    return
                host, _, port = target.rpartition(":")
                up_r, up_w = await asyncio.open_connection(host, int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                first = b""
            else:
                parts = target.split("/")
                host, _, port = parts[2].rpartition(":")
                up_r, up_w = await asyncio.open_connection(host, int(port))
                first = head_
            up_w.write(first)
            await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer))
        except (OSError, EOFError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        finally:
            dst.close()

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await _end_all(self._tasks)
        await self._server.wait_closed()


async def test_an_http_endpoint_goes_through_the_proxy_in_absolute_form(
    server: ChatCompletionsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP-24, HTTP-27: with HTTP_PROXY set, an http:// endpoint is asked through the proxy
    with the absolute URL, the proxy's userinfo as Proxy-Authorization Basic."""
    async with Proxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://us%40er:p%3Ass@127.0.0.1:{proxy.port}")
        async with opened(server.base_url) as a:
            assert reason(await run(a)) == "stop"
    token = base64.b64encode(b"us@er:p:ss").decode()
    assert proxy.seen == [(f"POST {server.base_url}/chat/completions HTTP/1.1", f"Basic {token}")]


async def test_no_proxy_exempts_the_host(
    server: ChatCompletionsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP-25: NO_PROXY naming the host (lower or upper case) sends the request directly,
    the proxy never used."""
    async with Proxy() as proxy:
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setenv("NO_PROXY", "example.com, 127.0.0.1")
        async with opened(server.base_url) as a:
            assert reason(await run(a)) == "stop"
    assert proxy.seen == []


@pytest.mark.parametrize(
    ("host", "port", "value", "exempt"),
    [
        ("api.example.com", 443, "example.com", True),
        ("api.example.com", 443, ".example.com", True),
        ("example.com", 443, ".example.com", True),
        ("badexample.com", 443, "example.com", False),
        ("api.example.com", 443, "example.com:443", True),
        ("api.example.com", 443, "example.com:8443", False),
        ("10.1.2.3", 80, "10.0.0.0/8", True),
        ("11.1.2.3", 80, "10.0.0.0/8", False),
        ("::1", 80, "[::1]", True),
        ("anything", 80, "*", True),
        ("anything", 80, " , ", False),
    ],
)
def test_no_proxy_matching(host: str, port: int, value: str, exempt: bool) -> None:
    """HTTP-25: NO_PROXY entries match the host or its subdomains (with or without a
    leading dot), optionally a port, IP networks, and `*` everything."""
    assert _http._no_proxy(_http._Origin("https", host, port), value) is exempt


async def test_a_socks_proxy_is_refused_clearly(
    server: ChatCompletionsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP-26: a proxy of another scheme (socks5) fails the request with
    PROXY_UNSUPPORTED naming the scheme, never connecting directly; the proxy's password is
    not shown."""
    monkeypatch.setenv("ALL_PROXY", "socks5://user:hunter2@127.0.0.1:1080")
    async with opened(server.base_url, max_retries=2) as a:
        found = failure(await run(a))
    assert found.code == "PROXY_UNSUPPORTED"
    assert "socks5://" in found.message and "hunter2" not in found.message
    assert server.requests == []


async def test_a_proxy_that_does_not_answer_connect_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP-29: `connect_timeout` bounds connecting, the proxy's CONNECT included."""
    async with Proxy() as proxy:
        proxy.silent = True
        monkeypatch.setenv("HTTPS_PROXY", f"127.0.0.1:{proxy.port}")
        async with opened("https://api.invalid/v1", connect_timeout=0.5) as a:
            assert failure(await run(a)).code == "TIMEOUT"
    assert proxy.seen == [("CONNECT api.invalid:443 HTTP/1.1", None)]


# -- TLS -------------------------------------------------------------------------------------------


def _cert(folder: Path, name: str, san: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=dsh-test",
         "-addext", f"subjectAltName={san}"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """A self-signed certificate for 127.0.0.1 and one for another name (openssl's CLI)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("certs")
    return {
        "good": _cert(folder, "good", "IP:127.0.0.1,DNS:localhost"),
        "other": _cert(folder, "other", "DNS:other.invalid"),
    }


def _tls(cert: tuple[Path, Path]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert[0], cert[1])
    return context


async def _stream_handler(raw: Raw, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await serve_forever(raw, r, w, sse_head("Transfer-Encoding: chunked") + chunked(STREAM))


@pytest.mark.parametrize(("served", "trusted", "ok"), [("good", "good", True),
                         ("good", "other", False), ("other", "other", False)])  # fmt: skip
async def test_tls_trusts_ssl_cert_file_and_checks_the_hostname(
    certs: dict[str, tuple[Path, Path]],
    monkeypatch: pytest.MonkeyPatch,
    served: str,
    trusted: str,
    ok: bool,
) -> None:
    """HTTP-28: an https endpoint is verified against the trust store SSL_CERT_FILE names:
    its own certificate passes; an untrusted one, or a trusted one for another host name,
    fails (CONNECTION)."""
    monkeypatch.setenv("SSL_CERT_FILE", str(certs[trusted][0]))
    async with Raw(_stream_handler, tls=_tls(certs[served])) as raw, opened(raw.base_url) as a:
        chunks = await run(a)
    if ok:
        assert text(chunks) == "Hello"
    else:
        found = failure(chunks)
        assert found.code == "CONNECTION" and "CERTIFICATE_VERIFY_FAILED" in found.message


async def test_an_https_endpoint_goes_through_a_connect_tunnel(
    certs: dict[str, tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP-24, HTTP-27: with HTTPS_PROXY set, an https:// endpoint is reached by CONNECT
    (with Proxy-Authorization) and TLS inside the tunnel, the hostname checked; the tunnel
    is reused for the next request."""
    monkeypatch.setenv("SSL_CERT_FILE", str(certs["good"][0]))
    async with Raw(_stream_handler, tls=_tls(certs["good"])) as raw, Proxy() as proxy:
        monkeypatch.setenv("https_proxy", f"http://me:pw@127.0.0.1:{proxy.port}")
        async with opened(raw.base_url) as a:
            assert text(await run(a)) == "Hello"
            assert text(await run(a)) == "Hello"
    token = base64.b64encode(b"me:pw").decode()
    assert proxy.seen == [(f"CONNECT 127.0.0.1:{raw.port} HTTP/1.1", f"Basic {token}")]
    assert raw.requests[0][0] == "POST /v1/chat/completions HTTP/1.1"
