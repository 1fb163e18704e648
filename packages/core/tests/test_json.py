"""Lossless JSON (host-core §3: durable payloads are lossless JSON, snapshotted on append):
freezing copies exactly what survives JSON and names the first thing that does not; ``dumps``
writes what ``json.dumps`` writes."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core._json import MAX_INT_DIGITS, MAX_NESTING, NotJsonError, dumps, freeze_json, thaw_json


def _values() -> st.SearchStrategy[Any]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats()  # NaN, infinities and -0.0 included: they must be refused
        | st.text(max_size=4)
        | st.sampled_from([b"bytes", 1j])
    )
    keys = st.text(max_size=3) | st.integers(0, 3)
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.tuples(inner, inner)
            | st.dictionaries(keys, inner, max_size=3)
        ),
        max_leaves=8,
    )


def _first_offence(value: object, path: str = "$") -> str | None:
    """Where a plain walk finds the first value that is not lossless JSON."""
    if value is None or type(value) in (bool, int, str):
        return None
    if type(value) is float:
        lossy = not math.isfinite(value) or (value == 0.0 and math.copysign(1.0, value) < 0)
        return path if lossy else None
    if type(value) in (list, tuple):
        for i, v in enumerate(value):  # type: ignore[arg-type]
            found = _first_offence(v, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    if isinstance(value, Mapping):
        for k, v in value.items():
            if type(k) is not str:
                return path
            found = _first_offence(v, f"{path}.{k}")
            if found is not None:
                return found
        return None
    return path


@given(_values())
def test_freezing_copies_lossless_json_and_names_the_first_offence(value: object) -> None:
    """host-core §3: a frozen copy that thaws back to the same JSON, or NOT_JSON at the path of
    the first value JSON would lose."""
    offence = _first_offence(value)
    if offence is not None:
        with pytest.raises(NotJsonError) as caught:
            freeze_json(value)
        assert caught.value.path == offence
        assert caught.value.code == "NOT_JSON"
        return
    frozen = freeze_json(value)
    assert json.loads(json.dumps(thaw_json(frozen))) == json.loads(json.dumps(value))
    assert not isinstance(frozen, list | dict)


@given(_values())
def test_dumps_writes_what_json_dumps_writes(value: object) -> None:
    """host-core §3: the compact text of a frozen value is ``json.dumps`` of its thawed form."""
    if _first_offence(value) is not None:
        return
    frozen = freeze_json(value)
    expected = json.dumps(thaw_json(frozen), separators=(",", ":"), ensure_ascii=False)
    assert dumps(frozen) == expected
    assert dumps(thaw_json(frozen)) == expected


def _nested(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


def test_freezing_enforces_the_nesting_limit_at_any_depth() -> None:
    """hardening 11.2, host-core §3: MAX_NESTING levels freeze; one more, or 100k more, is
    NOT_JSON naming where (never a RecursionError)."""
    assert thaw_json(freeze_json(_nested(MAX_NESTING))) == _nested(MAX_NESTING)
    assert freeze_json({"a": _nested(MAX_NESTING - 1)})["a"] is not None
    for depth in (MAX_NESTING + 1, 100_000):
        with pytest.raises(NotJsonError) as caught:
            freeze_json({"a": _nested(depth)})
        assert caught.value.path.startswith("$.a[0]")
        assert "deeper than" in str(caught.value)


def test_freezing_enforces_the_integer_digit_limit() -> None:
    """hardening 11.1, host-core §3: integers of up to MAX_INT_DIGITS digits freeze (what
    str() and int() handle by default); longer ones are NOT_JSON, at the top or nested."""
    most = 10**MAX_INT_DIGITS - 1
    assert freeze_json(-most) == -most
    assert freeze_json([most]) == (most,)
    for too_long in (10**MAX_INT_DIGITS, -(10**MAX_INT_DIGITS), 10**5000):
        for value, path in ((too_long, "$"), ({"n": [too_long]}, "$.n[0]")):
            with pytest.raises(NotJsonError) as caught:
                freeze_json(value)
            assert caught.value.path == path
