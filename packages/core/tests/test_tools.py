"""Tools: scoped registration, one visibility rule, guarded execution (host-core §7)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest

from dsh_core import (
    AbortController,
    AbortSignal,
    Context,
    ContextError,
    Scope,
    TextBlock,
    _tools,
    blocks_text,
)
from dsh_core._tools import (
    ToolDefinition,
    ToolError,
    ToolExecutionInput,
    ToolExecutionResult,
    ToolOutput,
    ToolRestriction,
    ToolRunContext,
)
from dsh_core.testing import ScriptedReply, ScriptedToolCall, TestHost, scripted_host

NEVER = AbortSignal()


def tool(
    name: str,
    answer: Any = None,
    *,
    body: Callable[[Any, ToolRunContext], Awaitable[Any]] | None = None,
    parameters: dict[str, Any] | None = None,
    output: ToolOutput | None = None,
) -> ToolDefinition:
    """A tool answering ``answer`` (default: its own name), or running ``body``."""

    async def default_body(args: Any, run: ToolRunContext) -> Any:
        return name if answer is None else answer

    return ToolDefinition(
        name=name,
        description=f"the {name} tool",
        parameters=parameters or {"type": "object"},
        execute=body or default_body,
        output=output or ToolOutput(),
    )


def call(
    name: str, arguments: Any = "{}", *, signal: AbortSignal = NEVER, call_id: str = "c1"
) -> ToolExecutionInput:
    return ToolExecutionInput(call_id=call_id, name=name, arguments=arguments, signal=signal)


def scope_ctx(host: TestHost, key: str) -> Context:
    """A private owner with its own routing scope (stands in for an agent's context)."""
    return host.ctx.plugin(f"scope:{key}", scope=Scope(key))


def names(ctx: Context) -> list[str]:
    return [s.name for s in ctx.tools.schemas()]


def text(result: ToolExecutionResult) -> str:
    return blocks_text(result.content)


def code(result: ToolExecutionResult) -> str | None:
    return result.error.code if result.error is not None else None


# -- registration and shadowing ---------------------------------------------------------------


async def test_scoped_tool_shadows_the_global_one_for_that_scope_only() -> None:
    """host-core §7: a scoped tool shadows the global tool of the same name in its scope only."""
    async with scripted_host() as h:
        h.ctx.tools.register(tool("read", "global read"))
        a, b = scope_ctx(h, "a"), scope_ctx(h, "b")
        a.tools.register(tool("read", "scoped read"))
        assert text(await a.tools.execute(call("read"))) == "scoped read"
        assert text(await b.tools.execute(call("read"))) == "global read"
        assert text(await h.ctx.tools.execute(call("read"))) == "global read"
        assert names(a).count("read") == 1
        await a.dispose()
        assert text(await a.tools.execute(call("read"))) == "global read"


async def test_duplicate_tool_in_one_layer_fails() -> None:
    """host-core §7: a second tool of one name in the same layer fails DUPLICATE_TOOL."""
    async with scripted_host() as h:
        h.ctx.tools.register(tool("read"))
        with pytest.raises(ToolError) as err:
            h.ctx.tools.register(tool("read"))
        assert err.value.code == "DUPLICATE_TOOL"
        a = scope_ctx(h, "a")
        a.tools.register(tool("read"))
        with pytest.raises(ToolError) as scoped_err:
            a.tools.register(tool("read"))
        assert scoped_err.value.code == "DUPLICATE_TOOL"


async def test_registration_is_owned_by_the_registering_context() -> None:
    """host-core §7: a tool lives as long as the context that registered it."""
    async with scripted_host() as h:
        owner = h.ctx.plugin("owner")
        owner.tools.register(tool("temp"))
        assert "temp" in names(h.ctx)
        await owner.dispose()
        assert "temp" not in names(h.ctx)
        assert code(await h.ctx.tools.execute(call("temp"))) == "UNKNOWN_TOOL"


async def test_a_view_sees_every_change_however_often_it_answered_before() -> None:
    """host-core §7: a context's view answers repeated lookups from a memo, yet a registration,
    restriction or withdrawal anywhere reaches its very next lookup (schemas, get, execute)."""
    async with scripted_host() as h:
        a = scope_ctx(h, "a")
        view = a.tools
        base = names(a)  # the host's own tools (jobs)
        assert view.schemas() is view.schemas()
        owner = h.ctx.plugin("owner")
        owner.tools.register(tool("late"))
        assert names(a) == [*base, "late"]
        assert view.get("late") is not None
        assert text(await view.execute(call("late"))) == "late"
        a.tools.register(tool("own"))
        assert names(a) == [*base, "late", "own"]
        a.tools.restrict(ToolRestriction(deny=("late",)))
        assert names(a) == [*base, "own"]
        assert code(await view.execute(call("late"))) == "UNKNOWN_TOOL"
        await owner.dispose()
        assert view.get("late") is None
        assert names(h.ctx) == base


# -- restrict: one visibility rule ------------------------------------------------------------


async def test_restricted_tool_is_absent_from_schemas_and_fails_unknown_tool() -> None:
    """host-core §7: a hidden tool is absent from the schemas AND executes as UNKNOWN_TOOL."""
    async with scripted_host() as h:
        for n in ("read", "write", "shell"):
            h.ctx.tools.register(tool(n))
        a, b = scope_ctx(h, "a"), scope_ctx(h, "b")
        a.tools.restrict(ToolRestriction(allow=("read", "write")))
        b.tools.restrict(ToolRestriction(deny=("read",)))
        assert "shell" not in names(a)
        assert a.tools.get("shell") is None
        assert code(await a.tools.execute(call("shell"))) == "UNKNOWN_TOOL"
        assert code(await a.tools.execute(call("read"))) is None
        assert "read" not in names(b)
        assert code(await b.tools.execute(call("read"))) == "UNKNOWN_TOOL"
        assert names(h.ctx) == ["read", "write", "shell"]


@pytest.mark.parametrize(
    ("restriction", "expected"),
    [
        pytest.param(ToolRestriction(), "TOOL_RESTRICTION", id="empty-filter"),
        pytest.param(ToolRestriction(allow=("nope",)), "UNKNOWN_TOOL", id="unknown-allow"),
        pytest.param(ToolRestriction(deny=("nope",)), "UNKNOWN_TOOL", id="unknown-deny"),
        pytest.param(ToolRestriction(deny=("mine",)), "TOOL_RESTRICTION", id="own-scope-name"),
    ],
)
async def test_restrict_fails_loud_on_a_bad_filter(
    restriction: ToolRestriction, expected: str
) -> None:
    """host-core §7: an empty filter, an unknown name or a scope-local name fails loud."""
    async with scripted_host() as h:
        h.ctx.tools.register(tool("read"))
        a = scope_ctx(h, "a")
        a.tools.register(tool("mine"))
        with pytest.raises(ToolError) as err:
            a.tools.restrict(restriction)
        assert err.value.code == expected
        assert names(a) == ["read", "mine"]


async def test_restrict_needs_a_scoped_context() -> None:
    """host-core §7: restrict() only works through a scoped context."""
    async with scripted_host() as h:
        h.ctx.tools.register(tool("read"))
        with pytest.raises(ToolError) as err:
            h.ctx.tools.restrict(ToolRestriction(deny=("read",)))
        assert err.value.code == "TOOL_RESTRICTION"


async def test_restrictions_intersect_and_own_tools_stay_visible() -> None:
    """host-core §7: restrictions intersect; the scope's own tools are never filtered."""
    async with scripted_host() as h:
        for n in ("a", "b", "c"):
            h.ctx.tools.register(tool(n))
        s = scope_ctx(h, "s")
        s.tools.register(tool("own"))
        s.tools.restrict(ToolRestriction(allow=("a", "b")))
        s.tools.restrict(ToolRestriction(allow=("b", "c")))
        assert names(s) == ["b", "own"]
        t = scope_ctx(h, "t")
        t.tools.register(tool("report"))
        t.tools.restrict(ToolRestriction(allow=()))
        assert names(t) == ["report"]
        assert code(await t.tools.execute(call("report"))) is None


async def test_restriction_is_lifted_with_its_owner_and_changes_are_announced() -> None:
    """host-core §7: a restriction is an effect; tools/change fires on every visibility change."""
    async with scripted_host() as h:
        changes: list[str] = []
        h.ctx.on("tools/change", lambda: changes.append("change"))
        h.ctx.tools.register(tool("read"))
        assert changes == ["change"]
        owner = h.ctx.plugin("restricted", scope=Scope("r"))
        owner.tools.restrict(ToolRestriction(deny=("read",)))
        assert "read" not in names(owner)
        assert len(changes) == 2
        await owner.dispose()
        assert owner.tools.get("read") is not None
        assert len(changes) == 3


# -- guards and the execution pipeline --------------------------------------------------------


async def test_guard_denial_stops_the_call_and_only_reduces_permission() -> None:
    """host-core §7: a guard returning a reason denies (TOOL_DENIED); the body never runs."""
    async with scripted_host() as h:
        ran: list[str] = []

        async def body(args: Any, run: ToolRunContext) -> str:
            ran.append(run.call_id)
            return "ok"

        h.ctx.tools.register(tool("shell", body=body))
        a, b = scope_ctx(h, "a"), scope_ctx(h, "b")
        a.tools.guard(lambda c: "no shell here" if c.name == "shell" else None)
        denied = await a.tools.execute(call("shell", call_id="denied"))
        assert code(denied) == "TOOL_DENIED"
        assert "no shell here" in text(denied)
        allowed = await b.tools.execute(call("shell", call_id="allowed"))
        assert code(allowed) is None
        h.ctx.tools.guard(lambda c: None)
        assert code(await b.tools.execute(call("shell", call_id="still"))) is None
        h.ctx.tools.guard(lambda c: "globally off")
        assert code(await b.tools.execute(call("shell", call_id="global"))) == "TOOL_DENIED"
        assert ran == ["allowed", "still"]


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param("{not json", id="not-json"),
        pytest.param('{"path": 3}', id="wrong-type"),
        pytest.param("{}", id="missing-required"),
        pytest.param('{"path": NaN}', id="not-lossless"),
    ],
)
async def test_invalid_arguments_fail_before_the_body(arguments: str) -> None:
    """host-core §7: arguments that are not JSON or break the schema give INVALID_ARGS."""
    async with scripted_host() as h:
        ran: list[Any] = []

        async def body(args: Any, run: ToolRunContext) -> str:
            ran.append(args)
            return "ok"

        schema = {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        }
        h.ctx.tools.register(tool("read", body=body, parameters=schema))
        result = await h.ctx.tools.execute(call("read", arguments))
        assert code(result) == "INVALID_ARGS"
        assert text(result).startswith("Error: ")
        assert ran == []
        ok = await h.ctx.tools.execute(call("read", '{"path": "/x"}'))
        assert code(ok) is None and ran == [{"path": "/x"}]


@pytest.mark.parametrize(
    "value",
    [pytest.param({"count": "three"}, id="schema-mismatch"), pytest.param({1, 2}, id="not-json")],
)
async def test_output_that_breaks_the_output_schema_is_invalid_tool_output(value: Any) -> None:
    """host-core §7: a value failing the output schema (or not JSON) is INVALID_TOOL_OUTPUT."""
    async with scripted_host() as h:
        out = ToolOutput(
            schema={"type": "object", "properties": {"count": {"type": "integer"}}},
        )
        h.ctx.tools.register(tool("count", value, output=out))
        result = await h.ctx.tools.execute(call("count"))
        assert code(result) == "INVALID_TOOL_OUTPUT"


async def test_valid_output_is_rendered_by_the_tool_renderer() -> None:
    """host-core §7: a valid value is frozen and rendered by output.render (else as JSON text)."""
    async with scripted_host() as h:
        out = ToolOutput(
            schema={"type": "object", "properties": {"count": {"type": "integer"}}},
            render=lambda value, run: (TextBlock(text=f"{value['count']} hits"),),
        )
        h.ctx.tools.register(tool("count", {"count": 3}, output=out))
        h.ctx.tools.register(tool("plain", {"a": [1]}))
        counted = await h.ctx.tools.execute(call("count"))
        assert text(counted) == "3 hits"
        assert counted.value == {"count": 3}
        assert text(await h.ctx.tools.execute(call("plain"))) == '{"a":[1]}'


async def test_tool_exceptions_become_failure_results_with_their_code() -> None:
    """host-core §7: a raising tool gives a Failure result (its code, else TOOL_ERROR)."""
    async with scripted_host() as h:

        async def coded(args: Any, run: ToolRunContext) -> None:
            raise ToolError("file is locked", code="FILE_LOCKED")

        async def plain(args: Any, run: ToolRunContext) -> None:
            raise ValueError("bad value")

        h.ctx.tools.register(tool("coded", body=coded))
        h.ctx.tools.register(tool("plain", body=plain))
        locked = await h.ctx.tools.execute(call("coded"))
        assert code(locked) == "FILE_LOCKED"
        assert text(locked) == "Error: file is locked"
        broken = await h.ctx.tools.execute(call("plain"))
        assert code(broken) == "TOOL_ERROR"
        assert "bad value" in text(broken)


async def test_a_cancelled_error_of_the_body_itself_is_a_failure_result() -> None:
    """host-core §7: tool exceptions become Failure results, never turn failures; that holds
    for a ``CancelledError`` the body raises by itself (it awaited work that someone else
    cancelled) while its own task is not being cancelled."""
    async with scripted_host() as h:

        async def awaits_cancelled_work(args: Any, run: ToolRunContext) -> str:
            work = asyncio.get_running_loop().create_future()
            work.cancel()
            return await work  # type: ignore[no-any-return]

        h.ctx.tools.register(tool("orphaned", body=awaits_cancelled_work))
        result = await h.ctx.tools.execute(call("orphaned"))
        assert code(result) == "TOOL_ERROR"
        assert text(result) == "Error: the tool's work was cancelled"


async def test_cancelling_the_task_running_a_tool_still_propagates() -> None:
    """host-core §2: a foreign cancellation of the running task (the turn's, the loop's
    shutdown) is never turned into a product outcome: it propagates."""
    async with scripted_host() as h:
        started = asyncio.Event()

        async def waits(args: Any, run: ToolRunContext) -> str:
            started.set()
            await asyncio.get_running_loop().create_future()
            return "never"

        h.ctx.tools.register(tool("waits", body=waits))
        running = asyncio.ensure_future(h.ctx.tools.execute(call("waits")))
        async with asyncio.timeout(5):
            await started.wait()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(5):
                await running


async def test_pre_execute_waterfall_can_deny_and_ask_is_a_denial() -> None:
    """host-core §7: tools/pre-execute returns allow | deny; `ask` is a denial (no approval)."""
    async with scripted_host() as h:
        h.ctx.tools.register(tool("shell"))
        verdicts = iter(["deny", "ask", "allow"])

        async def policy(c: ToolExecutionInput, next_: Callable[[], Awaitable[str]]) -> str:
            verdict = next(verdicts)
            return await next_() if verdict == "allow" else verdict

        h.ctx.on("tools/pre-execute", policy)
        assert code(await h.ctx.tools.execute(call("shell"))) == "TOOL_DENIED"
        assert code(await h.ctx.tools.execute(call("shell"))) == "TOOL_DENIED"
        assert code(await h.ctx.tools.execute(call("shell"))) is None


async def test_execute_waterfall_wraps_the_body_and_fuses_the_callers_signal() -> None:
    """host-core §7: tools/execute wraps the body; a replaced signal is fused with the caller's."""
    async with scripted_host() as h:
        caller = AbortController()
        started = asyncio.Event()
        observed: list[object] = []

        async def body(args: Any, run: ToolRunContext) -> str:
            started.set()
            observed.append(await run.signal.wait())
            return "done"

        h.ctx.tools.register(tool("slow", body=body))
        trace: list[str] = []

        async def around(
            c: ToolExecutionInput, next_: Callable[..., Awaitable[ToolExecutionResult]]
        ) -> ToolExecutionResult:
            trace.append("before")
            own = AbortController()
            result = await next_(attrs.evolve(c, signal=own.signal))
            trace.append("after")
            return result

        h.ctx.on("tools/execute", around)
        running = asyncio.ensure_future(h.ctx.tools.execute(call("slow", signal=caller.signal)))
        await started.wait()
        caller.abort("caller stop")
        result = await running
        assert observed == ["caller stop"]
        assert trace == ["before", "after"]
        assert code(result) == "ABORTED"


async def test_post_execute_waterfall_can_replace_the_outcome_and_result_is_emitted() -> None:
    """host-core §7: tools/post-execute may replace the outcome; tools/result emits the final."""
    async with scripted_host() as h:
        h.ctx.tools.register(tool("read", "secret"))
        emitted: list[tuple[str, str]] = []

        async def redact(
            c: ToolExecutionInput,
            outcome: ToolExecutionResult,
            next_: Callable[..., Awaitable[ToolExecutionResult]],
        ) -> ToolExecutionResult:
            accepted = await next_()
            return attrs.evolve(accepted, content=(TextBlock(text="[redacted]"),))

        h.ctx.on("tools/post-execute", redact)
        h.ctx.on("tools/result", lambda c, r: emitted.append((c.call_id, text(r))))
        result = await h.ctx.tools.execute(call("read", call_id="c9"))
        assert text(result) == "[redacted]"
        assert emitted == [("c9", "[redacted]")]


async def test_cancellation_before_dispatch_never_runs_the_body() -> None:
    """host-core §7: an already-aborted call fails ABORTED_BEFORE_DISPATCH without running."""
    async with scripted_host() as h:
        ran: list[str] = []

        async def body(args: Any, run: ToolRunContext) -> str:
            ran.append("ran")
            return "ok"

        h.ctx.tools.register(tool("read", body=body))
        result = await h.ctx.tools.execute(
            call("read", signal=AbortSignal.aborted_with("too late"))
        )
        assert code(result) == "ABORTED_BEFORE_DISPATCH"
        assert ran == []


async def test_cancellation_after_dispatch_awaits_started_work_and_reports_aborted() -> None:
    """host-core §7: aborting during the body turns a success into ABORTED after the body ends."""
    async with scripted_host() as h:
        controller = AbortController()
        started, release = asyncio.Event(), asyncio.Event()
        finished: list[str] = []

        async def body(args: Any, run: ToolRunContext) -> str:
            started.set()
            await release.wait()  # ignores the signal: started work must still be awaited
            finished.append("body done")
            return "ok"

        h.ctx.tools.register(tool("slow", body=body))
        running = asyncio.ensure_future(h.ctx.tools.execute(call("slow", signal=controller.signal)))
        await started.wait()
        controller.abort("stop")
        await asyncio.wait((running,), timeout=0)
        assert not running.done()
        release.set()
        result = await running
        assert finished == ["body done"]
        assert code(result) == "ABORTED"


# -- through the agent loop -------------------------------------------------------------------


async def test_hidden_tool_is_absent_from_the_request_and_unknown_when_called() -> None:
    """host-core §7, BUG-8: a hidden tool is not in the request; calling it gives UNKNOWN_TOOL."""
    replies = [
        ScriptedReply(tool_calls=(ScriptedToolCall(name="shell", id="c1"),)),
        "done",
    ]
    async with scripted_host(model=replies) as h:
        ran: list[str] = []

        async def shell(args: Any, run: ToolRunContext) -> str:
            ran.append("shell")
            return "ok"

        h.ctx.tools.register(tool("shell", body=shell))
        h.ctx.tools.register(tool("read"))

        def setup(ctx: Context) -> None:
            ctx.tools.restrict(ToolRestriction(deny=("shell",)))

        handle = await h.create_agent(setup=setup)
        assert await h.run(handle.agent, "go") == "done"
        first = h.model.requests[0]
        assert first.tools is not None
        assert [t.name for t in first.tools] == ["read"]
        results = [e.data for e in handle.agent.session.events if e.type == "tool/result"]
        assert [r.error.code for r in results if r.error] == ["UNKNOWN_TOOL"]
        assert ran == []


async def test_invalid_args_from_the_model_are_a_result_and_the_turn_goes_on() -> None:
    """host-core §7: INVALID_ARGS is a tool result the model sees; the turn continues."""
    replies = [
        ScriptedReply(tool_calls=(ScriptedToolCall(name="read", arguments="{oops", id="c1"),)),
        "recovered",
    ]
    async with scripted_host(model=replies) as h:
        h.ctx.tools.register(tool("read"))
        handle = await h.create_agent()
        assert await h.run(handle.agent, "go") == "recovered"
        second = h.model.requests[1]
        assert second.messages[-1].role == "tool"
        assert blocks_text(second.messages[-1].content[0].content) == (  # type: ignore[attr-defined]
            "Error: invalid arguments for read: the arguments are not valid JSON: a property "
            "name in double quotes was expected at line 1, column 2. Call read again with its "
            "arguments as one JSON object."
        )
        ends = [e.data.reason.kind for e in handle.agent.session.events if e.type == "turn/end"]
        assert ends == ["completed"]


async def test_a_body_that_raises_cancelled_error_by_itself_does_not_end_the_turn() -> None:
    """host-core §7: a tool whose body raises ``CancelledError`` by itself gives an errored
    tool result the model reads, and the turn completes (its call is answered)."""
    replies = [ScriptedReply(tool_calls=(ScriptedToolCall(name="orphaned", id="c1"),)), "went on"]
    async with scripted_host(model=replies) as h:

        async def awaits_cancelled_work(args: Any, run: ToolRunContext) -> str:
            work = asyncio.get_running_loop().create_future()
            work.cancel()
            return await work  # type: ignore[no-any-return]

        h.ctx.tools.register(tool("orphaned", body=awaits_cancelled_work))
        handle = await h.create_agent()
        assert await h.run(handle.agent, "go") == "went on"
        answer = h.model.requests[1].messages[-1]
        assert answer.role == "tool"
        assert blocks_text(answer.content[0].content) == (  # type: ignore[attr-defined]
            "Error: the tool's work was cancelled"
        )
        ends = [e.data.reason.kind for e in handle.agent.session.events if e.type == "turn/end"]
        assert ends == ["completed"]


async def test_registration_through_a_disposed_context_is_refused_and_leaves_nothing() -> None:
    """host-core §9: after a scope is disposed, register/restrict/guard fail and leak nothing."""
    async with scripted_host() as h:
        h.ctx.tools.register(tool("read"))
        gone = scope_ctx(h, "gone")
        await gone.dispose()
        attempts = [
            lambda: gone.tools.register(tool("late")),
            lambda: gone.tools.restrict(ToolRestriction(deny=("read",))),
            lambda: gone.tools.guard(lambda c: "denied by a dead scope"),
        ]
        for attempt in attempts:
            with pytest.raises(ContextError) as err:
                attempt()
            assert err.value.code == "INACTIVE_EFFECT"
        assert gone.tools.get("late") is None
        assert "read" in names(gone)
        assert code(await gone.tools.execute(call("read"))) is None


async def test_tools_inherited_from_an_ancestor_scope_can_be_restricted() -> None:
    """host-core §7, BUG-3: restrict filters every inherited layer, never the scope's own."""
    async with scripted_host() as h:
        h.ctx.tools.register(tool("global_tool"))
        parent_scope = Scope("parent")
        parent = h.ctx.plugin("parent", scope=parent_scope)
        parent.tools.register(tool("parent_tool"))
        child = h.ctx.plugin("child", scope=Scope("child", parent_scope))
        child.tools.register(tool("own_tool"))
        assert sorted(names(child)) == [
            "global_tool",
            "own_tool",
            "parent_tool",
        ]
        child.tools.restrict(ToolRestriction(allow=("global_tool",)))
        assert sorted(names(child)) == ["global_tool", "own_tool"]
        assert code(await child.tools.execute(call("parent_tool"))) == "UNKNOWN_TOOL"
        assert "parent_tool" in names(parent)


class _Text(str):
    """A ``str`` subclass: equal to a plain string, not one."""


@pytest.mark.parametrize(
    ("answer", "render", "plain"),
    [
        ("hi", False, True),
        ({"a": [1, 2]}, False, True),
        (_Text("hi"), False, False),  # not JSON: a failure, checked as any other
        ("hi", True, False),
    ],
    ids=["str", "json", "str-subclass", "rendered"],
)
async def test_only_a_plain_text_result_is_known_loggable_by_construction(
    answer: Any, render: bool, plain: bool
) -> None:
    """hardening 11.1, host-core §7: the registry marks the result it just built from a tool's
    value as one the loop need not check only when its content is one text block of a plain
    ``str`` (the value, or its JSON text) and it has no meta; a renderer's blocks are not."""
    output = ToolOutput(render=lambda value, run: (TextBlock(text=str(value)),)) if render else None
    async with scripted_host() as h:
        h.ctx.tools.register(tool("t", answer, output=output))
        result = await h.ctx.tools.execute(call("t"))
    (block,) = result.content
    assert isinstance(block, TextBlock)
    assert (result is _tools.plain_result) == plain
