"""What ``dsh-subagents run`` shows while the tree works: the transcript lines.

The root agent's text as it streams; every tool call and result (a child's prefixed with its
session id); each child run's start and end. This plain view writes lines only, for an
output that is not a terminal; :mod:`._live` adds the live tree of running children on a
terminal (CLI-14).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO

from dsh_core import TextDelta, blocks_text

__all__ = ["Transcript", "cut"]

#: A tool argument or result longer than this is cut when shown.
SHOWN = 200


def cut(text: str, limit: int = SHOWN) -> str:
    """``text`` on one line, at most ``limit`` characters (an ellipsis marks a cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class Transcript:
    """Writes what the agents do as it happens, as plain lines.

    The first write that finds the output closed (``dsh-subagents run | head -1``) calls
    ``on_closed`` and makes every later write a no-op (ROB-44): the listener never raises, so
    the event that carried the write is not logged as a failed listener, once per event.
    """

    def __init__(self, out: TextIO, root: str) -> None:
        self.out = out
        self.root = root
        self.mid_line = False
        self.closed = False
        self.on_closed: Callable[[], None] | None = None
        #: Called with ``(session id, event)`` for every ``assistant/message`` (usage, -u).
        self.on_message: Callable[[str, Any], None] | None = None

    # -- output ----------------------------------------------------------------------------

    def _write(self, text: str) -> None:
        if self.closed:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except BrokenPipeError:
            self._gone()

    def _gone(self) -> None:
        self.closed = True
        if self.on_closed is not None:
            self.on_closed()

    def _line(self, text: str) -> None:
        if self.mid_line:
            self.mid_line = False
            text = "\n" + text
        self._write(text + "\n")

    def _who(self, session_id: str) -> str:
        return "" if session_id == self.root else f"[{session_id}] "

    # -- listeners -------------------------------------------------------------------------

    def on_session_event(self, session: Any, event: Any) -> None:
        """``session/event``: streamed text of the root, tool calls and results of all."""
        kind = event.type
        sid = session.header.id
        if kind == "assistant/chunk":
            chunk = event.data.chunk
            if sid == self.root and chunk.__class__ is TextDelta and chunk.text:
                self._write(chunk.text)
                self.mid_line = not chunk.text.endswith("\n")
        elif kind == "tool/call":
            self._line(f"{self._who(sid)}→ {event.data.name} {cut(event.data.arguments)}")
        elif kind == "tool/result":
            text = blocks_text(
                b for block in event.data.message.content for b in getattr(block, "content", ())
            )
            failed = " (error)" if event.data.error is not None else ""
            self._line(f"{self._who(sid)}← {cut(text)}{failed}")
        elif kind == "assistant/message":
            if sid == self.root and self.mid_line:
                # The answer is complete: what follows (a next turn) starts a line of its own.
                self.mid_line = False
                self._write("\n")
            if self.on_message is not None:
                self.on_message(sid, event)
        elif kind == "turn/start":
            self.turn_started(sid)

    def turn_started(self, session_id: str) -> None:
        """A turn of ``session_id`` began (the live view counts them)."""

    def on_child_start(self, info: Any) -> None:
        """``subagent/start``."""
        self._line(f"⇢ child {info.id} started ({info.provider})")

    def on_child_end(self, info: Any) -> None:
        """``subagent/end``."""
        self._line(f"⇠ child {info.id} ended: {info.stop_reason}")

    def on_status(self, agent: Any, status: str) -> None:
        """``agent/status``: nothing to show in plain lines."""

    # -- end -------------------------------------------------------------------------------

    def pause(self) -> None:
        """Stop drawing anything but lines (before a notice goes to standard error)."""

    def abandon(self) -> None:
        """Leave the terminal clean at once: the process is about to end."""

    def finish(self) -> None:
        """End the last line; leave the terminal as it was found (idempotent)."""
        if self.mid_line:
            self.mid_line = False
            self._write("\n")
        elif not self.closed:
            self._write("")
