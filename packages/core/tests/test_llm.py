"""The LLM seam: adapter routing, the llm/stream waterfall, BlockAssembler (host-core §2)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from dsh_core import (
    BlockEnd,
    BlockStart,
    Context,
    ContextError,
    Finish,
    Host,
    LlmFailure,
    ReasoningBlock,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolCallDelta,
    UsageChunk,
    user_message,
)
from dsh_core._llm import BlockAssembler, GenerateOptions, LlmRuntimeService, LlmSeamError


class ListAdapter:
    """Streams a fixed chunk list and records the requests it got."""

    def __init__(self, *chunks: StreamChunk) -> None:
        self.chunks = chunks
        self.requests: list[GenerateOptions] = []

    async def stream(self, options: GenerateOptions) -> AsyncIterator[StreamChunk]:
        self.requests.append(options)
        for chunk in self.chunks:
            yield chunk


def llm_ctx() -> Context:
    """A bare host providing only the LLM runtime."""
    host = Host()
    ctx = Context(host, host.root)
    ctx.provide("llm", LlmRuntimeService())
    return ctx


def request(provider: str = "p", model: str = "m") -> GenerateOptions:
    return GenerateOptions(provider=provider, model=model, messages=(user_message("hi"),))


async def collect(ctx: Context, options: GenerateOptions) -> list[StreamChunk]:
    return [chunk async for chunk in ctx.llm.stream(options)]


STOP = Finish(reason="stop")


# -- adapter registry -------------------------------------------------------------------------


def test_duplicate_adapter_route_fails_atomically() -> None:
    """host-core §2: a duplicate provider route fails DUPLICATE_ADAPTER and registers nothing."""
    ctx = llm_ctx()
    first, second = ListAdapter(STOP), ListAdapter(STOP)
    ctx.llm.register_adapter(["a", "b"], first)
    with pytest.raises(LlmSeamError) as err:
        ctx.llm.register_adapter(["c", "b"], second)
    assert err.value.code == "DUPLICATE_ADAPTER"
    assert ctx.llm.adapter("b") is first
    assert ctx.llm.adapter("c") is None
    with pytest.raises(LlmSeamError) as twice:
        ctx.llm.register_adapter(["d", "d"], second)
    assert twice.value.code == "DUPLICATE_ADAPTER"
    assert ctx.llm.adapter("d") is None


async def test_adapter_route_is_removed_with_its_owner() -> None:
    """host-core §2: register_adapter is an effect; disposing the owner frees the route."""
    ctx = llm_ctx()
    owner = ctx.plugin("adapter-owner")
    adapter = ListAdapter(STOP)
    owner.llm.register_adapter("p", adapter)
    assert ctx.llm.adapter("p") is adapter
    await owner.dispose()
    assert ctx.llm.adapter("p") is None
    ctx.llm.register_adapter("p", ListAdapter(STOP))


async def test_unknown_provider_fails_no_adapter() -> None:
    """host-core §2: streaming to a provider without an adapter fails NO_ADAPTER."""
    ctx = llm_ctx()
    with pytest.raises(LlmSeamError) as err:
        await collect(ctx, request(provider="nobody"))
    assert err.value.code == "NO_ADAPTER"


# -- streaming ---------------------------------------------------------------------------------


async def test_stream_reaches_the_adapter_and_stops_at_the_first_finish() -> None:
    """host-core §2: nothing follows finish; chunks after it are not delivered."""
    ctx = llm_ctx()
    adapter = ListAdapter(TextDelta(index=0, text="hi"), STOP, TextDelta(index=0, text="late"))
    ctx.llm.register_adapter("p", adapter)
    chunks = await collect(ctx, request())
    assert chunks == [TextDelta(index=0, text="hi"), STOP]
    assert [r.model for r in adapter.requests] == ["m"]


async def test_stream_without_finish_ends_with_an_incomplete_stream_error() -> None:
    """host-core §2: a stream that ends without finish yields an error finish INCOMPLETE_STREAM."""
    ctx = llm_ctx()
    ctx.llm.register_adapter("p", ListAdapter(TextDelta(index=0, text="cut")))
    chunks = await collect(ctx, request())
    assert chunks[0] == TextDelta(index=0, text="cut")
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert finish.reason == "error"
    assert finish.failure is not None and finish.failure.code == "INCOMPLETE_STREAM"
    assert len(chunks) == 2


async def test_llm_stream_waterfall_can_rewrite_the_request() -> None:
    """host-core §2: llm/stream listeners wrap the terminal adapter lookup (next(new_options))."""
    ctx = llm_ctx()
    adapter = ListAdapter(STOP)
    ctx.llm.register_adapter("p", adapter)
    seen: list[str] = []

    async def rewrite(
        options: GenerateOptions, next_: Callable[..., Awaitable[AsyncIterator[StreamChunk]]]
    ) -> AsyncIterator[StreamChunk]:
        seen.append(options.model)
        return await next_(GenerateOptions(provider="p", model="rewritten", messages=()))

    ctx.on("llm/stream", rewrite)
    assert await collect(ctx, request(model="asked")) == [STOP]
    assert seen == ["asked"]
    assert [r.model for r in adapter.requests] == ["rewritten"]


async def test_llm_stream_waterfall_can_short_circuit_the_adapter() -> None:
    """host-core §2: a listener that does not call next() replaces the adapter's stream."""
    ctx = llm_ctx()
    adapter = ListAdapter(STOP)
    ctx.llm.register_adapter("p", adapter)

    async def canned() -> AsyncIterator[StreamChunk]:
        yield TextDelta(index=0, text="canned")
        yield STOP

    async def short(
        options: GenerateOptions, next_: Callable[..., Awaitable[AsyncIterator[StreamChunk]]]
    ) -> AsyncIterator[StreamChunk]:
        return canned()

    ctx.on("llm/stream", short)
    assert await collect(ctx, request()) == [TextDelta(index=0, text="canned"), STOP]
    assert adapter.requests == []


# -- BlockAssembler ----------------------------------------------------------------------------


def assemble(*chunks: StreamChunk) -> BlockAssembler:
    assembler = BlockAssembler()
    for chunk in chunks:
        assembler.add(chunk)
    return assembler


def test_assembler_folds_deltas_into_blocks_in_index_order() -> None:
    """host-core §2: deltas open blocks implicitly; text, reasoning and calls fold by index."""
    usage = TokenUsage(input_tokens=3, output_tokens=5)
    a = assemble(
        ReasoningDelta(index=0, text="think "),
        ReasoningDelta(index=0, text="hard"),
        TextDelta(index=1, text="Hel"),
        ToolCallDelta(index=2, id="c1", name="grep", arguments_delta='{"q":'),
        TextDelta(index=1, text="lo"),
        ToolCallDelta(index=2, arguments_delta='"x"}'),
        UsageChunk(usage=usage),
        Finish(reason="tool-calls"),
    )
    assert a.blocks() == (
        ReasoningBlock(text="think hard"),
        TextBlock(text="Hello"),
        ToolCallBlock(id="c1", name="grep", arguments='{"q":"x"}'),
    )
    assert a.usage == usage
    assert a.finish == Finish(reason="tool-calls")
    assert a.streamed_text() == "Hello"


def test_assembler_tool_call_arguments_stay_raw_and_default_to_an_empty_object() -> None:
    """host-core §2: tool arguments stay the raw JSON text; a call without text gets '{}'."""
    a = assemble(
        ToolCallDelta(index=0, id="c1", name="noargs"),
        ToolCallDelta(index=1, id="c2", name="raw", arguments_delta='{ "a" : 1 }'),
        STOP,
    )
    assert a.blocks() == (
        ToolCallBlock(id="c1", name="noargs", arguments="{}"),
        ToolCallBlock(id="c2", name="raw", arguments='{ "a" : 1 }'),
    )


def test_assembler_block_end_replaces_the_folded_block() -> None:
    """host-core §2: BlockEnd.block is the block's final form."""
    a = assemble(
        BlockStart(index=0, block_type="text"),
        TextDelta(index=0, text="draft"),
        BlockEnd(index=0, block=TextBlock(text="final")),
        STOP,
    )
    assert a.blocks() == (TextBlock(text="final"),)


def test_assembler_drops_tool_calls_on_max_tokens() -> None:
    """host-core §2: on a max-tokens finish tool calls are dropped (arguments may be cut)."""
    a = assemble(
        TextDelta(index=0, text="partial"),
        ToolCallDelta(index=1, id="c1", name="grep", arguments_delta='{"q": "cut'),
        Finish(reason="max-tokens"),
    )
    assert a.blocks() == (TextBlock(text="partial"),)


def test_assembler_interrupted_blocks_keep_only_non_blank_text_and_reasoning() -> None:
    """host-core §2: interrupted_blocks keeps non-blank text/reasoning, never calls."""
    a = assemble(
        ReasoningDelta(index=0, text="why"),
        TextDelta(index=1, text="   "),
        ToolCallDelta(index=2, id="c1", name="grep", arguments_delta="{}"),
        TextDelta(index=3, text="partial answer"),
    )
    assert a.finish is None
    assert a.interrupted_blocks() == (
        ReasoningBlock(text="why"),
        TextBlock(text="partial answer"),
    )


def test_assembler_error_finish_carries_the_failure() -> None:
    """host-core §2: an error finish keeps its failure for the loop to log."""
    failure = LlmFailure(message="overloaded", code="HTTP_529", status=529)
    a = assemble(TextDelta(index=0, text="x"), Finish(reason="error", failure=failure))
    assert a.finish is not None and a.finish.failure == failure


async def test_registering_an_adapter_through_a_disposed_context_leaves_no_route() -> None:
    """host-core §1/§2: a disposed owner cannot register an adapter, and no route leaks."""
    ctx = llm_ctx()
    owner = ctx.plugin("gone")
    await owner.dispose()
    with pytest.raises(ContextError) as err:
        owner.llm.register_adapter("p", ListAdapter(STOP))
    assert err.value.code == "INACTIVE_EFFECT"
    assert ctx.llm.adapter("p") is None


# -- consume (push form of stream) -------------------------------------------------------------


class ClosingAdapter(ListAdapter):
    """A ListAdapter whose streams record that they were closed."""

    def __init__(self, *chunks: StreamChunk) -> None:
        super().__init__(*chunks)
        self.closed = 0

    async def stream(self, options: GenerateOptions) -> AsyncIterator[StreamChunk]:
        try:
            async for chunk in super().stream(options):
                yield chunk
        finally:
            self.closed += 1


async def consumed(
    ctx: Context, options: GenerateOptions, stop_after: int | None = None
) -> list[StreamChunk]:
    got: list[StreamChunk] = []

    def sink(chunk: StreamChunk) -> bool:
        got.append(chunk)
        return stop_after is not None and len(got) >= stop_after

    await ctx.llm.consume(options, sink)
    return got


@pytest.mark.parametrize("with_waterfall", [False, True])
async def test_consume_pushes_what_stream_yields(with_waterfall: bool) -> None:
    """host-core §2: consume() sees exactly stream()'s chunks: reading stops at the first finish
    and the adapter's stream is closed, with or without llm/stream listeners."""
    ctx = llm_ctx()
    chunks = (TextDelta(index=0, text="a"), STOP, TextDelta(index=0, text="after"))
    adapter = ClosingAdapter(*chunks)
    ctx.llm.register_adapter("p", adapter)
    if with_waterfall:

        async def passthrough(
            options: GenerateOptions, next_: Callable[..., Awaitable[AsyncIterator[StreamChunk]]]
        ) -> AsyncIterator[StreamChunk]:
            return await next_()

        ctx.on("llm/stream", passthrough)
    assert await consumed(ctx, request()) == await collect(ctx, request()) == list(chunks[:2])
    assert adapter.closed == 2


async def test_consume_without_finish_ends_with_an_incomplete_stream_error() -> None:
    """host-core §2: consume() also ends a finish-less stream with INCOMPLETE_STREAM."""
    ctx = llm_ctx()
    ctx.llm.register_adapter("p", ListAdapter(TextDelta(index=0, text="cut")))
    got = await consumed(ctx, request())
    assert len(got) == 2
    finish = got[-1]
    assert isinstance(finish, Finish) and finish.failure is not None
    assert finish.failure.code == "INCOMPLETE_STREAM"


async def test_consume_stops_when_the_sink_says_so() -> None:
    """host-core §2: a sink returning True stops reading at once (no synthetic finish) and the
    adapter's stream is closed."""
    ctx = llm_ctx()
    adapter = ClosingAdapter(TextDelta(index=0, text="a"), TextDelta(index=0, text="b"), STOP)
    ctx.llm.register_adapter("p", adapter)
    assert await consumed(ctx, request(), stop_after=1) == [TextDelta(index=0, text="a")]
    assert adapter.closed == 1


async def test_consume_unknown_provider_fails_no_adapter() -> None:
    """host-core §2: consume() to a provider without an adapter fails NO_ADAPTER."""
    ctx = llm_ctx()
    with pytest.raises(LlmSeamError) as err:
        await consumed(ctx, request(provider="nobody"))
    assert err.value.code == "NO_ADAPTER"
