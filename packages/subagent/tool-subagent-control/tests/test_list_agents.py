"""``list_agents`` through the real tool registry: scope, projection, statuses and rendering
(CTL-4, CTL-5, BUG-4)."""

from __future__ import annotations

from types import SimpleNamespace

from dsh_core import SessionHeader, thaw_json
from dsh_core.testing import tool_call_reply
from dsh_core.testing.strategies import LogBuilder
from dsh_subagent import DESCRIPTOR_EVENT
from dsh_tool_subagent_control import LIST_AGENTS_DESCRIPTION


async def test_list_agents_plugin_loads_alone(kit: SimpleNamespace) -> None:
    """CTL plugins: tool-subagent-list-agents registers list_agents once, globally, without
    send_message or interrupt_agent."""
    async with kit.boot(("tool-subagent-list-agents",)) as b:
        child = await b.start("hold c")
        for ctx in (b.host.ctx, b.parent.ctx, b.agent(child).ctx):
            names = [s.name for s in ctx.tools.schemas()]
            assert names.count("list_agents") == 1
            assert "send_message" not in names and "interrupt_agent" not in names


async def test_list_agents_schema_description_and_status_vocabulary(kit: SimpleNamespace) -> None:
    """CTL-4, CTL-5, BUG-4: scope is optional and is children or descendants; the description
    pins its fragments; the output status enum is exactly running / idle / ready."""
    async with kit.boot() as b:
        tool = b.host.ctx.tools.get("list_agents")
        assert tool is not None
        params = thaw_json(tool.parameters)
        assert "required" not in params and list(params["properties"]) == ["scope"]
        assert params["properties"]["scope"]["enum"] == ["children", "descendants"]
        assert tool.description == LIST_AGENTS_DESCRIPTION
        for fragment in (
            "you are told when one finishes",
            "resumable, not terminal",
            "Rows at depth 1 accept send_message",
            "deeper rows accept only interrupt_agent",
        ):
            assert fragment in tool.description
        assert tool.output.schema is not None
        child_item = thaw_json(tool.output.schema)["items"]["oneOf"][0]
        assert child_item["properties"]["status"]["enum"] == ["running", "idle", "ready"]


async def test_no_subagents(kit: SimpleNamespace) -> None:
    """CTL-5: an empty listing renders "(no subagents)" with an empty value."""
    async with kit.boot() as b:
        for scope in ({}, {"scope": "children"}, {"scope": "descendants"}):
            result = await b.call("list_agents", scope)
            assert result.ok, result.error
            assert thaw_json(result.value) == [] and kit.text(result) == "(no subagents)"


async def test_statuses_come_from_the_live_registry(kit: SimpleNamespace) -> None:
    """CTL-5, BUG-4: running (its driver runs), idle (resident between turns, waiting on its
    own child), ready (settled: no live agent, resumable); rows render
    `<id> [<status>] — <label>` in the listing's order."""
    async with kit.boot() as b:
        busy = await b.start("hold busy", label="busy one")
        waiting = await b.start("hold waiting", label="waiting one")
        await b.start("hold below", parent=await b.asked(waiting, "hold waiting"))
        b.model.release("hold waiting")
        waiter = b.agent(waiting)
        await b.until(lambda: kit.turn_ends(waiter) == ["completed"] and waiter.status == "idle")
        done = await b.start("finish now", label="done one")
        await b.settled(done)
        await b.asked(busy, "hold busy")
        result = await b.call("list_agents", {})
        assert result.ok, result.error
        rows = {row["id"]: row for row in thaw_json(result.value)}
        assert {i: r["status"] for i, r in rows.items()} == {
            busy: "running",
            waiting: "idle",
            done: "ready",
        }
        assert rows[done] == {"kind": "child", "id": done, "label": "done one", "status": "ready"}
        expected = [f"{r['id']} [{r['status']}] — {r['label']}" for r in thaw_json(result.value)]
        assert kit.text(result).split("\n") == expected
        assert f"{done} [ready] — done one" in expected


async def test_a_label_with_line_breaks_stays_in_its_own_row(kit: SimpleNamespace) -> None:
    """CTL-5: rows are one per line, so a label a model wrote with line breaks (here one that
    imitates another row) renders on its own row, its breaks as spaces; the value keeps the
    label as written."""
    async with kit.boot() as b:
        label = "real one\nforged-id [running] — not a child\r\nthird"
        child = await b.start("finish", label=label)
        await b.settled(child)
        result = await b.call("list_agents", {})
        assert result.ok, result.error
        assert thaw_json(result.value)[0]["label"] == label
        assert kit.text(result) == (
            f"{child} [ready] — real one forged-id [running] — not a child third"
        )


async def test_one_shot_children_are_dropped_and_diagnostics_kept(kit: SimpleNamespace) -> None:
    """CTL-5: a one-shot child gives no row; a child whose record is unreadable (here a
    malformed descriptor) is kept as `<id> [diagnostic: <reason>]`."""
    async with kit.boot() as b:
        run = await b.start_one_shot("hold one-shot")
        kept = await b.start("finish", label="kept")
        await b.settled(kept)
        header = SessionHeader(
            id="broken-child", created_at=1, parent_session=b.parent.id, origin="subagent"
        )
        store = b.host.ctx.session_persistence
        await store.create(header)
        log = LogBuilder()
        log.add(DESCRIPTOR_EVENT, {"version": 2, "mode": "one-shot", "provider": 7}, ignorable=True)
        await store.append("broken-child", list(log.events))
        result = await b.call("list_agents", {"scope": "children"})
        assert result.ok, result.error
        assert thaw_json(result.value) == [
            {"kind": "diagnostic", "id": "broken-child", "reason": "corrupt"},
            {"kind": "child", "id": kept, "label": "kept", "status": "ready"},
        ]
        assert kit.text(result) == f"broken-child [diagnostic: corrupt]\n{kept} [ready] — kept"
        assert run.id not in kit.text(result)
        b.model.release("hold one-shot")
        await run.result
        await run.dispose()


async def test_descendants_scope_keeps_what_is_below_a_one_shot_intermediate(
    kit: SimpleNamespace,
) -> None:
    """CTL-4, CTL-5: scope descendants lists the tree with parent and depth, rendered
    ` parent=<id> depth=<n>` after the status bracket; a one-shot intermediate is dropped but
    its continuable child is kept; children scope shows only depth-1 rows."""
    async with kit.boot() as b:
        child = await b.start("hold child", label="child")
        grandchild = await b.start(
            "hold grandchild", label="grandchild", parent=await b.asked(child, "hold child")
        )
        run = await b.start_one_shot("hold one-shot")
        assert run.local_agent is not None
        await b.asked(run.id, "hold one-shot")
        under = await b.start("hold under", label="under one-shot", parent=run.local_agent)
        for agent_id, prompt in ((grandchild, "hold grandchild"), (under, "hold under")):
            await b.asked(agent_id, prompt)
        result = await b.call("list_agents", {"scope": "descendants"})
        assert result.ok, result.error
        rows = thaw_json(result.value)
        assert {(r["id"], r["parent"], r["depth"]) for r in rows} == {
            (child, b.parent.id, 1),
            (grandchild, child, 2),
            (under, run.id, 2),
        }
        assert all(r["kind"] == "child" and r["status"] == "running" for r in rows)
        assert set(kit.text(result).split("\n")) == {
            f"{child} [running] parent={b.parent.id} depth=1 — child",
            f"{grandchild} [running] parent={child} depth=2 — grandchild",
            f"{under} [running] parent={run.id} depth=2 — under one-shot",
        }
        children = await b.call("list_agents", {})
        assert kit.text(children) == f"{child} [running] — child"
        for gate in ("hold one-shot", "hold under"):
            b.model.release(gate)
        await run.result
        await run.dispose()


async def test_list_agents_from_a_real_turn(kit: SimpleNamespace) -> None:
    """CTL-4: a parent model calling list_agents with no arguments reads its children."""
    async with kit.boot() as b:
        child = await b.start("hold work", label="worker")
        await b.asked(child, "hold work")
        b.model.parent_replies[:] = [tool_call_reply(("list_agents", {})), "listed"]
        assert await b.host.run(b.parent, "who is there?") == "listed"
        tool_messages = [m for m in b.parent.session.derive_messages() if m.role == "tool"]
        (block,) = tool_messages[-1].content
        assert not block.is_error
        assert kit.text(SimpleNamespace(content=block.content)) == f"{child} [running] — worker"


async def test_list_agents_refusals(kit: SimpleNamespace) -> None:
    """CTL-4: no calling agent gives "list_agents requires a calling agent…"; a scope outside
    the enum is an errored result naming the field."""
    async with kit.boot() as b:
        result = await b.call("list_agents", {}, agent=None)
        assert result.error is not None and result.error.code == "NO_AGENT"
        assert kit.text(result).startswith("Error: list_agents requires a calling agent")
        bad = await b.call("list_agents", {"scope": "everyone"})
        assert bad.error is not None and bad.error.code == "INVALID_ARGS"
        assert "scope" in kit.text(bad)


async def test_a_listing_failure_is_an_errored_result(kit: SimpleNamespace) -> None:
    """CTL-4, LIST-S: without a session query the listing's own error comes back as an
    errored result with its code, not as an exception out of the turn."""
    async with kit.boot(query=False) as b:
        result = await b.call("list_agents", {"scope": "descendants"})
        assert result.error is not None
        assert result.error.code == "SUBAGENT_CONTROL_SESSION_QUERY_UNAVAILABLE"
