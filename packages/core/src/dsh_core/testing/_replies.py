"""Reply helpers for the scripted model: the common cases of a test, one call each.

Each returns a plain :class:`ScriptedReply`, so a helper's reply can go wherever a reply goes
(a ``model=`` list, a script callable's return value, ``ScriptedAdapter.replies``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from .._content import LlmFailure
from .._scripted import ScriptedReply, ScriptedToolCall

__all__ = ["held_reply", "max_tokens_reply", "model_error_reply", "tool_call_reply"]

CallLike = ScriptedToolCall | str | tuple[str, Any]


def _call(call: CallLike) -> ScriptedToolCall:
    if isinstance(call, ScriptedToolCall):
        return call
    if isinstance(call, str):
        return ScriptedToolCall(name=call)
    name, arguments = call
    return ScriptedToolCall(name=name, arguments=arguments)


def tool_call_reply(*calls: CallLike) -> ScriptedReply:
    """A reply made of tool calls only: no text, finish ``tool-calls``.

    Each call is a tool name (no arguments), a ``(name, arguments)`` pair (an object, or raw
    JSON text) or a :class:`ScriptedToolCall`. A call without an id gets a fresh unique one.
    """
    if not calls:
        raise ValueError("tool_call_reply needs at least one call")
    return ScriptedReply(tool_calls=tuple(_call(c) for c in calls))


def max_tokens_reply(text: str = "") -> ScriptedReply:
    """A reply that stops at the token limit (finish ``max-tokens``) after ``text``."""
    return ScriptedReply(text=text or None, finish="max-tokens")


def model_error_reply(
    message: str = "scripted model error",
    *,
    code: str = "MODEL_ERROR",
    status: int | None = None,
    text: str | None = None,
    raise_error: bool = False,
) -> ScriptedReply:
    """A reply that fails with a model error: an ``error`` finish carrying
    ``LlmFailure(message, code, status)`` after any ``text``, or, with ``raise_error``, an
    :class:`~dsh_core.LlmError` raised from the stream (an adapter that throws)."""
    failure = LlmFailure(message=message, code=code, status=status)
    return ScriptedReply(text=text, failure=failure, raise_failure=raise_error)


def held_reply(
    until: asyncio.Event | Callable[[], Awaitable[object]],
    reply: str | ScriptedReply = "",
) -> ScriptedReply:
    """``reply`` (a text or a full reply), held "in the request" until ``until`` (an
    :class:`asyncio.Event`, or a callable returning an awaitable) is done.

    Its text streams first, then it waits before finishing; if the request's abort signal
    fires first, it finishes ``aborted``. Use it for steering, cancelling and concurrency tests.
    """
    wait = until.wait if isinstance(until, asyncio.Event) else until
    if isinstance(reply, ScriptedReply):
        return attrs.evolve(reply, wait=wait)
    return ScriptedReply(text=reply or None, wait=wait)
