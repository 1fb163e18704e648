"""The `llm-openai` row in a host: config, the agent loop, the session log (llm-openai 17.1)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core import (
    AgentCancelCause,
    BlockAssembler,
    GenerateOptions,
    PluginError,
    PluginRow,
    TextBlock,
    ToolCallBlock,
    ToolDefinition,
    dumps,
    unstructure,
    user_message,
)
from dsh_core.testing import TestHost, default_options
from dsh_llm_openai import OpenAIAdapter, OpenAIConfig
from dsh_llm_openai import plugin as openai_plugin
from dsh_llm_openai.testing import ChatCompletionsServer, Reply, chunk, text_reply

pytestmark = pytest.mark.usefixtures("both_transports")

KEY = "sk-plugin-test-key-0123456789"
OPENAI = default_options(provider="openai", model="loopback-model")


@pytest.fixture
def server() -> Iterator[ChatCompletionsServer]:
    with ChatCompletionsServer() as srv:
        yield srv


async def host_with(server: ChatCompletionsServer, **config: Any) -> TestHost:
    row = PluginRow(
        plugin="llm-openai",
        config={"base_url": server.base_url, "api_key": KEY, "max_retries": 0, **config},
    )
    return await TestHost.start(row, modules={"llm-openai": openai_plugin})


async def test_the_row_routes_its_provider_to_the_adapter(server: ChatCompletionsServer) -> None:
    """host-core §2, llm-openai 17.1: a mounted row registers its `provider` (default
    `openai`); an agent on that route answers from the endpoint."""
    server.add(text_reply("Hello from the endpoint.", pieces=4))
    async with await host_with(server) as host:
        assert isinstance(host.ctx.llm.adapter("openai"), OpenAIAdapter)
        handle = await host.create_agent(options=OPENAI)
        assert await host.run(handle.agent, "hi") == "Hello from the endpoint."
        await handle.dispose()
    assert server.requests[0].body["messages"][-1] == {"role": "user", "content": "hi"}


async def test_a_tool_call_round_trips_through_the_loop(server: ChatCompletionsServer) -> None:
    """host-core §2/§9, llm-openai 17.1: the model's streamed tool call runs, and the next
    request carries the assistant's call and the tool's result in the wire shape."""
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add"}}
    server.add(
        Reply(
            chunks=(
                chunk(tool_calls=[{**call, "function": {"name": "add", "arguments": '{"a": 2,'}}]),
                chunk(tool_calls=[{"index": 0, "function": {"arguments": ' "b": 3}'}}]),
                chunk(finish_reason="tool_calls"),
            )
        ),
        text_reply("The sum is 5."),
    )

    async def add(arguments: Any, run: Any) -> str:
        return str(arguments["a"] + arguments["b"])

    async with await host_with(server) as host:
        host.ctx.tools.register(
            ToolDefinition(name="add", description="Add two numbers.", execute=add)
        )
        handle = await host.create_agent(options=OPENAI)
        assert await host.run(handle.agent, "2+3?") == "The sum is 5."
        await handle.dispose()
    second = server.requests[1].body
    assert "add" in [t["function"]["name"] for t in second["tools"]]
    assert second["messages"][-2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]


async def test_cancelling_a_turn_closes_the_http_stream(server: ChatCompletionsServer) -> None:
    """host-core §9, llm-openai 17.1/17.2: cancelling an agent mid-stream ends the turn
    `aborted` and closes the HTTP stream at once: the server sees the connection go."""
    server.add(Reply(chunks=(chunk(content="Partial answer"),), hold=30))
    async with await host_with(server) as host:
        handle = await host.create_agent(options=OPENAI)
        agent = handle.agent
        agent.followup(user_message("go"))
        await asyncio.to_thread(server.responding.wait, 10)
        agent.cancel(AgentCancelCause(kind="user"))
        await agent.when_idle()
        assert await asyncio.to_thread(server.disconnected.wait, 10)
        ends = [e for e in agent.session.events if e.type == "turn/end"]
        assert ends[-1].data.reason.kind == "aborted"
        await handle.dispose()


async def test_the_key_never_reaches_the_session_log(server: ChatCompletionsServer) -> None:
    """llm-openai 17.1: a 401 whose body echoes the key fails the turn; the failure in the
    log names AUTHENTICATION, and no event of the log holds the key."""
    server.add(Reply(status=401, error={"message": f"Incorrect API key provided: {KEY}"}))
    async with await host_with(server) as host:
        handle = await host.create_agent(options=OPENAI)
        await host.run(handle.agent, "hi")
        log = json.dumps([unstructure(e) for e in handle.agent.session.events])
        assert "AUTHENTICATION" in log
        assert KEY not in log and KEY[:8] not in log
        await handle.dispose()


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"base_url": "localhost:11434"}, ["plugins[", "'llm-openai'", "base_url"]),
        ({"timeout": 0}, ["'llm-openai'", "timeout"]),
        ({"max_retries": -1}, ["max_retries"]),
        ({"max_retries": "3"}, ["max_retries", "int"]),
        ({"api_kee": "x"}, ["api_kee", "unknown"]),
        ({"max_tokens_field": "tokens"}, ["max_tokens_field"]),
        ({"max_retries": 11}, ["'max_retries' must be from 0 to 10, got 11"]),
        ({"base_url": "http://localhost:99999/v1"}, ["base_url", "port from 1 to 65535"]),
        ({"base_url": "http://localhost:0/v1"}, ["base_url", "port from 1 to 65535"]),
        ({"base_url": "http://localhost:x/v1"}, ["base_url", "port from 1 to 65535"]),
        ({"base_url": "http://user@/v1"}, ["base_url", "with a host"]),
        ({"headers": {"X Team": "a"}}, ["key 'headers.X Team': not an HTTP header name"]),
        ({"headers": {"X:Team": "a"}}, ["key 'headers.X:Team': not an HTTP header name"]),
        ({"headers": {"": "a"}}, ["key 'headers.': not an HTTP header name"]),
        ({"headers": {"X-Team": "s3cret\r\nX-Evil: 1"}}, ["key 'headers.X-Team': the value"]),
        ({"headers": {"X-Team": "s3cret\n"}}, ["key 'headers.X-Team': the value", "LF"]),
        ({"headers": {"X-Team": "s3cret\0"}}, ["key 'headers.X-Team': the value", "NUL"]),
        ({"headers": {"X-Team": "s3cr\u00e9t"}}, ["key 'headers.X-Team': the value", "ASCII"]),
    ],
)
async def test_a_bad_config_fails_the_boot_naming_the_row_and_key(
    config: dict[str, Any], words: list[str]
) -> None:
    """llm-openai 17.3: a wrong key or value fails with PLUGIN_CONFIG naming the row, the
    plugin and the key: a base_url without a host or with a port outside 1-65535, more than 10
    retries, a header name that is not a token or a value that is not printable ASCII (the
    value itself is never shown: it may be a secret)."""
    with pytest.raises(PluginError) as caught:
        await TestHost.start(
            PluginRow(plugin="llm-openai", config=config), modules={"llm-openai": openai_plugin}
        )
    assert caught.value.code == "PLUGIN_CONFIG"
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))
    assert "s3cr" not in str(caught.value)


def test_the_value_checks_leave_what_an_endpoint_takes() -> None:
    """llm-openai 17.3: the checks refuse only what cannot go out: an IPv6 host with a port, a
    header value with spaces and tabs, and 10 retries are taken."""
    config = OpenAIConfig(
        base_url="https://[::1]:8443/v1",
        headers={"X-Team_1": "a b\tc", "OpenAI-Organization": "org-1"},
        max_retries=10,
    )
    assert (config.max_retries, config.headers["X-Team_1"]) == (10, "a b\tc")


# -- chunk mapping, whatever the split ----------------------------------------------------------


class _Objects:
    """An SDK stream stand-in: the endpoint's chunk objects, in order."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects

    async def _gen(self) -> AsyncIterator[dict[str, Any]]:
        for o in self.objects:
            yield o

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._gen()

    async def close(self) -> None:
        pass


class _Client:
    """A transport stand-in (builtin or SDK) whose one request streams ``objects``."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects

    async def post(self, path: str, **_: Any) -> _Objects:
        return _Objects(self.objects)

    async def open(self, body: bytes) -> _Objects:
        return _Objects(self.objects)


def _pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points) if b > a]


@given(
    text=st.text(min_size=1, max_size=30),
    arguments=st.dictionaries(st.text(max_size=5), st.integers(), max_size=4).map(dumps),
    text_cuts=st.lists(st.integers(0, 40), max_size=6),
    arg_cuts=st.lists(st.integers(0, 60), max_size=8),
)
async def test_any_split_of_text_and_arguments_assembles_the_same_blocks(
    text: str, arguments: str, text_cuts: list[int], arg_cuts: list[int]
) -> None:
    """host-core §2, llm-openai 17.1: however an endpoint splits the text and a tool call's
    arguments across chunks, the blocks are the same and the arguments stay the raw JSON."""
    objects = [chunk(content=p) for p in _pieces(text, text_cuts)]
    head = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f"}}
    objects.append(chunk(tool_calls=[head]))
    objects += [
        chunk(tool_calls=[{"index": 0, "function": {"arguments": p}}])
        for p in _pieces(arguments, arg_cuts)
    ]
    objects.append(chunk(finish_reason="tool_calls"))
    adapter = OpenAIAdapter(OpenAIConfig(api_key="k"))
    adapter._client = _Client(objects)  # the mapping alone: no HTTP
    asm = BlockAssembler()
    request = GenerateOptions(provider="openai", model="m", messages=(user_message("hi"),))
    async for c in adapter.stream(request):
        asm.add(c)
    assert asm.blocks() == (
        TextBlock(text=text),
        ToolCallBlock(id="c1", name="f", arguments=arguments),
    )
    assert asm.finish is not None and asm.finish.reason == "tool-calls"


def test_the_config_reads_the_key_from_the_named_variable() -> None:
    """llm-openai 17.1: `api_key` wins; else the variable `api_key_env` names; empty is none."""
    assert OpenAIConfig(api_key="a").resolved_key({"OPENAI_API_KEY": "b"}) == "a"
    assert OpenAIConfig().resolved_key({"OPENAI_API_KEY": "b"}) == "b"
    assert OpenAIConfig(api_key_env="K").resolved_key({"K": ""}) is None
