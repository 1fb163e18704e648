"""Lossless JSON: the only shape durable payloads may take.

A lossless JSON value survives ``json.dumps`` → ``json.loads`` unchanged: ``None``, ``bool``,
``int`` of at most :data:`MAX_INT_DIGITS` digits, finite ``float`` other than ``-0.0``, ``str``,
and arrays and objects of those, with string keys, nested at most :data:`MAX_NESTING` levels.
Stored values are *frozen*: arrays become tuples and objects become read-only mappings, so a
caller that mutates what it appended cannot rewrite history.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from json.encoder import c_encode_basestring as _c_encode_str  # type: ignore[attr-defined]
from json.encoder import c_make_encoder as _c_make_encoder  # type: ignore[attr-defined]
from types import MappingProxyType
from typing import Any, TypeAlias

from ._errors import DshError

__all__ = [
    "MAX_INT_DIGITS",
    "MAX_NESTING",
    "JsonValue",
    "NotJsonError",
    "dumps",
    "freeze_json",
    "is_lossless_json",
    "thaw_json",
]

#: How deep a payload may nest: every array or object is one level, the payload's own included.
#: A session line adds one (the event object). Far above any real payload, far below what the
#: recursive JSON encoder, decoder and the converter reach before a ``RecursionError``.
MAX_NESTING = 100
#: The most decimal digits an integer may have: CPython's default ``int_max_str_digits``, the
#: most ``str(int)`` (so the writer) and ``int(str)`` (so the reader) handle by default.
MAX_INT_DIGITS = 4300

JsonValue: TypeAlias = Any
"""A lossless JSON value (see the module docstring); ``Any`` because Python cannot spell it."""


class NotJsonError(DshError, TypeError):
    """A value is not lossless JSON; ``path`` names where (``$.a[2]``), ``kind`` what is wrong:
    ``nesting``, ``not-finite``, ``negative-zero``, ``big-int``, ``key`` (an object key that
    is not a string) or ``type`` (a value of no JSON type)."""

    code = "NOT_JSON"

    def __init__(self, message: str, *, path: str, kind: str = "type") -> None:
        super().__init__(f"{message} at {path}")
        self.path = path
        self.kind = kind


def _check_float(value: float, path: str) -> None:
    if not math.isfinite(value):
        raise NotJsonError(f"{value!r} is not finite JSON", path=path, kind="not-finite")
    if value == 0.0 and math.copysign(1.0, value) < 0:
        raise NotJsonError("-0.0 does not survive JSON", path=path, kind="negative-zero")


def freeze_json(value: object, path: str = "$") -> JsonValue:
    """Return a frozen deep copy of ``value``, or raise :class:`NotJsonError`.

    Lists and tuples become tuples, dicts become read-only mappings; scalars pass through.
    Besides the JSON types, the log's writer and reader set two limits: at most
    :data:`MAX_NESTING` levels and integers of at most :data:`MAX_INT_DIGITS` digits.
    """
    t = type(value)
    if t is str or value is None or t is bool or (t is int and _INT_LO < value < _INT_HI):
        return value
    try:
        return _freeze(value, MAX_NESTING)
    except (_Unfit, NotJsonError, RecursionError):
        pass
    return _freeze_at(value, path, MAX_NESTING)  # again, tracking where, to name it in the error


#: Exclusive bounds of the integers JSON text may carry (at most MAX_INT_DIGITS digits).
_INT_HI = 10**MAX_INT_DIGITS
_INT_LO = -_INT_HI


class _Unfit(Exception):
    """Internal: :func:`_freeze` met something that is not lossless JSON."""


def _freeze(value: object, depth: int) -> JsonValue:
    """:func:`freeze_json` without the path bookkeeping (the common, valid case); ``depth`` is
    how many levels ``value`` may still open. Strings, ints, ``None`` and booleans inside a
    container are taken without a call."""
    t = type(value)
    if t is str or value is None or t is bool:
        return value
    if t is int:
        if _INT_LO < value < _INT_HI:
            return value
        raise _Unfit
    if t is float:
        _check_float(value, "$")  # type: ignore[arg-type]  # the 2nd walk names the path
        return value
    if depth < 1:
        raise _Unfit
    depth -= 1
    if t is list or t is tuple:
        items: list[JsonValue] = []
        append = items.append
        for v in value:  # type: ignore[attr-defined]
            c = v.__class__
            if c is str or (c is int and _INT_LO < v < _INT_HI) or v is None or c is bool:
                append(v)
            else:
                append(_freeze(v, depth))
        return tuple(items)
    if t is dict or isinstance(value, Mapping):
        out: dict[str, JsonValue] = {}
        for k, v in value.items():  # type: ignore[attr-defined]
            if k.__class__ is not str:
                raise _Unfit
            c = v.__class__
            if c is str or (c is int and _INT_LO < v < _INT_HI) or v is None or c is bool:
                out[k] = v
            else:
                out[k] = _freeze(v, depth)
        return MappingProxyType(out)
    raise _Unfit


def _freeze_at(value: object, path: str, depth: int) -> JsonValue:
    t = type(value)
    if t is str or value is None or t is bool:
        return value
    if t is int:
        if _INT_LO < value < _INT_HI:
            return value
        raise NotJsonError(
            f"an integer of more than {MAX_INT_DIGITS} digits", path=path, kind="big-int"
        )
    if t is float:
        _check_float(value, path)  # type: ignore[arg-type]
        return value
    if (t is list or t is tuple or isinstance(value, dict | Mapping)) and depth < 1:
        raise NotJsonError(
            f"JSON nested deeper than {MAX_NESTING} levels", path=path, kind="nesting"
        )
    depth -= 1
    if t is list or t is tuple:
        items: list[object] | tuple[object, ...] = value  # type: ignore[assignment]
        return tuple(_freeze_at(v, f"{path}[{i}]", depth) for i, v in enumerate(items))
    if isinstance(value, dict | Mapping):  # dict first: the common case skips the ABC check
        out: dict[str, JsonValue] = {}
        for k, v in value.items():
            if type(k) is not str:
                raise NotJsonError(
                    f"an object key of type {type(k).__name__} is not a string",
                    path=path,
                    kind="key",
                )
            out[k] = _freeze_at(v, f"{path}.{k}", depth)
        return MappingProxyType(out)
    raise NotJsonError(f"{type(value).__name__} is not JSON", path=path)


def is_lossless_json(value: object) -> bool:
    """Whether ``value`` is lossless JSON (never raises)."""
    try:
        freeze_json(value)
    except NotJsonError:
        return False
    return True


def thaw_json(value: JsonValue) -> Any:
    """The plain ``list``/``dict`` form of a frozen JSON value (for ``json.dumps``)."""
    if isinstance(value, tuple | list):
        return [thaw_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: thaw_json(v) for k, v in value.items()}
    return value


def _default(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_default)
# ``JSONEncoder.encode`` builds a C encoder for every call; this one is built once. It skips the
# cycle check (no markers), as ``check_circular=False`` does: values here are frozen JSON, which
# cannot be cyclic, and a shared marker table would be unsafe across the I/O threads.
_C_ENCODE: Any = (
    _c_make_encoder(None, _default, _c_encode_str, None, ":", ",", False, False, True)
    if _c_make_encoder is not None and _c_encode_str is not None
    else None
)


def dumps(value: object) -> str:
    """Compact JSON text; frozen mappings and tuples serialize as objects and arrays."""
    if value.__class__ is str:
        return _ENCODER.encode(value)
    if _C_ENCODE is not None:
        return "".join(_C_ENCODE(value, 0))
    return _ENCODER.encode(value)
