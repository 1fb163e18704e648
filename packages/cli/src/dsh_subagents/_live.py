"""The live tree of ``dsh-subagents run`` on a terminal (CLI-14, CLI-15).

Below the transcript, a region redrawn in place lists each running child: its label (indented
under its parent), provider, mode, status, turns and elapsed time. The region exists only
while some child runs; it is drawn with ``rich``, imported here, so only a run whose output is
a terminal pays for the import. Whatever ends the run (the tree settling, Ctrl-C, an error),
the region is erased and the cursor shown again (:meth:`LiveTranscript.finish`,
:meth:`LiveTranscript.abandon`).

While the region is shown, the root's streamed text appears a line at a time (a partial line
would be overdrawn); without it, text streams as it comes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ._view import Transcript, cut

__all__ = ["LiveTranscript"]

#: How often the elapsed times are redrawn, in seconds.
TICK = 1.0
#: A label longer than this is cut in the region.
LABEL_WIDTH = 40


class _Row:
    __slots__ = ("agent", "id", "label", "mode", "parent", "provider", "started", "turns")

    def __init__(self, info: Any, agent: Any) -> None:
        self.id: str = info.id
        self.provider: str = info.provider
        self.agent = agent
        self.started = time.monotonic()
        self.label: str | None = None
        self.mode = "one-shot"
        self.parent: str | None = None
        self.turns = 0
        if agent is not None:
            session = agent.session
            self.parent = session.header.parent_session
            own = session.events[session.header.seed_length or 0 :]
            for event in own:
                if event.type == "subagent/descriptor" and isinstance(event.data, Mapping):
                    label = event.data.get("label")
                    self.label = label if isinstance(label, str) else None
                    mode = event.data.get("mode")
                    self.mode = mode if isinstance(mode, str) else self.mode
                elif event.type == "turn/start":
                    self.turns += 1

    @property
    def status(self) -> str:
        agent = self.agent
        if agent is None or agent.status == "running":
            return "running"
        return "waiting"  # resident, between turns: waiting for its own children


def _elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s"


class LiveTranscript(Transcript):
    """The transcript's lines above a live region of the running children."""

    def __init__(self, out: TextIO, root: str, ctx: Any) -> None:
        super().__init__(out, root)
        self.ctx = ctx
        self.console = Console(file=out, markup=False, emoji=False, highlight=False, soft_wrap=True)
        self.rows: dict[str, _Row] = {}
        self.live: Live | None = None
        self.paused = False
        self.partial = ""
        self.ticker: asyncio.TimerHandle | None = None

    # -- output ----------------------------------------------------------------------------

    def _write(self, text: str) -> None:
        if self.closed:
            return
        if self.live is None:
            super()._write(text)
            return
        self.partial += text
        if "\n" in self.partial:
            lines, _, self.partial = self.partial.rpartition("\n")
            try:
                self.console.print(Text(lines), end="\n")
            except BrokenPipeError:
                self._gone()

    # -- the region ------------------------------------------------------------------------

    def _render(self) -> Table:
        table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
        for name in ("subagent", "provider", "mode", "status", "turns", "elapsed"):
            table.add_column(name, no_wrap=True, justify="right" if name == "turns" else "left")
        now = time.monotonic()
        rows = list(self.rows.values())
        for row in rows:
            depth, up = 0, row.parent
            while up in self.rows and depth < len(rows):
                depth += 1
                up = self.rows[up].parent
            name = row.label or row.id
            table.add_row(
                "  " * depth + cut(name, LABEL_WIDTH),
                row.provider,
                row.mode,
                row.status,
                str(row.turns),
                _elapsed(now - row.started),
            )
        return table

    def _show(self) -> None:
        """Draw the region now: start it if children run, stop it when none does."""
        if self.closed or self.paused:
            return
        if not self.rows:
            self._stop_region()
            return
        try:
            if self.live is None:
                self.live = Live(
                    get_renderable=self._render,
                    console=self.console,
                    auto_refresh=False,
                    transient=True,
                    redirect_stdout=False,
                    redirect_stderr=False,
                )
                self.live.start(refresh=True)
                self._schedule()
            else:
                self.live.refresh()
        except BrokenPipeError:
            self._gone()

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self.ticker = loop.call_later(TICK, self._tick)

    def _tick(self) -> None:
        self.ticker = None
        if self.live is not None:
            self._show()
            if self.live is not None:
                self._schedule()

    def _stop_region(self) -> None:
        if self.ticker is not None:
            self.ticker.cancel()
            self.ticker = None
        live, self.live = self.live, None
        if live is None:
            return
        try:
            live.stop()  # transient: the region is erased, the cursor shown again
        except BrokenPipeError:
            self._gone()
        partial, self.partial = self.partial, ""
        if partial:
            super()._write(partial)

    # -- listeners -------------------------------------------------------------------------

    def on_child_start(self, info: Any) -> None:
        super().on_child_start(info)
        agent = self.ctx.agents.get(info.id) if info.local else None
        self.rows[info.id] = _Row(info, agent)
        self._show()

    def on_child_end(self, info: Any) -> None:
        super().on_child_end(info)
        if self.rows.pop(info.id, None) is not None:
            self._show()

    def on_status(self, agent: Any, status: str) -> None:
        if agent.id in self.rows:
            self._show()

    def turn_started(self, session_id: str) -> None:
        row = self.rows.get(session_id)
        if row is not None:
            row.turns += 1
            self._show()

    # -- end -------------------------------------------------------------------------------

    def pause(self) -> None:
        self.paused = True
        self._stop_region()

    def abandon(self) -> None:
        self.paused = True
        self._stop_region()

    def finish(self) -> None:
        self.paused = True
        self._stop_region()
        super().finish()
