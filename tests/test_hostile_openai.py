"""A hostile model through the real dsh-llm-openai adapter (ROB-18).

The same random tool calls as ``test_hostile_model.py`` (ROB-15), but streamed by the loopback
chat-completions server: each call's raw argument text goes out in ``function.arguments``
deltas as an endpoint would send it (lone surrogates escaped as ``\\ud800`` on the JSON wire,
NUL, deep nesting, huge text, no JSON at all), so every agent of the tree runs on the adapter
and every request it makes crosses the wire. After every turn: each turn ended with a
documented reason (the lead's ``completed``), every request the server received is strict
UTF-8 JSON in which each assistant tool call has its tool result before the next assistant
message, and at the end every session's JSONL log reads back equal to the live one.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh_core import PluginRow
from dsh_core.testing import ScriptedToolCall, default_options, scripted_host
from dsh_llm_openai import plugin as openai_plugin
from dsh_llm_openai.testing import ChatCompletionsServer, RecordedRequest, Reply, chunk, text_reply


def _shared() -> ModuleType:
    """The strategies and checks of ``test_hostile_model.py`` (a test file, not a package)."""
    name = "hostile_model_shared"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).with_name("test_hostile_model.py")
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


H = _shared()
OPENAI = default_options(provider="openai", model="loopback-model")
KEY = "sk-hostile-test-key-0123456789"
#: The default run stays short; `nox -s thorough` (its profile: 2000 examples) runs 2000.
EXAMPLES = 2000 if settings.default.max_examples >= 2000 else 6
USAGE = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}


class _Server(ChatCompletionsServer):
    """The loopback server, each reply computed from the request it answers."""

    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.answer = answer
        self.failures: list[BaseException] = []

    def _next(self, request: RecordedRequest) -> Reply:
        super()._next(request)
        try:
            reply: Reply = self.answer(request.body)
        except Exception as exc:  # surfaced by the test, not lost in the server thread
            self.failures.append(exc)
            raise
        return reply


def _tool_calls_reply(calls: list[ScriptedToolCall], ids: Any) -> Reply:
    """``calls`` streamed as tool-call deltas: id and name with the first half of the raw
    argument text, then the rest, then ``tool_calls`` and usage."""
    chunks: list[dict[str, Any]] = []
    for index, call in enumerate(calls):
        raw, half = call.arguments, len(call.arguments) // 2
        first = {"name": call.name, "arguments": raw[:half]}
        chunks.append(
            chunk(
                tool_calls=[
                    {"index": index, "id": next(ids), "type": "function", "function": first}
                ]
            )
        )
        chunks.append(chunk(tool_calls=[{"index": index, "function": {"arguments": raw[half:]}}]))
    chunks.append(chunk(finish_reason="tool_calls"))
    chunks.append(chunk(usage=USAGE))
    return Reply(chunks=tuple(chunks))


def _check_wire(request: RecordedRequest) -> None:
    """The request is strict UTF-8 JSON, and each assistant tool call has its tool result
    before the next assistant message (what an endpoint needs to accept it)."""
    body = json.loads(request.raw.decode("utf-8", errors="strict"))
    messages = body["messages"]
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or not message.get("tool_calls"):
            continue
        wanted = {call["id"] for call in message["tool_calls"]}
        answered: set[str] = set()
        for later in itertools.takewhile(lambda m: m["role"] != "assistant", messages[i + 1 :]):
            if later["role"] == "tool":
                answered.add(later["tool_call_id"])
        assert wanted <= answered, (wanted - answered, i)


async def _scenario(turns: list[list[ScriptedToolCall]], child_report: str) -> None:
    prompts = {f"turn {i}": calls for i, calls in enumerate(turns)}
    ids = (f"call_{n}" for n in itertools.count())
    children: list[str] = []

    def answer(body: Any) -> Reply:
        messages = body["messages"]
        users = [m["content"] for m in messages if m["role"] == "user"]
        last = messages[-1]["role"]
        if not users or users[0] != "turn 0":  # a child: report once, then answer
            if last == "tool":
                return text_reply("child done", usage=USAGE)
            report = ScriptedToolCall(name="report", arguments=H._expand(child_report, "nobody"))
            return _tool_calls_reply([report], ids)
        if last == "tool":
            return text_reply("done", usage=USAGE)
        calls = prompts.get(users[-1])
        if calls is None or last != "user":
            return text_reply("ok", usage=USAGE)
        child = children[-1] if children else "nobody"
        expanded = [attrs.evolve(c, arguments=H._expand(c.arguments, child)) for c in calls]
        return _tool_calls_reply(expanded, ids)

    row = PluginRow(plugin="llm-openai", config={"base_url": "", "api_key": KEY, "max_retries": 0})
    with _Server(answer) as server, tempfile.TemporaryDirectory() as tmp:
        row = attrs.evolve(row, config={**row.config, "base_url": server.base_url})
        async with scripted_host(
            *H.ROWS,
            row,
            load=H.LOAD,
            modules={"llm-openai": openai_plugin},
            store="jsonl",
            store_root=Path(tmp),
        ) as host:
            watch = H._Watch(host)
            children = watch.children
            handle = await host.create_agent(session_id="lead", options=OPENAI)
            for prompt in prompts:
                async with asyncio.timeout(30):
                    await host.run(handle.agent, prompt)
                    await watch.quiet(host)
                assert server.failures == []
                for request in list(server.requests):
                    _check_wire(request)
                for session in watch.by_id.values():
                    H._check_requests(session)
                kinds = {kind for _, kind in watch.ends}
                assert kinds <= H.DOCUMENTED, kinds
                assert all(kind == "completed" for sid, kind in watch.ends if sid == "lead")
            async with asyncio.timeout(30):
                await handle.dispose()
                await watch.quiet(host)
            persistence = host.ctx.session_persistence
            for session in watch.by_id.values():
                _, stored = await persistence.load(session.id)
                assert stored == tuple(session.events), session.id


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(turns=st.lists(H._calls, min_size=1, max_size=2), child_report=H._raw_for("report"))
async def test_a_hostile_model_on_the_openai_adapter_keeps_every_request_well_formed(
    turns: list[list[ScriptedToolCall]], child_report: str
) -> None:
    """ROB-18: random tool calls with hostile raw argument text, streamed by an endpoint to
    the real adapter: each turn ends with a documented reason (the lead's `completed`), every
    request sent is strict UTF-8 JSON with every tool call answered, and every JSONL log
    reads back equal to the live one."""
    await _scenario(turns, child_report)
