"""``dsh-subagents demo``: the offline tour of the subagent seam, as a transcript a person
can follow.

A coordinator agent on the scripted model (the embedded :data:`TOUR_SCRIPT`, or a script
file) runs through the real model-facing tools: it fans out continuable ``spawn`` children
with several ``subagent`` calls in one response, hears their reports and settlement notices,
follows up with a settled child (``send_message``: a cold resume from the demo's JSONL store),
runs a ``fork`` child in the foreground, lists its agents (``list_agents``) and answers. The
transcript is written from the session and subagent events as they happen, never from the
script, and ends with the child tree read back from the store. One of the children is an ACP
child: the coordinator's ``postcard`` tool (a continuable ``subagent`` tool row for the ``acp``
provider) hands a task to a ``dsh-acp-agent`` process over the Agent Client Protocol, then a
follow-up in the same ACP session.

Children are named by their label and the last characters of their id (``flights·0007``);
full ids are in the final tree and in ``dsh-subagents sessions tree``. Lines appear in causal
order: a continuable child's lines are held until its parent's tool result has named it.

The tour composes the tool distributions by plugin name, and says which distributions are
missing when they are not installed (then one plain offline turn runs instead).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, TextIO

from dsh_core import (
    Agent,
    AgentOptions,
    CreateAgentOptions,
    DshPluginManager,
    PluginRow,
    ScriptedAdapter,
    SessionEvent,
    SessionMeta,
    TextBlock,
    blocks_text,
    boot_host,
    make_plugin_manager,
    user_message,
)

from ._home import home

__all__ = [
    "DEFAULT_PROMPT",
    "TOUR_PLUGINS",
    "TOUR_SCRIPT",
    "demo_store",
    "missing_tour_plugins",
    "run_one_turn",
    "run_tour",
]

#: The coordinator's user message when ``--prompt`` gives none.
DEFAULT_PROMPT: Final = (
    "Plan a weekend in Lisbon for two: flights, a hotel in Alfama, and the weather."
)
#: The tour's plugins beyond the core ones, by plugin name, with the distribution of each.
TOUR_PLUGINS: Final[Mapping[str, str]] = {
    "subagent": "dsh-subagent",
    "subagent-spawn": "dsh-subagent-spawn",
    "subagent-fork": "dsh-subagent-fork",
    "tool-subagent": "dsh-tool-subagent",
    "tool-subagent-control": "dsh-tool-subagent-control",
    "tool-subagent-list-agents": "dsh-tool-subagent-control",
    "tool-subagent-report": "dsh-tool-subagent-report",
    "subagent-acp": "dsh-subagent-acp",
}
#: How long the tour may take before it is declared stuck (it takes well under a second).
_TOUR_TIMEOUT: Final = 60.0
#: The narrowest an entry's text is wrapped to, however narrow the terminal.
_NARROWEST: Final = 40
#: The columns before an entry's text: two spaces, the agent's name, its mark.
_GUTTER: Final = 2 + 14 + 1 + 2
#: An entry of more lines than this is cut when shown.
_LINES: Final = 8

_COORDINATOR = "You coordinate a small team of helper agents."
_RESEARCHER = "You are a travel researcher working for a coordinator."
_REVIEWER = "You review a plan you were handed, and answer in one sentence."
#: What the ACP child is asked (a dsh-acp-agent process on the echo model answers it back).
_POSTCARD = (
    "Lisbon, Friday to Sunday: TP1351 out, TP1356 back, Memmo Alfama, sun. About 760 EUR for two."
)
#: The follow-up the ACP child gets in its same ACP session (the echo model answers it back).
_SIGNATURE = "Sign it: with love, from both of us."
_NOTICE = r"^Background subagent (?P<child>\S+) finished"

#: The embedded script of the tour (format: docs/scripted-model.md). Every agent runs on it;
#: the persona in its system prompt tells the coordinator, the researchers and the reviewer
#: apart. Each coordinator rule answers what arrived since its last answer (``unanswered``),
#: so the tour reads the same whichever reports and notices arrive together; the review
#: waits until the whole ``conversation`` holds every closing message, in whatever order the
#: children settled, so the final answer comes after the last notice.
TOUR_SCRIPT: Final[Mapping[str, Any]] = {
    "default": "I have nothing more to do.",
    "rules": [
        # -- the researchers (continuable spawn children) --
        {
            "when": {"system": "travel researcher", "last_user": "(?i)return flight"},
            "reply": "Return: TP1356 leaves Lisbon on Sunday at 19:40, 95 EUR each.",
        },
        {
            "when": {"system": "travel researcher", "last_user": "(?i)flight", "last_role": "tool"},
            "reply": "Outbound: TP1351 leaves on Friday at 08:15, 120 EUR each.",
        },
        {
            "when": {"system": "travel researcher", "last_user": "(?i)flight"},
            "reply": {
                "tool_calls": [
                    {
                        "name": "report",
                        "arguments": {"output": "TP1351 on Friday morning looks best."},
                    }
                ]
            },
        },
        {
            "when": {"system": "travel researcher", "last_user": "(?i)hotel", "last_role": "tool"},
            "reply": "Memmo Alfama: 180 EUR a night, with a view of the river.",
        },
        {
            "when": {"system": "travel researcher", "last_user": "(?i)hotel"},
            "reply": {
                "tool_calls": [
                    {"name": "report", "arguments": {"output": "Two candidates in Alfama so far."}}
                ]
            },
        },
        {
            "when": {"system": "travel researcher"},
            "reply": "Sunny on Saturday, 24 degrees; a light breeze on Sunday.",
        },
        # -- the reviewer (a one-shot fork child: it sees the coordinator's completed turns) --
        {
            "when": {"system": "review a plan"},
            "reply": "Within budget: about 760 EUR for two, flights and two nights included.",
        },
        # -- the coordinator --
        {  # every researcher has settled (its notice is in), the flights one twice: review
            "when": {
                "system": "coordinate",
                "unanswered": _NOTICE,
                "conversation": (
                    r"(?s)^(?!.*Within budget)"
                    r"(?=.*message:\s*Return)(?=.*message:\s*Memmo)(?=.*message:\s*Sunny)"
                ),
            },
            "reply": {
                "tool_calls": [
                    {
                        "name": "fork",
                        "arguments": {
                            "description": "Review the plan's budget",
                            "prompt": "Check the plan so far against a budget of 900 EUR.",
                        },
                    }
                ]
            },
        },
        {  # the review is in: an ACP child (another process) writes the postcard
            "when": {"system": "coordinate", "unanswered": "^Within budget"},
            "reply": {
                "tool_calls": [
                    {
                        "name": "postcard",
                        "arguments": {"description": "Write the postcard", "prompt": _POSTCARD},
                    }
                ]
            },
        },
        {  # the postcard child runs in the background (continuable, in another process)
            "when": {
                "system": "coordinate",
                "unanswered": "^started subagent",
                "conversation": "Within budget",
            },
            "reply": "The postcard is being written in another process.",
        },
        {  # its first answer is in: a follow-up in the same ACP session
            "when": {
                "system": "coordinate",
                "unanswered": _NOTICE + r"[\s\S]*message:\s*Lisbon, Friday to Sunday",
            },
            "reply": {
                "tool_calls": [
                    {
                        "name": "send_message",
                        "arguments": {"subagent_id": "{{child}}", "message": _SIGNATURE},
                    }
                ]
            },
        },
        {
            "when": {
                "system": "coordinate",
                "unanswered": "^message queued",
                "conversation": "Within budget",
            },
            "reply": "I asked for a signature on the postcard.",
        },
        {  # the signature is in too: list the agents
            "when": {"system": "coordinate", "unanswered": _NOTICE + r"[\s\S]*message:\s*Sign"},
            "reply": {"tool_calls": [{"name": "list_agents", "arguments": {}}]},
        },
        {
            "when": {"system": "coordinate", "unanswered": r"\[(ready|idle|running)\]"},
            "reply": (
                "Your weekend in Lisbon: fly out on TP1351 on Friday at 08:15 and back on "
                "TP1356 on Sunday at 19:40; stay at Memmo Alfama; expect sun. About 760 EUR "
                "for two. My three researchers are ready if you want more."
            ),
        },
        {
            "when": {"system": "coordinate", "unanswered": _NOTICE + r"[\s\S]*message:\s*Outbound"},
            "reply": {
                "tool_calls": [
                    {
                        "name": "send_message",
                        "arguments": {
                            "subagent_id": "{{child}}",
                            "message": "Please also find the return flight on Sunday evening.",
                        },
                    }
                ]
            },
        },
        {
            "when": {"system": "coordinate", "unanswered": "^message queued"},
            "reply": "I asked the flights researcher for the return flight too.",
        },
        {
            "when": {"system": "coordinate", "unanswered": "^started subagent"},
            "reply": "Three researchers are at work in the background; I will hear from them.",
        },
        {
            "when": {
                "system": "coordinate",
                "unanswered": r"^Background subagent (?P<child>\S+) (?P<what>reported|finished)",
            },
            "reply": "Noted: {{child}} {{what}}.",
        },
        {
            "when": {"system": "coordinate", "last_role": "user"},
            "reply": {
                "tool_calls": [
                    {
                        "name": "subagent",
                        "arguments": {
                            "description": "Find Lisbon flights",
                            "prompt": "Find a Friday morning flight to Lisbon for two.",
                        },
                    },
                    {
                        "name": "subagent",
                        "arguments": {
                            "description": "Find an Alfama hotel",
                            "prompt": "Find a hotel in Alfama for two nights.",
                        },
                    },
                    {
                        "name": "subagent",
                        "arguments": {
                            "description": "Check the weekend weather",
                            "prompt": "What is the weather in Lisbon this weekend?",
                        },
                    },
                ]
            },
        },
    ],
}


def demo_store(store: str | None) -> Path:
    """The demo's JSONL store: ``store``, else the home's ``demo`` folder
    (``$DSH_SUBAGENTS_HOME/demo``, else ``~/.dsh-subagents/demo``)."""
    return Path(store) if store else home() / "demo"


def missing_tour_plugins(pm: DshPluginManager) -> list[str]:
    """The tour's plugins that are not installed, as ``plugin (distribution)``."""
    specs = pm.collect_plugin_specs()
    return [f"{name} ({dist})" for name, dist in TOUR_PLUGINS.items() if name not in specs]


def _tour_rows(store: Path, model: PluginRow | None) -> list[PluginRow | str]:
    """The tour's composition; ``model`` is the ``llm-openai`` row of a real-model tour."""
    rows: list[PluginRow | str] = [
        "sessions",
        PluginRow(plugin="session-persistence-jsonl", config={"root": str(store)}),
        "session-query",
        "llm",
        "tools",
        PluginRow(plugin="system-prompt", config={"persona": _COORDINATOR}),
        "agents",
        "jobs",
        "invariants",
        "subagent",
        "subagent-spawn",
        "subagent-fork",
        PluginRow(
            plugin="subagent-acp",
            config={"command": sys.executable, "args": ["-m", "dsh_acp_agent"]},
        ),
        PluginRow(
            plugin="tool-subagent",
            config={"provider": "spawn", "background_mode": "continuable", "persona": _RESEARCHER},
        ),
        PluginRow(  # FORK-2: the fork tool is one-shot; in the foreground only
            plugin="tool-subagent",
            config={
                "provider": "fork",
                "tool_name": "fork",
                "enable_run_in_background": False,
                "persona": _REVIEWER,
            },
        ),
        PluginRow(  # a continuable child in another process, over the Agent Client Protocol
            plugin="tool-subagent",
            config={
                "provider": "acp",
                "tool_name": "postcard",
                "background_mode": "continuable",
                "max_depth": "provider-managed",  # the child's own host limits its depth
            },
        ),
        "tool-subagent-control",
        "tool-subagent-list-agents",
        "tool-subagent-report",
    ]
    if model is not None:
        rows.insert(4, model)
    return rows


def _text(content: Any) -> str:
    """The text blocks of ``content``, one per line (a notice's lines stay apart)."""
    return "\n".join(b.text for b in content if isinstance(b, TextBlock))


def _width() -> int:
    """The columns an entry's text may take: the terminal's width (``COLUMNS``, else 80 when
    the output is no terminal) less the gutter, never under :data:`_NARROWEST`."""
    return max(_NARROWEST, shutil.get_terminal_size((80, 24)).columns - _GUTTER - 1)


#: Words a label's name skips: what a task does, not what it is about.
_FILLER = frozenset(
    (
        "a", "an", "the", "of", "for", "to", "in", "on", "and", "or", "with",
        "find", "check", "get", "write", "review", "look", "make", "plan",
    )
)  # fmt: skip
_WORD = re.compile(r"[a-z0-9]+")


def short_name(label: str | None, provider: str, child_id: str) -> str:
    """A child's name in the transcript: the label's last word that is not filler (else the
    provider) and the id's last four characters: ``flights·0007``."""
    words = [w for w in _WORD.findall((label or "").lower()) if w not in _FILLER]
    return f"{(words[-1] if words else provider)[:10]}·{child_id[-4:]}"


class _Transcript:
    """Writes the tour from events as they happen: who called which tool with what, what came
    back, what each agent said, what reached the coordinator, and each child's epochs.

    Causal order: a continuable child starts inside its parent's tool call and may run before
    the parent's result is logged (results are committed when the response's calls are done),
    so its lines are held until a result in its parent's session names it (or the tour ends).
    Ids in shown text are replaced by the children's names.
    """

    def __init__(self, out: TextIO, agents: Any) -> None:
        self.out = out
        self.agents = agents
        self.root: str | None = None
        self.names: dict[str, str] = {}
        self.epochs: dict[str, int] = {}
        self.providers: dict[str, str] = {}
        self.open_runs = 0
        self.changed = asyncio.Event()
        self.width = _width()
        #: Lines held per child until its parent's result names it.
        self.held: dict[str, list[str]] = {}
        self._ids: re.Pattern[str] | None = None

    def _entry(self, who: str, mark: str, text: str) -> list[str]:
        """One entry: its first line after ``who`` and ``mark``, the rest indented below it
        (wrapped to the terminal's width, at most :data:`_LINES` lines)."""
        text = self._shorten(text)
        lines = [
            part for line in text.splitlines() for part in textwrap.wrap(line, self.width)
        ] or [""]
        if len(lines) > _LINES:
            lines[_LINES - 1 :] = [f"… ({len(lines) - _LINES + 1} more lines)"]
        first = f"  {who:<14} {mark} {lines[0]}"
        return [first, *(f"  {'':<14}   {line}" for line in lines[1:])]

    def _line(self, session_id: str, mark: str, text: str) -> None:
        lines = self._entry(self.who(session_id), mark, text)
        held = self.held.get(session_id)
        if held is not None:
            held.extend(lines)
        else:
            for line in lines:
                print(line, file=self.out)

    def _shorten(self, text: str) -> str:
        if self._ids is None:
            return text
        return self._ids.sub(lambda m: self.names.get(m.group(0), m.group(0)), text)

    def _release(self, text: str) -> None:
        """Print the held lines of every child ``text`` (a parent's tool result) names."""
        for child_id in [c for c in self.held if c in text]:
            for line in self.held.pop(child_id):
                print(line, file=self.out)

    def release_all(self) -> None:
        for child_id in list(self.held):
            for line in self.held.pop(child_id):
                print(line, file=self.out)

    def who(self, session_id: str) -> str:
        if session_id == self.root:
            return "coordinator"
        return self.names.get(session_id) or self._name(session_id, None)

    def _name(self, session_id: str, provider: str | None) -> str:
        descriptor = self._descriptor(session_id)
        label = descriptor.get("label") if descriptor else None
        name = short_name(label if isinstance(label, str) else None, provider or "child",
                          session_id)  # fmt: skip
        self.names[session_id] = name
        self._ids = re.compile("|".join(re.escape(i) for i in sorted(self.names, key=len)[::-1]))
        return name

    def on_session_event(self, session: Any, event: SessionEvent) -> None:
        kind = event.type
        sid = session.header.id
        data = event.data
        if kind == "tool/call":
            try:
                args = json.dumps(json.loads(data.arguments), ensure_ascii=False)
            except ValueError:
                args = data.arguments
            self._line(sid, "→", f"{data.name} {args}")
        elif kind == "tool/result":
            text = _text(b for block in data.message.content for b in getattr(block, "content", ()))
            failed = f"  (error {data.error.code})" if data.error is not None else ""
            self._line(sid, "←", text + failed)
            self._release(text)
        elif kind == "assistant/message":
            text = blocks_text(data.message.content)
            if text:
                self._line(sid, ">", text)
        elif kind == "user/message":
            source = data.source.kind
            text = _text(data.content)
            if sid == self.root:
                self._line(sid, "<" if source == "user" else "⇐", text)
            elif source not in ("user", "plugin"):  # the prompt: in the call shown above
                self._line(sid, "⇐", f"(from the {source}) {text}")
        self.changed.set()

    def on_start(self, info: Any) -> None:
        self.open_runs += 1
        n = self.epochs[info.id] = self.epochs.get(info.id, 0) + 1
        self.providers[info.id] = info.provider
        descriptor = self._descriptor(info.id)
        if info.id not in self.names:
            self._name(info.id, info.provider)
            if descriptor and descriptor.get("mode") == "continuable":
                self.held[info.id] = []  # until the parent's tool result names it
        remote = not info.local or info.provider == "acp"  # its turns run in another process
        how = "a follow-up in the same ACP session" if remote else "a cold resume from the store"
        what = "started" if n == 1 else f"resumed (epoch {n}: {how})"
        label = descriptor.get("label") if descriptor else None
        shown = f' "{label}"' if isinstance(label, str) else ""
        agent = self.agents.get(info.id)
        seeded = agent.session.header.seed_length if agent is not None else None
        if seeded:
            shown += f" (seeded with the coordinator's completed turns: {seeded} events)"
        where = " (another process, over ACP)" if remote else ""
        self._line(info.id, "⇢", f"{what}: {info.provider} child{where}{shown}")
        self.changed.set()

    def _descriptor(self, child_id: str) -> Mapping[str, Any] | None:
        """The child's durable descriptor, from its log (a continuable child's is written
        before it starts; a one-shot child's in its first turn)."""
        agent = self.agents.get(child_id)
        for event in agent.session.events if agent is not None else ():
            if event.type == "subagent/descriptor" and isinstance(event.data, Mapping):
                return event.data
        return None

    def on_end(self, info: Any) -> None:
        self.open_runs -= 1
        self._line(info.id, "⇠", f"ended {info.stop_reason}")
        self.changed.set()


async def _until_quiet(transcript: _Transcript, coordinator: Agent) -> None:
    """Wait until the coordinator is idle and every child run it began has ended."""
    while True:
        await coordinator.when_idle()
        if coordinator.status == "idle" and transcript.open_runs == 0:
            return
        transcript.changed.clear()
        await transcript.changed.wait()


async def run_tour(
    out: TextIO,
    pm: DshPluginManager,
    *,
    script: str | None,
    prompt: str,
    store: Path,
    model: str | None = None,
    max_steps: int | None = None,
) -> int:
    """The tour of the seam on ``pm``'s plugins (every :data:`TOUR_PLUGINS` installed); 0 when
    the coordinator's last turn completed and no invariant broke, else 1. ``model``
    (``openai:MODEL``) runs the coordinator and its in-process children on a real model
    through dsh-llm-openai instead of the script."""
    subagents: Any = importlib.import_module("dsh_subagent")
    real = None
    if model is not None:
        provider, _, name = model.partition(":")
        real = PluginRow(plugin="llm-openai", config={"provider": provider, "model": name})
        route = AgentOptions(provider=provider, model=name, max_steps=max_steps)
        what = f"the model {name} (provider {provider})"
    else:
        route = AgentOptions(provider="scripted", model="tour", max_steps=max_steps)
        what = f"the offline scripted model (the script {script})" if script else (
            "the offline scripted model (its embedded script)")  # fmt: skip
    print(f"\nthe subagent seam, on {what}:", file=out)
    print(f"  sessions are kept in {store}", file=out)
    print("  → a tool call   ← its result   > what an agent says", file=out)
    print("  ⇐ a message it receives   ⇢ ⇠ a child run starts, ends", file=out)
    async with await boot_host(_tour_rows(store, real), pm=pm) as host:
        ctx = host.ctx
        transcript = _Transcript(out, ctx.agents)
        if real is None:
            scripted = (
                ScriptedAdapter.from_file(script, record=False)
                if script
                else ScriptedAdapter.from_data(TOUR_SCRIPT, record=False)
            )
            ctx.llm.register_adapter("scripted", scripted)
        handle = await ctx.agents.create(
            CreateAgentOptions(meta=SessionMeta(cwd=os.getcwd()), agent_options=route)
        )
        coordinator = handle.agent
        transcript.root = coordinator.id
        print(f"  coordinator = session {coordinator.id}\n", file=out)
        ctx.on("session/event", transcript.on_session_event)
        ctx.on("subagent/start", transcript.on_start)
        ctx.on("subagent/end", transcript.on_end)
        coordinator.followup(user_message(prompt))
        status = 0
        try:
            async with asyncio.timeout(_TOUR_TIMEOUT):
                await _until_quiet(transcript, coordinator)
        except TimeoutError:
            print(f"\n  the tour did not settle within {_TOUR_TIMEOUT:.0f} s", file=out)
            status = 1
        transcript.release_all()
        ends = [e for e in coordinator.session.events if e.type == "turn/end"]
        if ends and ends[-1].data.reason.kind != "completed":
            print(f"\n  the coordinator's last turn ended {ends[-1].data.reason.kind}", file=out)
            status = 1
        await _print_tree(out, ctx[subagents.SUBAGENTS], coordinator.id, transcript)
        await handle.dispose()
        broken = list(ctx.invariants.violations)
    for v in broken:
        print(f"  invariant broken: {v}", file=out)
    return 1 if broken else status


async def _print_tree(out: TextIO, service: Any, root: str, transcript: _Transcript) -> None:
    """The coordinator's child tree, read back from the store (``list_descendants``), with
    the names the transcript used and, below each, the full id. A child that ran in another
    process and left no session here (a one-shot ACP child) follows, marked as such."""
    rows = await service.list_descendants(root)
    print("\nthe child tree, read back from the store (list_descendants):", file=out)
    print(f"coordinator  {root}", file=out)
    listed = {row.entry.id for row in rows}
    elsewhere = [c for c in transcript.names if c not in listed]
    lines: list[tuple[int, str, str]] = []  # (depth, first line, id)
    for row in rows:
        entry = row.entry
        name = transcript.names.get(entry.id, entry.id[-4:])
        if entry.kind == "child":
            provider = transcript.providers.get(entry.id)
            detail = f"{provider}, {entry.mode}" if provider else entry.mode
            if entry.mode == "continuable":
                epochs = transcript.epochs.get(entry.id, 0)
                detail += f", {epochs} epoch{'s' if epochs != 1 else ''}"
            label = f' "{entry.label}"' if entry.label else ""
            lines.append((row.depth, f"{name}{label} ({detail})", entry.id))
        else:
            lines.append((row.depth, f"{name} [diagnostic: {entry.reason}]", entry.id))
    for child_id in elsewhere:
        provider = transcript.providers.get(child_id, "child")
        first = (
            f"{transcript.names[child_id]} ({provider}, one-shot, in another process: no log here)"
        )
        lines.append((1, first, child_id))
    if not lines:
        print("└── (no children)", file=out)
    open_levels: list[bool] = []  # per depth above the row: does a later sibling follow?
    for i, (depth, first, child_id) in enumerate(lines):
        last = next((d for d, _, _ in lines[i + 1 :] if d <= depth), 0) < depth
        del open_levels[depth - 1 :]
        pad = "".join("│   " if more else "    " for more in open_levels)
        open_levels.append(not last)
        print(f"{pad}{'└── ' if last else '├── '}{first}", file=out)
        print(f"{pad}{'    ' if last else '│   '}    {child_id}", file=out)


async def run_one_turn(out: TextIO, *, script: str | None, prompt: str) -> int:
    """One turn of an agent on the core plugins alone, on the scripted model (echo, or
    ``script``); 1 if anything broke."""
    from dsh_core import plugin as core_plugin

    pm = make_plugin_manager(autoload=False, plugins={"core": core_plugin})
    model = PluginRow(plugin="llm-scripted", config={"script": script} if script else {})
    rows: list[PluginRow | str] = ["sessions", "session-persistence-memory", "llm", model, "tools",
            "system-prompt", "agents", "jobs", "invariants"]  # fmt: skip
    async with await boot_host(rows, pm=pm) as host:
        handle = await host.ctx.agents.create(
            CreateAgentOptions(
                meta=SessionMeta(cwd=os.getcwd()),
                agent_options=AgentOptions(provider="scripted", model="echo"),
            )
        )
        agent = handle.agent
        what = f"the script {script}" if script else "the embedded scripted model echoes"
        print(f"\none offline turn ({what}):", file=out)
        print(f"  user      > {prompt}", file=out)
        agent.followup(user_message(prompt))
        await agent.when_idle()
        print(f"  assistant > {agent.session.derive_messages()[-1].text}", file=out)
        print(f"  session {agent.id}: {agent.session.seq} durable events", file=out)
        print(f"    {', '.join(e.type for e in agent.session.events)}", file=out)
        await handle.dispose()
        broken = list(host.ctx.invariants.violations)
    for v in broken:
        print(f"  invariant broken: {v}", file=out)
    return 1 if broken else 0
