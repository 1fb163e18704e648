"""Model-facing words: how an error a model reads names a field, a value or an id.

A model reads every tool error as plain text and retries from it, so the text says which field
is at fault, what is wrong and what to do, in words; never a validator's message, a parser's
position notation or a Python ``repr`` (ROB-90). Names a model chose (a tool, a field, an id)
are shown JSON-quoted and bounded, so a hostile name cannot smuggle quotes, control characters
or a megabyte of text into the reply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from ._json import MAX_INT_DIGITS, MAX_NESTING, NotJsonError

__all__ = [
    "NAME_LIMIT",
    "check_positive_int",
    "field_of",
    "not_json_text",
    "invalid_arguments_text",
    "json_syntax_text",
    "quote_name",
    "quote_names",
    "reason_text",
    "shown_id",
    "unknown_fields_text",
]

#: The most characters of a model-chosen name an error text repeats (then ``…``).
NAME_LIMIT = 64

_PLAIN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,63}")


def quote_name(name: object, limit: int = NAME_LIMIT) -> str:
    """``name`` as a JSON string (double quotes; control characters, DEL and the C1 controls
    and lone surrogates escaped, ``\\n``, ``\\u0001``, ``\\u007f``, ``\\ud800``), cut to
    ``limit`` characters with ``…`` when longer. Not a string: its JSON text (bounded alike),
    or its type in words."""
    if isinstance(name, str):
        text = json.dumps(name if len(name) <= limit else name[:limit] + "…", ensure_ascii=False)
    else:
        try:
            text = json.dumps(name, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):
            return f"a value of type {type(name).__name__}"
        text = text if len(text) <= limit else text[:limit] + "…"
    return _RAW_UNSAFE.sub(_escape, text) if _RAW_UNSAFE.search(text) else text


#: What ``json.dumps(ensure_ascii=False)`` leaves raw but a reader must not get raw (ROB-96):
#: DEL and the C1 controls (invisible, some terminals act on them), and surrogates: one in a
#: ``str`` is a lone one (a pair is one code point), escaped so the text stays valid UTF-8 for
#: every model endpoint.
_RAW_UNSAFE = re.compile("[\x7f-\x9f\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


#: The most names :func:`quote_names` spells out (then ``and N more``).
LIST_LIMIT = 10


def quote_names(names: Iterable[object], conjunction: str = "and") -> str:
    """``"a"``, ``"a" and "b"``, ``"a", "b" and "c"`` (each :func:`quote_name`); past
    :data:`LIST_LIMIT` names, the first ones and ``and N more``."""
    items = [quote_name(n) for n in names]
    if len(items) > LIST_LIMIT:
        rest = len(items) - LIST_LIMIT + 1
        items = [*items[: LIST_LIMIT - 1], f"{rest} more"]
        conjunction = "and"
    if len(items) <= 1:
        return items[0] if items else "none"
    return f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


def shown_id(value: object) -> str:
    """An id in a sentence: as it is when it looks like an id (letters, digits and ``._:@/+-``,
    at most 64 characters), so the runtime's own ids read unchanged; otherwise
    :func:`quote_name`."""
    if isinstance(value, str) and _PLAIN_ID.fullmatch(value):
        return value
    return quote_name(value)


def reason_text(reason: object) -> str:
    """An abort or cancel reason in a sentence: its text (a string, or an exception's
    message), never its ``repr``; ``no reason given`` otherwise."""
    text = str(reason) if isinstance(reason, str | BaseException) else ""
    return text or "no reason given"


def invalid_arguments_text(tool: str, problem: str, todo: str | None = None) -> str:
    """The one shape of every ``INVALID_ARGS`` text: ``invalid arguments for <tool>:
    <problem>. <todo>``; ``todo`` defaults to calling the tool again with arguments that match
    its parameters."""
    if todo is None:
        todo = f"Call {tool} again with arguments that match its parameters."
    return f"invalid arguments for {tool}: {problem}. {todo}"


def unknown_fields_text(unknown: Iterable[object], allowed: Iterable[str]) -> str:
    """``unknown property "x"; the allowed properties are "a" and "b"`` (the words the schema
    check uses for ``additionalProperties``)."""
    extra = list(unknown)
    known = list(allowed)
    noun = "property" if len(extra) == 1 else "properties"
    text = f"unknown {noun} {quote_names(extra)}"
    if known:
        text += f"; the allowed properties are {quote_names(known)}"
    return text


def check_positive_int(name: str, value: Any, *, limit: int | None = None) -> None:
    """Raise ``ValueError`` unless ``value`` is an ``int`` (never a ``bool``) of at least 1 and,
    with ``limit``, at most ``limit``; the one message shape of every "a positive integer"
    setting: ``<name> must be an integer of at least 1, got <value>`` (``from 1 to <limit>``
    with a limit). The caller keeps its own error code (it wraps or re-raises)."""
    if value.__class__ is int and value >= 1 and (limit is None or value <= limit):
        return
    bound = f"from 1 to {limit}" if limit is not None else "of at least 1"
    raise ValueError(f"{name} must be an integer {bound}, got {_described(value)}")


def _described(value: Any) -> str:
    """A config value in words: JSON text for JSON scalars, else its type."""
    if isinstance(value, str):
        return quote_name(value)
    if value is None or isinstance(value, bool | int | float):
        try:
            return json.dumps(value, allow_nan=False)
        except ValueError:  # a float that is not finite, an int too long to print
            return "a number out of range" if isinstance(value, int) else str(value)
    return f"a value of type {type(value).__name__}"


def field_of(path: str, root: str) -> str:
    """A :class:`NotJsonError` path (``$.a[2]``) as a field in a sentence: ``root`` for the
    whole value, else the field JSON-quoted (``"a[2]"``)."""
    field = path[1:].lstrip(".") if path.startswith("$") else path
    return quote_name(field, 2 * NAME_LIMIT) if field else root


def not_json_text(exc: NotJsonError, root: str) -> str:
    """Why a value is not lossless JSON, in words naming the field (``root``: the whole)."""
    where = field_of(exc.path, root)
    kind = exc.kind
    if kind == "nesting":
        return f"{root} {_be(root)} nested deeper than {MAX_NESTING} levels"
    if kind == "not-finite":
        return f"{where} must be a finite number (NaN and Infinity are not JSON numbers)"
    if kind == "negative-zero":
        return f"{where} must not be negative zero (-0.0); use 0"
    if kind == "big-int":
        return f"{where} must be an integer of at most {MAX_INT_DIGITS} digits"
    if kind == "key":
        return f"{where} has an object key that is not a string"
    return f"{where} is not a JSON value"


def _be(subject: str) -> str:
    return "are" if subject.endswith("s") else "is"


#: The json module's decode messages (their stable prefixes), in words.
_DECODE_WORDS = (
    ("Expecting value", "a value was expected"),
    ("Expecting ',' delimiter", "a comma was expected"),
    ("Expecting ':' delimiter", "a colon was expected"),
    ("Expecting property name", "a property name in double quotes was expected"),
    ("Unterminated string", "a string is not closed"),
    ("Invalid control character", "a string holds a raw control character (escape it)"),
    ("Invalid \\uXXXX escape", "a string holds an invalid \\u escape"),
    ("Invalid \\escape", "a string holds an invalid backslash escape"),
    ("Extra data", "more text follows the JSON value"),
    ("Illegal trailing comma", "a comma is followed by no value"),
    ("Unexpected UTF-8 BOM", "the text starts with a byte-order mark"),
)


def json_syntax_text(exc: ValueError, root: str = "the arguments") -> str:
    """Why text is not JSON, in words: what the parser expected and where (line and column),
    never the json module's own message; ``exc`` is what ``json.loads`` raised."""
    msg = getattr(exc, "msg", None)
    line = getattr(exc, "lineno", None)
    column = getattr(exc, "colno", None)
    if not isinstance(msg, str):  # not a JSONDecodeError: an integer too long to convert
        if "digits" in str(exc):
            return f"{root} hold a number of more than {MAX_INT_DIGITS} digits"
        return f"{root} are not valid JSON"
    what = next((w for prefix, w in _DECODE_WORDS if msg.startswith(prefix)), None)
    where = f" at line {line}, column {column}" if line is not None else ""
    return f"{root} are not valid JSON: {what or 'the text is not JSON'}{where}"
