"""What a host's start leaves for later (PERF-10..PERF-19): work and imports a run may never
need are done on first use. The start-up figures are measured in benchmarks/cli_start.py,
never asserted here; these tests prove the laziness they rely on, and that it changes no
behaviour.
"""

from __future__ import annotations

import asyncio
from typing import Any

from dsh_core import ToolDefinition, ToolResultBlock, ToolRunContext, blocks_text, dumps
from dsh_core._tools import _compiled
from dsh_core.testing import ScriptedReply, ScriptedToolCall, scripted_host


async def _echo(args: Any, run: ToolRunContext) -> str:
    return dumps(args)


def _tool(name: str, parameters: dict[str, Any]) -> ToolDefinition:
    return ToolDefinition(name=name, description="d", parameters=parameters, execute=_echo)


async def _call(tool: ToolDefinition, arguments: str) -> tuple[str | None, str]:
    """One turn that calls ``tool`` once: the result's error code and its text."""
    replies = [
        ScriptedReply(tool_calls=(ScriptedToolCall(name=tool.name, arguments=arguments),)),
        "done",
    ]
    async with scripted_host(model=replies) as host:
        host.ctx.tools.register(tool)
        agent = (await host.create_agent()).agent
        await asyncio.wait_for(host.run(agent, "go"), 10)
        result = next(e for e in agent.session.events if e.type == "tool/result")
        error = result.data.error
        (block,) = result.data.message.content
        assert isinstance(block, ToolResultBlock)
        return (error.code if error else None), blocks_text(block.content)


async def test_registering_a_tool_compiles_no_validator() -> None:
    """PERF-11: registering a tool compiles none of its schemas; its first call does, once,
    and validates exactly as an eagerly compiled one (a bad argument is INVALID_ARGS)."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 7}}}
    tool = _tool("lazy_check", schema)
    before = _compiled.cache_info()
    async with scripted_host() as host:
        host.ctx.tools.register(tool)
        assert _compiled.cache_info() == before
    assert await _call(tool, '{"n": 8}') == (None, '{"n":8}')
    code, text = await _call(tool, '{"n": 3}')
    assert code == "INVALID_ARGS"
    assert "lazy_check" in text


async def test_a_schema_the_validator_cannot_compile_fails_its_first_call() -> None:
    """PERF-11: a parameters schema fastjsonschema cannot compile no longer fails at
    registration (nothing compiles then): each call of the tool is an error result
    TOOL_SCHEMA_INVALID in plain words, and the turn goes on."""
    tool = _tool("broken", {"type": "object", "properties": {"s": {"pattern": "("}}})
    code, text = await _call(tool, '{"s": "x"}')
    assert code == "TOOL_SCHEMA_INVALID"
    assert text.startswith('Error: tool "broken" cannot be used')
    assert "fastjsonschema" not in text and "Exception" not in text
