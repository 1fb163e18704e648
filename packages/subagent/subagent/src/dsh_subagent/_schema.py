"""The object-rooted JSON Schema subset an ``output_schema`` may use (SVC-6, STR-1).

The child reports structured output by calling a ``structured_output`` tool whose parameters
*are* the schema, so the schema must be something every model API accepts as tool parameters
and that fastjsonschema validates identically: an object root, no references, no remote or
dynamic keywords, keyword values of the documented types, and small enough for the validator
to compile. Anything else is refused at start, before any child exists (SVC-6, hardening 11.7).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dsh_core import NotJsonError, compile_schema, freeze_json

from ._errors import UnsupportedSchemaError

__all__ = ["SUPPORTED_KEYWORDS", "assert_object_json_schema"]

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties"})
_SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf"})
_SCHEMA_ONE = frozenset({"items", "additionalProperties", "not"})
_NUMBERS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
_COUNTS = frozenset(
    {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"}
)
_VALUES = (
    _NUMBERS
    | _COUNTS
    | {"type", "enum", "const", "required", "multipleOf", "pattern", "format", "uniqueItems"}
)
#: Every keyword the subset allows.
SUPPORTED_KEYWORDS = _ANNOTATIONS | _SCHEMA_MAPS | _SCHEMA_LISTS | _SCHEMA_ONE | _VALUES
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


def _fail(path: str, why: str) -> UnsupportedSchemaError:
    return UnsupportedSchemaError(f"unsupported JSON schema at {path}: {why}")


def _check(node: object, path: str) -> None:
    if isinstance(node, bool):
        return
    if not isinstance(node, Mapping):
        raise _fail(path, "a schema must be an object or a boolean")
    for key, value in node.items():
        where = f"{path}.{key}"
        if key not in SUPPORTED_KEYWORDS:
            raise _fail(where, f"keyword {key!r} is not supported")
        if key == "type":
            kinds = value if isinstance(value, tuple | list) else (value,)
            if not kinds or any(not isinstance(k, str) or k not in _TYPES for k in kinds):
                raise _fail(where, f"type must name JSON types, got {value!r}")
        elif key == "required":
            if not isinstance(value, tuple | list) or any(not isinstance(v, str) for v in value):
                raise _fail(where, "required must be a list of property names")
        elif key == "enum":
            if not isinstance(value, tuple | list) or not value:
                raise _fail(where, "enum must be a non-empty list")
        elif key in _SCHEMA_MAPS:
            if not isinstance(value, Mapping):
                raise _fail(where, f"{key} must map names to schemas")
            for name, sub in value.items():
                _check(sub, f"{where}.{name}")
        elif key in _SCHEMA_LISTS:
            if not isinstance(value, tuple | list) or not value:
                raise _fail(where, f"{key} must be a non-empty list of schemas")
            for i, sub in enumerate(value):
                _check(sub, f"{where}[{i}]")
        elif key in _SCHEMA_ONE:
            _check(value, where)
        elif key in _NUMBERS:
            if not _is_number(value):
                raise _fail(where, f"{key} must be a number")
        elif key in _COUNTS:
            if type(value) is not int or value < 0:
                raise _fail(where, f"{key} must be a non-negative integer")
        elif key == "multipleOf":
            if not _is_number(value) or value <= 0:
                raise _fail(where, "multipleOf must be a number greater than 0")
        elif key == "uniqueItems":
            if type(value) is not bool:
                raise _fail(where, "uniqueItems must be a boolean")
        elif key == "format":
            if not isinstance(value, str):
                raise _fail(where, "format must be a string")
        elif key == "pattern":
            if not isinstance(value, str):
                raise _fail(where, "pattern must be a string")
            try:
                re.compile(value)
            except re.error as exc:
                raise _fail(where, f"bad pattern: {exc}") from exc


def _is_number(value: object) -> bool:
    return type(value) is int or type(value) is float


def assert_object_json_schema(schema: object) -> Any:
    """Return ``schema`` frozen if it is an object-rooted schema within the subset.

    Raises :class:`UnsupportedSchemaError` ("unsupported JSON schema ...") otherwise: a schema
    that is not lossless JSON (NaN, non-string keys, sets, a recursive structure), a keyword
    value of the wrong type, or one the validator cannot compile (too deeply nested). The
    compiled validator is the one the ``structured_output`` tool then uses (cached).
    """
    try:
        frozen = freeze_json(schema)
    except NotJsonError as exc:
        raise UnsupportedSchemaError(f"unsupported JSON schema: {exc}") from exc
    except RecursionError:
        raise UnsupportedSchemaError(
            "unsupported JSON schema: recursive or too deeply nested"
        ) from None
    if not isinstance(frozen, Mapping):
        raise _fail("$", "the root must be an object schema")
    if frozen.get("type") != "object":
        raise _fail("$", 'the root must have "type": "object"')
    try:
        _check(frozen, "$")
    except RecursionError:
        raise UnsupportedSchemaError("unsupported JSON schema: nested too deeply") from None
    try:
        compile_schema(frozen)
    except Exception as exc:  # fastjsonschema's definition errors, SyntaxError, RecursionError
        raise UnsupportedSchemaError(
            f"unsupported JSON schema: the validator cannot compile it "
            f"({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    return frozen
