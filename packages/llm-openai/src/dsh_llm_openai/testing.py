"""A loopback chat-completions server for tests, benchmarks and offline examples.

:class:`ChatCompletionsServer` speaks enough of the OpenAI chat-completions wire format for the
adapter: ``POST /v1/chat/completions`` answered from a queue of :class:`Reply` values (an SSE
stream, an HTTP error, a stream cut in the middle, a slow first byte, a stream held open until
the client goes away). It binds 127.0.0.1 only, runs in a thread (so synchronous and asyncio
callers alike can use it) and records every request it served.
"""

from __future__ import annotations

import json
import select
import socket
import threading
from collections.abc import Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import attrs

__all__ = ["ChatCompletionsServer", "RecordedRequest", "Reply", "chunk", "sse_body", "text_reply"]


def chunk(
    *,
    content: str | None = None,
    reasoning_content: str | None = None,
    tool_calls: Sequence[Mapping[str, Any]] | None = None,
    finish_reason: str | None = None,
    usage: Mapping[str, Any] | None = None,
    model: str = "loopback",
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` object; ``usage`` alone makes the usage chunk (no
    choices), as an endpoint sends it last when asked to include usage."""
    if usage is not None and content is None and tool_calls is None and finish_reason is None:
        return {
            "id": "chatcmpl-loopback",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [],
            "usage": dict(usage),
        }
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if reasoning_content is not None:
        delta["reasoning_content"] = reasoning_content
    if tool_calls is not None:
        delta["tool_calls"] = [dict(c) for c in tool_calls]
    return {
        "id": "chatcmpl-loopback",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


@attrs.frozen(kw_only=True)
class Reply:
    """How the server answers one request.

    ``status`` other than 200 sends ``error`` as a JSON error body. Otherwise ``chunks`` go out
    as SSE events, then ``data: [DONE]`` unless ``cut`` (the connection is then closed in the
    middle of the chunked body, as a dropped connection would). ``delay`` is waited before the
    first byte of the response; ``hold`` keeps the stream open after the chunks until the
    client closes the connection (or ``hold`` seconds pass).
    """

    status: int = 200
    headers: Mapping[str, str] = attrs.field(factory=dict)
    chunks: tuple[Mapping[str, Any], ...] = ()
    error: Mapping[str, Any] | None = None
    cut: bool = False
    delay: float = 0.0
    hold: float = 0.0
    body: bytes | None = None  # a pre-rendered SSE body (benchmarks): sent as is


def text_reply(
    text: str, *, pieces: int = 1, usage: Mapping[str, Any] | None = None, model: str = "loopback"
) -> Reply:
    """A plain answer streamed in ``pieces`` content chunks, ``stop``, then usage."""
    step = max(1, -(-len(text) // pieces)) if text else 1
    parts = [text[i : i + step] for i in range(0, len(text), step)] or [""]
    chunks = [chunk(content=p, model=model) for p in parts]
    chunks.append(chunk(finish_reason="stop", model=model))
    chunks.append(
        chunk(usage=usage or {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})
    )
    return Reply(chunks=tuple(chunks))


def sse_body(chunks: Iterable[Mapping[str, Any]], *, done: bool = True) -> bytes:
    """``chunks`` as an SSE body (``data: {...}`` events), ending with ``[DONE]`` if ``done``."""
    out = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return out + (b"data: [DONE]\n\n" if done else b"")


@attrs.frozen(kw_only=True)
class RecordedRequest:
    """A request the server received: its path, headers (lower-cased names), JSON body (None
    if the bytes were not JSON) and the bytes as they came (``raw``)."""

    path: str
    headers: Mapping[str, str]
    body: Any
    raw: bytes = b""


class ChatCompletionsServer:
    """The loopback server; ``with`` starts and stops it. ``base_url`` is what a client points
    at (``http://127.0.0.1:PORT/v1``). Replies are served in order from :meth:`add`; with
    none queued, ``default`` answers (by default a short text). Three events say how far it
    got: ``received`` (a request came in), ``responding`` (a stream's first chunks went out)
    and ``disconnected`` (a client closed a held or delayed response)."""

    def __init__(self, *replies: Reply, default: Reply | None = None) -> None:
        self._queue: list[Reply] = list(replies)
        self._lock = threading.Lock()
        self.default = default or text_reply("hello from the loopback server")
        self.requests: list[RecordedRequest] = []
        self.received = threading.Event()
        self.disconnected = threading.Event()
        self.responding = threading.Event()
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.owner = self  # type: ignore[attr-defined]
        self._server = server
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The API root a client uses."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def add(self, *replies: Reply) -> None:
        """Queue ``replies`` for the next requests."""
        with self._lock:
            self._queue.extend(replies)

    def _next(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            self.received.set()
            return self._queue.pop(0) if self._queue else self.default

    def start(self) -> ChatCompletionsServer:
        """Serve in a background thread."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> ChatCompletionsServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        """No Nagle delay: a response's small writes go out at once, as a real server's do."""
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read :attr:`ChatCompletionsServer.requests` instead."""

    def do_POST(self) -> None:
        owner: ChatCompletionsServer = self.server.owner  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = owner._next(RecordedRequest(path=self.path, headers=headers, body=body, raw=raw))
        if reply.delay and _closed_within(self.connection, reply.delay):
            owner.disconnected.set()
            return
        if reply.status != 200:
            payload = json.dumps(
                {"error": dict(reply.error or {"message": "error", "type": "server_error"})}
            ).encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        data = (
            reply.body
            if reply.body is not None
            else sse_body(reply.chunks, done=not (reply.cut or reply.hold))
        )
        try:
            if reply.cut:
                cut = data[: max(1, len(data) - 20)] if data else b""
                self.wfile.write(f"{len(data):x}\r\n".encode() + cut)
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._send_chunk(data)
            owner.responding.set()
            if reply.hold:
                if _closed_within(self.connection, reply.hold):
                    owner.disconnected.set()
                    self.close_connection = True
                    return
                self._send_chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            owner.disconnected.set()
            self.close_connection = True

    def _send_chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()


def _closed_within(conn: socket.socket, seconds: float) -> bool:
    """Whether the peer closes ``conn`` within ``seconds`` (it sends nothing more meanwhile)."""
    readable, _, _ = select.select([conn], [], [], seconds)
    if not readable:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
