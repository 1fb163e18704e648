"""A hostile model against the agent loop: bounded tool arguments, every call answered, the
unanswered-call invariant, and the per-turn step limit (ROB-1..9, ROB-14, ROB-16)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from dsh_core import (
    AgentOptions,
    DshError,
    LogInvariantError,
    SessionEvent,
    SessionLogChecker,
    ToolDefinition,
    ToolRunContext,
    blocks_text,
)
from dsh_core._log_checker import unanswered_calls
from dsh_core._tools import MAX_ARGUMENT_CHARS, MAX_ARGUMENT_NESTING
from dsh_core.testing import (
    ScriptedRequest,
    ScriptedToolCall,
    scripted_host,
    tool_call_reply,
)


def _echo(name: str = "echo", **kw: Any) -> ToolDefinition:
    async def body(args: Any, run: ToolRunContext) -> Any:
        return f"{name} ok"

    return ToolDefinition(name=name, description=name, execute=body, **kw)


def _results(events: Any) -> dict[str, Any]:
    """call id -> the tool/result data of each answered call."""
    out: dict[str, Any] = {}
    for e in events:
        if e.type == "tool/result":
            out[e.data.message.content[0].tool_call_id] = e.data
    return out


def _text(data: Any) -> str:
    return blocks_text(data.message.content[0].content)


def _end(agent: Any) -> Any:
    return next(e.data.reason for e in reversed(agent.session.events) if e.type == "turn/end")


def _calls_then(*calls: ScriptedToolCall, then: str = "done") -> Any:
    """A model that makes ``calls`` once, then answers ``then``."""

    def model(request: ScriptedRequest) -> Any:
        if request.last_tool_result is None:
            return tool_call_reply(*calls)
        return then

    return model


def _nest(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [MAX_ARGUMENT_NESTING + 1, 1_000, 100_000])
async def test_deeply_nested_arguments_are_invalid_args_and_the_turn_goes_on(depth: int) -> None:
    """ROB-1: raw arguments nesting deeper than the limit (1,000 and 100,000 levels: deeper
    than the parser's stack) fail INVALID_ARGS naming the limit; the response's other call is
    answered and the turn completes."""
    model = _calls_then(
        ScriptedToolCall(name="echo", arguments=_nest(depth), id="deep"),
        ScriptedToolCall(name="echo", arguments="{}", id="fine"),
    )
    async with scripted_host(model=model) as host:
        host.ctx.tools.register(_echo())
        agent = (await host.create_agent()).agent
        assert await host.run(agent, "go") == "done"
        results = _results(agent.session.events)
        assert results["deep"].error.code == "INVALID_ARGS"
        assert f"arguments are nested deeper than {MAX_ARGUMENT_NESTING} levels" in _text(
            results["deep"]
        )
        assert results["fine"].error is None
        assert _end(agent).kind == "completed"


async def test_arguments_at_the_nesting_limit_are_taken() -> None:
    """ROB-1: arguments nesting exactly the limit parse and reach the tool."""
    seen: list[Any] = []

    async def body(args: Any, run: ToolRunContext) -> str:
        seen.append(args)
        return "ok"

    deep = '{"a":' + _nest(MAX_ARGUMENT_NESTING - 1) + "}"
    model = _calls_then(ScriptedToolCall(name="t", arguments=deep, id="c"))
    async with scripted_host(model=model) as host:
        host.ctx.tools.register(ToolDefinition(name="t", description="t", execute=body))
        agent = (await host.create_agent()).agent
        await host.run(agent, "go")
        assert _results(agent.session.events)["c"].error is None
        assert len(seen) == 1


async def test_arguments_over_the_size_limit_are_invalid_args() -> None:
    """ROB-2: raw argument text longer than MAX_ARGUMENT_CHARS fails INVALID_ARGS naming the
    limit, before it is parsed; the turn completes."""
    big = json.dumps({"text": "x" * MAX_ARGUMENT_CHARS})
    model = _calls_then(ScriptedToolCall(name="echo", arguments=big, id="big"))
    async with scripted_host(model=model) as host:
        host.ctx.tools.register(_echo())
        agent = (await host.create_agent()).agent
        assert await host.run(agent, "go") == "done"
        result = _results(agent.session.events)["big"]
        assert result.error.code == "INVALID_ARGS"
        assert f"the limit is {MAX_ARGUMENT_CHARS} characters" in _text(result)


class _Odd(BaseException):
    """A BaseException subclass a tool might raise (not an Exception)."""


async def test_a_tool_raising_any_base_exception_is_a_tool_error() -> None:
    """ROB-4: a tool body raising a BaseException subclass, a RecursionError or a MemoryError
    gets a TOOL_ERROR result; the response's other calls are answered and the turn goes on."""

    def raiser(name: str, exc: BaseException) -> ToolDefinition:
        async def body(args: Any, run: ToolRunContext) -> Any:
            raise exc

        return ToolDefinition(name=name, description=name, execute=body)

    model = _calls_then(
        ScriptedToolCall(name="odd", id="a"),
        ScriptedToolCall(name="deep", id="b"),
        ScriptedToolCall(name="memory", id="c"),
        ScriptedToolCall(name="echo", id="d"),
    )
    async with scripted_host(model=model) as host:
        host.ctx.tools.register(raiser("odd", _Odd("odd one")))
        host.ctx.tools.register(raiser("deep", RecursionError("too deep")))
        host.ctx.tools.register(raiser("memory", MemoryError()))
        host.ctx.tools.register(_echo())
        agent = (await host.create_agent()).agent
        assert await host.run(agent, "go") == "done"
        results = _results(agent.session.events)
        assert [results[k].error.code for k in "abc"] == ["TOOL_ERROR"] * 3
        assert _text(results["a"]) == "Error: odd one"
        assert _text(results["c"]) == "Error: MemoryError"
        assert results["d"].error is None


@pytest.mark.parametrize("hook", ["tools/pre-execute", "tools/execute", "tools/post-execute"])
async def test_a_raising_tool_listener_fails_only_its_call(hook: str) -> None:
    """ROB-5: a tools/pre-execute, tools/execute or tools/post-execute listener that raises
    fails that call (TOOL_ERROR with its message); the other call is answered and the turn
    completes."""

    async def listener(call: Any, *rest: Any) -> Any:
        if call.call_id == "bad":
            raise RecursionError(f"{hook} listener broke")
        return await rest[-1]()

    model = _calls_then(
        ScriptedToolCall(name="echo", id="bad"), ScriptedToolCall(name="echo", id="good")
    )
    async with scripted_host(model=model) as host:
        host.ctx.tools.register(_echo())
        host.ctx.on(hook, listener)
        agent = (await host.create_agent()).agent
        assert await host.run(agent, "go") == "done"
        results = _results(agent.session.events)
        assert results["bad"].error.code == "TOOL_ERROR"
        assert _text(results["bad"]) == f"Error: {hook} listener broke"
        assert results["good"].error is None
        assert _end(agent).kind == "completed"


async def test_a_cancelled_turn_task_answers_every_call_of_the_response() -> None:
    """ROB-6: the turn task cancelled while the first of three calls runs: the running call
    is answered ABORTED, the two not yet started ABORTED_BEFORE_DISPATCH, before the turn
    ends; the next turn's request carries no unanswered call."""
    entered = asyncio.Event()

    async def hold(args: Any, run: ToolRunContext) -> str:
        entered.set()
        await asyncio.Event().wait()
        return "never"

    calls = [ScriptedToolCall(name=n, id=n) for n in ("hold", "echo", "echo2")]
    replies = [tool_call_reply(*calls), "after"]
    async with scripted_host(model=replies) as host:
        host.ctx.tools.register(ToolDefinition(name="hold", description="h", execute=hold))
        host.ctx.tools.register(_echo())
        host.ctx.tools.register(_echo("echo2"))
        agent = (await host.create_agent()).agent
        from dsh_core import user_message

        task = asyncio.create_task(agent.run_followup(user_message("go")))
        async with asyncio.timeout(10):
            await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        results = _results(agent.session.events)
        assert {k: v.error.code for k, v in results.items()} == {
            "hold": "ABORTED",
            "echo": "ABORTED_BEFORE_DISPATCH",
            "echo2": "ABORTED_BEFORE_DISPATCH",
        }
        assert _end(agent).kind == "error"
        assert await host.run(agent, "again") == "after"  # invariants check the request
        assert unanswered_calls(host.model.requests[-1].messages) == []


def _unanswered_log() -> list[SessionEvent]:
    """An older runtime's log: a step announced two calls, answered one, and ended."""
    from dsh_core import (
        AssistantMessageData,
        Message,
        StepData,
        ToolCallBlock,
        ToolCallData,
        ToolResultData,
        TurnEndData,
        TurnEndReason,
        TurnStartData,
    )
    from dsh_core._events import make_event
    from dsh_core._tools import failure

    message = Message(
        id="m",
        role="assistant",
        content=(
            ToolCallBlock(id="a", name="t", arguments="{}"),
            ToolCallBlock(id="b", name="t", arguments="{}"),
        ),
    )
    data = [
        ("turn/start", TurnStartData(turn=1)),
        ("step/start", StepData(turn=1, step=1)),
        ("assistant/message", AssistantMessageData(turn=1, step=1, message=message)),
        ("tool/call", ToolCallData(turn=1, step=1, call_id="a", name="t", arguments="{}")),
        ("tool/call", ToolCallData(turn=1, step=1, call_id="b", name="t", arguments="{}")),
        (
            "tool/result",
            ToolResultData(turn=1, step=1, message=failure("x", "X").message("a"), error=None),
        ),
        ("step/end", StepData(turn=1, step=1)),
        ("turn/end", TurnEndData(turn=1, reason=TurnEndReason(kind="error"))),
    ]
    surface = {"assistant/message": (), "tool/result": (3,)}
    return [
        make_event(t, i, 0, d, surface.get(t), "append" if t in surface else None)
        for i, (t, d) in enumerate(data)
    ]


def test_the_checker_keeps_unanswered_calls_and_refuses_a_request_over_them() -> None:
    """ROB-7: a log whose closed step left a call unanswered still replays (older logs read),
    but the checker names the call and refuses the next model request."""
    checker = SessionLogChecker()
    checker.replay(_unanswered_log())  # no LogInvariantError: the log is read as it is
    assert checker.unanswered == {"b"}
    problem = checker.request_problem()
    assert problem is not None and "'b'" in problem
    clean = SessionLogChecker()
    clean.replay(_unanswered_log()[:2])
    assert clean.request_problem() is None
    assert LogInvariantError  # the exception class a violation of the replay raises


async def test_the_invariants_refuse_a_request_carrying_an_unanswered_call() -> None:
    """ROB-7: an agent resumed over a log with an unanswered call: the invariant companion
    refuses its next model request (a real endpoint would answer HTTP 400)."""
    async with scripted_host(model=["hi"], invariants=True) as host:
        handle = await host.create_agent(seed=_unanswered_log())
        async with asyncio.timeout(10):
            await host.run(handle.agent, "again")
        assert _end(handle.agent).kind == "error"  # the companion refused the step
        violations = [str(v) for v in host.invariants.violations]
        host.invariants.violations.clear()  # seen: the block's exit must not fail on them
    assert violations and all("without a result: ['b']" in v for v in violations)


def test_unanswered_calls_of_a_request_history() -> None:
    """ROB-7: unanswered_calls names the calls of a history no result answers."""
    from dsh_core import Message, ToolCallBlock, ToolResultBlock

    history = [
        Message(id="1", role="assistant", content=(ToolCallBlock(id="a", name="t", arguments=""),)),
        Message(id="2", role="tool", content=(ToolResultBlock(tool_call_id="a", content=()),)),
        Message(id="3", role="assistant", content=(ToolCallBlock(id="b", name="t", arguments=""),)),
    ]
    assert unanswered_calls(history) == ["b"]
    assert unanswered_calls(history[:2]) == []


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ('{"n": 1, "n": 2}', None),  # duplicate keys: the last value wins
        ('{"n": "\\u0000"}', None),  # NUL in a string: a string like any other
        ('{"n": "x\\ud800"}', None),  # a lone surrogate: a string like any other
        ('{"n": "one"}', "INVALID_ARGS"),  # a wrong type: the schema refuses it
        ("[1, 2]", "INVALID_ARGS"),  # not an object
        ("42", "INVALID_ARGS"),
        ('{"n": NaN}', "INVALID_ARGS"),  # not lossless JSON
        ('{"n": 1', "INVALID_ARGS"),  # not JSON at all
        ('{"n": ' + "9" * 5000 + "}", "INVALID_ARGS"),  # an integer beyond 4300 digits
    ],
)
async def test_odd_arguments_have_documented_outcomes(raw: str, code: str | None) -> None:
    """ROB-8: duplicate keys (the last wins), NUL and lone surrogates in strings are taken;
    wrong types, non-objects and non-JSON fail INVALID_ARGS; never a turn failure."""
    seen: list[Any] = []

    async def body(args: Any, run: ToolRunContext) -> str:
        seen.append(args["n"])
        return "ok"

    schema = {"type": "object", "properties": {"n": {}}, "required": ["n"]}
    if code == "INVALID_ARGS" and raw == '{"n": "one"}':
        schema["properties"] = {"n": {"type": "integer"}}
    model = _calls_then(ScriptedToolCall(name="t", arguments=raw, id="c"))
    async with scripted_host(model=model) as host:
        host.ctx.tools.register(
            ToolDefinition(name="t", description="t", parameters=schema, execute=body)
        )
        agent = (await host.create_agent()).agent
        assert await host.run(agent, "go") == "done"
        result = _results(agent.session.events)["c"]
        assert (result.error.code if result.error else None) == code
        if code is None:
            assert seen == [json.loads(raw)["n"]]


def _looping(request: ScriptedRequest) -> Any:
    """A model that calls a tool for ever."""
    return tool_call_reply("echo")


def _steps(agent: Any, turn: int) -> int:
    return sum(1 for e in agent.session.events if e.type == "step/start" and e.data.turn == turn)


async def test_a_model_calling_tools_for_ever_stops_at_the_step_limit() -> None:
    """ROB-9: a model that never stops calling tools ends the turn ``max-steps`` after the
    default 100 steps, with the diagnostic (MAX_STEPS); every call is answered and the agent
    takes its next turn."""
    async with scripted_host(model=_looping) as host:
        host.ctx.tools.register(_echo())
        agent = (await host.create_agent()).agent
        async with asyncio.timeout(30):
            await host.run(agent, "go")
        end = _end(agent)
        assert end.kind == "max-steps"
        assert end.error.code == "MAX_STEPS"
        assert end.error.message == "the turn reached its step limit (100 steps)"
        assert _steps(agent, 1) == 100
        events = agent.session.events
        assert sum(e.type == "tool/call" for e in events) == sum(
            e.type == "tool/result" for e in events
        )
        async with asyncio.timeout(30):
            await host.run(agent, "again")
        assert _steps(agent, 2) == 100


async def test_the_step_limit_comes_from_the_agent_or_the_agents_row() -> None:
    """ROB-9: ``AgentOptions.max_steps`` sets one agent's limit; the ``agents`` row's
    ``max_steps`` sets the default of the others; a turn within the limit is untouched."""
    async with scripted_host(model=_looping, config={"agents": {"max_steps": 3}}) as host:
        host.ctx.tools.register(_echo())
        by_row = (await host.create_agent()).agent
        own = (
            await host.create_agent(
                options=AgentOptions(provider="scripted", model="m", max_steps=7)
            )
        ).agent
        async with asyncio.timeout(30):
            await host.run(by_row, "go")
            await host.run(own, "go")
        assert (_steps(by_row, 1), _end(by_row).error.message) == (
            3,
            "the turn reached its step limit (3 steps)",
        )
        assert _steps(own, 1) == 7 and _end(own).kind == "max-steps"
    async with scripted_host(
        model=_calls_then(ScriptedToolCall(name="echo")), config={"agents": {"max_steps": 2}}
    ) as host:
        host.ctx.tools.register(_echo())
        agent = (await host.create_agent()).agent
        assert await host.run(agent, "go") == "done"  # two steps: within the limit
        assert _end(agent).kind == "completed"


@pytest.mark.parametrize("value", [0, -1, "7", 2.5])
async def test_a_bad_step_limit_is_refused(value: Any) -> None:
    """ROB-9: a ``max_steps`` that is not an int of at least 1 is refused, on the agents row
    (PLUGIN_CONFIG) and in AgentOptions (ValueError)."""
    with pytest.raises(DshError) as err:
        async with scripted_host(config={"agents": {"max_steps": value}}):
            pass
    assert err.value.code == "PLUGIN_CONFIG"
    with pytest.raises(ValueError, match="max_steps"):
        AgentOptions(max_steps=value)


async def test_a_max_steps_turn_end_reads_back_from_the_jsonl_store(tmp_path: Path) -> None:
    """ROB-16: the new turn-end reason is logged, stored and read back equal (JSONL)."""
    async with scripted_host(
        model=_looping, store="jsonl", store_root=tmp_path, config={"agents": {"max_steps": 2}}
    ) as host:
        host.ctx.tools.register(_echo())
        handle = await host.create_agent()
        agent = handle.agent
        await host.run(agent, "go")
        live = tuple(agent.session.events)
        await handle.dispose()
        _, stored = await host.ctx.session_persistence.load(agent.id)
    assert stored == live
    assert stored[-1].data.reason.kind == "max-steps"
