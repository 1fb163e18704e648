"""Schema failures reach the model in plain words: the field, what is wrong, what to do."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dsh_core import AbortSignal, blocks_text
from dsh_core._tools import ToolDefinition, ToolExecutionInput, ToolOutput, ToolRunContext
from dsh_core.testing import scripted_host

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 4, "pattern": "^x"},
        "count": {"type": "integer", "minimum": 1, "maximum": 5},
        "mode": {"enum": ["fast", "slow"]},
        "flag": {"const": True},
        "tags": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string"}},
        "inner": {"type": "object", "properties": {"z": {"type": "number"}}, "required": ["z"]},
    },
    "required": ["name", "count"],
    "additionalProperties": False,
}

TAIL = ". Call probe again with arguments that match its parameters."


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ({}, 'missing required properties "name" and "count"'),
        ({"count": 1}, 'missing required property "name"'),
        ({"name": 1, "count": 1}, '"name" must be a string, not an integer'),
        ({"name": "x", "count": 1}, '"name" must be at least 2 characters long'),
        ({"name": "xxxxx", "count": 1}, '"name" must be at most 4 characters long'),
        ({"name": "yy", "count": 1}, '"name" must be text matching the pattern ^x'),
        ({"name": "xx", "count": 0}, '"count" must be at least 1'),
        ({"name": "xx", "count": 9}, '"count" must be at most 5'),
        ({"name": "xx", "count": True}, '"count" must be an integer, not a boolean'),
        ({"name": "xx", "count": 2, "mode": "odd"}, '"mode" must be one of "fast" or "slow"'),
        ({"name": "xx", "count": 2, "flag": False}, '"flag" must be true'),
        ({"name": "xx", "count": 2, "tags": []}, '"tags" must be an array of at least 1 item'),
        (
            {"name": "xx", "count": 2, "tags": ["a", "b", "c"]},
            '"tags" must be an array of at most 2 items',
        ),
        ({"name": "xx", "count": 2, "tags": [7]}, '"tags[0]" must be a string, not an integer'),
        ({"name": "xx", "count": 2, "inner": {}}, '"inner" is missing required property "z"'),
        (
            {"name": "xx", "count": 2, "model": "big"},
            'unknown property "model"; the allowed properties are "name", "count", "mode", '
            '"flag", "tags" and "inner"',
        ),
        ([1], "the arguments must be an object, not an array"),
    ],
)
async def test_schema_errors_read_as_plain_words(arguments: Any, words: str) -> None:
    """ROB-80: a schema failure names the field and the broken rule in plain words, says what
    to do, keeps INVALID_ARGS, and shows none of the validator's own wording."""

    async def body(args: Any, run: ToolRunContext) -> str:
        return "ran"

    async with scripted_host() as h:
        h.ctx.tools.register(
            ToolDefinition(name="probe", description="p", parameters=SCHEMA, execute=body)
        )
        result = await h.ctx.tools.execute(
            ToolExecutionInput(
                call_id="c1", name="probe", arguments=json.dumps(arguments), signal=AbortSignal()
            )
        )
    assert result.error is not None and result.error.code == "INVALID_ARGS"
    text = blocks_text(result.content)
    assert text == f"Error: invalid arguments for probe: {words}{TAIL}"
    assert "data" not in text and "['" not in text


async def test_an_invalid_tool_value_is_described_in_plain_words() -> None:
    """ROB-81: a value breaking the tool's output schema is INVALID_TOOL_OUTPUT named in plain
    words (the field and the rule), not the validator's message."""

    async def body(args: Any, run: ToolRunContext) -> Any:
        return {"count": "three"}

    out = ToolOutput(schema={"type": "object", "properties": {"count": {"type": "integer"}}})
    async with scripted_host() as h:
        h.ctx.tools.register(
            ToolDefinition(name="count", description="c", execute=body, output=out)
        )
        result = await h.ctx.tools.execute(
            ToolExecutionInput(call_id="c1", name="count", arguments="{}", signal=AbortSignal())
        )
    assert result.error is not None and result.error.code == "INVALID_TOOL_OUTPUT"
    assert blocks_text(result.content) == (
        'Error: tool output is invalid: "count" must be an integer, not a string'
    )
