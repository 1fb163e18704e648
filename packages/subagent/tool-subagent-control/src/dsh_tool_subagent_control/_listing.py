"""``list_agents``: the continuable subagents below the calling agent, as the model sees them
(CTL-4, CTL-5, BUG-4).

The rows come from ``ctx.subagents.list_children`` / ``list_descendants``; this module only
projects them: one-shot children are dropped (``send_message`` cannot continue them), though
in ``descendants`` scope the walk still goes through them, so their continuable descendants
stay; diagnostics are kept; a child's status is read from the live agent registry, never
from the listing's ``activity``: ``running`` (its driver is running), ``idle`` (resident
between turns, maybe waiting on its own children) or ``ready`` (no live agent: resumable, not
terminal).
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from typing import Any, Literal

from dsh_core import (
    AgentRegistry,
    ContentBlock,
    Context,
    ServiceKey,
    ToolDefinition,
    ToolError,
    ToolOutput,
    ToolRunContext,
    text_blocks,
)
from dsh_subagent import (
    SUBAGENTS,
    SubagentChildEntry,
    SubagentDescendantListEntry,
    SubagentListEntry,
    SubagentRunEndInfo,
    SubagentRunInfo,
)

__all__ = ["LIST_AGENTS_DESCRIPTION", "ListAgentsStatus", "install_list_agents"]

#: A listed child's status (BUG-4: exactly these three; none of them reads as terminal).
ListAgentsStatus = Literal["running", "idle", "ready"]

_AGENTS: ServiceKey[AgentRegistry] = ServiceKey("agents")

#: What the model reads about ``list_agents`` (CTL-5's pinned fragments: "you are told when
#: one finishes", "resumable, not terminal", ``send_message`` for depth-1 rows only,
#: ``interrupt_agent`` for deeper ones).
LIST_AGENTS_DESCRIPTION = (
    "List the background subagents you started, with their ids, labels and status: running "
    "(working on a turn), idle (alive between turns, possibly waiting on its own subagents) or "
    "ready (not loaded: resumable, not terminal; send_message continues it). There is no need "
    "to poll: you are told when one finishes. scope children (the default) lists your direct "
    "subagents; scope descendants lists the whole tree below you, each row with its parent id "
    "and depth. Rows at depth 1 accept send_message; deeper rows accept only interrupt_agent. "
    "A row [diagnostic: <reason>] is a subagent whose record could not be read."
)

_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scope": {
            "type": "string",
            "enum": ["children", "descendants"],
            "description": "children (default): your direct subagents. descendants: every "
            "subagent below you, with its parent id and depth.",
        }
    },
    "additionalProperties": False,
}

_POSITION: dict[str, Any] = {"parent": {"type": "string"}, "depth": {"type": "integer"}}
_OUTPUT: dict[str, Any] = {
    "type": "array",
    "items": {
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "kind": {"const": "child"},
                    "id": {"type": "string"},
                    "label": {"type": "string"},
                    "status": {"enum": ["running", "idle", "ready"]},
                    "last_turn": {"const": "max-steps"},
                    **_POSITION,
                },
                "required": ["kind", "id", "label", "status"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {
                    "kind": {"const": "diagnostic"},
                    "id": {"type": "string"},
                    "reason": {"enum": ["corrupt", "unsupported", "unavailable"]},
                    **_POSITION,
                },
                "required": ["kind", "id", "reason"],
                "additionalProperties": False,
            },
        ]
    },
}


def _status(registry: AgentRegistry, child_id: str) -> ListAgentsStatus:
    agent = registry.get(child_id)
    if agent is None:
        return "ready"
    return "running" if agent.status == "running" else "idle"


def _row(
    registry: AgentRegistry, entry: SubagentListEntry, stopped: Container[str]
) -> dict[str, Any] | None:
    """The model-facing row of one listing entry, or ``None`` for a one-shot child.
    ``stopped``: the children whose latest epoch ended at its step limit."""
    if isinstance(entry, SubagentChildEntry):
        if entry.mode != "continuable":
            return None
        row: dict[str, Any] = {
            "kind": "child",
            "id": entry.id,
            "label": entry.label or "",
            "status": _status(registry, entry.id),
        }
        if entry.id in stopped and row["status"] != "running":
            row["last_turn"] = "max-steps"  # its last turn was cut at the step limit (ROB-11)
        return row
    return {"kind": "diagnostic", "id": entry.id, "reason": entry.reason}


def project_children(
    registry: AgentRegistry,
    entries: Iterable[SubagentListEntry],
    stopped: Container[str] = frozenset(),
) -> list[dict[str, Any]]:
    """CTL-5 over ``list_children``: diagnostics kept, one-shot children dropped."""
    rows = []
    for entry in entries:
        row = _row(registry, entry, stopped)
        if row is not None:
            rows.append(row)
    return rows


def project_descendants(
    registry: AgentRegistry,
    entries: Iterable[SubagentDescendantListEntry],
    stopped: Container[str] = frozenset(),
) -> list[dict[str, Any]]:
    """CTL-5 over ``list_descendants``: as :func:`project_children`, each row with its durable
    ``parent`` and ``depth``; a dropped one-shot intermediate leaves its descendants' rows."""
    rows = []
    for item in entries:
        row = _row(registry, item.entry, stopped)
        if row is not None:
            row["parent"] = item.parent_id
            row["depth"] = item.depth
            rows.append(row)
    return rows


#: What a row's status bracket adds about the child's last turn.
_NOTES = {"max-steps": ", stopped at its step limit"}


def _one_line(text: str) -> str:
    """``text`` with its line breaks as spaces: a label (a model wrote it, maybe a child's
    model) or a reason stays inside its own row and cannot pass for another row."""
    return " ".join(text.splitlines()) if text else text


def render_rows(rows: Any) -> str:
    """``<id> [<status>] — <label>``, ``<id> [diagnostic: <reason>]`` (with `` parent=<id>
    depth=<n>`` after the bracket on a descendants row, and ``, stopped at its step limit``
    inside the bracket of a child whose last turn ended there), one per line; ``(no subagents)``.
    Line breaks inside a label or a reason are rendered as spaces (the value keeps them)."""
    if not rows:
        return "(no subagents)"
    lines = []
    for row in rows:
        at = f" parent={row['parent']} depth={row['depth']}" if "parent" in row else ""
        if row["kind"] == "child":
            note = _NOTES.get(row.get("last_turn", ""), "")
            lines.append(f"{row['id']} [{row['status']}{note}]{at} — {_one_line(row['label'])}")
        else:
            lines.append(f"{row['id']} [diagnostic: {_one_line(row['reason'])}]{at}")
    return "\n".join(lines)


def _render(value: Any, run: ToolRunContext) -> tuple[ContentBlock, ...]:
    return text_blocks(render_rows(value))


def install_list_agents(ctx: Context) -> None:
    """Register ``list_agents`` once, in ``ctx``'s (global) layer; it goes when ``ctx`` is
    disposed."""
    subagents = ctx[SUBAGENTS]
    registry = ctx[_AGENTS]
    # The children whose latest epoch ended at its step limit, as this host saw them settle
    # (ROB-11). Kept from subagent/end rather than read from each child's log, so a listing
    # stays a bounded read of each child's first events; a host started later does not know.
    stopped: set[str] = set()

    def on_end(info: SubagentRunEndInfo) -> None:
        if info.stop_reason == "max-steps":
            stopped.add(info.id)
        else:
            stopped.discard(info.id)

    def on_start(info: SubagentRunInfo) -> None:
        stopped.discard(info.id)  # a new epoch: how the last one ended no longer tells

    ctx.on("subagent/start", on_start)
    ctx.on("subagent/end", on_end)

    async def list_agents(args: Any, run: ToolRunContext) -> list[dict[str, Any]]:
        parent = run.agent
        if parent is None:
            raise ToolError(
                "list_agents requires a calling agent (exec.agent was undefined)",
                code="NO_AGENT",
            )
        if args.get("scope", "children") == "descendants":
            below = await subagents.list_descendants(parent.id, run.signal)
            return project_descendants(registry, below, stopped)
        children = await subagents.list_children(parent.id, run.signal)
        return project_children(registry, children, stopped)

    ctx.tools.register(
        ToolDefinition(
            name="list_agents",
            description=LIST_AGENTS_DESCRIPTION,
            parameters=_PARAMETERS,
            execute=list_agents,
            output=ToolOutput(schema=_OUTPUT, render=_render),
            concurrency_safe=True,
        )
    )
