"""The public test API, ``dsh_core.testing``, as a user testing their own tool or provider
needs it (host-core §10, dx 12.7)."""

from __future__ import annotations

import asyncio
import importlib.metadata as md
import re
from pathlib import Path
from typing import Any

import pytest

from dsh_core import (
    AgentCancelCause,
    GenerateOptions,
    LlmError,
    PluginError,
    ToolDefinition,
    ToolRunContext,
    user_message,
)
from dsh_core._invariants import InvariantError
from dsh_core.testing import (
    ScriptedAdapter,
    ScriptedReply,
    ScriptedRequest,
    ScriptedToolCall,
    TestHost,
    held_reply,
    max_tokens_reply,
    model_error_reply,
    scripted_host,
    tool_call_reply,
    write_distribution,
)


def echo_tool() -> ToolDefinition:
    async def execute(args: Any, run: ToolRunContext) -> str:
        return f"echo {args.get('n')}"

    return ToolDefinition(name="echo", description="Echo n.", parameters={}, execute=execute)


def turn_end(agent: Any) -> Any:
    return next(e.data.reason for e in reversed(agent.session.events) if e.type == "turn/end")


# -- ScriptedRequest --------------------------------------------------------------------------


async def test_requests_are_recorded_as_scripted_requests_with_the_raw_options() -> None:
    """host-core §2, dx 12.7: the model records each request as a ScriptedRequest with
    tool_names, system, last_user_text and session_id; the raw GenerateOptions stay at .options."""
    async with scripted_host(
        model=["one", "two"], config={"system-prompt": {"persona": "Be brief."}}
    ) as h:
        h.ctx.tools.register(echo_tool())
        handle = await h.create_agent()
        await h.run(handle.agent, "first")
        await h.run(handle.agent, "second")
        first, second = h.model.requests
        assert isinstance(first, ScriptedRequest) and isinstance(first.options, GenerateOptions)
        assert (first.index, second.index) == (0, 1)
        assert first.session_id == handle.agent.id == first.options.session_id
        assert first.system == "Be brief."
        assert "echo" in first.tool_names
        assert [t.name for t in first.tools or ()] == list(first.tool_names)
        assert (first.last_user_text, second.last_user_text) == ("first", "second")
        assert (first.provider, first.model) == ("scripted", "scripted-1")
        assert second.messages == second.options.messages and len(second.messages) == 3
        assert first.max_tokens is None and first.loop_request is True


# -- TestHost without async with --------------------------------------------------------------


async def test_a_test_host_starts_and_closes_without_async_with() -> None:
    """host-core §10, dx 12.7: `await TestHost.start(...)` and `await host.aclose()` (for
    fixtures); closing is idempotent and disposes the host."""
    host = await TestHost.start(model=["hi"])
    handle = await host.create_agent()
    assert await host.run(handle.agent, "hello") == "hi"
    await host.aclose()
    await host.aclose()  # a second close does nothing
    assert host.ctx.get("agents") is None  # the host was disposed
    async with await TestHost.start() as again:  # it is an async context manager too
        assert await again.run((await again.create_agent()).agent, "ping") == "ping"


async def test_closing_a_test_host_reports_broken_invariants_once() -> None:
    """host-core §10, dx 12.7: aclose raises AssertionError listing the invariant violations
    seen during the test (once; a second aclose is quiet)."""
    host = await TestHost.start()
    host.invariants.violations.append(InvariantError("made up for the test", package_name="t"))
    with pytest.raises(AssertionError, match="made up for the test"):
        await host.aclose()
    await host.aclose()


# -- loading installed plugins ----------------------------------------------------------------


GOOD = """
from dsh_core import PluginSpec, hookimpl

@hookimpl
def dsh_plugins():
    return [PluginSpec(name="greet", apply=lambda ctx, config: ctx.provide("greeting", "hi"))]
"""


@pytest.mark.parametrize("name", ["greeter", "dsh-greeter"])
async def test_a_plugin_loads_by_entry_point_or_distribution_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """host-core §1, dx 12.7: `load=` takes an installed entry-point or distribution name, with
    no hand-made modules map; the rows then mount what it offers."""
    write_distribution(
        tmp_path / "site",
        "dsh-greeter",
        version="1.0.0",
        entry_points={"greeter": "greeter_plugin"},
        modules={"greeter_plugin": GOOD},
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    async with scripted_host("greet", load=(name,)) as h:
        assert h.ctx.greeting == "hi"
        (greeter,) = [d for d in h.runtime.pm.discovered if d.name == "greeter"]
        assert (greeter.distribution, greeter.version) == ("dsh-greeter", "1.0.0")


@pytest.fixture
def broken_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An installed distribution whose plugin module fails to import."""
    write_distribution(
        tmp_path / "site",
        "dsh-kaputt",
        version="0.2.0",
        entry_points={"kaputt": "kaputt_plugin"},
        modules={"kaputt_plugin": "raise ImportError('kaputt on purpose')\n"},
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return "kaputt"


@pytest.mark.parametrize("name", ["kaputt", "dsh-kaputt", "no-such-plugin"])
async def test_loading_a_plugin_follows_the_rules_of_discovery(broken_site: str, name: str) -> None:
    """host-core §1, dx 12.7: a named plugin that fails to import, or matches nothing
    installed, fails the start loudly (PLUGIN_UNKNOWN with the reason), as discovery reports it."""
    with pytest.raises(PluginError) as err:
        await TestHost.start(load=(name,))
    assert err.value.code == "PLUGIN_UNKNOWN"
    if name == "no-such-plugin":
        assert "no installed dsh plugin or distribution is named 'no-such-plugin'" in str(err.value)
    else:
        assert "kaputt (dsh-kaputt 0.2.0): import failed: ImportError: kaputt on purpose" in str(
            err.value
        )


# -- reply helpers -----------------------------------------------------------------------------


async def test_a_tool_call_only_reply_runs_its_calls_then_the_turn_goes_on() -> None:
    """host-core §9, dx 12.7: tool_call_reply makes a reply of calls only (no text); each call
    is a name, a (name, arguments) pair or a ScriptedToolCall, and gets its own id."""
    reply = tool_call_reply(
        ("echo", {"n": 1}), "echo", ScriptedToolCall(name="echo", arguments={"n": 3}, id="c3")
    )
    assert reply.text is None and len(reply.tool_calls) == 3
    async with scripted_host(model=[reply, "done"]) as h:
        h.ctx.tools.register(echo_tool())
        handle = await h.create_agent()
        assert await h.run(handle.agent, "go") == "done"
        calls = [e.data for e in handle.agent.session.events if e.type == "tool/call"]
        assert len({c.call_id for c in calls}) == 3 and calls[-1].call_id == "c3"
        assert h.model.requests[1].last_tool_result == "echo 3"


async def test_a_max_tokens_reply_ends_the_turn_max_tokens() -> None:
    """host-core §9, dx 12.7: max_tokens_reply stops at the token limit; the turn ends
    max-tokens with the partial text kept."""
    async with scripted_host(model=[max_tokens_reply("cut sh")]) as h:
        handle = await h.create_agent()
        assert await h.run(handle.agent, "go") == "cut sh"
        assert turn_end(handle.agent).kind == "max-tokens"


async def test_a_model_error_reply_ends_the_turn_error() -> None:
    """host-core §9, dx 12.7: model_error_reply fails the request with a model error (an
    error finish, or a raised LlmError); the turn ends error, the agent stays usable."""
    reply = model_error_reply("overloaded", code="HTTP_529", status=529)
    assert reply.failure is not None and reply.failure.status == 529
    async with scripted_host(model=[reply, "fine"]) as h:
        handle = await h.create_agent()
        await h.run(handle.agent, "go")
        end = turn_end(handle.agent)
        assert end.kind == "error" and "overloaded" in str(end)
        assert await h.run(handle.agent, "again") == "fine"
    raising = ScriptedAdapter.replies(model_error_reply(raise_error=True))
    stream = raising.stream(
        GenerateOptions(provider="scripted", model="m", messages=(user_message("x"),))
    )
    with pytest.raises(LlmError) as err:
        await stream.__anext__()
    assert err.value.failure.code == "MODEL_ERROR"


async def test_a_held_reply_streams_its_text_and_waits_for_the_event() -> None:
    """host-core §2, dx 12.7: held_reply holds the request until the event is set (steering,
    cancelling and concurrency tests need a request in flight); an abort still ends it."""
    gate, entered = asyncio.Event(), asyncio.Event()

    async def until() -> None:
        entered.set()
        await gate.wait()

    async with scripted_host(
        model=[held_reply(until, "partial"), held_reply(gate, "open"), held_reply(gate)]
    ) as h:
        handle = await h.create_agent()
        agent = handle.agent
        agent.followup(user_message("go"))
        async with asyncio.timeout(5):
            await entered.wait()
        assert agent.status != "idle"
        assert any(e.type == "assistant/chunk" for e in agent.session.events)  # text came first
        gate.set()
        await agent.when_idle()
        assert turn_end(agent).kind == "completed"
        assert await h.run(agent, "again") == "open"  # the gate is already open: no hold
        gate.clear()
        agent.followup(user_message("held"))
        agent.cancel(AgentCancelCause(kind="user"))
        await agent.when_idle()
        assert turn_end(agent).kind == "aborted"
    reply = held_reply(gate, ScriptedReply(text="x", reasoning="r"))
    assert (reply.text, reply.reasoning) == ("x", "r") and reply.wait is not None


# -- the guide ---------------------------------------------------------------------------------

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "testing.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("index", range(len(python_blocks(GUIDE.read_text(encoding="utf-8")))))
def test_every_example_of_the_testing_guide_runs(index: int) -> None:
    """host-core §10, dx 12.7: each ```python block of docs/testing.md runs as written (one
    that loads a distribution which is not installed here is skipped)."""
    block = python_blocks(GUIDE.read_text(encoding="utf-8"))[index]
    for dist in re.findall(r'"(dsh-[a-z-]+)"', block):
        try:
            md.distribution(dist)
        except md.PackageNotFoundError:
            pytest.skip(f"the example loads {dist}, which is not installed")
    exec(compile(block, f"docs/testing.md block {index}", "exec"), {"__name__": "doc_example"})
