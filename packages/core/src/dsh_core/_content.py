"""The LLM vocabulary: content blocks, messages, message sources, stream chunks (host-core §2).

All values are frozen attrs classes and durable (they round-trip through the converter).
Blocks are tagged by ``type`` and sources by ``kind``; both are merge-extensible, and a tag no
variant claims survives a load → save cycle as ``UnknownBlock`` / ``UnknownSource``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Mapping
from typing import Literal, TypeAlias

import attrs

from ._errors import DshError
from ._frozen import attrs_eq, attrs_hash, attrs_repr, builder, speed_up_inits
from ._json import JsonValue, freeze_json
from ._tagged import TaggedUnion

__all__ = [
    "MESSAGE_BLOCK_SEPARATOR",
    "BlockEnd",
    "BlockStart",
    "CallId",
    "ContentBlock",
    "Finish",
    "FinishReason",
    "LlmError",
    "LlmFailure",
    "Message",
    "MessageId",
    "MessageSource",
    "ModelSource",
    "PluginSource",
    "ReasoningBlock",
    "ReasoningDelta",
    "Role",
    "SessionId",
    "StreamChunk",
    "TextBlock",
    "TextDelta",
    "TokenUsage",
    "ToolCallBlock",
    "ToolCallDelta",
    "ToolResultBlock",
    "ToolSource",
    "UnknownBlock",
    "UnknownChunk",
    "UnknownSource",
    "UsageChunk",
    "UserSource",
    "assistant_message",
    "blocks_text",
    "message_text",
    "new_id",
    "text_blocks",
    "user_message",
]

SessionId: TypeAlias = str
MessageId: TypeAlias = str
CallId: TypeAlias = str
Role = Literal["system", "user", "assistant", "tool"]


_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count(1)


def _reseed() -> None:
    global _ID_PREFIX, _ID_COUNTER
    _ID_PREFIX = os.urandom(8).hex()
    _ID_COUNTER = itertools.count(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed)


def new_id() -> str:
    """A fresh id, unique across processes: a random per-process prefix (re-drawn in a forked
    child) and a counter."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):08x}"


# -- content blocks ----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ContentBlock:
    """Base of every content block; ``type`` is the tag."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: str = attrs.field(default="", init=False)


@attrs.frozen(kw_only=True)
class TextBlock(ContentBlock):
    """Plain text."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: Literal["text"] = attrs.field(default="text", init=False)
    text: str


@attrs.frozen(kw_only=True)
class ReasoningBlock(ContentBlock):
    """Model reasoning text (never sent back as an answer)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: Literal["reasoning"] = attrs.field(default="reasoning", init=False)
    text: str


@attrs.frozen(kw_only=True)
class ToolCallBlock(ContentBlock):
    """A tool call; ``arguments`` stays the model's raw JSON text."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: Literal["tool-call"] = attrs.field(default="tool-call", init=False)
    id: CallId
    name: str
    arguments: str


@attrs.frozen(kw_only=True)
class ToolResultBlock(ContentBlock):
    """The result of one tool call."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: Literal["tool-result"] = attrs.field(default="tool-result", init=False)
    tool_call_id: CallId
    content: tuple[ContentBlock, ...]
    is_error: bool = False


@attrs.frozen(kw_only=True)
class UnknownBlock(ContentBlock):
    """A block whose ``type`` no installed plugin knows; kept verbatim."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: str = attrs.field(default="")
    fields: Mapping[str, JsonValue] = attrs.field(factory=dict, converter=freeze_json)


BLOCKS: TaggedUnion[ContentBlock] = TaggedUnion(
    ContentBlock, "type", lambda t, f: UnknownBlock(type=t, fields=f), UnknownBlock
)
for _cls in (TextBlock, ReasoningBlock, ToolCallBlock, ToolResultBlock):
    BLOCKS.register(_cls)


#: The blocks :func:`text_blocks` built last from a plain ``str``: a message of them and
#: otherwise fresh values is as loggable as one built from that string (see
#: ``plain_user_message``). One slot: only the latest such tuple is known.
plain_text_blocks: tuple[ContentBlock, ...] | None = None


def text_blocks(text: str) -> tuple[ContentBlock, ...]:
    """``(TextBlock(text),)``."""
    blocks = (_text_block(text=text),)
    if text.__class__ is str:
        global plain_text_blocks
        plain_text_blocks = blocks
    return blocks


def blocks_text(blocks: Iterable[ContentBlock]) -> str:
    """The concatenated text of the text blocks (reasoning and tool blocks excluded)."""
    if blocks.__class__ is tuple and len(blocks) == 1:
        (only,) = blocks  # the usual message: one block, no join
        return only.text if isinstance(only, TextBlock) else ""
    return "".join([b.text for b in blocks if isinstance(b, TextBlock)])


#: What stands between the text blocks of a user or system message when a model reads it as
#: one text (the OpenAI-compatible adapter and the scripted model alike): a blank line, so
#: ``"...send it more."`` and ``"Its closing message:"`` never run together (ROB-83).
MESSAGE_BLOCK_SEPARATOR = "\n\n"


def message_text(blocks: Iterable[ContentBlock]) -> str:
    """The text blocks of a user or system message as a model reads them: joined by
    :data:`MESSAGE_BLOCK_SEPARATOR` (reasoning and tool blocks excluded)."""
    if blocks.__class__ is tuple and len(blocks) == 1:
        (only,) = blocks
        return only.text if isinstance(only, TextBlock) else ""
    return MESSAGE_BLOCK_SEPARATOR.join([b.text for b in blocks if isinstance(b, TextBlock)])


# -- message sources ---------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class MessageSource:
    """Where a message came from: durable attribution, never authority. ``kind`` is the tag."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    kind: str = attrs.field(default="", init=False)


@attrs.frozen(kw_only=True)
class UserSource(MessageSource):
    """Typed by a person (or a test standing in for one)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    kind: Literal["user"] = attrs.field(default="user", init=False)


@attrs.frozen(kw_only=True)
class PluginSource(MessageSource):
    """Produced by a plugin; ``form`` says how (e.g. ``snapshot`` for runtime context)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    kind: Literal["plugin"] = attrs.field(default="plugin", init=False)
    plugin: str
    form: str | None = None
    sections: tuple[str, ...] = ()
    summary: str | None = None


@attrs.frozen(kw_only=True)
class ModelSource(MessageSource):
    """Produced by a model through an adapter."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    kind: Literal["model"] = attrs.field(default="model", init=False)
    provider: str
    model: str


@attrs.frozen(kw_only=True)
class ToolSource(MessageSource):
    """A tool result or a context a tool deferred."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    kind: Literal["tool"] = attrs.field(default="tool", init=False)
    call_id: CallId


@attrs.frozen(kw_only=True)
class UnknownSource(MessageSource):
    """A source whose ``kind`` no installed plugin knows; kept verbatim."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    kind: str = attrs.field(default="")
    fields: Mapping[str, JsonValue] = attrs.field(factory=dict, converter=freeze_json)


SOURCES: TaggedUnion[MessageSource] = TaggedUnion(
    MessageSource, "kind", lambda k, f: UnknownSource(kind=k, fields=f), UnknownSource
)
for _src in (UserSource, PluginSource, ModelSource, ToolSource):
    SOURCES.register(_src)

_USER = UserSource()


# -- messages ----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Message:
    """One conversation message. ``role`` narrows it: user, assistant, tool (results), system."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    id: MessageId
    role: Role
    content: tuple[ContentBlock, ...]
    source: MessageSource = _USER

    @property
    def text(self) -> str:
        """The concatenated text blocks."""
        return blocks_text(self.content)


#: The message :func:`user_message` built last from a plain ``str`` (or the blocks
#: :func:`text_blocks` built last from one) with a fresh id and the default source: every
#: field of it is a literal, a fresh id or that ``str``, so the log can hold it by
#: construction, and an inbox that is handed this very object need not check it again (see
#: ``Inbox.insert``, hardening 11.1). One slot: only the latest such message is known.
plain_user_message: Message | None = None


def user_message(
    content: str | Iterable[ContentBlock],
    *,
    source: MessageSource = _USER,
    id: MessageId | None = None,
) -> Message:
    """A user-role message with a fresh id."""
    if isinstance(content, str):
        blocks: tuple[ContentBlock, ...] = (_text_block(text=content),)
        plain = content.__class__ is str
    else:
        blocks = tuple(content)
        plain = blocks is plain_text_blocks
    if plain and source is _USER and id is None:
        global plain_user_message
        built = plain_user_message = _message(
            id=new_id(), role="user", content=blocks, source=_USER
        )
        return built
    return _message(id=id or new_id(), role="user", content=blocks, source=source)


def assistant_message(
    content: str | Iterable[ContentBlock], *, source: MessageSource, id: MessageId | None = None
) -> Message:
    """An assistant-role message with a fresh id."""
    blocks = text_blocks(content) if isinstance(content, str) else tuple(content)
    return _message(id=id or new_id(), role="assistant", content=blocks, source=source)


# -- failures, usage, stream chunks -------------------------------------------------------------


@attrs.frozen(kw_only=True)
class LlmFailure:
    """Why a model request failed, in durable form."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    message: str
    code: str
    status: int | None = None
    provider_retry_after_ms: int | None = None


class LlmError(DshError):
    """An adapter failure raised instead of an ``error`` finish; carries the durable failure."""

    code = "LLM_ERROR"

    def __init__(self, failure: LlmFailure) -> None:
        super().__init__(failure.message, code=failure.code)
        self.failure = failure


@attrs.frozen(kw_only=True)
class TokenUsage:
    """Token accounting of one model response."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None


@attrs.frozen(kw_only=True)
class StreamChunk:
    """Base of the streamed response pieces; ``type`` is the tag."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: str = attrs.field(default="", init=False)


@attrs.frozen(kw_only=True)
class BlockStart(StreamChunk):
    """A content block begins at ``index`` (optional: deltas open their block implicitly)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: Literal["block-start"] = attrs.field(default="block-start", init=False)
    index: int
    block_type: str


@attrs.frozen(kw_only=True)
class TextDelta(StreamChunk):
    """More text for the text block at ``index``."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: Literal["text-delta"] = attrs.field(default="text-delta", init=False)
    index: int
    text: str


@attrs.frozen(kw_only=True)
class ReasoningDelta(StreamChunk):
    """More reasoning text for the block at ``index``."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: Literal["reasoning-delta"] = attrs.field(default="reasoning-delta", init=False)
    index: int
    text: str


@attrs.frozen(kw_only=True)
class ToolCallDelta(StreamChunk):
    """Part of a tool call at ``index``: its id and name (first delta) and argument text."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: Literal["tool-call-delta"] = attrs.field(default="tool-call-delta", init=False)
    index: int
    id: CallId | None = None
    name: str | None = None
    arguments_delta: str = ""


@attrs.frozen(kw_only=True)
class BlockEnd(StreamChunk):
    """The block at ``index`` is complete; ``block`` (if given) is its final form."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: Literal["block-end"] = attrs.field(default="block-end", init=False)
    index: int
    block: ContentBlock | None = None


@attrs.frozen(kw_only=True)
class UsageChunk(StreamChunk):
    """Token usage; precedes ``finish`` when present."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: Literal["usage"] = attrs.field(default="usage", init=False)
    usage: TokenUsage


FinishReason = Literal["stop", "tool-calls", "max-tokens", "aborted", "error"]


@attrs.frozen(kw_only=True)
class Finish(StreamChunk):
    """The response ended; nothing follows. ``failure`` accompanies ``aborted`` / ``error``."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: Literal["finish"] = attrs.field(default="finish", init=False)
    reason: FinishReason
    failure: LlmFailure | None = None


@attrs.frozen(kw_only=True)
class UnknownChunk(StreamChunk):
    """A chunk type no installed plugin knows; kept verbatim, ignored by the assembler."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    type: str = attrs.field(default="")
    fields: Mapping[str, JsonValue] = attrs.field(factory=dict, converter=freeze_json)


CHUNKS: TaggedUnion[StreamChunk] = TaggedUnion(
    StreamChunk, "type", lambda t, f: UnknownChunk(type=t, fields=f), UnknownChunk
)
for _chunk in (BlockStart, TextDelta, ReasoningDelta, ToolCallDelta, BlockEnd, UsageChunk, Finish):
    CHUNKS.register(_chunk)


del _cls, _src, _chunk


speed_up_inits(globals())

# Built for every message: plain-function builders (see dsh_core._frozen.builder).
_message = builder(Message)
_text_block = builder(TextBlock)
