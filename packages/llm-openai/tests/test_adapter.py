"""The adapter against a loopback chat-completions server (host-core §2; llm-openai 17.1, 17.2).

No network: every request goes to :class:`ChatCompletionsServer` on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from dsh_core import (
    AbortController,
    BlockAssembler,
    Finish,
    GenerateOptions,
    ReasoningBlock,
    StreamChunk,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolResultBlock,
    ToolSchema,
    UsageChunk,
    assistant_message,
    user_message,
)
from dsh_core._content import Message, ModelSource, ToolSource
from dsh_llm_openai import OpenAIAdapter, OpenAIConfig, request_body
from dsh_llm_openai.testing import ChatCompletionsServer, Reply, chunk, text_reply

pytestmark = pytest.mark.usefixtures("both_transports")

KEY = "sk-test-0123456789abcdefXYZ"


@pytest.fixture
def server() -> Iterator[ChatCompletionsServer]:
    with ChatCompletionsServer() as srv:
        yield srv


def adapter(server: ChatCompletionsServer, **config: Any) -> OpenAIAdapter:
    config.setdefault("api_key", KEY)
    config.setdefault("max_retries", 0)
    return OpenAIAdapter(OpenAIConfig(base_url=server.base_url, **config))


def request(*messages: Message, **changes: Any) -> GenerateOptions:
    return GenerateOptions(
        provider="openai",
        model="loopback-model",
        messages=messages or (user_message("hi"),),
        **changes,
    )


async def collect(a: OpenAIAdapter, options: GenerateOptions) -> list[StreamChunk]:
    try:
        return [c async for c in a.stream(options)]
    finally:
        await a.aclose()


def assemble(chunks: list[StreamChunk]) -> BlockAssembler:
    asm = BlockAssembler()
    for c in chunks:
        asm.add(c)
    return asm


def finish_of(chunks: list[StreamChunk]) -> Finish:
    assert isinstance(chunks[-1], Finish), chunks
    assert sum(isinstance(c, Finish) for c in chunks) == 1, chunks
    return chunks[-1]


async def wait_for(event: Any, seconds: float = 10.0) -> bool:
    """Wait for a threading.Event of the server, bounded."""
    result: bool = await asyncio.to_thread(event.wait, seconds)
    return result


# -- a normal stream ------------------------------------------------------------------------------


async def test_a_normal_stream_becomes_text_reasoning_usage_and_a_stop(
    server: ChatCompletionsServer,
) -> None:
    """host-core §2, llm-openai 17.1: reasoning and text deltas become their blocks, usage
    (with cached tokens) precedes the single `stop` finish."""
    server.add(
        Reply(
            chunks=(
                chunk(reasoning_content="Think"),
                chunk(reasoning_content="ing."),
                chunk(content="Hel"),
                chunk(content="lo"),
                chunk(finish_reason="stop"),
                chunk(
                    usage={
                        "prompt_tokens": 11,
                        "completion_tokens": 5,
                        "prompt_tokens_details": {"cached_tokens": 3},
                    }
                ),
            )
        )
    )
    chunks = await collect(adapter(server), request())
    asm = assemble(chunks)
    assert asm.blocks() == (ReasoningBlock(text="Thinking."), TextBlock(text="Hello"))
    assert finish_of(chunks).reason == "stop"
    assert isinstance(chunks[-2], UsageChunk)
    assert (asm.usage.input_tokens, asm.usage.output_tokens, asm.usage.cache_read_tokens) == (
        11,
        5,
        3,
    )


@pytest.mark.parametrize(
    ("usage", "cached"),
    [
        ({"prompt_cache_hit_tokens": 7}, 7),
        ({"prompt_tokens_details": {"cached_tokens": 3}, "prompt_cache_hit_tokens": 7}, 3),
        ({"prompt_tokens_details": {}, "prompt_cache_hit_tokens": 7}, 7),
        ({"prompt_tokens_details": None}, None),
        ({"prompt_cache_hit_tokens": "7"}, None),
    ],
)
async def test_cached_tokens_fall_back_to_deepseeks_field(
    server: ChatCompletionsServer, usage: dict[str, Any], cached: int | None
) -> None:
    """host-core §2, llm-openai 17.1: without OpenAI's prompt_tokens_details.cached_tokens the
    cache-read count is DeepSeek's prompt_cache_hit_tokens (OpenAI's name wins when both
    come; a value that is not an integer counts as unknown)."""
    server.add(
        Reply(
            chunks=(
                chunk(content="ok"),
                chunk(finish_reason="stop"),
                chunk(usage={"prompt_tokens": 11, "completion_tokens": 5, **usage}),
            )
        )
    )
    asm = assemble(await collect(adapter(server), request()))
    assert (asm.usage.input_tokens, asm.usage.cache_read_tokens) == (11, cached)


async def test_the_request_carries_the_conversation_tools_and_limits(
    server: ChatCompletionsServer,
) -> None:
    """llm-openai 17.1: system, user, assistant tool calls and tool results go out in the
    chat-completions shape, with tools, max_tokens, temperature, stop, streaming usage, the
    bearer key and the row's extra headers."""
    call = ToolCallBlock(id="call-1", name="lookup", arguments='{"q": "x"}')
    history = (
        user_message("find x"),
        assistant_message(
            (ReasoningBlock(text="secret thoughts"), TextBlock(text="Looking."), call),
            source=ModelSource(provider="openai", model="m"),
        ),
        Message(
            id="r1",
            role="tool",
            content=(ToolResultBlock(tool_call_id="call-1", content=(TextBlock(text="x is 1"),)),),
            source=ToolSource(call_id="call-1"),
        ),
    )
    tool = ToolSchema(
        name="lookup",
        description="Look a thing up.",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}},
    )
    options = request(
        *history, system="Be brief.", tools=(tool,), max_tokens=64, temperature=0.5, stop=("END",)
    )
    await collect(adapter(server, headers={"X-Team": "dsh"}), options)
    (seen,) = server.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.headers["x-team"] == "dsh"
    assert seen.body == {
        "model": "loopback-model",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "find x"},
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    {
                        "id": "call-1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"q": "x"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call-1", "content": "x is 1"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "Look a thing up.",
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                },
            }
        ],
        "max_tokens": 64,
        "temperature": 0.5,
        "stop": ["END"],
    }


def test_a_multi_block_user_message_goes_out_with_a_blank_line_between_blocks() -> None:
    """ROB-83: a user (or system) message of several text blocks is sent as one text with
    MESSAGE_BLOCK_SEPARATOR (a blank line) between blocks, never run together; one block is
    sent as it is."""
    notice = user_message(
        (
            TextBlock(text="It waits unless you send it more."),
            TextBlock(text="Its closing message:"),
            TextBlock(text="done"),
        )
    )
    body = request_body(request(notice, user_message("next")), OpenAIConfig(api_key=KEY))
    assert body["messages"] == [
        {
            "role": "user",
            "content": "It waits unless you send it more.\n\nIts closing message:\n\ndone",
        },
        {"role": "user", "content": "next"},
    ]


async def test_reasoning_is_sent_back_only_when_the_row_asks(
    server: ChatCompletionsServer,
) -> None:
    """llm-openai 17.1: a reasoning block is never sent back by default (DeepSeek's reasoner
    refuses it); `send_reasoning` sends it as `reasoning_content`; `max_tokens_field` renames
    the limit."""
    answer = assistant_message(
        (ReasoningBlock(text="why"), TextBlock(text="because")),
        source=ModelSource(provider="openai", model="m"),
    )
    options = request(user_message("q"), answer, user_message("and?"), max_tokens=9)
    await collect(adapter(server), options)
    await collect(
        adapter(server, send_reasoning=True, max_tokens_field="max_completion_tokens"), options
    )
    plain, sent = (r.body for r in server.requests)
    assert plain["messages"][1] == {"role": "assistant", "content": "because"}
    assert "reasoning_content" not in json.dumps(plain)
    assert sent["messages"][1]["reasoning_content"] == "why"
    assert sent["max_completion_tokens"] == 9 and "max_tokens" not in sent


# -- tool calls --------------------------------------------------------------------------------


async def test_tool_calls_split_across_chunks_assemble_into_raw_json_blocks(
    server: ChatCompletionsServer,
) -> None:
    """host-core §2, llm-openai 17.1/17.2: two tool calls whose id and name come first and
    whose arguments arrive in pieces, interleaved, become two tool-call blocks with the raw
    JSON text, after the text, and a `tool-calls` finish."""
    first = {"index": 0, "id": "call_a", "type": "function", "function": {"name": "read"}}
    second = {"index": 1, "id": "call_b", "type": "function", "function": {"name": "write"}}
    server.add(
        Reply(
            chunks=(
                chunk(content="Working."),
                chunk(tool_calls=[{**first, "function": {"name": "read", "arguments": ""}}]),
                chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"pa'}}]),
                chunk(tool_calls=[second]),
                chunk(tool_calls=[{"index": 0, "function": {"arguments": 'th": "a"}'}}]),
                chunk(tool_calls=[{"index": 1, "function": {"arguments": '{"n": [1, '}}]),
                chunk(tool_calls=[{"index": 1, "function": {"arguments": "2]}"}}]),
                chunk(finish_reason="tool_calls"),
            )
        )
    )
    chunks = await collect(adapter(server), request())
    asm = assemble(chunks)
    assert asm.blocks() == (
        TextBlock(text="Working."),
        ToolCallBlock(id="call_a", name="read", arguments='{"path": "a"}'),
        ToolCallBlock(id="call_b", name="write", arguments='{"n": [1, 2]}'),
    )
    assert finish_of(chunks).reason == "tool-calls"


async def test_tool_calls_that_end_with_stop_still_finish_as_tool_calls(
    server: ChatCompletionsServer,
) -> None:
    """host-core §2: an endpoint that streams a tool call then says `stop` (some local
    servers do) still finishes `tool-calls`, so the loop runs the call."""
    call = {
        "index": 0,
        "id": "c1",
        "type": "function",
        "function": {"name": "t", "arguments": "{}"},
    }
    server.add(Reply(chunks=(chunk(tool_calls=[call]), chunk(finish_reason="stop"))))
    assert finish_of(await collect(adapter(server), request())).reason == "tool-calls"


async def test_whole_tool_calls_without_an_index_stay_apart(
    server: ChatCompletionsServer,
) -> None:
    """host-core §2: an endpoint that sends each tool call whole, without `index` (as some
    local servers do), gets one block per call id."""
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "b", "arguments": '{"x": 1}'}},
    ]
    server.add(Reply(chunks=(chunk(tool_calls=calls), chunk(finish_reason="tool_calls"))))
    assert assemble(await collect(adapter(server), request())).blocks() == (
        ToolCallBlock(id="c1", name="a", arguments="{}"),
        ToolCallBlock(id="c2", name="b", arguments='{"x": 1}'),
    )


async def test_parallel_tool_calls_that_reuse_one_index_stay_apart(
    server: ChatCompletionsServer,
) -> None:
    """host-core §2: an endpoint that numbers every parallel call `index: 0` (Ollama does), each
    with an id of its own and its arguments in pieces, gets one block per call, never one call
    with the arguments of both; an endpoint that repeats a call's id on each of its pieces
    (vLLM does) still gets one block for it."""

    def call(call_id: str | None, name: str | None, arguments: str) -> dict[str, Any]:
        function: dict[str, Any] = {"arguments": arguments}
        if name is not None:
            function["name"] = name
        head = {"id": call_id, "type": "function"} if call_id is not None else {}
        return {"index": 0, **head, "function": function}

    server.add(
        Reply(
            chunks=(
                chunk(tool_calls=[call("call_a", "read", "")]),
                chunk(tool_calls=[call(None, None, '{"path": ')]),
                chunk(tool_calls=[call(None, None, '"a"}')]),
                chunk(tool_calls=[call("call_b", "read", '{"path": ')]),
                chunk(tool_calls=[call("call_b", None, '"b"}')]),
                chunk(finish_reason="tool_calls"),
            )
        )
    )
    assert assemble(await collect(adapter(server), request())).blocks() == (
        ToolCallBlock(id="call_a", name="read", arguments='{"path": "a"}'),
        ToolCallBlock(id="call_b", name="read", arguments='{"path": "b"}'),
    )


# -- finish reasons -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "reason", "code"),
    [
        ("stop", "stop", None),
        ("length", "max-tokens", None),
        ("tool_calls", "tool-calls", None),
        ("content_filter", "error", "CONTENT_FILTER"),
        ("insufficient_system_resource", "error", "UNEXPECTED_FINISH"),
    ],
)
async def test_finish_reasons_are_mapped(
    server: ChatCompletionsServer, wire: str, reason: str, code: str | None
) -> None:
    """host-core §2, llm-openai 17.1: stop, length → max-tokens, tool_calls, and
    content_filter (or an unknown reason) → an error finish with a diagnostic."""
    server.add(Reply(chunks=(chunk(content="partial"), chunk(finish_reason=wire))))
    finish = finish_of(await collect(adapter(server), request()))
    assert finish.reason == reason
    assert (finish.failure.code if finish.failure else None) == code
    if code is not None:
        assert finish.failure is not None and finish.failure.message


# -- failures ----------------------------------------------------------------------------------


async def test_a_stream_cut_in_the_middle_keeps_what_came_and_ends_in_an_error(
    server: ChatCompletionsServer,
) -> None:
    """host-core §2, llm-openai 17.2: a connection dropped mid-stream yields the text that
    arrived, then one `error` finish (CONNECTION); nothing follows it."""
    server.add(
        Reply(chunks=(chunk(content="Hello "), chunk(content="wor"), chunk(content="ld")), cut=True)
    )
    chunks = await collect(adapter(server), request())
    finish = finish_of(chunks)
    assert finish.reason == "error" and finish.failure is not None
    assert finish.failure.code == "CONNECTION"
    assert [c.text for c in chunks if isinstance(c, TextDelta)][:1] == ["Hello "]


async def test_a_stream_that_ends_without_a_finish_reason_is_incomplete(
    server: ChatCompletionsServer,
) -> None:
    """host-core §2: a well-formed stream that closes before any finish reason ends with an
    `error` finish (INCOMPLETE_STREAM), never a silent `stop`."""
    server.add(Reply(chunks=(chunk(content="Hel"),)))
    finish = finish_of(await collect(adapter(server), request()))
    assert finish.failure is not None and finish.failure.code == "INCOMPLETE_STREAM"


async def test_429_with_retry_after_fails_with_the_delay_when_retries_are_off(
    server: ChatCompletionsServer,
) -> None:
    """llm-openai 17.2: a 429 becomes RATE_LIMITED with status 429 and the endpoint's
    Retry-After in milliseconds."""
    server.add(
        Reply(
            status=429,
            headers={"Retry-After": "7"},
            error={"message": "slow down", "type": "rate_limit"},
        )
    )
    finish = finish_of(await collect(adapter(server), request()))
    assert finish.failure is not None
    assert (finish.failure.code, finish.failure.status) == ("RATE_LIMITED", 429)
    assert finish.failure.provider_retry_after_ms == 7000
    assert "slow down" in finish.failure.message
    assert len(server.requests) == 1


async def test_429_is_retried_after_the_delay_the_endpoint_asks(
    server: ChatCompletionsServer,
) -> None:
    """llm-openai 17.1/17.2: with retries on, the SDK waits what Retry-After asks and tries
    again; the caller sees only the answer."""
    server.add(
        Reply(status=429, headers={"Retry-After": "1", "retry-after-ms": "20"}),
        text_reply("second time lucky"),
    )
    chunks = await collect(adapter(server, max_retries=1), request())
    assert assemble(chunks).blocks() == (TextBlock(text="second time lucky"),)
    assert len(server.requests) == 2


async def test_500_is_retried_then_reported_as_a_server_error(
    server: ChatCompletionsServer,
) -> None:
    """llm-openai 17.2: a 500 is retried `max_retries` times, then becomes SERVER_ERROR with
    status 500."""
    fail = Reply(status=500, headers={"retry-after-ms": "1"}, error={"message": "boom"})
    server.add(fail, fail)
    finish = finish_of(await collect(adapter(server, max_retries=1), request()))
    assert finish.failure is not None
    assert (finish.failure.code, finish.failure.status) == ("SERVER_ERROR", 500)
    assert len(server.requests) == 2


async def test_401_is_not_retried_and_never_shows_the_key(server: ChatCompletionsServer) -> None:
    """llm-openai 17.1/17.2: a 401 becomes AUTHENTICATION at once (no retry); an endpoint
    that echoes the key, whole or masked, does not get it into the failure."""
    masked = f"{KEY[:8]}***{KEY[-4:]}"
    server.add(
        Reply(
            status=401,
            error={"message": f"Incorrect API key provided: {KEY} ({masked})", "type": "auth"},
        )
    )
    finish = finish_of(await collect(adapter(server, max_retries=3), request()))
    assert finish.failure is not None
    assert (finish.failure.code, finish.failure.status) == ("AUTHENTICATION", 401)
    assert KEY not in finish.failure.message and KEY[:8] not in finish.failure.message
    assert len(server.requests) == 1


async def test_a_slow_first_byte_times_out(server: ChatCompletionsServer) -> None:
    """llm-openai 17.1/17.2: an endpoint that sends nothing within `timeout` fails with
    TIMEOUT, and the connection is closed (the server sees it go)."""
    server.add(Reply(delay=30, chunks=(chunk(content="late"), chunk(finish_reason="stop"))))
    finish = finish_of(await collect(adapter(server, timeout=0.3), request()))
    assert finish.failure is not None and finish.failure.code == "TIMEOUT"
    assert await wait_for(server.disconnected)


async def test_no_key_fails_the_request_without_calling_the_endpoint(
    server: ChatCompletionsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llm-openai 17.1: with no key (neither `api_key` nor the variable `api_key_env` names)
    the request ends with NO_API_KEY naming that variable; nothing is sent."""
    monkeypatch.delenv("MY_KEY", raising=False)
    chunks = await collect(adapter(server, api_key=None, api_key_env="MY_KEY"), request())
    finish = finish_of(chunks)
    assert finish.failure is not None and finish.failure.code == "NO_API_KEY"
    assert "MY_KEY" in finish.failure.message
    assert server.requests == []


async def test_an_empty_config_honours_openai_base_url_and_api_key(
    server: ChatCompletionsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llm-openai 17.1: with no config, `OPENAI_BASE_URL` and `OPENAI_API_KEY` choose the
    endpoint and the key; `api_key_env` reads another variable."""
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OTHER_KEY", "sk-other")
    await collect(OpenAIAdapter(), request())
    await collect(OpenAIAdapter(OpenAIConfig(api_key_env="OTHER_KEY")), request())
    assert [r.headers["authorization"] for r in server.requests] == [
        "Bearer sk-from-env",
        "Bearer sk-other",
    ]


def test_the_key_is_not_in_the_config_repr() -> None:
    """llm-openai 17.1: the config's repr (what a log or an error prints) hides the key."""
    assert KEY not in repr(OpenAIConfig(api_key=KEY))


# -- cancellation ------------------------------------------------------------------------------


async def _first_text(stream: AsyncIterator[StreamChunk]) -> StreamChunk:
    async for c in stream:
        if isinstance(c, TextDelta):
            return c
    raise AssertionError("no text arrived")


async def test_aborting_the_signal_mid_stream_closes_the_connection(
    server: ChatCompletionsServer,
) -> None:
    """host-core §2, llm-openai 17.1/17.2: a request's signal fired while the adapter waits
    for the next chunk ends the stream with one `aborted` finish at once, and the server sees
    the connection close."""
    server.add(Reply(chunks=(chunk(content="first"),), hold=30))
    ctl = AbortController()
    a = adapter(server)
    stream = a.stream(request(signal=ctl.signal))
    try:
        await _first_text(stream)
        next_chunk = asyncio.ensure_future(anext(stream))
        await asyncio.to_thread(server.responding.wait, 10)
        ctl.abort("user")  # before or while the read waits: either way it stops
        finish = await next_chunk
        assert isinstance(finish, Finish) and finish.reason == "aborted"
        assert await wait_for(server.disconnected)
        assert [c async for c in stream] == []
    finally:
        await a.aclose()


async def test_aborting_before_the_first_byte_stops_the_request(
    server: ChatCompletionsServer,
) -> None:
    """host-core §2, llm-openai 17.1: a signal fired while the endpoint has not answered yet
    ends the stream `aborted` at once (no retry, no timeout wait); the server sees the close."""
    # An hour: only the abort can end this wait before the test's own time limit.
    server.add(Reply(delay=3600, chunks=(chunk(content="late"), chunk(finish_reason="stop"))))
    ctl = AbortController()
    a = adapter(server, max_retries=3)
    stream = a.stream(request(signal=ctl.signal))
    first = asyncio.ensure_future(anext(stream))
    try:
        assert await wait_for(server.received)  # the request reached the server: abort it
        ctl.abort("user")
        finish = await first
        assert isinstance(finish, Finish) and finish.reason == "aborted"
        assert await wait_for(server.disconnected)
        assert [c async for c in stream] == []
        assert len(server.requests) == 1
    finally:
        await a.aclose()


async def test_cancelling_the_reading_task_closes_the_connection(
    server: ChatCompletionsServer,
) -> None:
    """llm-openai 17.1/17.2: cancelling the task that reads the stream (what the agent loop
    does on a turn's abort) closes the HTTP stream; the server sees the close."""
    server.add(Reply(chunks=(chunk(content="first"),), hold=30))
    a = adapter(server)
    got_text = asyncio.Event()

    async def read() -> None:
        async for c in a.stream(request()):
            if isinstance(c, TextDelta):
                got_text.set()

    task = asyncio.ensure_future(read())
    try:
        async with asyncio.timeout(10):
            await got_text.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await wait_for(server.disconnected)
    finally:
        await a.aclose()
