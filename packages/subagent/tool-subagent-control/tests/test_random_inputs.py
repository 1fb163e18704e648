"""Bad model input is the normal case: random JSON-ish arguments and callers, through the real
tool execution path, give an ok result or an errored one with a documented code — never a
raise, never a hang (tools-common, issue 15: "a hypothesis test drives random tool inputs
through the real execution path of every tool")."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh_core import AbortController, blocks_text
from dsh_core.testing import repr_markers
from dsh_core.testing.strategies import json_values

#: Codes a call may fail with: core's argument and abort checks, the tools' own refusals and
#: the seam's (CONT-8/10, INT-1, LIST-5, DRN-1).
DOCUMENTED = {
    "INVALID_ARGS",
    "ABORTED",
    "ABORTED_BEFORE_DISPATCH",
    "NO_AGENT",
    "NOT_RESUMABLE",
    "UNAUTHORIZED",
    "DRAINING",
    "ACTIVATION_CLOSING",
    "CANCELLED",
}
HUGE = "x" * 100_000
CALLERS = ("parent", "child", "stranger", "none")


def _values(ids: list[str]) -> st.SearchStrategy[Any]:
    """A field's value: a real id, an id-like or huge string, or any JSON value."""
    return st.one_of(
        st.sampled_from(ids),
        st.text(max_size=40),
        st.sampled_from(["", "../escape", "a/b", "\x00", HUGE, "children", "descendants"]),
        json_values(max_leaves=4),
    )


def _arguments(ids: list[str]) -> st.SearchStrategy[Any]:
    """Whole arguments: the tools' fields (each maybe present), raw JSON text (maybe broken),
    or any JSON value."""
    fields = st.fixed_dictionaries(
        {},
        optional={
            "subagent_id": _values(ids),
            "agent_id": _values(ids),
            "message": _values(ids),
            "scope": _values(ids),
            "extra": json_values(max_leaves=2),
        },
    )
    return st.one_of(fields, st.text(max_size=30), json_values(max_leaves=4))


async def _drive(kit: SimpleNamespace, data: st.DataObject, tool: str) -> None:
    with tempfile.TemporaryDirectory() as root:
        async with kit.boot(store_root=Path(root)) as b:
            held = await b.start("hold h")
            done = await b.start("finish")
            await b.settled(done)
            stranger = (await b.host.create_agent()).agent
            ids = [held, done, b.parent.id, stranger.id]
            for _ in range(data.draw(st.integers(1, 4), label="calls")):
                arguments = data.draw(_arguments(ids), label="arguments")
                who = data.draw(st.sampled_from(CALLERS), label="caller")
                caller = {
                    "parent": b.parent,
                    "child": b.host.ctx.agents.get(held),
                    "stranger": stranger,
                    "none": None,
                }[who]
                controller = AbortController()
                if data.draw(st.booleans(), label="aborted"):
                    controller.abort("test")
                async with asyncio.timeout(10):
                    result = await b.call(tool, arguments, agent=caller, signal=controller.signal)
                assert result.ok or result.error.code in DOCUMENTED, result.error
                assert result.content  # the model always reads something
                if not result.ok:  # ROB-94: in plain words, a hostile id quoted and bounded
                    text = blocks_text(result.content)
                    assert repr_markers(text) == [] and HUGE not in text, result.error


_SETTINGS = settings(
    max_examples=30,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_SETTINGS
@given(data=st.data())
async def test_send_message_random_inputs(kit: SimpleNamespace, data: st.DataObject) -> None:
    """CTL-1, CTL-2: random send_message arguments and callers end in a result, never a raise
    or a hang."""
    await _drive(kit, data, "send_message")


@_SETTINGS
@given(data=st.data())
async def test_interrupt_agent_random_inputs(kit: SimpleNamespace, data: st.DataObject) -> None:
    """CTL-3: random interrupt_agent arguments and callers end in a result, never a raise or a
    hang."""
    await _drive(kit, data, "interrupt_agent")


@_SETTINGS
@given(data=st.data())
async def test_list_agents_random_inputs(kit: SimpleNamespace, data: st.DataObject) -> None:
    """CTL-4, CTL-5: random list_agents arguments and callers end in a result, never a raise or
    a hang."""
    await _drive(kit, data, "list_agents")
