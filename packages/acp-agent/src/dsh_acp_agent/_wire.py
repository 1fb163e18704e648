"""The ACP byte stream between the pipe and the SDK: what the peer sends is checked before the
SDK sees it, and what we send is made encodable (ROB-20..ROB-39).

The SDK's own stdio framing (``acp._transport.NdjsonTransport``) hands its message loop any
JSON value: a number, a string, an array or ``null`` on one line ended the connection (every
session with it), a line that is not JSON cost a traceback on the root logger, and a lone
surrogate left as a ``\\ud800`` escape a strict peer refuses. :class:`GuardedTransport` is an
SDK ``Transport`` in its place (the SDK is not patched): each line is decoded here, and only a
JSON-RPC object the SDK can route reaches it. Everything else is answered on the writer the
way the TypeScript SDK answers it, with an error whose id is ``null``, logged once in one line
naming the peer, and the connection goes on:

- a line that is not JSON (``NaN`` and ``Infinity`` included): -32700 Parse error;
- JSON that is no JSON-RPC object (a number, a string, ``null``, an array, a batch array as a
  whole, an object with neither ``method`` nor ``id``, an ``id`` that is no string, number or
  ``null``, a ``method`` that is no string), a message nested more than 200 levels deep (an
  answer that echoes it could not be read back), or a line longer than :data:`MAX_FRAME` (read to
  its end without being kept): -32600 Invalid Request (with the request's id when that one is
  usable).

A response whose ``error`` is no object reaches the SDK as an internal error (-32603), so the
request waiting for it fails rather than the connection. Bytes that are not UTF-8 are read
with U+FFFD in their place, and so is every lone surrogate a frame escapes (``"\\ud800"``):
nothing inside ever holds text the outside cannot carry. What we send leaves as UTF-8 with
each lone surrogate replaced by U+FFFD and each non-finite number as ``null`` (one warning per
connection for each kind); the caller's values are not changed.

:func:`quiet_notifications` keeps notifications the SDK cannot route from logging
tracebacks: ``$/cancel_request`` is accepted quietly, an unknown one is a debug line, one whose
params do not fit is a warning line.

This module is the same file in dsh-acp-agent and dsh-subagent-acp (a test checks that).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["MAX_FRAME", "GuardedTransport", "quiet_notifications"]

#: The longest line read as a frame, in bytes; a longer one is skipped (and refused).
MAX_FRAME = 64 << 20
#: How many bytes of held frames (``GuardedTransport.hold``) are written at once, response or not.
HOLD_LIMIT = 64 << 10
#: How many bad frames of one connection are logged, one line each; later ones are counted.
LOG_LIMIT = 20
#: How deep a value we send may nest: deeper parts leave as ``null`` (only when ``json``
#: itself could not encode it).
_MAX_DEPTH = 200

_PARSE_ERROR = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}\n'
_INVALID = {"code": -32600, "message": "Invalid Request"}
_MALFORMED_ERROR = {"code": -32603, "message": "Malformed error response"}
#: The types a JSON-RPC id may have (``bool`` is not ``int`` here: its class is tested).
_ID_CLASSES = frozenset({str, int, float, type(None)})
#: A JSON escape of a surrogate (paired or lone): only a line holding one is searched.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE = re.compile("[\ud800-\udfff]")
_KINDS = {
    int: "a JSON number", float: "a JSON number", str: "a JSON string", bool: "a JSON boolean",
    type(None): "JSON null", list: "a JSON array",
}  # fmt: skip


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: ``json.loads`` without the ``NaN``/``Infinity`` extension (the C scanner all the same).
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _no_default(value: Any) -> Any:
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


def _encoder() -> Callable[[Any], str]:
    """``_ENCODER.encode``, with the C encoder it builds for each call built once (PERF-26).

    The same text: compact, non-ASCII as itself, ``NaN`` refused (``ValueError``), a value
    JSON has no form for refused (``TypeError``). Circular values are not looked for: one
    recurses until ``RecursionError``, which :meth:`GuardedTransport.send` handles as it
    handles a value nested too deep. Without the C accelerator, ``_ENCODER.encode`` itself.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - a Python without the json C accelerator
        return _ENCODER.encode
    chunks = make(
        None, _no_default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    join = "".join

    def encode(value: Any) -> str:
        return join(chunks(value, 0))

    return encode


_ENCODE = _encoder()


def _fix(text: str) -> str:
    """``text`` with each lone surrogate as U+FFFD (a pair in it becomes its character)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _scrub(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` that JSON and UTF-8 can carry: lone surrogates as U+FFFD, non-finite
    numbers and what nests deeper than ``_MAX_DEPTH`` as ``None``, any other object as its
    ``str``."""
    cls = value.__class__
    if cls is str:
        return _fix(value) if _LONE.search(value) else value
    if cls is float:
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        if depth >= _MAX_DEPTH:
            return None
        return {
            (_scrub(k, depth) if k.__class__ is str else k): _scrub(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        if depth >= _MAX_DEPTH:
            return None
        return [_scrub(v, depth + 1) for v in value]
    if value is None or isinstance(value, int):  # bool is an int
        return value
    return str(value)  # what JSON has no form for (an error's context object, say)


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` arrays and objects (iteratively: no stack)."""
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if item.__class__ is dict:
            children: Any = item.values()
        elif item.__class__ is list:
            children = item
        else:
            continue
        if depth > limit:
            return True
        todo.extend((child, depth + 1) for child in children)
    return False


def _kind(value: Any) -> str:
    return _KINDS.get(value.__class__, "JSON that is not an object")


def _problem(message: dict[str, Any]) -> str | None:
    """Why the SDK cannot route ``message``, or ``None`` when it can."""
    if "method" in message:
        if message["method"].__class__ is not str:
            return "a message whose method is not a string"
        if "id" in message and message["id"].__class__ not in _ID_CLASSES:
            return "a request whose id is not a string, a number or null"
        return None
    if "id" not in message:
        return "an object with neither a method nor an id"
    if message["id"].__class__ not in _ID_CLASSES:
        return "a response whose id is not a string, a number or null"
    return None


class GuardedTransport:
    """An SDK ``Transport`` over newline-delimited JSON on a pair of asyncio streams (see the
    module docstring). ``peer`` names the other side in log lines (``client (pid 4242)``).

    :meth:`hold` lets a request's handler send its last notifications with its answer: the
    frames sent from then on are written, in their order, in one write with the next
    response (or at :meth:`release`, or once :data:`HOLD_LIMIT` bytes are held): one system
    call and one wake-up of the peer rather than one per frame (PERF-24)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        peer: str,
        log: logging.Logger,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.peer = peer
        self._log = log
        self._closed = False
        self._broken = False
        self.bad_frames = 0
        self._warned_in: set[str] = set()  # what the peer sent that was repaired, once each
        self._warned_out = False
        self._held: list[bytes] | None = None  # frames held for the next response (hold())
        self._held_size = 0

    # -- sending ----------------------------------------------------------------------------

    async def send(self, message: dict[str, Any]) -> None:
        """Write one frame. A request or a notification raises ``ConnectionError`` once the
        stream is closed or broken; a response to a peer that has gone is dropped."""
        try:
            data = (_ENCODE(message) + "\n").encode()
        except (UnicodeEncodeError, ValueError, TypeError, RecursionError):
            data = self._encodable(message)
        held = self._held
        if held is not None:
            if self._closed or self._broken or self._writer.is_closing():
                self._held = None
            else:
                held.append(data)
                self._held_size += len(data)
                if "method" in message and self._held_size < HOLD_LIMIT:
                    return  # written with the response that follows (or at release())
                data = self._take_held()
        if not self._write(data):
            if "method" in message:
                raise ConnectionError("Connection closed")
            return
        try:
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            self._lost(exc)
            if "method" in message:
                raise ConnectionError("Connection closed") from None

    def hold(self) -> None:
        """Hold the frames sent from now on until the next response, and write them with it
        in one write (see the class docstring); the caller makes sure a response or
        :meth:`release` follows without waiting on anything else."""
        if self._held is None:
            self._held = []
            self._held_size = 0

    def release(self) -> None:
        """Write the frames held, and hold no more (a handler that will send no response)."""
        if self._held is not None:
            data = self._take_held()
            if data:
                self._write(data)

    def _take_held(self) -> bytes:
        held, self._held = self._held or [], None
        return held[0] if len(held) == 1 else b"".join(held)

    def _encodable(self, message: dict[str, Any]) -> bytes:
        if not self._warned_out:
            self._warned_out = True
            self._log.warning(
                "%s: a value that UTF-8 or JSON cannot carry (a lone surrogate, a non-finite "
                "number) was sent as U+FFFD or null (once per connection)",
                self.peer,
            )
        return (_ENCODE(_scrub(message)) + "\n").encode()

    def _write(self, data: bytes) -> bool:
        """Queue ``data`` (a frame and its newline); ``False`` when the stream cannot take it."""
        if self._closed or self._broken or self._writer.is_closing():
            return False
        try:
            self._writer.write(data)
        except (ConnectionError, RuntimeError) as exc:
            self._lost(exc)
            return False
        return True

    def _lost(self, exc: BaseException) -> None:
        if not self._broken:
            self._broken = True
            self._log.debug("%s: the stream to the peer closed: %s", self.peer, exc)

    async def _answer(self, data: bytes) -> None:
        """Write an error answer of ours (after any frames held); a peer that has gone gets
        none."""
        if self._held is not None:
            self._held.append(data)
            data = self._take_held()
        if self._write(data):
            try:
                await self._writer.drain()
            except (ConnectionError, RuntimeError) as exc:
                self._lost(exc)

    # -- receiving --------------------------------------------------------------------------

    async def receive(self) -> dict[str, Any] | None:
        """The next frame the SDK can route; ``None`` at the end of the stream."""
        while True:
            line = await self._read_line()
            if line is None:
                return None
            if isinstance(line, int):  # the length of a line too long to keep
                await self._bad(f"a line of more than {MAX_FRAME} bytes", _INVALID_NULL, -32600)
                continue
            try:
                text = line.decode()
            except UnicodeDecodeError:
                text = line.decode("utf-8", "replace")
                self._warn_in("bytes that are not UTF-8")
            try:
                message: Any = _DECODER.decode(text)
            except (ValueError, RecursionError) as exc:
                if not text.strip():
                    continue
                reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
                await self._bad(f"a line that is not JSON ({reason[:80]})", _PARSE_ERROR, -32700)
                continue
            if message.__class__ is not dict:
                await self._bad(f"{_kind(message)}, not a JSON-RPC object", _INVALID_NULL, -32600)
                continue
            problem = _problem(message)
            if problem is not None:
                request_id = message.get("id") if "method" in message else None
                if request_id.__class__ not in _ID_CLASSES:
                    request_id = None
                await self._bad(problem, _invalid(request_id), -32600)
                continue
            if line.count(b"[") + line.count(b"{") > _MAX_DEPTH and _deeper_than(
                message, _MAX_DEPTH
            ):  # what the SDK answers may echo it: no peer could read that back
                request_id = message.get("id") if "method" in message else None
                what = f"a message nested more than {_MAX_DEPTH} levels deep"
                await self._bad(what, _invalid(request_id), -32600)
                continue
            if _SURROGATE_ESCAPE.search(line) is not None:
                message = self._repaired(message)
            if "error" in message and "method" not in message:
                error = message["error"]
                if error.__class__ is not dict and "result" not in message:
                    await self._bad("a response whose error is not an object", None, None)
                    message = {"jsonrpc": "2.0", "id": message["id"], "error": _MALFORMED_ERROR}
            frame: dict[str, Any] = message
            return frame

    def _repaired(self, message: dict[str, Any]) -> dict[str, Any]:
        """``message`` with its lone surrogates as U+FFFD (a pair is a character already)."""
        fixed: dict[str, Any] = _scrub(message)
        if fixed != message:
            self._warn_in("text with lone surrogates")
        return fixed

    def _warn_in(self, what: str) -> None:
        if what not in self._warned_in:
            self._warned_in.add(what)
            self._log.warning("%s: sent %s; read as U+FFFD (once per connection)", self.peer, what)

    async def _bad(self, what: str, answer: bytes | None, code: int | None) -> None:
        """Log a bad frame (one line; the first ``LOG_LIMIT`` of the connection) and answer it."""
        self.bad_frames += 1
        if self.bad_frames <= LOG_LIMIT:
            answered = "" if code is None else f"; answered {code}"
            last = (
                f" (the last logged: {LOG_LIMIT} bad frames from this peer)"
                if self.bad_frames == LOG_LIMIT
                else ""
            )
            self._log.warning("%s: sent %s%s%s", self.peer, what, answered, last)
        if answer is not None:
            await self._answer(answer)

    async def _read_line(self) -> bytes | int | None:
        """The next line (its newline kept); its length alone when it is longer than
        ``MAX_FRAME``; ``None`` at the end of the stream (or when the stream fails)."""
        reader = self._reader
        try:
            line = await reader.readuntil(b"\n")
            return line if len(line) <= MAX_FRAME else len(line)
        except asyncio.IncompleteReadError as exc:
            return exc.partial or None
        except asyncio.LimitOverrunError:
            pass
        except (ConnectionError, OSError) as exc:
            self._log.debug("%s: reading from the peer failed: %s", self.peer, exc)
            return None
        chunks: list[bytes] = []
        size = 0
        while True:  # a line longer than the reader's buffer: read it in parts
            try:
                chunk = await reader.readuntil(b"\n")
                end = True
            except asyncio.LimitOverrunError as exc:
                chunk = await reader.readexactly(exc.consumed)
                end = False
            except asyncio.IncompleteReadError as exc:
                chunk = exc.partial
                end = True
            except (ConnectionError, OSError):
                return None
            size += len(chunk)
            if size <= MAX_FRAME:
                chunks.append(chunk)
            else:
                chunks.clear()
            if end:
                if size > MAX_FRAME:
                    return size
                return b"".join(chunks) or None

    async def close(self) -> None:
        """Write what is held, then stop sending (the streams belong to the caller and stay
        open)."""
        self.release()
        self._closed = True


def _invalid(request_id: Any) -> bytes:
    """The -32600 answer to a request with ``request_id`` (a usable id, or ``None``)."""
    answer = {"jsonrpc": "2.0", "id": _scrub(request_id), "error": _INVALID}
    return (_ENCODE(answer) + "\n").encode()


_INVALID_NULL = _invalid(None)


_Handler = Callable[[str, Any, bool], Awaitable[Any]]


def quiet_notifications(conn: Any, *, peer: str, log: logging.Logger) -> None:
    """Route the notifications of ``conn`` (an SDK ``AgentSideConnection`` or
    ``ClientSideConnection``) through a guard: ``$/cancel_request`` is accepted quietly, and a
    notification the SDK refuses (unknown method, params that do not fit) is one log line
    instead of the SDK's ERROR traceback. Requests go to the SDK's router untouched."""
    from acp import RequestError
    from pydantic import ValidationError

    inner_conn: Any = getattr(conn, "_conn", None)
    found: _Handler | None = getattr(inner_conn, "_handler", None)
    if found is None:  # pragma: no cover - an SDK without the attribute: nothing to guard
        return
    inner = found

    async def notification(method: str, params: Any) -> None:
        if method == "$/cancel_request":
            log.debug("%s: $/cancel_request accepted (requests are not cancelled one by one)", peer)
            return
        try:
            await inner(method, params, True)
        except RequestError as exc:
            log.debug("%s: notification %r ignored: %s", peer, method[:100], exc)
        except ValidationError as exc:
            log.warning(
                "%s: notification %r ignored: its params do not fit the protocol (%d errors)",
                peer, method[:100], exc.error_count(),
            )  # fmt: skip

    def handler(method: str, params: Any, is_notification: bool) -> Awaitable[Any]:
        if is_notification:
            return notification(method, params)
        return inner(method, params, False)

    inner_conn._handler = handler
