"""The agent loop checks an adapter's chunks where it reads them (host-core §3, §9; hardening 11.1).

The loop logs its own values (``turn/start``, steps, inbox messages, the chunks it checked and
the message assembled from them) without the append's payload check. These tests drive an
adapter (plugin code) that yields arbitrary chunks through an agent on both stores: whatever
it yields, the turn ends, the agent goes on, and the log flushes and reads back equal.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dsh_core import (
    AgentOptions,
    BlockEnd,
    BlockStart,
    EventTypeRegistry,
    Finish,
    LlmCallConfig,
    LlmFailure,
    NotJsonError,
    PreStep,
    PreStepDecision,
    ReasoningDelta,
    ScriptedReply,
    SessionError,
    SessionEvent,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolCallDelta,
    ToolDefinition,
    ToolError,
    ToolExecutionResult,
    ToolFailure,
    ToolResultBlock,
    ToolResultData,
    ToolResultError,
    ToolRunContext,
    UnknownBlock,
    UnknownChunk,
    UsageChunk,
    user_message,
)
from dsh_core._json import MAX_INT_DIGITS, MAX_NESTING, dumps
from dsh_core._tools import SCHEMA_NESTING
from dsh_core.testing import TestHost, scripted_host

BACKENDS: list[Literal["memory", "jsonl"]] = ["memory", "jsonl"]
TYPES = EventTypeRegistry()

# -- arbitrary field values ----------------------------------------------------------------------

_strings = st.text(max_size=4) | st.sampled_from(["\ud800", "a\udfffb", "", "text"])
_huge = st.sampled_from([MAX_INT_DIGITS, 5000]).map(lambda n: 10**n) | st.just(-1).map(
    lambda s: s * 10**MAX_INT_DIGITS
)
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    _huge,
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(-0.0),
    _strings,
    st.binary(max_size=2),
)


def nested(depth: int, leaf: object = 0) -> object:
    """A JSON value with ``depth`` nested arrays around ``leaf``."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


_json_ish = st.recursive(
    _scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_strings, inner, max_size=3),
    max_leaves=6,
) | st.integers(0, 2 * MAX_NESTING).map(nested)
#: A field value of any type: mostly wrong for the field it lands in (one branch of a one_of,
#: however many it has inside).
_junk = st.one_of(
    _scalar, st.lists(_scalar, max_size=2), st.dictionaries(_strings, _scalar, max_size=2)
).map(lambda v: v)


def _mostly(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` about nine times in ten, else a value of any type."""
    return st.tuples(st.sampled_from(range(10)), good, _junk).map(
        lambda t: t[2] if t[0] == 5 else t[1]
    )


_index = _mostly(st.integers(0, 3))
_text = _mostly(_strings)


def _unknown(cls: Any, type_: str, fields: dict[str, Any]) -> Any:
    """An unknown block or chunk, or a text block when its constructor refuses ``fields``."""
    try:
        return cls(type=type_, fields=fields)
    except NotJsonError:
        return TextBlock(text="refused when built")


def _block_chain(depth: int) -> ToolResultBlock:
    """``depth`` tool-result blocks, each inside the previous one's content (2 levels each)."""
    block = ToolResultBlock(tool_call_id="c", content=())
    for _ in range(depth - 1):
        block = ToolResultBlock(tool_call_id="c", content=(block,))
    return block


_blocks = st.one_of(
    st.builds(TextBlock, text=_text),
    st.builds(ToolCallBlock, id=_text, name=_text, arguments=_text),
    st.builds(_unknown, st.just(UnknownBlock), _strings, st.dictionaries(_strings, _json_ish)),
    st.integers(40, 60).map(_block_chain),
    st.builds(ToolResultBlock, tool_call_id=_text, content=st.lists(_junk, max_size=2).map(tuple)),
    _junk,
)
#: Tool-call arguments as a model may stream them: JSON text of any depth and size, or junk.
_arguments = st.one_of(
    st.just("{}"),
    st.integers(0, 3 * MAX_NESTING).map(lambda n: dumps({"a": nested(n)})),
    st.just('{"n": ' + "9" * (MAX_INT_DIGITS + 5) + "}"),
    st.just('{"x": NaN}'),
    _text,
)
_usage = st.builds(
    TokenUsage,
    input_tokens=_mostly(st.integers(0, 9)),
    output_tokens=_mostly(st.integers(0, 9)),
    cache_read_tokens=_mostly(st.none()),
    cache_write_tokens=_mostly(st.none() | st.integers(0, 9)),
)
_failure = st.builds(
    LlmFailure,
    message=_text,
    code=_text,
    status=_mostly(st.none() | st.integers(400, 599)),
    provider_retry_after_ms=_mostly(st.none()),
)
_reasons = _mostly(st.sampled_from(["stop", "tool-calls", "max-tokens", "error", "aborted"]))
_chunks = st.one_of(
    st.builds(TextDelta, index=_index, text=_text),
    st.builds(ReasoningDelta, index=_index, text=_text),
    st.builds(
        ToolCallDelta,
        index=_index,
        id=st.none() | _text,
        name=st.none() | st.sampled_from(["echo", "missing-tool"]) | _text,
        arguments_delta=_arguments,
    ),
    st.builds(  # a well-formed call of the echo tool, with arguments of any depth and size
        ToolCallDelta,
        index=st.just(9),
        id=st.just("call-9"),
        name=st.just("echo"),
        arguments_delta=_arguments,
    ),
    st.builds(BlockStart, index=_index, block_type=st.sampled_from(["text", "tool-call"]) | _text),
    st.builds(BlockEnd, index=_index, block=st.none() | _blocks),
    st.builds(UsageChunk, usage=_mostly(_usage)),
    st.builds(Finish, reason=_reasons, failure=_mostly(st.none() | _failure)),
    st.builds(_unknown, st.just(UnknownChunk), _strings, st.dictionaries(_strings, _json_ish)),
)
#: What an adapter might yield that is no chunk at all.
_not_chunks = _blocks | st.sampled_from(["text", {"type": "text-delta", "index": 0, "text": "a"}])


# -- the agent -----------------------------------------------------------------------------------


async def _run(host: TestHost, chunks: list[Any]) -> tuple[SessionEvent, ...]:
    """One turn answered by ``chunks`` then a plain turn; returns the log as stored."""
    handle = await host.create_agent()
    agent = handle.agent
    agent.followup(user_message("go"))
    async with asyncio.timeout(10):
        await agent.when_idle()
    assert agent.session.events[-1].type == "turn/end"
    agent.followup(user_message("again"))  # the agent goes on after whatever the adapter did
    async with asyncio.timeout(10):
        await agent.when_idle()
    last = agent.session.events[-1]
    assert last.type == "turn/end" and last.data.reason.kind == "completed"
    await host.ctx.sessions.flush(agent.session)
    _, stored = await host.ctx.session_persistence.inspect(agent.session.id)
    assert stored == agent.session.events
    await handle.dispose()
    return stored


async def _echo(args: Any, run: ToolRunContext) -> str:
    return dumps(args)


#: A tool the chunks may call, with arguments of any depth and size (the parser's limits).
ECHO = ToolDefinition(
    name="echo", description="Echo the arguments.", parameters={"type": "object"}, execute=_echo
)


def _model(chunks: list[Any]) -> Any:
    """The adapter's script: ``chunks`` for the first request, plain text for every other."""
    served: list[int] = []

    def answer(_: object) -> ScriptedReply | str:
        served.append(1)
        return ScriptedReply(chunks=tuple(chunks)) if len(served) == 1 else "done"

    return answer


class _Hosts:
    """One host per store for every example of the properties (an example runs a fresh
    agent, so a fresh session; booting a host and a store folder per example was most of
    their time), on one event loop. ``chunks`` answers the next agent's first request and
    ``result``, when set, replaces what its tool calls return."""

    def __init__(self, runner: asyncio.Runner, root: Path) -> None:
        self._runner, self._root = runner, root
        self._booted: dict[str, tuple[Any, TestHost]] = {}
        self.chunks: list[Any] = []
        self.served = 0
        self.result: ToolExecutionResult | None = None

    def _answer(self, _: object) -> ScriptedReply | str:
        self.served += 1
        return ScriptedReply(chunks=tuple(self.chunks)) if self.served == 1 else "done"

    async def _replace(self, call: Any, outcome: Any, next_: Callable[..., Awaitable[Any]]) -> Any:
        given = await next_()
        return given if self.result is None else self.result

    async def _boot(self, store: Literal["memory", "jsonl"]) -> TestHost:
        booting = scripted_host(model=self._answer, store=store, store_root=self._root / store)
        host = await booting.__aenter__()
        host.ctx.tools.register(ECHO)
        host.ctx.on("tools/post-execute", self._replace)
        self._booted[store] = (booting, host)
        return host

    def run(
        self,
        store: Literal["memory", "jsonl"],
        chunks: list[Any],
        result: ToolExecutionResult | None = None,
    ) -> tuple[SessionEvent, ...]:
        """One example: a fresh agent of the ``store`` host through :func:`_run`."""
        self.chunks, self.served, self.result = chunks, 0, result

        async def example() -> tuple[SessionEvent, ...]:
            async with asyncio.timeout(60):
                booted = self._booted.get(store)
                host = booted[1] if booted else await self._boot(store)
                return await _run(host, chunks)

        return self._runner.run(example())

    def close(self) -> None:
        for booting, _ in self._booted.values():
            self._runner.run(booting.__aexit__(None, None, None))


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Hosts]:
    with asyncio.Runner() as runner:
        shared = _Hosts(runner, tmp_path_factory.mktemp("adapter-chunks"))
        try:
            yield shared
        finally:
            shared.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunks=st.lists(_chunks, max_size=4),
    intruder=st.none() | st.tuples(st.integers(0, 4), _not_chunks),
    finish=st.booleans(),
)
def test_whatever_an_adapter_streams_the_turn_ends_and_the_log_reads_back(
    hosts: _Hosts,
    chunks: list[Any],
    intruder: tuple[int, Any] | None,
    finish: bool,
) -> None:
    """hardening 11.1, host-core §3/§9: arbitrary adapter chunks (wrong types, huge ints, NaN,
    deep nesting, lone surrogates, non-chunks) end the turn, the agent goes on, and the log
    flushes and reads back equal from either store; a bad chunk is an ``error`` finish."""
    if intruder is not None:
        chunks.insert(*intruder)
    if finish:
        chunks.append(Finish(reason="stop"))
    for store in BACKENDS:  # the same chunks from either store's agent: drawn once
        stored = hosts.run(store, chunks)
        first_end = next(e for e in stored if e.type == "turn/end")
        event(f"first turn: {first_end.data.reason.kind}")
        if any(e.type == "tool/result" for e in stored):
            event("a tool call was answered")
        error = first_end.data.reason.error
        if error is not None and "SESSION_EVENT_" in error.message:
            event("a chunk was refused")
            assert error.code == "UNKNOWN", store
            assert error.message.startswith("SessionError [SESSION_EVENT_"), store


@pytest.mark.parametrize("store", BACKENDS)
async def test_a_bad_chunk_fails_the_request_and_is_never_logged(
    tmp_path: Path, store: Literal["memory", "jsonl"]
) -> None:
    """hardening 11.1, host-core §3: a chunk the log cannot hold (``TextDelta(text=5)``) is
    refused where the loop reads it: the request fails with an ``error`` finish naming
    SESSION_EVENT_INVALID, nothing of it is logged, and the agent goes on."""
    chunks = [TextDelta(index=0, text="ok"), TextDelta(index=0, text=5), Finish(reason="stop")]
    async with scripted_host(model=_model(chunks), store=store, store_root=tmp_path) as host:
        stored = await _run(host, chunks)
    logged = [e.data.chunk for e in stored if e.type == "assistant/chunk"]
    assert TextDelta(index=0, text="ok") in logged
    assert not any(isinstance(c, TextDelta) and c.text.__class__ is not str for c in logged)
    end = next(e for e in stored if e.type == "turn/end")
    assert end.data.reason.kind == "error"
    assert end.data.reason.error.message.startswith("SessionError [SESSION_EVENT_INVALID]")


@pytest.mark.parametrize(("depth", "kind"), [(48, "completed"), (49, "error")])
async def test_a_block_end_nested_to_the_limit_is_checked_in_the_message_too(
    tmp_path: Path, depth: int, kind: str
) -> None:
    """hardening 11.2, host-core §3: a ``BlockEnd`` block that fits its chunk event but would
    nest one level too deep in the assembled ``assistant/message`` is logged as a chunk, and the
    message is refused (the turn ends ``error``), never written past the limit."""
    chunks = [BlockEnd(index=0, block=_block_chain(depth)), Finish(reason="stop")]
    async with scripted_host(model=_model(chunks), store="jsonl", store_root=tmp_path) as host:
        stored = await _run(host, chunks)
    assert sum(e.type == "assistant/chunk" for e in stored) >= 2
    end = next(e for e in stored if e.type == "turn/end")
    assert end.data.reason.kind == kind
    if kind == "error":
        assert "SESSION_EVENT_NOT_JSON" in end.data.reason.error.message


@pytest.mark.parametrize("store", BACKENDS)
async def test_a_message_a_pre_step_listener_enters_is_checked_at_the_append(
    tmp_path: Path, store: Literal["memory", "jsonl"]
) -> None:
    """hardening 11.1, host-core §9: only inbox messages (checked when queued) skip the check;
    a bad message an ``agent/pre-step`` listener enters is refused and the turn ends ``error``,
    and the log still reads back equal."""
    bad = user_message([TextBlock(text=5)])  # type: ignore[arg-type]

    async def gate(pre: PreStep, next_: Callable[[], Awaitable[PreStepDecision]]) -> Any:
        decision = await next_()
        return decision if pre.turn > 1 else PreStepDecision(kind="enter", messages=(bad,))

    async with scripted_host(model=lambda _: "ok", store=store, store_root=tmp_path) as host:
        host.ctx.on("agent/pre-step", gate)
        stored = await _run(host, [])
    assert bad not in [e.data for e in stored if e.type == "user/message"]
    end = next(e for e in stored if e.type == "turn/end")
    assert end.data.reason.error.message.startswith("SessionError [SESSION_EVENT_INVALID]")


@pytest.mark.parametrize(
    "arguments",
    [
        dumps({"a": nested(3 * MAX_NESTING)}),
        '{"n": ' + "9" * (MAX_INT_DIGITS + 5) + "}",
        '{"x": NaN}',
        '{"s": "\\ud800"}',
        '{"text": "hi"}',
    ],
    ids=["deep", "huge-int", "nan", "lone-surrogate", "plain"],
)
async def test_tool_arguments_of_any_depth_and_size_are_logged_raw_and_answered(
    tmp_path: Path, arguments: str
) -> None:
    """hardening 11.1/11.2, host-core §9: a call's arguments stay the model's raw text in the
    log (no JSON limit applies to a string); the tool is answered (a result or an error), the
    turn completes and the JSONL log reads back equal."""
    chunks = [
        ToolCallDelta(index=0, id="call-1", name="echo", arguments_delta=arguments),
        Finish(reason="tool-calls"),
    ]
    async with scripted_host(model=_model(chunks), store="jsonl", store_root=tmp_path) as host:
        host.ctx.tools.register(ECHO)
        stored = await _run(host, chunks)
    (call,) = [e.data for e in stored if e.type == "tool/call"]
    assert call.arguments == arguments
    assert [e.data.reason.kind for e in stored if e.type == "turn/end"] == ["completed"] * 2
    assert sum(e.type == "tool/result" for e in stored) == 1


# -- the request header: tools checked at registration, the route and prompt at the write -------


@pytest.mark.parametrize(
    "make",
    [
        lambda: ToolDefinition(name=5, description="d", execute=_echo),
        lambda: ToolDefinition(name="t", description=None, execute=_echo),
        lambda: ToolDefinition(
            name="t", description="d", parameters={"a": nested(SCHEMA_NESTING)}, execute=_echo
        ),
    ],
    ids=["int-name", "no-description", "too-deep"],
)
async def test_a_tool_the_header_could_not_log_is_refused_at_registration(make: Any) -> None:
    """hardening 11.1, host-core §6: a tool whose schema a ``request/header`` could not hold is
    refused when registered (TOOL_SCHEMA_INVALID), never at some later request; a schema at
    the depth limit registers and is logged."""
    async with scripted_host() as host:
        with pytest.raises(ToolError) as info:
            host.ctx.tools.register(make())
        assert info.value.code == "TOOL_SCHEMA_INVALID"

    with tempfile.TemporaryDirectory() as tmp:
        async with scripted_host(model=lambda _: "ok", store="jsonl", store_root=Path(tmp)) as host:
            host.ctx.tools.register(
                ToolDefinition(
                    name="deep",
                    description="d",
                    parameters={"a": nested(SCHEMA_NESTING - 1)},  # exactly the limit
                    execute=_echo,
                )
            )
            stored = await _run(host, [])
    assert any(e.type == "request/header" and e.data.header.tools for e in stored)


@pytest.mark.parametrize("store", BACKENDS)
@pytest.mark.parametrize(
    "route",
    [
        {"provider": 5, "model": "echo"},
        {"provider": "scripted", "model": "echo", "max_tokens": True},
        {"provider": "scripted", "model": "echo", "max_tokens": 10**5000},
    ],
    ids=["int-provider", "bool-max-tokens", "huge-max-tokens"],
)
async def test_a_route_an_agent_request_listener_breaks_is_checked_at_the_append(
    tmp_path: Path, store: Literal["memory", "jsonl"], route: dict[str, Any]
) -> None:
    """hardening 11.1, host-core §9: the loop vouches for its request header only when the
    route and system prompt hold what their types declare; a route an ``agent/request``
    listener replaced with unloggable values is refused at the append, the turn ends
    ``error``, and the log still reads back equal."""

    async def reroute(request: Any, next_: Callable[[], Awaitable[Any]]) -> Any:
        config = await next_()
        return LlmCallConfig(**route) if request.turn == 1 else config

    async with scripted_host(model=lambda _: "ok", store=store, store_root=tmp_path) as host:
        host.ctx.on("agent/request", reroute)
        stored = await _run(host, [])
    assert not any(
        e.type == "request/header" and e.data.header.config.provider != "scripted" for e in stored
    )
    end = next(e for e in stored if e.type == "turn/end")
    assert end.data.reason.kind == "error"
    assert "SESSION_EVENT_" in end.data.reason.error.message


# -- tool results: the loop checks what the tool supplied, the append the rest --------------------

#: Results of any shape, mostly loggable: block chains near the depth limit, JSON meta of any
#: depth, error codes of any type.
_results = st.builds(
    ToolExecutionResult,
    content=_mostly(st.lists(st.builds(TextBlock, text=_strings) | _blocks, max_size=2).map(tuple)),
    error=st.none() | st.builds(ToolFailure, message=st.just("failed"), code=_text),
    meta=st.none() | _json_ish,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(result=_results)
def test_whatever_result_a_tool_listener_gives_is_logged_only_if_the_log_can_hold_it(
    hosts: _Hosts, result: ToolExecutionResult
) -> None:
    """hardening 11.1, host-core §7/§9, ROB-3: the loop checks a result's content, error code
    and meta itself and builds the rest of ``tool/result``; whatever a ``tools/post-execute``
    listener returns, the result is logged as given exactly when the payload's full check
    takes it, else the call is answered ``INVALID_TOOL_OUTPUT``; the agent goes on and the log
    reads back equal."""
    chunks = [
        ToolCallDelta(index=0, id="call-1", name="echo", arguments_delta="{}"),
        Finish(reason="tool-calls"),
    ]
    try:
        data = ToolResultData(
            turn=1,
            step=1,
            message=result.message("call-1"),
            error=None
            if result.error is None
            else ToolResultError(name="echo", code=result.error.code),
            meta=result.meta,
        )
        spec = TYPES.get("tool/result")
        assert spec is not None
        TYPES.snapshot(spec, "tool/result", data)
        loggable = True
    except (NotJsonError, SessionError):
        loggable = False
    event("logged" if loggable else "refused")
    for store in BACKENDS:  # the same result from either store's agent: drawn once
        stored = hosts.run(store, chunks, result)
        logged = [e.data for e in stored if e.type == "tool/result"]
        assert len(logged) == 1, store  # the call is answered either way
        if loggable:
            assert logged[0] == data, store
        else:
            assert logged[0].error == ToolResultError(name="echo", code="INVALID_TOOL_OUTPUT")


class _Name(str):
    """A ``str`` subclass: equal to a plain string, not one."""


@pytest.mark.parametrize("store", BACKENDS)
@pytest.mark.parametrize(
    "route",
    [
        {"provider": "scripted", "model": "echo", "max_tokens": True},
        {"provider": "scripted", "model": "echo", "max_tokens": 10**5000},
        {"provider": _Name("scripted"), "model": "echo"},
        {"provider": "scripted", "model": ["echo"]},
    ],
    ids=["bool-max-tokens", "huge-max-tokens", "str-subclass", "unhashable-model"],
)
async def test_an_agents_own_route_is_vouched_for_only_when_the_log_can_hold_it(
    tmp_path: Path, store: Literal["memory", "jsonl"], route: dict[str, Any]
) -> None:
    """hardening 11.1, host-core §9: the loop checks an agent's own route once (shared by the
    agents on the same route) and vouches for its header only if the log can hold it; any other
    route's header gets the append's check, and whatever is logged reads back equal."""
    async with scripted_host(model=lambda _: "ok", store=store, store_root=tmp_path) as host:
        for options in (AgentOptions(**route), AgentOptions(**route)):  # the cached verdict too
            handle = await host.create_agent(options=options)
            agent = handle.agent
            agent.followup(user_message("go"))
            async with asyncio.timeout(10):
                await agent.when_idle()
            await host.ctx.sessions.flush(agent.session)
            _, stored = await host.ctx.session_persistence.inspect(agent.session.id)
            assert stored == agent.session.events
            headers = [e.data.header.config for e in stored if e.type == "request/header"]
            assert all(h.max_tokens is None or type(h.max_tokens) is int for h in headers)
            end = next(e for e in stored if e.type == "turn/end")
            assert end.data.reason.kind in ("completed", "error")
            await handle.dispose()
