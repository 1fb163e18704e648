"""Random model input through the real execution path of the ``subagent`` tool (tools 15)."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsh_subagent.plugin
import dsh_tool_subagent.plugin
from dsh_core import AbortSignal, PluginRow, TextBlock, ToolExecutionInput, blocks_text
from dsh_core.testing import repr_markers, scripted_host
from dsh_subagent import (
    ResolvedSubagentStartRequest,
    SubagentCapabilities,
    SubagentResult,
    SubagentRun,
)
from dsh_subagent.in_process import IN_PROCESS_CAPABILITIES

MODULES = {"subagent": dsh_subagent.plugin, "tool-subagent": dsh_tool_subagent.plugin}
#: Every code an errored result of these calls may carry (documented in docs/tools.md).
DOCUMENTED = {
    "INVALID_ARGS",
    "NO_AGENT",
    "BACKGROUND_DISABLED",
    "JOB_LIMIT",
    "SUBAGENT_RUN_FAILED",
    "INVALID_START_REQUEST",
}


@attrs.define(eq=False)
class InstantProvider:
    """Answers every request at once with its prompt."""

    name: str = "instant"
    capabilities: SubagentCapabilities = IN_PROCESS_CAPABILITIES
    inherits_parent_context: bool = False

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        future: asyncio.Future[SubagentResult] = asyncio.get_running_loop().create_future()
        future.set_result(SubagentResult(output=request.prompt, stop_reason="completed"))

        async def dispose() -> None:
            return None

        return SubagentRun(id="instant", local_agent=None, result=future, dispose=dispose)


json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
fields = st.sampled_from(["description", "prompt", "run_in_background", "extra"])
#: Well-formed calls carrying fields the tool does not take (a type, a model).
with_extras = st.fixed_dictionaries(
    {"description": st.text(max_size=8), "prompt": st.text(max_size=8)},
    optional={"extra": json_values, "model": st.text(max_size=8), "subagent_type": json_values},
)
arguments = (
    with_extras
    | st.dictionaries(fields, json_values | st.text(max_size=2000), max_size=4)
    | json_values
    | st.text(max_size=40)  # raw (often invalid) JSON text
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    calls=st.lists(st.tuples(arguments, st.booleans()), min_size=1, max_size=4),
    enable_background=st.booleans(),
)
def test_random_input_is_a_result_never_a_raise(
    calls: list[tuple[Any, bool]], enable_background: bool
) -> None:
    """TOOL-4..8, tools 15 (bad input): whatever the model sends, with or without a calling
    agent, the call ends within the bound as an ok result or an errored one with a documented
    code, in plain words (ROB-94: no repr, no validator or parser wording); it never raises out
    of execute."""

    async def scenario() -> None:
        row = PluginRow(
            plugin="tool-subagent",
            config={"provider": "instant", "enable_run_in_background": enable_background},
        )
        async with scripted_host("subagent", row, modules=MODULES) as host:
            host.ctx.plugin("provider").subagents.register_provider(InstantProvider())
            parent = (await host.create_agent()).agent
            for i, (raw, with_agent) in enumerate(calls):
                async with asyncio.timeout(10):
                    result = await parent.ctx.tools.execute(
                        ToolExecutionInput(
                            call_id=f"c{i}",
                            name="subagent",
                            arguments=raw,
                            signal=AbortSignal(),
                            agent=parent if with_agent else None,
                        )
                    )
                if result.error is None:
                    shown = blocks_text(result.content)
                    assert shown == raw["prompt"] or shown.startswith(
                        "started background subagent job subagent-"
                    )
                else:
                    assert result.error.code in DOCUMENTED, result.error
                    assert blocks_text(result.content).startswith("Error: ")
                    assert repr_markers(blocks_text(result.content)) == [], result.error
                    assert result.content == (TextBlock(text=blocks_text(result.content)),)

    asyncio.run(scenario())
