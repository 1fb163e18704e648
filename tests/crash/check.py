"""The crash tier's checker: a fresh process verifies what a killed host left on disk.

Usage: ``python check.py STORE SIDE_RECORD [STORE SIDE_RECORD ...]``; prints one JSON object
per pair (the tally of that kill point: children, follow-ups, reports, and every loss found).

For each kill point, against the side record of every acknowledgement the host gave:

1. every child whose id was handed out is listed below the root (``list_descendants``), as a
   continuable child (not a diagnostic row), with its durable parent and depth unchanged;
2. every follow-up acknowledged "message queued" is in its target's stored log, and every
   report acknowledged "accepted ... as message X" has X in its parent's stored log (the raw
   JSONL lines, read before anything is resumed);
3. a fresh host resumes the root and cold-resumes each child with a follow-up that asks it
   to ``send_message`` each of its own recorded children: every follow-up must be accepted,
   and each resumed child's ``send_message`` to its children must be queued too.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from tree import LOAD, PLUGINS, ROOT_ID, check_model, rest

from dsh_core import text_blocks
from dsh_core.testing import TestHost
from dsh_subagent import SUBAGENTS, CoordinatorMessageSource, SubagentError, SubagentFollowupOptions

_WAIT = 30.0  # seconds a resumed tree may take to answer the checker


def read_record(side: Path) -> list[dict[str, Any]]:
    """The side record's complete lines (a line cut by the kill was never acknowledged)."""
    try:
        data = side.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")[:-1]  # the part after the last newline is incomplete
    return [json.loads(line) for line in lines if line]


def _stored_lines(store: Path, session_id: str) -> list[dict[str, Any]]:
    path = store / f"{session_id}.jsonl"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in raw.split(b"\n"):
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a torn last line: the reader's repair drops it
    return out


def _inserted(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every message a stored log's inbox splices inserted."""
    found: list[dict[str, Any]] = []
    for line in lines:
        if line.get("type") == "agent/inbox/spliced":
            found.extend(line.get("data", {}).get("inserted", ()))
    return found


def _says(message: dict[str, Any], text: str) -> bool:
    """Whether a stored message's text blocks are exactly ``text``."""
    return "".join(b.get("text", "") for b in message.get("content", ())) == text


async def check_store(store: Path, side: Path) -> dict[str, Any]:
    """Verify one kill point; the tally and every loss found."""
    record = read_record(side)
    children = [r for r in record if r["k"] == "child"]
    followups = [r for r in record if r["k"] == "followup"]
    reports = [r for r in record if r["k"] == "report"]
    lost: list[str] = []
    tally: dict[str, Any] = {
        "children": len(children),
        "followups": len(followups),
        "reports": len(reports),
        "mid_turn": 0,
        "resumed": 0,
        "reached": 0,
        "lost": lost,
    }
    if not (store / f"{ROOT_ID}.jsonl").exists():
        if record:
            lost.append("the root's log is missing")
        return tally
    # 2. the durable logs, before anything is resumed (and repaired).
    logs: dict[str, list[dict[str, Any]]] = {}

    def log(sid: str) -> list[dict[str, Any]]:
        if sid not in logs:
            logs[sid] = _stored_lines(store, sid)
        return logs[sid]

    for c in children:  # a child that died with its turn open: the resume repairs it
        turns = [line.get("type") for line in log(c["id"])]
        starts, ends = turns.count("turn/start"), turns.count("turn/end")
        tally["mid_turn"] += starts > ends
    lost.extend(
        f"follow-up {f['token']} to {f['target']} is not in its log"
        for f in followups
        if not any(_says(m, f"FOLLOWUP {f['token']}") for m in _inserted(log(f["target"])))
    )
    lost.extend(
        f"report {r['id']} of {r['from']} is not in {r['parent']}'s log"
        for r in reports
        if not any(m.get("id") == r["id"] for m in _inserted(log(r["parent"])))
    )
    # 1. the listing.
    host = await TestHost.start(
        *PLUGINS, model=check_model, load=LOAD, store="jsonl", store_root=store
    )
    try:
        service = host.ctx[SUBAGENTS]
        rows = {row.entry.id: row for row in await service.list_descendants(ROOT_ID)}
        for c in children:
            row = rows.get(c["id"])
            if row is None:
                lost.append(f"child {c['id']} is not listed")
            elif row.entry.kind != "child" or row.entry.mode != "continuable":
                lost.append(f"child {c['id']} is listed as {row.entry}")
            elif row.parent_id != c["owner"] or row.depth != c["depth"]:
                lost.append(
                    f"child {c['id']} is listed under {row.parent_id} at depth {row.depth}, "
                    f"handed out by {c['owner']} at depth {c['depth']}"
                )
        # 3. cold resume, top-down: the root, each child, each child's own children.
        await _resume_tree(host, children, tally)
    finally:
        await host.aclose()
    return tally


async def _resume_tree(
    host: TestHost, children: list[dict[str, Any]], tally: dict[str, Any]
) -> None:
    lost: list[str] = tally["lost"]
    below: dict[str, list[str]] = defaultdict(list)
    for c in children:
        below[c["owner"]].append(c["id"])
    service = host.ctx[SUBAGENTS]
    root = (await host.resume_agent(ROOT_ID)).agent
    answered: dict[str, asyncio.Event] = {}
    results: dict[str, list[str]] = defaultdict(list)

    def on_event(session: Any, event: Any) -> None:
        if event.type != "tool/result":
            return
        sid = session.header.id
        for block in event.data.message.content:
            text = "".join(getattr(b, "text", "") for b in getattr(block, "content", ()))
            results[sid].append(("error: " if event.data.error is not None else "") + text)
        want = len(below.get(sid, ()))
        if sid in answered and len(results[sid]) >= want:
            answered[sid].set()

    host.ctx.on("session/event", on_event)
    options = SubagentFollowupOptions(source=CoordinatorMessageSource(sender_session_id=ROOT_ID))
    for child_id in below[ROOT_ID]:
        mine = below.get(child_id, [])
        if mine:
            answered[child_id] = asyncio.Event()
        try:
            await service.followup(root, child_id, text_blocks(" ".join(["PING", *mine])), options)
        except SubagentError as exc:
            lost.append(f"child {child_id} could not be resumed: {exc.code} {exc}")
            answered.pop(child_id, None)
            continue
        tally["resumed"] += 1
    try:
        async with asyncio.timeout(_WAIT):
            for event in answered.values():
                await event.wait()
    except TimeoutError:
        lost.append(f"resumed children did not answer within {_WAIT:.0f} s")
    for child_id in answered:
        for text in results[child_id]:
            if text.startswith("message queued"):
                tally["reached"] += 1
            else:
                lost.append(f"child {child_id} could not reach its child: {text}")
    try:
        async with asyncio.timeout(_WAIT):
            await rest(host.ctx, root)
    except TimeoutError:
        lost.append("the resumed tree did not come to rest")


async def main(pairs: list[tuple[Path, Path]]) -> None:
    for store, side in pairs:
        try:
            tally = await check_store(store, side)
        except Exception as exc:  # one broken kill point must not hide the others
            tally = {"lost": [f"the checker failed: {type(exc).__name__}: {exc}"]}
        tally["store"] = str(store)
        print(json.dumps(tally), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main([(Path(a), Path(b)) for a, b in zip(args[::2], args[1::2], strict=True)]))
