"""The LLM seam (``ctx.llm``): adapters by provider, the ``llm/stream`` waterfall, assembly.

An adapter turns one request into a stream of chunks; one call is one attempt. The contract
kept from the reference: a usage chunk (if any) precedes ``finish`` and nothing follows it; tool
arguments stay raw JSON strings; a provider failure either raises :class:`LlmError` or ends with
an ``error``/``aborted`` finish (host-core §2).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

from ._abort import AbortSignal
from ._content import (
    BlockEnd,
    BlockStart,
    ContentBlock,
    Finish,
    LlmError,
    LlmFailure,
    Message,
    ReasoningBlock,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolCallDelta,
    UsageChunk,
)
from ._errors import DshError
from ._events import ToolSchema
from ._frozen import attrs_eq, attrs_hash, attrs_repr, builder, speed_up_inits

if TYPE_CHECKING:
    from ._context import Context

__all__ = [
    "BlockAssembler",
    "GenerateOptions",
    "LlmAdapter",
    "LlmRuntime",
    "LlmRuntimeService",
    "LlmSeamError",
]


class LlmSeamError(DshError):
    """The LLM seam refused: ``NO_ADAPTER``, ``DUPLICATE_ADAPTER``."""

    code = "LLM_SEAM"


@attrs.frozen(kw_only=True)
class GenerateOptions:
    """One model request. ``loop_request`` marks requests the agent loop built from its log.

    ``messages`` is any immutable sequence: the loop passes its session's
    ``derive_messages()``, a view of the history that costs O(1) to take (not a copy).
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    provider: str
    model: str
    messages: Sequence[Message]
    system: str | None = None
    tools: tuple[ToolSchema, ...] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    stop: tuple[str, ...] | None = None
    signal: AbortSignal | None = attrs.field(default=None, eq=False)
    session_id: str | None = None
    loop_request: bool = False


class LlmAdapter(Protocol):
    """Streams one response for one request."""

    def stream(self, options: GenerateOptions) -> AsyncIterator[StreamChunk]:
        """Yield the response's chunks, ending with exactly one :class:`Finish`."""
        ...


class LlmRuntimeService:
    """The adapter registry of one host (provided as ``llm``; use the bound view)."""

    def __init__(self) -> None:
        self.adapters: dict[str, LlmAdapter] = {}

    def __dsh_bind__(self, ctx: Context) -> LlmRuntime:
        return LlmRuntime(self, ctx)


class LlmRuntime:
    """``ctx.llm``: register adapters and stream requests through ``llm/stream``."""

    __slots__ = ("_ctx", "_listeners", "_svc")

    def __init__(self, service: LlmRuntimeService, ctx: Context) -> None:
        self._svc = service
        self._ctx = ctx
        # Read per request (the host keeps one table): not looked up through the context.
        self._listeners = ctx.host.listeners

    def register_adapter(
        self, providers: str | Iterable[str], adapter: LlmAdapter
    ) -> Callable[[], object]:
        """Route ``providers`` to ``adapter`` while this context lives (atomic on conflict)."""
        self._ctx._require_active()
        names = [providers] if isinstance(providers, str) else list(providers)
        taken = [n for n in names if n in self._svc.adapters]
        if taken or len(set(names)) != len(names):
            raise LlmSeamError(
                f"an adapter for provider(s) {taken or names} is already registered",
                code="DUPLICATE_ADAPTER",
            )
        for n in names:
            self._svc.adapters[n] = adapter

        def remove() -> None:
            for n in names:
                if self._svc.adapters.get(n) is adapter:
                    del self._svc.adapters[n]

        return self._ctx.fiber.add(remove)

    def adapter(self, provider: str) -> LlmAdapter | None:
        """The adapter routed for ``provider``, if any."""
        return self._svc.adapters.get(provider)

    async def _terminal(self, options: GenerateOptions) -> AsyncIterator[StreamChunk]:
        adapter = self._svc.adapters.get(options.provider)
        if adapter is None:
            raise LlmSeamError(
                f"no LLM adapter is registered for provider {options.provider!r}",
                code="NO_ADAPTER",
            )
        return adapter.stream(options)

    def _direct(self, options: GenerateOptions) -> AsyncIterator[StreamChunk] | None:
        """The adapter's own stream when no ``llm/stream`` listener wraps it (nothing to
        await); ``None`` sends the caller through :meth:`_open`."""
        if "llm/stream" in self._listeners:
            return None
        adapter = self._svc.adapters.get(options.provider)
        return adapter.stream(options) if adapter is not None else None

    async def _open(self, options: GenerateOptions) -> AsyncIterator[StreamChunk]:
        if "llm/stream" in self._listeners:
            return await self._ctx.waterfall("llm/stream", options, default=self._terminal)
        return await self._terminal(options)

    async def stream(self, options: GenerateOptions) -> AsyncIterator[StreamChunk]:
        """Stream ``options`` through the ``llm/stream`` waterfall to its provider's adapter.

        Stops reading at the first :class:`Finish`; a stream that ends without one yields an
        ``error`` finish (``INCOMPLETE_STREAM``) so callers always see exactly one finish.
        """
        iterator = self._direct(options)
        if iterator is None:
            iterator = await self._open(options)
        finished = False
        try:
            async for chunk in iterator:
                yield chunk
                if isinstance(chunk, Finish):
                    finished = True
                    break
        finally:
            await _close(iterator)
        if not finished:
            yield _INCOMPLETE_FINISH

    async def consume(self, options: GenerateOptions, sink: Callable[[StreamChunk], bool]) -> None:
        """Push the chunks of :meth:`stream` into ``sink`` (same guarantees: exactly one finish
        unless ``sink`` returns ``True``, which stops reading at once).

        The agent loop uses this instead of iterating :meth:`stream`: one generator layer less
        per chunk on the hottest path of a turn.
        """
        iterator = self._direct(options)
        if iterator is None:
            iterator = await self._open(options)
        try:
            async for chunk in iterator:
                if sink(chunk) or isinstance(chunk, Finish):
                    return
        finally:
            await _close(iterator)
        sink(_INCOMPLETE_FINISH)


#: The finish of a stream that ended without one.
_INCOMPLETE_FINISH = Finish(
    reason="error",
    failure=LlmFailure(message="the model stream ended without a finish", code="INCOMPLETE_STREAM"),
)


async def _close(iterator: AsyncIterator[StreamChunk]) -> None:
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()


class _Builder:
    __slots__ = ("call_id", "final", "kind", "name", "parts")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.parts: list[str] = []
        self.call_id: str | None = None
        self.name: str | None = None
        self.final: ContentBlock | None = None


class BlockAssembler:
    """Folds stream chunks into content blocks, usage and the finish.

    Deltas open their block implicitly; ``BlockEnd.block`` replaces what was folded. On a
    ``max-tokens`` finish tool calls are dropped (their arguments may be cut off).
    """

    __slots__ = ("_blocks", "finish", "usage")

    def __init__(self) -> None:
        self._blocks: dict[int, _Builder] = {}
        self.usage: TokenUsage | None = None
        self.finish: Finish | None = None

    def add(self, chunk: StreamChunk) -> None:
        """Fold one chunk."""
        blocks = self._blocks
        if chunk.__class__ is Finish:  # once per response, and else the last of seven tests
            self.finish = chunk
        elif isinstance(chunk, TextDelta):
            b = blocks.get(chunk.index) or blocks.setdefault(chunk.index, _Builder("text"))
            b.parts.append(chunk.text)
        elif isinstance(chunk, ToolCallDelta):
            b = blocks.get(chunk.index) or blocks.setdefault(chunk.index, _Builder("tool-call"))
            if chunk.id is not None:
                b.call_id = chunk.id
            if chunk.name is not None:
                b.name = chunk.name
            if chunk.arguments_delta:
                b.parts.append(chunk.arguments_delta)
        elif isinstance(chunk, ReasoningDelta):
            b = blocks.get(chunk.index) or blocks.setdefault(chunk.index, _Builder("reasoning"))
            b.parts.append(chunk.text)
        elif isinstance(chunk, BlockStart):
            blocks.setdefault(chunk.index, _Builder(chunk.block_type))
        elif isinstance(chunk, BlockEnd):
            if chunk.block is not None:
                b = blocks.setdefault(chunk.index, _Builder(chunk.block.type))
                b.final = chunk.block
        elif isinstance(chunk, UsageChunk):
            self.usage = chunk.usage
        elif isinstance(chunk, Finish):
            self.finish = chunk

    def blocks(self) -> tuple[ContentBlock, ...]:
        """The assembled blocks in index order (tool calls dropped on ``max-tokens``)."""
        out: list[ContentBlock] = []
        drop_calls = self.finish is not None and self.finish.reason == "max-tokens"
        for _, b in sorted(self._blocks.items()):
            block = b.final or _build(b)
            if block is None or (drop_calls and isinstance(block, ToolCallBlock)):
                continue
            out.append(block)
        return tuple(out)

    def interrupted_blocks(self) -> tuple[ContentBlock, ...]:
        """What an interrupted response keeps: its non-blank text and reasoning."""
        out: list[ContentBlock] = []
        for _, b in sorted(self._blocks.items()):
            block = b.final or _build(b)
            if isinstance(block, TextBlock | ReasoningBlock) and block.text.strip():
                out.append(block)
        return tuple(out)

    def streamed_text(self) -> str:
        """The concatenated text deltas so far."""
        return "".join(
            "".join(b.parts) for _, b in sorted(self._blocks.items()) if b.kind == "text"
        )


def _build(b: _Builder) -> ContentBlock | None:
    text = "".join(b.parts)
    if b.kind == "text":
        return _text_block(text=text)
    if b.kind == "reasoning":
        return ReasoningBlock(text=text)
    if b.kind == "tool-call":
        if b.call_id is None or b.name is None:
            return None
        return _call_block(id=b.call_id, name=b.name, arguments=text or "{}")
    return None


def failure_of(exc: BaseException) -> LlmFailure:
    """The durable failure of an exception that ended a turn.

    An :class:`LlmError` keeps its own failure; any other error flattens to code ``UNKNOWN``
    (host-core §3), its message keeping the error's class and, for dsh errors, their stable
    code, e.g. ``"LlmSeamError [NO_ADAPTER]: no LLM adapter ..."``.
    """
    if isinstance(exc, LlmError):
        return exc.failure
    if isinstance(exc, DshError):
        return LlmFailure(message=f"{type(exc).__name__} [{exc.code}]: {exc}", code="UNKNOWN")
    return LlmFailure(message=f"{type(exc).__name__}: {exc}", code="UNKNOWN")


speed_up_inits(globals())

# Built for every answer: plain-function builders (see dsh_core._frozen.builder).
_text_block = builder(TextBlock)
_call_block = builder(ToolCallBlock)
