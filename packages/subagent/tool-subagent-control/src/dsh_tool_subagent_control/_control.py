"""``send_message`` and ``interrupt_agent``: a coordinator model following up with, and
stopping, the continuable subagents it started (CTL-1..3).

Both are thin adapters over ``ctx.subagents``: ``followup`` for ``send_message`` (routing,
cold resume and authority are the seam's, CONT-7/8/10) and ``interrupt`` for
``interrupt_agent`` (INT-1/2). Every failure is an errored tool result whose text keeps the
seam's words and adds what the model can do about it; nothing raises out of the turn.
"""

from __future__ import annotations

from typing import Any

from dsh_core import (
    ContentBlock,
    Context,
    SessionError,
    ToolDefinition,
    ToolError,
    ToolOutput,
    ToolRunContext,
    text_blocks,
)
from dsh_subagent import (
    SUBAGENTS,
    AncestorInterruptAuthority,
    CoordinatorMessageSource,
    SubagentError,
    SubagentFollowupOptions,
)

__all__ = [
    "INTERRUPT_AGENT_DESCRIPTION",
    "SEND_MESSAGE_DESCRIPTION",
    "install_control_tools",
]

#: What the model reads about ``send_message`` (CTL-1: the next turn, no redirect, no answer,
#: a failure delivered nothing; never a word about jobs).
SEND_MESSAGE_DESCRIPTION = (
    "Send a message to one of your background subagents by its subagent id, continuing the "
    "same conversation. The message becomes the subagent's next turn: if it is still working, "
    "the message waits until its current turn ends, so it cannot redirect work already under "
    "way. A subagent that has finished is resumed with its conversation intact. This call "
    "returns no answer from the subagent, only confirmation that the message was queued; its "
    "reply reaches you later. A failure means nothing was delivered."
)

#: What the model reads when the subagent's log could not be written (``SESSION_IO``).
NOT_WRITTEN = "the message was not delivered: the session store could not write it"

#: What the model reads about ``interrupt_agent`` (CTL-3: only the current turn stops; queued
#: messages wait for a later ``send_message``).
INTERRUPT_AGENT_DESCRIPTION = (
    "Stop the current turn of a background agent created under you, by its agent id: your "
    "direct subagent or a deeper one. Only the current turn stops: messages already queued for "
    "it stay parked until a later send_message, agents it started keep running, and it stays "
    "available for follow-ups. This call returns as soon as the stop is requested, so the agent "
    "may keep running briefly; interrupting an agent that has already finished is an accepted "
    "no-op."
)

_SEND_MESSAGE_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "subagent_id": {
            "type": "string",
            "description": "The subagent id you were given when the subagent was started.",
        },
        "message": {"type": "string", "description": "The message to deliver to the subagent."},
    },
    "required": ["subagent_id", "message"],
    "additionalProperties": False,
}

_INTERRUPT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "agent_id": {
            "type": "string",
            "description": "The id of an agent created under you: your direct subagent or a "
            "deeper one.",
        }
    },
    "required": ["agent_id"],
    "additionalProperties": False,
}

_SEND_MESSAGE_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {"messageId": {"type": "string"}},
    "required": ["messageId"],
    "additionalProperties": False,
}

_INTERRUPT_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {"accepted": {"const": True}},
    "required": ["accepted"],
    "additionalProperties": False,
}

#: What the model can do about a refusal: by the seam's error code, the first hint whose marker
#: the seam's message contains (the seam's own text stays first, so its wording is still there
#: to match; a message that already says what to do, "do not retry ...", gets no hint).
_Hints = dict[str, tuple[tuple[str, str], ...]]
_SEND_HINTS: _Hints = {
    "UNAUTHORIZED": (("", "you can send messages only to subagents you started yourself"),),
    "NOT_RESUMABLE": (
        (
            "is unavailable",
            "check the subagent_id: use an id you were given when you started the subagent",
        ),
    ),
    "DRAINING": (("", "subagents are being shut down; no message can be delivered now"),),
    "ACTIVATION_CLOSING": (("", "you are being shut down; no message can be delivered now"),),
}
_INTERRUPT_HINTS: _Hints = {
    "UNAUTHORIZED": (("", "you can interrupt only agents created under you, never yourself"),),
}


def _hinted(exc: SubagentError, hints: _Hints) -> ToolError:
    """``exc`` as a tool error with the same code, and a hint appended where one applies."""
    message = str(exc)
    for marker, hint in hints.get(exc.code, ()):
        if marker in message:
            message = f"{message}; {hint}"
            break
    return ToolError(message, code=exc.code)


def _render_send(value: Any, run: ToolRunContext) -> tuple[ContentBlock, ...]:
    return text_blocks(
        f"message queued as the next turn for subagent {run.arguments['subagent_id']}"
    )


def _render_interrupt(value: Any, run: ToolRunContext) -> tuple[ContentBlock, ...]:
    return text_blocks(f"interrupt requested for agent {run.arguments['agent_id']}")


def install_control_tools(ctx: Context) -> None:
    """Register ``send_message`` and ``interrupt_agent`` once, in ``ctx``'s (global) layer;
    both go when ``ctx`` is disposed."""
    subagents = ctx[SUBAGENTS]

    async def send_message(args: Any, run: ToolRunContext) -> dict[str, str]:
        parent = run.agent
        if parent is None:
            raise ToolError(
                "send_message requires a calling agent (exec.agent was undefined)",
                code="NO_AGENT",
            )
        options = SubagentFollowupOptions(
            source=CoordinatorMessageSource(sender_session_id=parent.id), signal=run.signal
        )
        try:
            message_id = await subagents.followup(
                parent, args["subagent_id"], text_blocks(args["message"]), options
            )
        except SubagentError as exc:
            raise _hinted(exc, _SEND_HINTS) from exc
        except SessionError as exc:  # DUR-33: not written, so not queued
            raise ToolError(f"{exc}; {NOT_WRITTEN}", code=exc.code) from exc
        return {"messageId": message_id}

    async def interrupt_agent(args: Any, run: ToolRunContext) -> dict[str, bool]:
        caller = run.agent
        if caller is None:
            raise ToolError(
                "interrupt_agent requires a calling agent (exec.agent was undefined)",
                code="NO_AGENT",
            )
        try:
            subagents.interrupt(args["agent_id"], AncestorInterruptAuthority(agent=caller))
        except SubagentError as exc:
            raise _hinted(exc, _INTERRUPT_HINTS) from exc
        return {"accepted": True}

    ctx.tools.register(
        ToolDefinition(
            name="send_message",
            description=SEND_MESSAGE_DESCRIPTION,
            parameters=_SEND_MESSAGE_PARAMETERS,
            execute=send_message,
            output=ToolOutput(schema=_SEND_MESSAGE_OUTPUT, render=_render_send),
        )
    )
    ctx.tools.register(
        ToolDefinition(
            name="interrupt_agent",
            description=INTERRUPT_AGENT_DESCRIPTION,
            parameters=_INTERRUPT_PARAMETERS,
            execute=interrupt_agent,
            output=ToolOutput(schema=_INTERRUPT_OUTPUT, render=_render_interrupt),
        )
    )
