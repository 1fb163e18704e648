"""``dsh-subagents run -u``: the tokens a run used, per turn of the root and for the whole tree.

Read from what is logged: the ``usage`` of each ``assistant/message`` event (one per model
request) of the root and of every agent below it during this run (CLI-20). A request whose
adapter reported no usage counts as a request, and the summary says how many did.
"""

from __future__ import annotations

from typing import Any

__all__ = ["UsageMeter"]


class _Tally:
    __slots__ = ("cached", "input", "output", "requests", "unreported")

    def __init__(self) -> None:
        self.requests = 0
        self.unreported = 0
        self.input = 0
        self.output = 0
        self.cached = 0

    def add(self, usage: Any) -> None:
        self.requests += 1
        if usage is None:
            self.unreported += 1
            return
        self.input += usage.input_tokens
        self.output += usage.output_tokens
        self.cached += usage.cache_read_tokens or 0

    def describe(self) -> str:
        requests = f"{self.requests} request{'' if self.requests == 1 else 's'}"
        if self.unreported == self.requests:
            return f"{requests}, no usage reported"
        cached = f" ({self.cached:,} cached)" if self.cached else ""
        text = f"{requests}, {self.input:,} input{cached} and {self.output:,} output tokens"
        if self.unreported:
            text += f"; {self.unreported} reported no usage"
        return text


class UsageMeter:
    """Counts the usage of the model requests of a run, as their messages are logged."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.turns: dict[int, _Tally] = {}
        self.tree = _Tally()
        self.agents: set[str] = set()

    def on_message(self, session_id: str, event: Any) -> None:
        """An ``assistant/message`` of ``session_id`` was logged."""
        usage = event.data.usage
        self.tree.add(usage)
        self.agents.add(session_id)
        if session_id == self.root:
            tally = self.turns.get(event.data.turn)
            if tally is None:
                tally = self.turns[event.data.turn] = _Tally()
            tally.add(usage)

    def lines(self) -> list[str]:
        """The summary: one line per turn of the root, then one for the whole tree."""
        out = [f"usage: turn {turn}: {t.describe()}" for turn, t in sorted(self.turns.items())]
        n = len(self.agents - {self.root})
        below = f" (the root and {n} subagent{'' if n == 1 else 's'})" if n else ""
        out.append(f"usage: whole tree{below}: {self.tree.describe()}")
        return out
