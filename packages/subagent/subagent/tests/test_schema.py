"""The output-schema check against arbitrary malformed schemas (SVC-6, hardening 11.7)."""

from __future__ import annotations

from typing import Any

import fastjsonschema
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dsh_core import compile_schema, thaw_json
from dsh_subagent import SUPPORTED_KEYWORDS, UnsupportedSchemaError, assert_object_json_schema

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
_keywords = st.sampled_from([*sorted(SUPPORTED_KEYWORDS), "$ref", "if", "definitions"])
_names = st.sampled_from(["a", "b", "^x+$", "(", "type"])


def _bodies(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    value = (
        _json
        | inner
        | st.lists(inner, max_size=2)
        | st.dictionaries(_names, inner, max_size=2)
        | st.sampled_from(["object", "string", "array", "integer", 0, -1, 1.5, "("])
    )
    return st.dictionaries(_keywords, value, max_size=4)


_schemas = st.recursive(st.booleans() | st.just({}), _bodies, max_leaves=12)
_roots = _bodies(_schemas).map(lambda body: {**body, "type": "object"})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_roots, instance=_json)
@example(schema={"type": "object", "items": {"type": {}}}, instance=None)
@example(schema={"type": "object", "pattern": 123}, instance=None)
@example(schema={"type": "object", "minimum": "x"}, instance=None)
def test_a_schema_is_refused_or_usable(schema: dict[str, Any], instance: Any) -> None:
    """SVC-6, hardening 11.7: any schema is either UnsupportedSchemaError or compiles into a
    validator that judges any JSON value (valid, or JsonSchemaValueException) without crashing."""
    try:
        frozen = assert_object_json_schema(schema)
    except UnsupportedSchemaError as exc:
        refused = str(exc)
        assert refused.startswith("unsupported JSON schema")
        return
    validate = compile_schema(frozen)
    for value in ({}, instance, {"a": instance}):
        try:
            validate(thaw_json(value) if value is not instance else value)
        except fastjsonschema.JsonSchemaValueException:
            pass
