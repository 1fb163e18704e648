"""The offline scripted model: callables, reply lists, echo, script files (host-core §2)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_core import (
    MESSAGE_BLOCK_SEPARATOR,
    AbortController,
    Finish,
    LlmError,
    LlmFailure,
    Message,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallDelta,
    ToolResultBlock,
    ToolSchema,
    ToolSource,
    UsageChunk,
    user_message,
)
from dsh_core._llm import GenerateOptions
from dsh_core._scripted import ScriptError
from dsh_core.testing import ScriptedAdapter, ScriptedReply, ScriptedRequest, ScriptedToolCall


def options(
    *messages: Message,
    system: str | None = None,
    tools: tuple[str, ...] = (),
    signal: Any = None,
) -> GenerateOptions:
    return GenerateOptions(
        provider="scripted",
        model="m",
        messages=messages,
        system=system,
        tools=tuple(ToolSchema(name=t, description=t, parameters={}) for t in tools) or None,
        signal=signal,
    )


async def run(adapter: ScriptedAdapter, opts: GenerateOptions) -> list[StreamChunk]:
    stream: AsyncIterator[StreamChunk] = adapter.stream(opts)
    return [chunk async for chunk in stream]


def text_of(chunks: list[StreamChunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta))


def tool_result(call_id: str, text: str) -> Message:
    return Message(
        id=f"r-{call_id}",
        role="tool",
        content=(ToolResultBlock(tool_call_id=call_id, content=(TextBlock(text=text),)),),
        source=ToolSource(call_id=call_id),
    )


# -- constructors -----------------------------------------------------------------------------


async def test_callable_script_sees_each_request_with_its_index() -> None:
    """host-core §2: a script callable sees each request and its index; requests are recorded."""
    seen: list[tuple[int, str]] = []

    def script(request: ScriptedRequest) -> str:
        seen.append((request.index, request.last_user_text))
        return f"reply {request.index}"

    adapter = ScriptedAdapter(script)
    first = await run(adapter, options(user_message("one")))
    second = await run(adapter, options(user_message("two")))
    assert text_of(first) == "reply 0"
    assert text_of(second) == "reply 1"
    assert first[-1] == Finish(reason="stop")
    assert seen == [(0, "one"), (1, "two")]
    assert len(adapter.requests) == 2


async def test_async_callable_script_may_return_a_full_reply() -> None:
    """host-core §2: an async script returning ScriptedReply drives reasoning, text and usage."""
    usage = TokenUsage(input_tokens=1, output_tokens=2)

    async def script(request: ScriptedRequest) -> ScriptedReply:
        return ScriptedReply(reasoning="hmm", text="answer", usage=usage)

    chunks = await run(ScriptedAdapter(script), options(user_message("q")))
    assert chunks == [
        ReasoningDelta(index=0, text="hmm"),
        TextDelta(index=1, text="answer"),
        UsageChunk(usage=usage),
        Finish(reason="stop"),
    ]


async def test_replies_are_served_in_order_then_exhaust_with_an_error_finish() -> None:
    """host-core §2: replies() serves one reply per request; running out is SCRIPT_EXHAUSTED."""
    adapter = ScriptedAdapter.replies("first", ScriptedReply(text="second"))
    assert text_of(await run(adapter, options(user_message("a")))) == "first"
    assert text_of(await run(adapter, options(user_message("b")))) == "second"
    last = (await run(adapter, options(user_message("c"))))[-1]
    assert isinstance(last, Finish) and last.reason == "error"
    assert last.failure is not None and last.failure.code == "SCRIPT_EXHAUSTED"


async def test_echo_answers_the_latest_user_text_with_a_prefix() -> None:
    """host-core §2: echo() answers prefix + the latest user-role text."""
    adapter = ScriptedAdapter.echo("you said: ")
    chunks = await run(adapter, options(user_message("old"), user_message("new")))
    assert text_of(chunks) == "you said: new"


async def test_tool_calls_stream_raw_json_arguments_and_finish_tool_calls() -> None:
    """host-core §2: scripted tool calls become ToolCallDeltas with raw JSON; finish tool-calls."""
    adapter = ScriptedAdapter.replies(
        ScriptedReply(
            text="calling",
            tool_calls=(
                ScriptedToolCall(name="grep", arguments={"q": "x"}, id="c1"),
                ScriptedToolCall(name="raw", arguments='{"bad json'),
            ),
        )
    )
    chunks = await run(adapter, options(user_message("go")))
    calls = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert calls[0] == ToolCallDelta(index=1, id="c1", name="grep", arguments_delta='{"q":"x"}')
    assert calls[1].name == "raw" and calls[1].arguments_delta == '{"bad json'
    assert calls[1].id  # a fresh id is minted
    assert chunks[-1] == Finish(reason="tool-calls")


async def test_failure_ends_with_an_error_finish_or_raises_llm_error() -> None:
    """host-core §2: a provider failure is an error finish, or LlmError with raise_failure."""
    failure = LlmFailure(message="boom", code="HTTP_500", status=500)
    finishing = ScriptedAdapter.replies(ScriptedReply(text="part", failure=failure))
    chunks = await run(finishing, options(user_message("x")))
    assert chunks == [TextDelta(index=0, text="part"), Finish(reason="error", failure=failure)]
    raising = ScriptedAdapter.replies(ScriptedReply(failure=failure, raise_failure=True))
    with pytest.raises(LlmError) as err:
        await run(raising, options(user_message("x")))
    assert err.value.failure == failure
    assert err.value.code == "HTTP_500"


async def test_wait_holds_the_request_until_the_gate_opens() -> None:
    """host-core §2: wait holds the request open (after the text) until it resolves."""
    gate = asyncio.Event()
    adapter = ScriptedAdapter.replies(ScriptedReply(text="held", wait=gate.wait))
    controller = AbortController()
    stream = adapter.stream(options(user_message("x"), signal=controller.signal))
    assert await anext(stream) == TextDelta(index=0, text="held")
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.wait((pending,), timeout=0)
    assert not pending.done()
    gate.set()
    assert await pending == Finish(reason="stop")


async def test_wait_finishes_aborted_when_the_request_signal_fires() -> None:
    """host-core §2: a held request whose signal fires finishes aborted."""
    adapter = ScriptedAdapter.replies(ScriptedReply(text="held", wait=asyncio.Event().wait))
    controller = AbortController()
    stream = adapter.stream(options(user_message("x"), signal=controller.signal))
    assert await anext(stream) == TextDelta(index=0, text="held")
    pending = asyncio.ensure_future(anext(stream))
    controller.abort("stop")
    finish = await pending
    assert isinstance(finish, Finish) and finish.reason == "aborted"
    assert [c async for c in stream] == []


async def test_a_consumer_that_stops_reading_cancels_the_held_wait() -> None:
    """host-core §1 (tasks are owned): cancelling a held request's reader cancels its wait."""
    entered, cancelled = asyncio.Event(), asyncio.Event()

    async def wait() -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    adapter = ScriptedAdapter.replies(ScriptedReply(text="held", wait=wait))
    stream = adapter.stream(options(user_message("x"), signal=AbortController().signal))
    assert await anext(stream) == TextDelta(index=0, text="held")
    reader = asyncio.ensure_future(anext(stream))
    await entered.wait()
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    async with asyncio.timeout(5):
        await cancelled.wait()


async def test_exact_chunks_replace_the_generated_stream() -> None:
    """host-core §2: ScriptedReply(chunks=...) streams exactly those chunks."""
    exact = (TextDelta(index=0, text="x"),)
    chunks = await run(ScriptedAdapter.replies(ScriptedReply(chunks=exact)), options())
    assert chunks == list(exact)


# -- script files -----------------------------------------------------------------------------

RULES: dict[str, Any] = {
    "rules": [
        {"when": {"last_user": "^weather"}, "reply": {"text": "sunny, you asked {{last_user}}"}},
        {
            "when": {"last_role": "tool"},
            "reply": {"text": "the tool said {{last_tool_result}}"},
        },
        {"when": {"tool": "grep", "system": "search"}, "reply": {"tool_calls": [{"name": "grep"}]}},
        {"when": {"last_user": "explode"}, "reply": {"error": {"message": "no", "code": "X"}}},
    ],
    "default": "default reply",
}

TOML_RULES = """
default = "default reply"

[[rules]]
when = { last_user = "^weather" }
reply = { text = "sunny, you asked {{last_user}}" }

[[rules]]
when = { last_role = "tool" }
reply = { text = "the tool said {{last_tool_result}}" }

[[rules]]
when = { tool = "grep", system = "search" }
reply = { tool_calls = [{ name = "grep" }] }

[[rules]]
when = { last_user = "explode" }
reply = { error = { message = "no", code = "X" } }
"""


@pytest.fixture(params=["json", "toml"])
def script_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The same rules as a JSON and as a TOML script file."""
    if request.param == "json":
        path = tmp_path / "script.json"
        path.write_text(json.dumps(RULES), encoding="utf-8")
    else:
        path = tmp_path / "script.toml"
        path.write_text(TOML_RULES, encoding="utf-8")
    return path


async def test_script_file_rules_default_and_templating(script_file: Path) -> None:
    """host-core §2: JSON/TOML scripts: first matching rule, else default; {{...}} templating."""
    adapter = ScriptedAdapter.from_file(script_file)
    weather = await run(adapter, options(user_message("weather today?")))
    assert text_of(weather) == "sunny, you asked weather today?"
    tool = await run(adapter, options(user_message("q"), tool_result("c1", "42 lines")))
    assert text_of(tool) == "the tool said 42 lines"
    call = await run(adapter, options(user_message("find"), system="you search", tools=("grep",)))
    assert [c.name for c in call if isinstance(c, ToolCallDelta)] == ["grep"]
    no_tool = await run(adapter, options(user_message("find"), system="you search"))
    assert text_of(no_tool) == "default reply"
    failed = (await run(adapter, options(user_message("explode"))))[-1]
    assert failed == Finish(reason="error", failure=LlmFailure(message="no", code="X"))


async def test_script_without_default_fails_unmatched_requests() -> None:
    """host-core §2: with no rule matching and no default the reply is SCRIPT_NO_MATCH."""
    adapter = ScriptedAdapter.from_data({"rules": [{"when": {"last_user": "x"}, "reply": "y"}]})
    last = (await run(adapter, options(user_message("nope"))))[-1]
    assert isinstance(last, Finish) and last.failure is not None
    assert last.failure.code == "SCRIPT_NO_MATCH"


async def test_script_file_tool_call_keeps_its_id() -> None:
    """host-core §2: a scripted tool call's `id` (an accepted key) reaches the stream."""
    adapter = ScriptedAdapter.from_data(
        {"default": {"tool_calls": [{"name": "grep", "arguments": {"q": 1}, "id": "fixed"}]}}
    )
    calls = [c for c in await run(adapter, options()) if isinstance(c, ToolCallDelta)]
    assert calls == [ToolCallDelta(index=0, id="fixed", name="grep", arguments_delta='{"q":1}')]


@pytest.mark.parametrize(
    "data",
    [
        pytest.param({"rules": [], "extra": 1}, id="unknown-top-level-key"),
        pytest.param({"rules": [{"when": {}}]}, id="rule-without-reply"),
        pytest.param({"rules": [{"reply": "x", "then": 1}]}, id="unknown-rule-key"),
        pytest.param({"rules": [{"when": {"who": "x"}, "reply": "x"}]}, id="unknown-when-key"),
        pytest.param({"rules": [{"when": {"last_user": "("}, "reply": "x"}]}, id="bad-regex"),
        pytest.param({"rules": [{"when": {"last_role": "usr"}, "reply": "x"}]}, id="bad-role"),
        pytest.param({"rules": ["x"]}, id="rule-not-a-table"),
        pytest.param({"default": {"txt": "x"}}, id="unknown-reply-key"),
        pytest.param({"default": 3}, id="reply-not-text-or-table"),
        pytest.param({"default": {"text": 3}}, id="text-not-a-string"),
        pytest.param({"default": {"reasoning": ["a"]}}, id="reasoning-not-a-string"),
        pytest.param({"default": {"finish": "aborted"}}, id="bad-finish"),
        pytest.param({"default": {"tool_calls": [{"arguments": {}}]}}, id="call-without-name"),
        pytest.param({"default": {"tool_calls": ["grep"]}}, id="call-not-a-table"),
        pytest.param({"default": {"error": "boom"}}, id="error-not-a-table"),
        pytest.param(
            {"rules": [{"when": {"unanswered": "(?P<last_user>x)"}, "reply": "x"}]},
            id="group-named-like-a-built-in",
        ),
        pytest.param({"rules": [{"when": {"last_tool_result": "["}, "reply": "x"}]}, id="bad-re"),
        # a wrong type is refused, never converted nor left to fail at request time
        pytest.param({"rules": 5}, id="rules-not-a-list"),
        pytest.param({"rules": "ab"}, id="rules-a-string"),
        pytest.param({"default": {"tool_calls": 5}}, id="calls-not-a-list"),
        pytest.param({"default": {"tool_calls": [{"name": 3}]}}, id="call-name-a-number"),
        pytest.param({"default": {"tool_calls": [{"name": ""}]}}, id="call-name-empty"),
        pytest.param({"default": {"tool_calls": [{"name": "t", "arguments": 5}]}}, id="args-5"),
        pytest.param(
            {"default": {"tool_calls": [{"name": "t", "arguments": {"d": date(2024, 1, 1)}}]}},
            id="args-a-toml-date",
        ),
        pytest.param({"rules": [{"when": {"last_role": []}, "reply": "x"}]}, id="role-a-list"),
        pytest.param({"rules": [{"when": {"last_user": 5}, "reply": "x"}]}, id="regex-a-number"),
        pytest.param({"rules": [{"when": {"tool": ["a"]}, "reply": "x"}]}, id="tool-a-list"),
        pytest.param({"default": {"error": {"message": 5}}}, id="error-message-a-number"),
        pytest.param({"default": {"error": {"reason": "x"}}}, id="error-unknown-key"),
    ],
)
def test_malformed_script_data_is_script_invalid(data: dict[str, Any]) -> None:
    """host-core §2: a malformed script fails SCRIPT_INVALID when loaded, never at request time."""
    with pytest.raises(ScriptError) as err:
        ScriptedAdapter.from_data(data)
    assert err.value.code == "SCRIPT_INVALID"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("broken.json", "{not json"),
        ("broken.toml", "rules = [ {"),
        ("list.json", "[1, 2]"),
        ("deep.json", '{"rules": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        ("deep.toml", "rules = " + "[" * 100_000 + "]" * 100_000),
        ("latin1.toml", "default = 'caf\xe9'"),
    ],
)
def test_unreadable_script_files_are_script_invalid(tmp_path: Path, name: str, text: str) -> None:
    """host-core §2: invalid JSON/TOML, a non-object script, one nested too deep to parse, one
    not in UTF-8, or a missing file is SCRIPT_INVALID."""
    path = tmp_path / name
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ScriptError) as err:
        ScriptedAdapter.from_file(path)
    assert err.value.code == "SCRIPT_INVALID"
    with pytest.raises(ScriptError):
        ScriptedAdapter.from_file(tmp_path / "missing.json")


@pytest.mark.parametrize("record", [True, False])
async def test_recording_requests_is_optional_and_indexes_count_either_way(record: bool) -> None:
    """host-core §2: record=False keeps no request history; request indexes still count."""
    seen: list[int] = []

    def script(request: ScriptedRequest) -> str:
        seen.append(request.index)
        return "ok"

    adapter = ScriptedAdapter(script, record=record)
    for _ in range(3):
        await run(adapter, options(user_message("hi")))
    assert seen == [0, 1, 2]
    assert len(adapter.requests) == (3 if record else 0)
    assert ScriptedAdapter.echo(record=False)._record is False
    assert ScriptedAdapter.replies("a", record=False)._record is False


async def test_every_reply_path_streams_the_same_chunks() -> None:
    """host-core §2: a reply streams the same chunks whether its script is synchronous (list
    replay), awaitable (generator) or the reply waits first."""
    usage = TokenUsage(input_tokens=3, output_tokens=4)

    async def nothing() -> None:
        return None

    def reply(**extra: Any) -> ScriptedReply:
        return ScriptedReply(
            reasoning="think",
            text="say",
            tool_calls=(ScriptedToolCall(name="t", arguments={"a": 1}, id="c1"),),
            usage=usage,
            **extra,
        )

    async def later(request: ScriptedRequest) -> ScriptedReply:
        return reply()

    sync = await run(ScriptedAdapter(lambda r: reply()), options(user_message("hi")))
    awaited = await run(ScriptedAdapter(later), options(user_message("hi")))
    waiting = await run(ScriptedAdapter(lambda r: reply(wait=nothing)), options(user_message("hi")))
    assert sync == awaited == waiting
    assert [type(c).__name__ for c in sync] == [
        "ReasoningDelta",
        "TextDelta",
        "ToolCallDelta",
        "UsageChunk",
        "Finish",
    ]
    failing = ScriptedAdapter(
        lambda r: ScriptedReply(failure=LlmFailure(message="x", code="X"), raise_failure=True)
    )
    stream = failing.stream(options(user_message("hi")))  # opening does not raise
    with pytest.raises(LlmError):
        await stream.__anext__()


async def test_generated_tool_call_ids_are_unique_within_and_across_responses() -> None:
    """host-core §2, hardening 11.11: every id the scripted model mints for a call is unique,
    among many calls of one response and across responses."""
    calls = tuple(ScriptedToolCall(name="t", arguments={"i": i}) for i in range(50))
    adapter = ScriptedAdapter(lambda r: ScriptedReply(tool_calls=calls))
    ids: list[str] = []
    for _ in range(3):
        chunks = await run(adapter, options(user_message("go")))
        ids += [c.id for c in chunks if isinstance(c, ToolCallDelta)]
    assert len(ids) == 150
    assert len(set(ids)) == 150
    assert all(i.startswith("call-") for i in ids)


async def test_an_agent_runs_two_id_less_calls_of_one_response() -> None:
    """host-core §3, hardening 11.11: two calls without ids in one response both run; the
    session log holds two distinct tool calls, not "tool call repeated"."""
    from dsh_core import ToolDefinition
    from dsh_core.testing import scripted_host

    async def echo(args: Any, run: Any) -> str:
        return str(args["n"])

    both = ScriptedReply(
        tool_calls=(
            ScriptedToolCall(name="echo", arguments={"n": 1}),
            ScriptedToolCall(name="echo", arguments={"n": 2}),
        )
    )
    async with scripted_host(model=[both, "done"]) as h:
        h.ctx.tools.register(
            ToolDefinition(name="echo", description="echo", parameters={}, execute=echo)
        )
        handle = await h.create_agent()
        assert await h.run(handle.agent, "go") == "done"
        calls = [e.data for e in handle.agent.session.events if e.type == "tool/call"]
        assert len({c.call_id for c in calls}) == 2


def assistant(text: str) -> Message:
    return Message(id=f"a-{text}", role="assistant", content=(TextBlock(text=text),))


NOTICE = "Background subagent s-1 finished and will do no further work unless you send it more."

COORDINATOR = """
default = "waiting"

[[rules]]
when = { unanswered = '(?s)^Background subagent (?P<child>\\S+) finished.*message:(?P<said>.*)' }
reply = { text = "{{child}} said {{said}}", tool_calls = [
  { name = "send_message", arguments = { subagent_id = "{{child}}", message = "more, {{said}}" } },
  { name = "raw", arguments = '{"id": "{{child}}", "q": "{{said}}", "keep": "{{unknown}}"}' },
] }

[[rules]]
when = { last_tool_result = '^started subagent (?P<id>\\S+)$', tool = "list_agents" }
reply = { tool_calls = [{ name = "list_agents", arguments = { note = ["{{id}}", 1] } }] }
"""


async def test_a_rule_reacts_to_a_tool_result_or_a_notice_with_what_it_captured(
    tmp_path: Path,
) -> None:
    """host-core §2, tools 15.5: `last_tool_result` matches the tool result the latest message
    is; `unanswered` matches any message after the latest assistant one (a notice in a
    batch); named groups fill `{{name}}` in text and in call arguments (raw JSON escaped),
    an unknown placeholder stays as written."""
    path = tmp_path / "coordinator.toml"
    path.write_text(COORDINATOR, encoding="utf-8")
    adapter = ScriptedAdapter.from_file(path)
    started = await run(
        adapter,
        options(
            user_message("go"), tool_result("c1", "started subagent s-9"), tools=("list_agents",)
        ),
    )
    (call,) = [c for c in started if isinstance(c, ToolCallDelta)]
    assert (call.name, json.loads(call.arguments_delta)) == ("list_agents", {"note": ["s-9", 1]})
    # A tool result that is not the latest message does not count for `last_tool_result`.
    answered = options(tool_result("c1", "started subagent s-9"), assistant("ok"))
    assert text_of(await run(adapter, answered)) == "waiting"
    notice = Message(
        id="n1",
        role="user",
        content=(TextBlock(text=NOTICE), TextBlock(text='Its closing message:"quoted"')),
    )
    batch = options(assistant("ok"), notice, user_message("and another thing"))
    chunks = await run(adapter, batch)
    assert text_of(chunks) == 's-1 said "quoted"'
    calls = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert json.loads(calls[0].arguments_delta) == {
        "subagent_id": "s-1",
        "message": 'more, "quoted"',
    }
    assert json.loads(calls[1].arguments_delta) == {
        "id": "s-1",
        "q": '"quoted"',
        "keep": "{{unknown}}",
    }
    # The notice already answered (an assistant message after it) matches no more.
    assert text_of(await run(adapter, options(notice, assistant("done")))) == "waiting"


async def test_an_unanswered_rule_captures_from_the_oldest_matching_message() -> None:
    """host-core §2, tools 15.5: of several unanswered messages (tool results by their
    content), the oldest that matches gives the groups; a rule whose regexes name no group
    renders its reply unchanged."""
    adapter = ScriptedAdapter.from_data(
        {
            "rules": [
                {"when": {"unanswered": "^id (?P<id>\\w+)"}, "reply": "first {{id}}"},
                {"when": {"last_user": "plain"}, "reply": "{{id}} as written"},
            ]
        }
    )
    chunks = await run(adapter, options(user_message("id a"), user_message("id b")))
    assert text_of(chunks) == "first a"
    results = options(assistant("calls"), tool_result("c1", "id t"), user_message("id u"))
    assert text_of(await run(adapter, results)) == "first t"  # a tool result's own text
    assert text_of(await run(adapter, options(user_message("plain")))) == "{{id}} as written"


@given(said=st.text(max_size=40))
@settings(deadline=None)
def test_captured_text_fills_raw_json_arguments_as_a_json_string(said: str) -> None:
    """host-core §2, tools 15.5: whatever a group captured (quotes, backslashes, control
    characters, any code point), raw JSON arguments stay JSON and carry it exactly."""
    adapter = ScriptedAdapter.from_data(
        {
            "rules": [
                {
                    "when": {"unanswered": "(?s)^said:(?P<said>.*)\\Z"},
                    "reply": {"tool_calls": [{"name": "t", "arguments": '{"v": "{{said}}"}'}]},
                }
            ]
        }
    )
    message = Message(id="m", role="user", content=(TextBlock(text=f"said:{said}"),))
    chunks = asyncio.run(run(adapter, options(message)))
    calls = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert json.loads(calls[0].arguments_delta) == {"v": said}


async def test_a_conversation_rule_holds_once_everything_it_looks_for_was_said() -> None:
    """host-core §2, tools 15.5: `conversation` searches every message of the request (tool
    results by their content) joined by newlines, so lookaheads check that several things
    arrived, in any order and any batch; its groups fill placeholders too."""
    adapter = ScriptedAdapter.from_data(
        {
            "rules": [
                {
                    "when": {"conversation": "(?s)(?=.*hotel (?P<hotel>\\w+))(?=.*flight booked)"},
                    "reply": "all set at {{hotel}}",
                }
            ],
            "default": "waiting",
        }
    )
    hotel = user_message("hotel Memmo")
    assert text_of(await run(adapter, options(hotel, assistant("ok")))) == "waiting"
    both = options(tool_result("c1", "flight booked"), assistant("ok"), hotel)
    assert text_of(await run(adapter, both)) == "all set at Memmo"


async def test_a_multi_block_user_message_reads_with_a_blank_line_between_blocks() -> None:
    """ROB-83: the scripted model reads a multi-block user message as its text blocks joined
    by MESSAGE_BLOCK_SEPARATOR (a blank line), as dsh-llm-openai sends it, in ``last_user``
    conditions, ``conversation`` and ``{{last_user}}`` alike."""
    notice = user_message(
        (TextBlock(text="It ended; it waits unless you send it more."), TextBlock(text="Bye."))
    )
    adapter = ScriptedAdapter.from_data(
        {
            "rules": [
                {
                    "when": {"last_user": r"more\.\n\nBye", "conversation": r"more\.\n\nBye"},
                    "reply": {"text": "[{{last_user}}]"},
                }
            ]
        }
    )
    chunks = await run(adapter, options(notice))
    assert text_of(chunks) == "[It ended; it waits unless you send it more.\n\nBye.]"
    assert MESSAGE_BLOCK_SEPARATOR == "\n\n"
