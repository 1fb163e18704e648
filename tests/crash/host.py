"""The crash tier's host process: runs the tree (``tree.py``) on a JSONL store until killed.

Usage: ``python host.py STORE SIDE_RECORD ROUNDS``. Every acknowledgement an agent of the
tree receives is appended to the side record right after it is given, as one JSON line,
written to the operating system (a flush; only the process dies, never the machine):

- ``{"k": "child", "id", "owner", "depth"}``: a ``subagent`` call returned a child id;
- ``{"k": "followup", "target", "token", "from"}``: ``send_message`` said "message queued";
- ``{"k": "report", "id", "parent", "from"}``: ``report`` said "report accepted ... as
  message <id>".

A tool result is appended to the caller's session after the tool body returned, so the
record never runs ahead of the acknowledgement. After each record the host prints ``ack``
(the killer counts them); ``ready`` once the root exists; ``done`` if every round ended.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tree import LOAD, PLUGINS, ROOT_ID, record_line, rest, tree_model

from dsh_core import SessionMeta, user_message
from dsh_core.testing import TestHost

_ACCEPTED = re.compile(r"^report accepted by the agent that started you as message (\S+)$")
_QUEUED = re.compile(r"^message queued as the next turn for subagent (\S+)$")
_STARTED = re.compile(r"^started subagent (\S+)$")


def _stdout(word: str) -> None:
    sys.stdout.write(word + "\n")
    sys.stdout.flush()


def serve(store: str, side: str, rounds: int, conn: Connection) -> None:
    """The host in a process forked by the driver's fork server (the modules are imported
    already): as the script, but ``ready``, ``ack`` and ``done`` go over ``conn``."""
    asyncio.run(main(Path(store), Path(side), rounds, say=conn.send_bytes))


async def main(
    store: Path, side: Path, rounds: int, say: Callable[[bytes], None] | None = None
) -> None:
    out = side.open("a", encoding="utf-8")
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    tell: Callable[[bytes], None] = say or (lambda word: _stdout(word.decode()))

    def record(entry: dict[str, Any]) -> None:
        out.write(record_line(entry))
        out.flush()  # to the operating system: the process may die right after
        tell(b"ack")

    def on_event(session: Any, event: Any) -> None:
        kind = event.type
        if kind == "tool/call":
            try:
                args = json.loads(event.data.arguments)
            except ValueError:
                args = {}
            calls[event.data.call_id] = (event.data.name, args)
            return
        if kind != "tool/result" or event.data.error is not None:
            return
        caller = session.header.id
        for block in event.data.message.content:
            call = calls.pop(getattr(block, "tool_call_id", ""), None)
            text = "".join(getattr(b, "text", "") for b in getattr(block, "content", ()))
            if call is None:
                continue
            name, args = call
            if name == "subagent" and (m := _STARTED.match(text)):
                depth = (session.header.delegation_depth or 0) + 1
                record({"k": "child", "id": m.group(1), "owner": caller, "depth": depth})
            elif name == "send_message" and _QUEUED.match(text):
                record(
                    {
                        "k": "followup",
                        "target": args["subagent_id"],
                        "token": args["message"].split()[-1],
                        "from": caller,
                    }
                )
            elif name == "report" and (m := _ACCEPTED.match(text)):
                parent = session.header.parent_session
                record({"k": "report", "id": m.group(1), "parent": parent, "from": caller})

    host = await TestHost.start(
        *PLUGINS, model=tree_model, load=LOAD, store="jsonl", store_root=store
    )
    host.ctx.on("session/event", on_event)
    handle = await host.create_agent(session_id=ROOT_ID, meta=SessionMeta(cwd=os.getcwd()))
    root = handle.agent
    tell(b"ready")
    for r in range(rounds):
        root.followup(user_message(f"ROUND {r}"))
        await rest(host.ctx, root)
    await handle.dispose()
    await host.aclose()
    tell(b"done")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])))
