"""The crash tier's tree: one host's plugins and the scripted models its agents run on.

A root agent (session ``root``) starts three continuable children through the real
``subagent`` tool; each child starts two grandchildren and reports up; every grandchild
reports to its child. Each round the root sends every child a follow-up (``send_message``),
and each child, on a follow-up, reports and sends each of its grandchildren one. Every turn
ends after a bounded number of steps, so a round always comes to rest.

Roles are told apart by the first user message of an agent's own conversation (its prompt).
The checker's model (:func:`check_model`) only answers, except a child asked to ``PING`` its
grandchildren, which it does with ``send_message`` (the real path a resumed parent takes).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from dsh_core import PluginRow, blocks_text
from dsh_core.testing import ScriptedReply, ScriptedRequest, tool_call_reply

ROOT_ID = "root"
CHILDREN = 3
GRANDCHILDREN = 2

LOAD = (
    "dsh-subagent",
    "dsh-subagent-spawn",
    "dsh-tool-subagent",
    "dsh-tool-subagent-control",
    "dsh-tool-subagent-report",
)
PLUGINS: tuple[str | PluginRow, ...] = (
    "subagent",
    "subagent-spawn",
    PluginRow(
        plugin="tool-subagent",
        config={"provider": "spawn", "background_mode": "continuable"},
    ),
    "tool-subagent-control",
    "tool-subagent-report",
)

_STARTED = re.compile(r"^started subagent (\S+)$")


def _first_user(request: ScriptedRequest) -> str:
    for m in request.messages:
        if m.role == "user" and m.source.kind == "user":
            return m.text
    return ""


def _unanswered(request: ScriptedRequest) -> list[str]:
    """The texts after the latest assistant message (tool results by their content)."""
    texts: list[str] = []
    for m in reversed(request.messages):
        if m.role == "assistant":
            break
        if m.role == "tool":
            texts.extend(blocks_text(b.content) for b in m.content if hasattr(b, "content"))
        else:
            texts.append(m.text)
    return texts[::-1]


def _started(request: ScriptedRequest) -> list[str]:
    """The ids this agent's ``subagent`` calls were given, in order."""
    found: list[str] = []
    for m in request.messages:
        if m.role == "tool":
            for b in m.content:
                match = _STARTED.match("".join(blocks_text(getattr(b, "content", ()))))
                if match:
                    found.append(match.group(1))
    return found


def _token(request: ScriptedRequest, k: int) -> str:
    return f"{request.session_id}.{request.index}.{k}"


def tree_model(request: ScriptedRequest) -> ScriptedReply | str:
    """The tree's agents while the host runs (see the module docstring)."""
    new = _unanswered(request)
    role = _first_user(request)
    if request.session_id == ROOT_ID:
        if not any(t.startswith("ROUND") for t in new):
            return "noted"
        children = _started(request)
        if not children:
            calls = [
                ("subagent", {"description": f"child {i}", "prompt": "CHILD task"})
                for i in range(CHILDREN)
            ]
        else:
            calls = [
                ("send_message", {"subagent_id": c, "message": f"FOLLOWUP {_token(request, k)}"})
                for k, c in enumerate(children)
            ]
        return tool_call_reply(*calls)
    if role.startswith("CHILD"):
        if "CHILD task" in new:
            calls = [
                ("subagent", {"description": f"grandchild {i}", "prompt": "GRANDCHILD task"})
                for i in range(GRANDCHILDREN)
            ]
            calls.append(("report", {"output": f"child started {_token(request, 0)}"}))
            return tool_call_reply(*calls)
        if any(t.startswith("FOLLOWUP") for t in new):
            calls = [
                ("send_message", {"subagent_id": g, "message": f"FOLLOWUP {_token(request, k)}"})
                for k, g in enumerate(_started(request))
            ]
            calls.append(("report", {"output": f"child progress {_token(request, 99)}"}))
            return tool_call_reply(*calls)
        return "child noted"
    if role.startswith("GRANDCHILD"):
        if "GRANDCHILD task" in new or any(t.startswith("FOLLOWUP") for t in new):
            return tool_call_reply(("report", {"output": f"grandchild {_token(request, 0)}"}))
        return "grandchild noted"
    return "nothing to do"


def check_model(request: ScriptedRequest) -> ScriptedReply | str:
    """The checker's agents: a child told ``PING <id> ...`` sends each id a message."""
    for text in _unanswered(request):
        if text.startswith("PING"):
            ids = text.split()[1:]
            if not ids:
                return "pong"
            return tool_call_reply(
                *(("send_message", {"subagent_id": g, "message": "PING"}) for g in ids)
            )
    return "pong"


def record_line(record: dict[str, Any]) -> str:
    """One side-record line (JSON, newline-terminated)."""
    return json.dumps(record, sort_keys=True) + "\n"


async def rest(ctx: Any, root: Any) -> None:
    """Until ``root`` is idle and no continuable child is resident or retiring."""
    manager = ctx.subagents._state.continuation
    moved = asyncio.Event()

    def wake(*args: object) -> None:
        moved.set()

    removers = [ctx.on(name, wake) for name in ("agent/status", "subagent/end")]
    try:
        while manager.activations or manager.retiring or root.status != "idle":
            moved.clear()
            await moved.wait()
    finally:
        for remove in removers:
            remove()
