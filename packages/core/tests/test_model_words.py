"""Hostile tool arguments get errors in plain words: the field, what is wrong, what to do; never
a Python repr, the json module's or the validator's own wording (ROB-90..93)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh_core import AbortSignal, AgentOptions, blocks_text, shown_id
from dsh_core._tools import ToolDefinition, ToolExecutionInput, ToolRunContext
from dsh_core.testing import repr_markers, scripted_host

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 100},
        "count": {"type": "integer", "minimum": 1, "maximum": 5},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "count"],
    "additionalProperties": False,
}
VALID = {"name": "x", "count": 1}
HEAD = "Error: invalid arguments for probe: "
#: The most characters an error text may take whatever the arguments (1 MiB of them included).
BOUND = 2_000

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
#: Field names of the model's: plain letters here (a hostile name is shown quoted, below).
names = st.text(_LETTERS, min_size=1, max_size=12).filter(lambda n: n not in SCHEMA["properties"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=6,
)
HUGE = (
    "x" * 200_000,
    "1" * 5_000,
    "1e400",
    "-1e400",
    "NaN",
    "-Infinity",
    "-0.0",
    "[" * 5_000 + "]" * 5_000,
)
#: Raw argument text: anything, broken JSON, JSON of the wrong shape, huge or exotic numbers.
raw_texts = st.one_of(
    st.text(max_size=60),
    values.map(json.dumps),
    values.map(lambda v: json.dumps(v)[:-1]),
    st.sampled_from(["", " ", "{", "{'name': 1}", "[1,]", '{"a" 1}', "\ufeff{}", "nul", "{} x"]),
    st.sampled_from(HUGE).map(lambda h: f'{{"name": "x", "count": {h}}}'),
    st.sampled_from(HUGE),
    st.just('{"name": "x", "count": 1, "' + "k" * 300_000 + '": 1}'),
)


async def _body(args: Any, run: ToolRunContext) -> str:
    return "ran"


async def _execute(h: Any, arguments: Any) -> tuple[str, str | None]:
    async with asyncio.timeout(10):
        result = await h.ctx.tools.execute(
            ToolExecutionInput(
                call_id="c1", name="probe", arguments=arguments, signal=AbortSignal()
            )
        )
    return blocks_text(result.content), result.error.code if result.error else None


async def _run(arguments: Any) -> tuple[str, str | None]:
    async with scripted_host() as h:
        h.ctx.tools.register(
            ToolDefinition(name="probe", description="p", parameters=SCHEMA, execute=_body)
        )
        return await _execute(h, arguments)


Probe = Callable[[Any], tuple[str, str | None]]


@pytest.fixture(scope="module")
def probe() -> Iterator[Probe]:
    """One host for every example of the property tests (a tool call leaves nothing behind
    in it; booting a host per example was most of their time)."""
    with asyncio.Runner() as runner:
        host = scripted_host()
        h = runner.run(host.__aenter__())
        h.ctx.tools.register(
            ToolDefinition(name="probe", description="p", parameters=SCHEMA, execute=_body)
        )
        try:
            yield lambda arguments: runner.run(_execute(h, arguments))
        finally:
            runner.run(host.__aexit__(None, None, None))


def _plain(text: str) -> None:
    assert repr_markers(text) == [], text
    assert len(text) <= BOUND, text[:200]


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(raw=raw_texts)
def test_hostile_argument_text_is_refused_in_plain_words(raw: str, probe: Probe) -> None:
    """ROB-90: whatever text the model sends as arguments, an error reads as plain words (no
    repr, no parser or validator wording, no raw control character), bounded in length, in
    the INVALID_ARGS shape "invalid arguments for probe: <what>. <what to do>"."""
    text, code = probe(raw)
    if code is None:
        return
    assert code == "INVALID_ARGS"
    assert text.startswith(HEAD) and ". Call probe again" in text, text[:300]
    _plain(text)


def _in_range(value: Any) -> bool:
    """Whether ``count`` takes ``value`` (the validator takes 2.0 for an integer)."""
    return type(value) in (int, float) and value == int(value) and 1 <= value <= 5


field_faults = st.one_of(
    st.tuples(st.just("name"), scalars.filter(lambda v: not isinstance(v, str))),
    st.tuples(st.just("name"), st.just("y" * 300_000)),
    st.tuples(st.just("count"), scalars.filter(lambda v: not _in_range(v))),
    st.tuples(st.just("count"), st.sampled_from([10**5000, 1e400, -0.0, math.nan])),
    st.tuples(st.just("tags"), values.filter(lambda v: not isinstance(v, list))),
)


@_SETTINGS
@given(fault=field_faults)
def test_a_wrong_field_is_named(fault: tuple[str, Any], probe: Probe) -> None:
    """ROB-91: a field of the wrong type, out of range, too long or not JSON at all (a number
    of 5,000 digits, infinity, NaN, negative zero) is named, JSON-quoted, in plain words."""
    field, value = fault
    arguments = {**VALID, field: value}
    raw = json.dumps(arguments) if not isinstance(value, int) or value < 10**100 else None
    for sent in (raw, arguments):
        if sent is None:
            continue
        text, code = probe(sent)
        assert code == "INVALID_ARGS", text
        assert text.startswith(HEAD) and f'"{field}"' in text, text[:300]
        _plain(text)


@_SETTINGS
@given(
    missing=st.sets(st.sampled_from(["name", "count"]), min_size=1),
    extra=st.dictionaries(names, values, max_size=3),
)
def test_missing_and_unknown_fields_are_named(
    missing: set[str], extra: dict[str, Any], probe: Probe
) -> None:
    """ROB-91: a missing required field, and else an unknown one, is named JSON-quoted (the
    allowed ones listed for an unknown one)."""
    arguments = {k: v for k, v in VALID.items() if k not in missing}
    text, code = probe(json.dumps({**arguments, **extra}))
    assert code == "INVALID_ARGS"
    if extra:  # an unknown one, a missing one, or a value inside an unknown one ("k[0]")
        assert any(f'"{k}' in text for k in (*extra, *missing)), text
    else:
        assert all(f'"{k}"' in text for k in missing), text
    _plain(text)


@pytest.mark.parametrize(
    "name",
    [
        "a'b",
        "['x']",
        "\x00\x01",
        "\\x41",
        "é" * 500,
        "Traceback <class 'x'>",
        "a\ud800",
        "del\x7f c1\x85\x9f",
    ],
)
async def test_a_hostile_name_is_shown_json_quoted_and_bounded(name: str) -> None:
    """ROB-92: a name the model chose (an unknown tool, an unknown field) is repeated only
    JSON-quoted (control characters and lone surrogates escaped, never repr's \\x) and cut
    after 64 characters. ROB-96: DEL and the C1 controls, which JSON leaves raw, are escaped
    too."""
    async with scripted_host() as h:
        h.ctx.tools.register(
            ToolDefinition(name="probe", description="p", parameters=SCHEMA, execute=_never)
        )
        unknown_tool = await h.ctx.tools.execute(
            ToolExecutionInput(call_id="c1", name=name, arguments="{}", signal=AbortSignal())
        )
        unknown_field = await h.ctx.tools.execute(
            ToolExecutionInput(
                call_id="c2", name="probe", arguments={**VALID, name: 1}, signal=AbortSignal()
            )
        )
    shown = json.dumps(name if len(name) <= 64 else name[:64] + "…", ensure_ascii=False)
    for raw in ("\ud800", "\x7f", "\x85", "\x9f"):  # escaped: valid UTF-8, nothing invisible
        shown = shown.replace(raw, f"\\u{ord(raw):04x}")
    text = blocks_text(unknown_tool.content)
    assert text == f"Error: unknown tool {shown}; call only the tools you have been given"
    assert repr_markers(text) == []
    text = blocks_text(unknown_field.content)
    assert f"unknown property {shown};" in text
    assert repr_markers(text) == []
    assert shown_id(name) == shown


async def _never(args: Any, run: ToolRunContext) -> str:
    raise AssertionError("not reached")


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (
            "",
            "the arguments are empty. Call probe again with its arguments as one JSON object "
            "({} for none).",
        ),
        (
            "{oops",
            "the arguments are not valid JSON: a property name in double quotes was "
            "expected at line 1, column 2. Call probe again with its arguments as one JSON object.",
        ),
        (
            '{"name": "x"} x',
            "the arguments are not valid JSON: more text follows the JSON value "
            "at line 1, column 15. Call probe again with its arguments as one JSON object.",
        ),
        (
            '{"name": "x", "count": NaN}',
            '"count" must be a finite number (NaN and Infinity are '
            "not JSON numbers). Call probe again with arguments that match its parameters.",
        ),
        (
            "[" * 101 + "]" * 101,
            "the arguments are nested deeper than 100 levels. Call probe "
            "again with arguments that match its parameters.",
        ),
    ],
)
async def test_argument_text_that_is_not_json_reads_as_words(raw: str, words: str) -> None:
    """ROB-90: text that is not JSON says what was expected and where (line, column), not the
    json module's message; numbers JSON cannot carry name their field."""
    text, code = await _run(raw)
    assert code == "INVALID_ARGS"
    assert text == HEAD + words


@pytest.mark.parametrize("value", [0, -1, "7", 2.5, True, None])
def test_a_positive_integer_setting_has_one_message_shape(value: Any) -> None:
    """ROB-93: every "a positive integer" setting (AgentOptions.max_steps here; the agents
    row's max_steps and the subagent row's cap in their packages) is refused in one shape."""
    if value is None:
        AgentOptions(max_steps=value)
        return
    with pytest.raises(ValueError) as err:
        AgentOptions(max_steps=value)
    assert str(err.value) == f"max_steps must be an integer of at least 1, got {json.dumps(value)}"
