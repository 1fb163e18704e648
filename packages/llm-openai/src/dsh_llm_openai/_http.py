"""The builtin transport: a small asyncio HTTP/1.1 client for the adapter's one request.

It POSTs a JSON body and reads back either a JSON error body or a server-sent-events stream
of JSON objects, on the standard library only (asyncio streams, ``ssl``, ``json``), so that a
run reaches its first model request without importing an HTTP stack and an SDK (the
``openai`` package's import alone takes most of a second). What it does, as the ``openai``
SDK it stands in for does:

* Framing by ``Content-Length``, ``Transfer-Encoding: chunked`` or the close of the
  connection (HTTP-4..HTTP-6); SSE per the WHATWG spec, ``[DONE]`` ending the stream (HTTP-7).
* Keep-alive: a connection whose response was read to its end, and that the server did not
  close, goes back to the adapter's small pool (HTTP-9, HTTP-10); a pooled connection the
  server has closed meanwhile is retried once on a fresh one, if nothing of the response came
  (HTTP-11). A response left half-read (an abort, a timeout, an error) closes its connection
  (HTTP-23).
* Retries as the SDK's (``_base_client``): ``max_retries`` more attempts on connection
  errors, timeouts, 408, 409, 429 and 5xx, as ``x-should-retry`` says when present, after
  ``retry-after-ms``/``retry-after`` when it asks for 0-120 s, else 0.5 s doubling to 8 s less
  up to 25 % jitter; never once a stream has started (HTTP-12..HTTP-17).
* Bounds on everything the server controls: the head's size and header count, each line,
  a chunk-size line, the error body read, one event (HTTP-19..HTTP-22).
* TLS through ``ssl.create_default_context()`` (OpenSSL's default trust store, which the
  ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` variables override), hostname checked (HTTP-28).
* ``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY`` and ``NO_PROXY``, lower case first as curl and
  urllib read them: an ``http://`` proxy, with ``CONNECT`` for an https endpoint and the
  absolute URL for an http one; a proxy of another scheme is an error, never a silent direct
  connection (HTTP-24..HTTP-27).
* The body is asked for uncompressed (a compressed stream is refused, HTTP-36). A 307 or
  308 to the same scheme, host and port is followed, as httpx follows it for the SDK (the
  same POST again, HTTP-37); any other 3xx is a status failure (the SDK would follow a
  301/302/303 as a GET, which no chat-completions endpoint answers), and so is a redirect to
  another host (the key is not sent there).
* ``connect_timeout`` bounds connecting (a proxy's ``CONNECT`` included); ``timeout`` bounds
  each single read or write, as httpx's read timeout does (HTTP-29).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import math
import os
import ssl
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

__all__ = [
    "ConnectFailure",
    "HttpFailure",
    "ProxyUnsupported",
    "StatusFailure",
    "StreamErrorEvent",
    "TimeoutFailure",
    "Transport",
    "chat_completions_url",
]

#: The most one response head may hold (status line and headers), and its header count.
MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
#: The most one line of the head or of a chunk's framing may hold (the reader's own limit).
MAX_LINE = 16 * 1024
#: The most a chunk-size line may hold (extensions included).
MAX_CHUNK_LINE = 1024
#: The most of an error body read (the rest is never read; the connection is closed).
MAX_ERROR_BODY = 1024 * 1024
#: The most one SSE event (its lines together) may hold.
MAX_EVENT = 16 * 1024 * 1024
#: The most 1xx interim responses taken before the final one.
MAX_INTERIM = 10
#: The most 307/308 redirects one request follows (httpx's default).
MAX_REDIRECTS = 20
#: Idle connections kept per transport.
MAX_IDLE = 8
#: The longest wait for the end of a body after its ``[DONE]`` before the connection is
#: reused (see :meth:`Response._finish`).
DRAIN_WAIT = 0.25
#: One network read asks for at most this much.
READ_SIZE = 64 * 1024

#: The SDK's retry schedule (openai._constants).
INITIAL_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 8.0
MAX_RETRY_AFTER = 120.0

_DEFAULT_BASE_URL = "https://api.openai.com/v1"


# -- failures ------------------------------------------------------------------------------------


class HttpFailure(Exception):
    """A request that did not get a usable response (the adapter maps each kind to a code)."""


class ConnectFailure(HttpFailure):
    """The connection failed or broke (refused, reset, closed early, TLS, malformed reply);
    ``__cause__`` is what failed."""


class TimeoutFailure(HttpFailure):
    """Connecting took longer than ``connect_timeout``, or one read or write longer than
    ``timeout``."""


class ProxyUnsupported(HttpFailure):
    """The proxy the environment names is not an ``http://`` proxy."""


class StatusFailure(HttpFailure):
    """The endpoint answered a status other than 2xx; ``message`` as the SDK builds it."""

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        message = f"Error code: {status}"
        text = body.decode("utf-8", "replace").strip()
        try:
            parsed = json.loads(text)
        except ValueError:
            pass
        else:
            error = parsed.get("error", parsed) if isinstance(parsed, dict) else None
            detail = error.get("message") if isinstance(error, dict) else None
            if isinstance(detail, str) and detail:
                message += f" - {detail}"
        self.message = message
        super().__init__(message)


class StreamErrorEvent(HttpFailure):
    """An event of the stream carried ``error`` (the SDK raises ``APIError`` for it)."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


# -- URLs and proxies ----------------------------------------------------------------------------


class _Origin:
    """Where a connection goes: scheme, host (no brackets) and port."""

    __slots__ = ("host", "port", "scheme")

    def __init__(self, scheme: str, host: str, port: int) -> None:
        self.scheme = scheme
        self.host = host
        self.port = port

    @property
    def authority(self) -> str:
        """``host:port`` as the Host header and CONNECT write it (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    def key(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)


def chat_completions_url(base_url: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The request URL: the base URL (the row's, else ``OPENAI_BASE_URL``, else OpenAI's)
    with a trailing slash enforced and ``chat/completions`` appended, as the SDK joins them
    (HTTP-31)."""
    env = os.environ if environ is None else environ
    base = base_url if base_url is not None else env.get("OPENAI_BASE_URL")
    if base is None:
        base = _DEFAULT_BASE_URL
    parts = urllib.parse.urlsplit(base)
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    return urllib.parse.urlunsplit(
        (parts.scheme, parts.netloc, path + "chat/completions", parts.query, "")
    )


def _env(environ: Mapping[str, str], name: str) -> str | None:
    """``name`` lower case first, then upper case (curl's and urllib's order); empty is
    unset."""
    return environ.get(name.lower()) or environ.get(name.upper()) or None


def _no_proxy(origin: _Origin, value: str) -> bool:
    """Whether ``NO_PROXY`` exempts ``origin``: ``*``, a host or domain (``example.com`` and
    ``.example.com`` both match its subdomains), either with ``:port``, or an IP network."""
    host = origin.host.lower()
    for raw in value.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if entry.startswith("[") and "]" in entry:  # [::1] or [::1]:port
            name, _, rest = entry[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        elif entry.count(":") == 1:
            name, _, port = entry.partition(":")
        else:
            name, port = entry, ""
        if port and port != str(origin.port):
            continue
        if "/" in name:
            import ipaddress

            try:
                if ipaddress.ip_address(host) in ipaddress.ip_network(name, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = name.lstrip(".")
        if host == name or host.endswith("." + name):
            return True
    return False


class _Proxy:
    """An ``http://`` proxy: its origin and the Proxy-Authorization value, if any."""

    __slots__ = ("authorization", "origin")

    def __init__(self, origin: _Origin, authorization: str | None) -> None:
        self.origin = origin
        self.authorization = authorization


def _shown(url: str) -> str:
    """A proxy URL without its userinfo (which may hold a password)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def proxy_for(origin: _Origin, environ: Mapping[str, str] | None = None) -> _Proxy | None:
    """The proxy the environment names for ``origin`` (``None``: connect directly), as
    httpx and requests read it: ``{scheme}_proxy`` then ``all_proxy``, unless ``no_proxy``
    exempts the host (HTTP-24..HTTP-26)."""
    env = os.environ if environ is None else environ
    url = _env(env, f"{origin.scheme}_proxy") or _env(env, "all_proxy")
    if url is None:
        return None
    exempt = _env(env, "no_proxy")
    if exempt and _no_proxy(origin, exempt):
        return None
    if "://" not in url:
        url = "http://" + url  # host:port, as curl and urllib take it
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme != "http":
        raise ProxyUnsupported(
            f"the proxy {_shown(url)} (from the environment) uses {scheme}://, which the "
            "builtin transport does not support: use an http:// proxy, exempt the host with "
            'NO_PROXY, or set the row\'s transport to "openai-sdk"'
        )
    try:
        port = parts.port or 80
    except ValueError:
        port = 0
    if not parts.hostname or not 0 < port < 65536:
        raise ProxyUnsupported(f"the proxy {_shown(url)} (from the environment) has no valid host")
    authorization = None
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        authorization = f"Basic {token}"
    return _Proxy(_Origin("http", parts.hostname, port), authorization)


# -- connections ----------------------------------------------------------------------------------


class _Conn:
    """One open connection; ``drain`` is the response whose end is still to be read before
    the connection can carry another request (the stream ended at ``[DONE]``)."""

    __slots__ = ("drain", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.drain: Response | None = None

    def abort(self) -> None:
        """Close now, without waiting for anything (the peer sees the close at once)."""
        transport = self.writer.transport
        if not transport.is_closing():
            transport.abort()

    def usable(self) -> bool:
        """Whether an idle connection still looks open (nothing unexpected buffered)."""
        reader = self.reader
        if self.writer.transport.is_closing() or reader.at_eof() or reader.exception():
            return False
        return self.drain is not None or not reader._buffer  # type: ignore[attr-defined]


async def _read_head(
    reader: asyncio.StreamReader, seconds: float
) -> tuple[int, str, dict[str, str]]:
    """One response head: (status, HTTP version, headers with lower-cased names; repeated
    fields joined with ``, ``), bounded in size and count (HTTP-19, HTTP-20)."""
    total = 0
    lines: list[bytes] = []
    async with asyncio.timeout(seconds):
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.LimitOverrunError as exc:
                raise ConnectFailure("a response header line is too long") from exc
            total += len(line)
            if total > MAX_HEAD:
                raise ConnectFailure("the response head is too large")
            if line in (b"\r\n", b"\n"):
                if lines:
                    break
                continue  # stray blank lines before a status line are tolerated (RFC 9112)
            lines.append(line)
            if len(lines) > MAX_HEADERS + 1:
                raise ConnectFailure("the response has too many header fields")
    status_line = lines[0].decode("latin-1").rstrip("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not (_digits(code) and len(code) == 3):
        raise ConnectFailure(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for raw in lines[1:]:
        text = raw.decode("latin-1").rstrip("\r\n")
        name, colon, value = text.partition(":")
        if not colon or not name or name != name.strip() or name[0] in " \t":
            raise ConnectFailure(f"a malformed response header line: {text[:80]!r}")
        key = name.lower()
        value = value.strip(" \t")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return int(code), version, headers


def _digits(text: str) -> bool:
    """Whether ``text`` is ASCII digits only (``str.isdigit`` takes other scripts' too)."""
    return text.isascii() and text.isdigit()


class Response:
    """A response whose head was read; its body is read with :meth:`read_some` and
    :meth:`read_all`. :meth:`release` gives the connection back to the pool when the body was
    read to its end and the server keeps it open, and closes it otherwise (HTTP-9, HTTP-23)."""

    __slots__ = (
        "_chunk_left",
        "_conn",
        "_done",
        "_keep",
        "_left",
        "_mode",
        "_timeout",
        "_transport",
        "headers",
        "status",
    )

    def __init__(
        self,
        transport: Transport,
        conn: _Conn,
        status: int,
        version: str,
        headers: dict[str, str],
        timeout: float,
    ) -> None:
        self._transport = transport
        self._conn: _Conn | None = conn
        self.status = status
        self.headers = headers
        self._timeout = timeout
        connection = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        self._keep = (
            "keep-alive" in connection if version == "HTTP/1.0" else "close" not in connection
        )
        self._done = False
        self._left = 0
        self._chunk_left = 0
        encoding = headers.get("transfer-encoding")
        if status in (204, 304):
            self._mode = "length"
        elif encoding is not None:  # RFC 9112 §6.3: Transfer-Encoding wins over Content-Length
            if encoding.rsplit(",", 1)[-1].strip().lower() == "chunked":
                self._mode = "chunked"
            else:
                self._mode, self._keep = "close", False
        elif "content-length" in headers:
            values = {v.strip() for v in headers["content-length"].split(",")}
            length = values.pop() if len(values) == 1 else ""
            if not _digits(length) or len(length) > 19:
                raise ConnectFailure("the response has an invalid Content-Length")
            self._mode, self._left = "length", int(length)
        else:
            self._mode, self._keep = "close", False
        if self._mode == "length" and self._left == 0:
            self._done = True

    @property
    def complete(self) -> bool:
        """Whether the body was read to its end."""
        return self._done

    async def read_some(self) -> bytes:
        """The next bytes of the body (``b""`` at its end); one read waits at most
        ``timeout``."""
        if self._done:
            return b""
        conn = self._conn
        if conn is None:
            raise ConnectFailure("the response was closed")
        reader = conn.reader
        try:
            async with asyncio.timeout(self._timeout):
                mode = self._mode
                if mode == "chunked":
                    while self._chunk_left == 0:
                        if not await self._next_chunk(reader):
                            self._done = True
                            return b""
                    data = await reader.read(min(self._chunk_left, READ_SIZE))
                    if not data:
                        raise ConnectFailure("the connection closed inside a chunk")
                    self._chunk_left -= len(data)
                    if self._chunk_left == 0:
                        end = await reader.readuntil(b"\n")
                        if end.strip():
                            raise ConnectFailure("a chunk does not end with CRLF")
                    return data
                if mode == "length":
                    data = await reader.read(min(self._left, READ_SIZE))
                    if not data:
                        raise ConnectFailure("the connection closed before the body's end")
                    self._left -= len(data)
                    if self._left == 0:
                        self._done = True
                    return data
                data = await reader.read(READ_SIZE)
                if not data:
                    self._done = True
                return data
        except BaseException as exc:
            # A read that did not finish (a timeout, an error, a cancellation) leaves the
            # connection mid-response: closed now, never pooled (HTTP-23).
            self._conn = None
            conn.abort()
            if isinstance(exc, TimeoutError):
                raise TimeoutFailure("a read timed out") from None
            if isinstance(exc, asyncio.LimitOverrunError):
                raise ConnectFailure("a chunk's framing line is too long") from exc
            if isinstance(exc, (OSError, EOFError)):
                raise ConnectFailure(str(exc) or type(exc).__name__) from exc
            raise

    async def _next_chunk(self, reader: asyncio.StreamReader) -> bool:
        """Read a chunk-size line (False: the last chunk, whose trailers are read too)."""
        line = await reader.readuntil(b"\n")
        if len(line) > MAX_CHUNK_LINE:
            raise ConnectFailure("a chunk-size line is too long")
        size = line.split(b";", 1)[0].strip(b" \t\r\n")
        if not size or len(size) > 16 or size.strip(b"0123456789abcdefABCDEF"):
            raise ConnectFailure(f"a malformed chunk-size line: {line[:40]!r}")
        self._chunk_left = int(size, 16)
        if self._chunk_left:
            return True
        total = 0
        while True:  # trailers, bounded like a head
            trailer = await reader.readuntil(b"\n")
            total += len(trailer)
            if total > MAX_HEAD:
                raise ConnectFailure("the response trailers are too large")
            if trailer in (b"\r\n", b"\n"):
                return False

    async def read_all(self, limit: int = MAX_ERROR_BODY) -> bytes:
        """The body (an error's), at most ``limit`` bytes: a longer one is cut there and its
        connection closed, never read on (HTTP-21)."""
        parts: list[bytes] = []
        size = 0
        while size < limit:
            data = await self.read_some()
            if not data:
                break
            parts.append(data)
            size += len(data)
        body = b"".join(parts)
        return body[:limit]

    def release(self) -> None:
        """Pool the connection if the body was read to its end and the server keeps it;
        close it otherwise. Idempotent."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._keep:
            self._transport._pool(conn)
        else:
            conn.abort()

    def release_after_end(self) -> None:
        """Pool the connection with the rest of this body still to be read (a stream that
        ended at ``[DONE]``, before the chunked body's last chunk came): the next request on
        it reads that end first, or takes another connection."""
        conn = self._conn
        if conn is None or self._done or not self._keep or self._mode == "close":
            self.release()
            return
        self._conn = None
        conn.drain = self
        self._transport._pool(conn)

    async def _finish(self, conn: _Conn) -> None:
        """Read the rest of the body (bounded) on ``conn`` before it carries another
        request."""
        self._conn = conn
        # The end of the body is normally there already; a server that holds it back costs
        # this short wait, then the connection is dropped for a fresh one.
        self._timeout = min(self._timeout, DRAIN_WAIT)
        left = MAX_ERROR_BODY
        while not self._done:
            data = await self.read_some()
            left -= len(data)
            if left < 0:
                raise ConnectFailure("too much after the end of a stream")
        self._conn = None


# -- SSE -----------------------------------------------------------------------------------------


class SSEDecoder:
    """Server-sent events to their ``data`` (WHATWG HTML §9.2.6): lines end at CRLF, LF or
    CR; ``data`` lines of one event are joined with LF; an event is dispatched at a blank line
    when it has data; comments and other fields are ignored (HTTP-7). Bounded: one event (its
    lines, or a line not yet ended) holds at most ``MAX_EVENT`` bytes (HTTP-22)."""

    __slots__ = ("_data", "_rest", "_size", "_skip_lf")

    def __init__(self) -> None:
        self._rest = b""
        self._skip_lf = False
        self._data: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[str]:
        """The data of each event ``chunk`` completes."""
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk[0] == 10:  # the LF of a CRLF whose CR ended the previous read
                chunk = chunk[1:]
        buf = self._rest + chunk if self._rest else chunk
        if b"\r" in buf:
            if buf[-1] == 13:  # this CR ends its line; a LF coming next belongs to it
                self._skip_lf = True
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        rest = lines.pop()
        if len(rest) + self._size > MAX_EVENT:
            raise ConnectFailure(f"a server-sent event is longer than {MAX_EVENT} bytes")
        self._rest = rest
        out: list[str] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    out.append(b"\n".join(data).decode("utf-8", "replace"))
                    self._data = data = []
                    self._size = 0
                continue
            if line.startswith(b"data:"):
                value = line[6:] if line.startswith(b"data: ") else line[5:]
            elif line == b"data":
                value = b""
            else:
                continue  # a comment, or a field other than data
            data.append(value)
            self._size += len(value) + 1
            if self._size > MAX_EVENT:
                raise ConnectFailure(f"a server-sent event is longer than {MAX_EVENT} bytes")
        return out

    def end(self) -> list[str]:
        """At the end of the stream: an event without its blank line is dropped, as the spec
        says (and the SDK does)."""
        return []


class EventStream:
    """A 200 response's events as parsed JSON values (``async for``); ``[DONE]`` ends it,
    an event carrying ``error`` raises :class:`StreamErrorEvent` as the SDK does (HTTP-33).
    :meth:`close` releases the connection (pooled only if the response ended cleanly)."""

    __slots__ = ("_decoder", "_finished", "_pending", "_response")

    def __init__(self, response: Response) -> None:
        self._response = response
        self._decoder = SSEDecoder()
        self._pending: collections.deque[str] = collections.deque()
        self._finished = False

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Any:
        pending = self._pending
        while True:
            if pending:
                data = pending.popleft()
                if data.startswith("[DONE]"):
                    self._end()
                    raise StopAsyncIteration
                value = json.loads(data)
                if value.__class__ is dict and value.get("error"):
                    error = value["error"]
                    message = error.get("message") if isinstance(error, dict) else None
                    if not message or not isinstance(message, str):
                        message = "An error occurred during streaming"
                    raise StreamErrorEvent(message)
                return value
            if self._finished:
                raise StopAsyncIteration
            chunk = await self._response.read_some()
            if chunk:
                pending.extend(self._decoder.feed(chunk))
            else:
                pending.extend(self._decoder.end())
                pending.append("[DONE]")  # the body's end ends the stream too

    def _end(self) -> None:
        self._finished = True
        self._pending.clear()
        response = self._response
        if response.complete:
            response.release()
        else:
            response.release_after_end()

    async def close(self) -> None:
        """Release the connection: to the pool after a clean end, closed otherwise."""
        self._response.release()


# -- the transport -------------------------------------------------------------------------------


def _parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asks to wait (``retry-after-ms``, else ``retry-after`` as seconds
    or an HTTP date), as the SDK's ``_parse_retry_after_header`` reads them."""
    if headers is None:
        return None
    for name, divisor in (("retry-after-ms", 1000), ("retry-after", 1)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            delay = float(value)
        except ValueError:
            continue
        if delay == math.inf and value.strip().lower() not in (
            "inf",
            "+inf",
            "infinity",
            "+infinity",
        ):
            return MAX_RETRY_AFTER + 1  # an overflow is an excessive delay, not infinity
        return delay / divisor
    raw = headers.get("retry-after")
    if raw is None:
        return None
    import email.utils

    try:
        parsed = email.utils.parsedate_tz(raw)
        if parsed is None:
            return None
        return float(email.utils.mktime_tz(parsed) - time.time())
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def should_retry(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an error status is worth another attempt (the SDK's ``_should_retry``,
    HTTP-12, HTTP-13)."""
    retry_after = _parse_retry_after(headers)
    if retry_after is not None and math.isfinite(retry_after) and retry_after > MAX_RETRY_AFTER:
        return False
    flag = headers.get("x-should-retry")
    if flag == "true":
        return True
    if flag == "false":
        return False
    return status in (408, 409, 429) or status >= 500


def retry_wait(
    retries_taken: int, headers: Mapping[str, str] | None, random: Callable[[], float]
) -> float:
    """Seconds before the next attempt (the SDK's ``_calculate_retry_timeout``, HTTP-14,
    HTTP-15): what the server asks if 0 < it <= 120 s, else 0.5 s doubling per retry taken,
    at most 8 s, less up to 25 % jitter."""
    retry_after = _parse_retry_after(headers)
    if (
        retry_after is not None
        and math.isfinite(retry_after)
        and 0 < retry_after <= MAX_RETRY_AFTER
    ):
        return retry_after
    delay = min(INITIAL_RETRY_DELAY * pow(2.0, min(retries_taken, 1000)), MAX_RETRY_DELAY)
    return max(delay * (1 - 0.25 * random()), 0.0)


def _random() -> float:
    import random

    return random.random()


class Transport:
    """The builtin transport of one adapter: its request URL and headers, its pool of idle
    connections, its retries. :meth:`aclose` closes the pool (HTTP-34).

    ``sleep`` and ``random`` are the retry wait and its jitter (tests record them)."""

    def __init__(
        self,
        *,
        url: str,
        headers: Mapping[str, str],
        timeout: float,
        connect_timeout: float,
        max_retries: int,
        environ: Mapping[str, str] | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        random: Callable[[], float] = _random,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        try:
            port_ok = parts.port != 0
        except ValueError:
            port_ok = False
        if scheme not in ("http", "https") or not parts.hostname or not port_ok:
            raise ConnectFailure(
                f"the base URL {_shown(url)!r} is not an http(s) URL with a host and, if any, "
                "a port from 1 to 65535"
            )
        self.origin = _Origin(
            scheme, parts.hostname or "", parts.port or (443 if scheme == "https" else 80)
        )
        self._url = url
        self._headers = dict(headers)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_retries = max_retries
        self._environ = os.environ if environ is None else environ
        self.sleep = sleep
        self.random = random
        self._idle: list[_Conn] = []
        self._closed = False  # after aclose: a connection released later is closed, not pooled
        self._ssl: ssl.SSLContext | None = None
        self._proxy: _Proxy | bool | None = False  # False: not resolved yet
        self.connections_made = 0  # how many connections this transport opened (tests read it)

    # -- connections -----------------------------------------------------------------------

    def _pool(self, conn: _Conn) -> None:
        if self._closed or len(self._idle) >= MAX_IDLE:
            conn.abort()
        else:
            self._idle.append(conn)

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()  # hostname checked, certificates required
        return self._ssl

    def _resolve_proxy(self) -> _Proxy | None:
        if self._proxy is False:
            self._proxy = proxy_for(self.origin, self._environ)
        return self._proxy  # type: ignore[return-value]

    async def _connect(self) -> _Conn:
        """A fresh connection to the endpoint (through the proxy, if any), within
        ``connect_timeout``."""
        origin = self.origin
        proxy = self._resolve_proxy()
        tls = self._ssl_context() if origin.scheme == "https" else None
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.connect_timeout):
                if proxy is None:
                    reader, writer = await asyncio.open_connection(
                        origin.host,
                        origin.port,
                        ssl=tls,
                        server_hostname=origin.host if tls is not None else None,
                        limit=MAX_LINE,
                    )
                else:
                    reader, writer = await asyncio.open_connection(
                        proxy.origin.host, proxy.origin.port, limit=MAX_LINE
                    )
                    if tls is not None:
                        await self._tunnel(reader, writer, proxy)
                        await writer.start_tls(tls, server_hostname=origin.host)
        except TimeoutError:
            if writer is not None:
                writer.transport.abort()
            raise TimeoutFailure("connecting timed out") from None
        except HttpFailure:
            if writer is not None:
                writer.transport.abort()
            raise
        except (OSError, EOFError, asyncio.LimitOverrunError) as exc:
            if writer is not None:
                writer.transport.abort()
            raise ConnectFailure(str(exc)) from exc
        except BaseException:
            if writer is not None:
                writer.transport.abort()
            raise
        self.connections_made += 1
        return _Conn(reader, writer)

    async def _tunnel(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proxy: _Proxy
    ) -> None:
        """``CONNECT`` to the endpoint through ``proxy`` (HTTP-24)."""
        authority = self.origin.authority
        lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
        if proxy.authorization is not None:
            lines.append(f"Proxy-Authorization: {proxy.authorization}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        status, _, _ = await _read_head(reader, self.connect_timeout)
        if not 200 <= status < 300:
            raise ConnectFailure(f"the proxy answered CONNECT with HTTP {status}")

    async def _idle_conn(self) -> _Conn | None:
        """An idle connection that still looks open (its previous response's end read
        first), or None."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.usable():
                conn.abort()
                continue
            pending, conn.drain = conn.drain, None
            if pending is not None:
                try:
                    await pending._finish(conn)
                except HttpFailure:
                    conn.abort()
                    continue
                except BaseException:
                    conn.abort()
                    raise
                if not conn.usable():
                    conn.abort()
                    continue
            return conn
        return None

    def _request_head(self, body: bytes, proxy: _Proxy | None, url: str) -> bytes:
        origin = self.origin
        absolute = proxy is not None and origin.scheme == "http"
        if absolute:
            target = url.split("#", 1)[0]
        else:
            parts = urllib.parse.urlsplit(url)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"POST {target} HTTP/1.1", f"Host: {origin.host_header}"]
        for name, value in self._headers.items():
            lines.append(f"{name}: {value}")
        if absolute and proxy is not None and proxy.authorization is not None:
            lines.append(f"Proxy-Authorization: {proxy.authorization}")
        lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _exchange(self, conn: _Conn, head: bytes, body: bytes) -> Response:
        """Send the request on ``conn`` and read the final response's head."""
        writer = conn.writer
        try:
            writer.write(head + body)
            async with asyncio.timeout(self.timeout):
                await writer.drain()
        except TimeoutError:
            raise TimeoutFailure("a write timed out") from None
        for _ in range(MAX_INTERIM + 1):
            try:
                status, version, headers = await _read_head(conn.reader, self.timeout)
            except TimeoutError:
                raise TimeoutFailure("reading the response timed out") from None
            if status >= 200 or status == 101:
                return Response(self, conn, status, version, headers, self.timeout)
        raise ConnectFailure("too many interim (1xx) responses")

    async def _send(self, body: bytes, url: str) -> Response:
        """One attempt: on an idle connection if there is one (a stale one retried once on a
        fresh connection, HTTP-11), else a fresh one."""
        head = self._request_head(body, self._resolve_proxy(), url)
        conn = await self._idle_conn()
        if conn is not None:
            try:
                return await self._exchange(conn, head, body)
            except (OSError, EOFError) as exc:
                if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                    conn.abort()
                    raise ConnectFailure(str(exc)) from exc
                conn.abort()  # the server closed it while it was idle: once more, afresh
            except BaseException:
                conn.abort()
                raise
        conn = await self._connect()
        try:
            return await self._exchange(conn, head, body)
        except HttpFailure:
            conn.abort()
            raise
        except (OSError, EOFError, asyncio.LimitOverrunError) as exc:
            conn.abort()
            raise ConnectFailure(str(exc) or type(exc).__name__) from exc
        except BaseException:
            conn.abort()
            raise

    async def open(self, body: bytes) -> EventStream:
        """POST ``body``; the 2xx response's event stream. Retries as the SDK does
        (HTTP-12..HTTP-16) and raises a :class:`HttpFailure` when they are spent. A wait
        between attempts is the request's to cancel (its abort signal does, HTTP-18)."""
        url = self._url
        retries_taken = redirects = 0
        while True:
            remaining = self.max_retries - retries_taken
            try:
                response = await self._send(body, url)
            except (ConnectFailure, TimeoutFailure):
                if remaining > 0:
                    await self.sleep(retry_wait(retries_taken, None, self.random))
                    retries_taken += 1
                    continue
                raise
            if response.status in (307, 308) and redirects < MAX_REDIRECTS:
                moved = self._redirect(url, response.headers.get("location"))
                if moved is not None:  # the same request again, at the new address (HTTP-37)
                    response.release()
                    url, redirects = moved, redirects + 1
                    continue
            if 200 <= response.status < 300:
                coding = response.headers.get("content-encoding", "").strip().lower()
                if coding not in ("", "identity"):
                    response.release()
                    raise ConnectFailure(
                        f"the endpoint sent its stream with Content-Encoding: {coding[:40]}, "
                        "which this client does not decode (it asks for identity)"
                    )
                return EventStream(response)
            if remaining > 0 and should_retry(response.status, response.headers):
                response.release()
                await self.sleep(retry_wait(retries_taken, response.headers, self.random))
                retries_taken += 1
                continue
            try:
                raw = await response.read_all()
            finally:
                response.release()
            raise StatusFailure(response.status, response.headers, raw)

    def _redirect(self, url: str, location: str | None) -> str | None:
        """Where a 307/308 sends the request, if it stays on this endpoint's scheme, host and
        port (the key goes nowhere else); None otherwise."""
        if not location:
            return None
        moved = urllib.parse.urljoin(url, location.strip())
        parts = urllib.parse.urlsplit(moved)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return None
        origin = self.origin
        same = (parts.scheme.lower(), (parts.hostname or "").lower(), port) == (
            origin.scheme,
            origin.host.lower(),
            origin.port,
        )
        return moved if same else None

    async def aclose(self) -> None:
        """Close every idle connection; one still in use is closed when its response ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.abort()
