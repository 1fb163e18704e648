"""Text the wire cannot carry (ROB-50..ROB-54): lone surrogates in a request are replaced at
the boundary with one warning; lone surrogates in a response are taken as they come; an API
key that cannot go in a header fails the request without sending it or showing it.

No network: every request goes to :class:`ChatCompletionsServer` on 127.0.0.1.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from dsh_core import (
    Finish,
    GenerateOptions,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    ToolSchema,
    assistant_message,
    user_message,
)
from dsh_core._content import Message, ModelSource, ToolSource
from dsh_llm_openai import OpenAIAdapter, OpenAIConfig
from dsh_llm_openai.testing import ChatCompletionsServer, Reply, chunk, text_reply

pytestmark = pytest.mark.usefixtures("both_transports")

KEY = "sk-test-0123456789abcdefXYZ"
BAD = "x\ud800y"  # a lone surrogate: valid in a Python str and in escaped JSON, not in UTF-8


@pytest.fixture
def server() -> Iterator[ChatCompletionsServer]:
    with ChatCompletionsServer() as srv:
        yield srv


def adapter(server: ChatCompletionsServer, **config: Any) -> OpenAIAdapter:
    config.setdefault("api_key", KEY)
    config.setdefault("max_retries", 0)
    return OpenAIAdapter(OpenAIConfig(base_url=server.base_url, **config))


def poisoned(text: str = BAD) -> GenerateOptions:
    """A request with ``text`` in every place text can be: system prompt, user, assistant
    text and tool-call arguments, tool result, tool schema description and property name."""
    args = json.dumps({"q": text}, ensure_ascii=False)  # the raw text, not a JSON escape
    call = ToolCallBlock(id="call-1", name="lookup", arguments=args)
    history = (
        user_message(f"find {text}"),
        assistant_message(
            (TextBlock(text=f"Looking {text}."), call),
            source=ModelSource(provider="openai", model="m"),
        ),
        Message(
            id="r1",
            role="tool",
            content=(
                ToolResultBlock(tool_call_id="call-1", content=(TextBlock(text=f"no {text}"),)),
            ),
            source=ToolSource(call_id="call-1"),
        ),
    )
    tool = ToolSchema(
        name="lookup",
        description=f"Look {text} up.",
        parameters={"type": "object", "properties": {text: {"type": "string"}}},
    )
    return GenerateOptions(
        provider="openai",
        model="loopback-model",
        messages=history,
        system=f"Be {text}.",
        tools=(tool,),
    )


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "dsh.llm_openai"]


async def test_a_lone_surrogate_anywhere_in_a_request_goes_out_replaced_with_one_warning(
    server: ChatCompletionsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """ROB-50: a lone surrogate in the system prompt, a message, a tool call, a tool result
    or a tool schema no longer fails the request: it goes out with U+FFFD in its place, and
    the adapter warns once however many requests carry one."""
    server.add(text_reply("one"), text_reply("two"))
    a = adapter(server)
    caplog.set_level(logging.WARNING, logger="dsh.llm_openai")
    try:
        for _ in range(2):
            chunks = [c async for c in a.stream(poisoned())]
            assert isinstance(chunks[-1], Finish) and chunks[-1].reason == "stop", chunks[-1]
    finally:
        await a.aclose()
    assert len(server.requests) == 2
    for seen in server.requests:
        assert seen.headers["content-type"] == "application/json"
        wire = json.dumps(seen.body, ensure_ascii=False)
        assert "\ud800" not in wire
        assert wire.count("x\ufffdy") == 7, wire  # system, user, text, args, result, 2 in tool
    (warned,) = warnings_of(caplog)
    assert warned.levelno == logging.WARNING and "U+FFFD" in warned.getMessage()


async def test_a_surrogate_pair_goes_out_as_the_character_it_spells(
    server: ChatCompletionsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """ROB-50: two surrogates that spell one character (as a UTF-16 source leaves them) go
    out as that character; only lone ones are replaced."""
    a = adapter(server)
    try:
        chunks = [c async for c in a.stream(poisoned("a\ud83d\ude00b\udcffc"))]
    finally:
        await a.aclose()
    assert isinstance(chunks[-1], Finish) and chunks[-1].reason == "stop", chunks[-1]
    (seen,) = server.requests
    assert seen.body["messages"][0]["content"] == "Be a\U0001f600b\ufffdc."


async def test_clean_requests_do_not_warn(
    server: ChatCompletionsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """ROB-50: a request with nothing to replace goes out unchanged and says nothing."""
    a = adapter(server)
    caplog.set_level(logging.DEBUG, logger="dsh.llm_openai")
    try:
        chunks = [c async for c in a.stream(poisoned("café → ok"))]
    finally:
        await a.aclose()
    assert isinstance(chunks[-1], Finish) and chunks[-1].reason == "stop"
    (seen,) = server.requests
    assert seen.body["messages"][0]["content"] == "Be café → ok."
    assert warnings_of(caplog) == []


async def test_lone_surrogates_coming_back_are_taken_as_they_come(
    server: ChatCompletionsServer,
) -> None:
    """ROB-51: an endpoint's escaped lone surrogate (in text and in tool-call arguments)
    reaches the chunks as it was sent; the stream finishes normally."""
    server.add(
        Reply(
            chunks=(
                chunk(content=f"say {BAD}"),
                chunk(
                    tool_calls=[
                        {
                            "index": 0,
                            "id": "c1",
                            "function": {"name": "t", "arguments": json.dumps({"a": BAD})},
                        }
                    ]
                ),
                chunk(finish_reason="tool_calls"),
            )
        )
    )
    a = adapter(server)
    try:
        chunks = [c async for c in a.stream(poisoned("plain"))]
    finally:
        await a.aclose()
    assert isinstance(chunks[-1], Finish) and chunks[-1].reason == "tool-calls", chunks[-1]
    texts = "".join(getattr(c, "text", "") for c in chunks)
    args = "".join(getattr(c, "arguments_delta", "") for c in chunks)
    assert texts == f"say {BAD}"
    assert json.loads(args) == {"a": BAD}


@pytest.mark.parametrize("key", ["sk-caf\u00e9", "sk-x\udcff", "sk-a\nb"])
async def test_an_api_key_that_cannot_go_in_a_header_fails_without_sending(
    server: ChatCompletionsServer, key: str
) -> None:
    """ROB-52: an API key that is not printable ASCII (a non-ASCII character, an undecodable
    byte from the environment, a line break) fails every request with `BAD_API_KEY`; the
    endpoint is never called and no part of the key is shown."""
    a = adapter(server, api_key=key)
    try:
        chunks = [c async for c in a.stream(poisoned("plain"))]
    finally:
        await a.aclose()
    finish = chunks[-1]
    assert isinstance(finish, Finish) and finish.failure is not None
    assert finish.reason == "error" and finish.failure.code == "BAD_API_KEY"
    assert "sk-" not in finish.failure.message and key[3:] not in finish.failure.message
    assert "`api_key`" in finish.failure.message  # where the key came from, never what it is
    assert server.requests == []
