"""Writing event lines: compiled per-type line encoders and the stand-in of an event that
cannot be encoded."""

from __future__ import annotations

import re
from collections.abc import Callable
from json.encoder import encode_basestring

from .._codec import Unfit, class_encoder
from .._events import (
    EventTypeRegistry,
    SessionEvent,
)
from .._json import dumps

#: A surrogate that is not half of a high-low pair: UTF-8 has no bytes for it.
_LONE_SURROGATE = re.compile(
    "[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]"
)


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def utf8_lines(text: str) -> bytes:
    """The bytes of JSON ``text`` (lines the writer built) as the file stores them.

    A string may hold lone surrogates (the log keeps what was said); written raw they would make
    the file invalid UTF-8 for every other reader (``jq``, an editor). Each one is written as its
    JSON escape instead, which reads back as the same character. A high surrogate followed by a
    low one stays raw: escaped, the pair would read back as the one character it spells, not
    as the two the string held. Text without surrogates (nearly all) costs one encode.
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub(_escape, text).encode("utf-8", "surrogatepass")


def _line_encoder(types: EventTypeRegistry, type_: str) -> Callable[[SessionEvent], str]:
    """The function writing one event line of ``type_``.

    For a type whose payload class compiles (:mod:`dsh_core._codec`) the line is written
    directly; any event it does not fit (a payload of another class, an unusual value) and every
    other type go through ``dumps(types.encode(event))``, which the fast line always equals.
    """

    def generic(event: SessionEvent) -> str:
        return dumps(types.encode(event)) + "\n"

    spec = types.get(type_)
    payload = class_encoder(spec.payload) if spec is not None and spec.payload else None
    if payload is None:
        return generic
    prefix = '{"type":' + encode_basestring(type_) + ',"seq":'

    def line(event: SessionEvent) -> str:
        try:
            seq = event.seq
            time = event.time
            if seq.__class__ is not int or time.__class__ is not int:
                raise Unfit
            data = payload(event.data)
            if (
                event.source_event_seqs is None
                and event.surface_op is None
                and event.ignorable is False
            ):
                return f'{prefix}{seq},"time":{time},"data":{data}}}\n'
            return f'{prefix}{seq},"time":{time},"data":{data}{_surface_text(event)}}}\n'
        except Exception:
            return generic(event)

    return line


def _surface_text(event: SessionEvent) -> str:
    """The optional keys of an event line, as ``EventTypeRegistry.encode`` writes them."""
    out = ""
    seqs = event.source_event_seqs
    if seqs is not None:
        if seqs.__class__ is not tuple or any(s.__class__ is not int for s in seqs):
            raise Unfit
        out = ',"source_event_seqs":[' + ",".join([int.__repr__(s) for s in seqs]) + "]"
    op = event.surface_op
    if op is not None:
        if op.__class__ is not str:
            raise Unfit
        out += ',"surface_op":' + encode_basestring(op)
    if event.ignorable is True:
        out += ',"ignorable":true'
    elif event.ignorable is not False:
        raise Unfit
    return out


def _stand_in(event: SessionEvent, exc: Exception) -> str:
    """The line stored for an event that could not be encoded (same seq and time)."""
    data = {"type": event.type, "error": f"{type(exc).__name__}: {exc}"[:1000]}
    line = {"type": "session/unwritable", "seq": event.seq, "time": event.time, "data": data}
    return dumps({**line, "ignorable": True}) + "\n"
