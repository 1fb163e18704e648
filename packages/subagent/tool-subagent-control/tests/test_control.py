"""``send_message`` and ``interrupt_agent`` through the real tool registry and a real agent
loop (CTL-1, CTL-2, CTL-3, INT-1, INT-2)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from dsh_core import blocks_text, thaw_json
from dsh_core.testing import repr_markers, tool_call_reply
from dsh_subagent import CoordinatorMessageSource
from dsh_tool_subagent_control import INTERRUPT_AGENT_DESCRIPTION, SEND_MESSAGE_DESCRIPTION

# -- the surface -----------------------------------------------------------------------------------


async def test_control_plugin_registers_both_tools_once_globally(kit: SimpleNamespace) -> None:
    """CTL plugins: tool-subagent-control registers send_message and interrupt_agent in the
    global layer (a child sees them too), and loads without list_agents."""
    async with kit.boot(("tool-subagent-control",)) as b:
        child = await b.start("hold c")
        for ctx in (b.host.ctx, b.parent.ctx, b.agent(child).ctx):
            names = [s.name for s in ctx.tools.schemas()]
            assert names.count("send_message") == 1 and names.count("interrupt_agent") == 1
            assert "list_agents" not in names


async def test_send_message_schema_and_description(kit: SimpleNamespace) -> None:
    """CTL-1: input {subagent_id, message}, both required strings; the description says the
    message becomes the next turn, cannot redirect work under way, returns no answer, and a
    failure delivered nothing; it never mentions jobs."""
    async with kit.boot() as b:
        tool = b.host.ctx.tools.get("send_message")
        assert tool is not None
        params = thaw_json(tool.parameters)
        assert params["required"] == ["subagent_id", "message"]
        assert set(params["properties"]) == {"subagent_id", "message"}
        assert {p["type"] for p in params["properties"].values()} == {"string"}
        assert tool.description == SEND_MESSAGE_DESCRIPTION
        for fragment in (
            "next turn",
            "cannot redirect work already under way",
            "returns no answer",
            "A failure means nothing was delivered",
        ):
            assert fragment in tool.description
        assert "job" not in tool.description.lower()


async def test_interrupt_agent_schema_and_description(kit: SimpleNamespace) -> None:
    """CTL-3: input {agent_id}, its only (required) parameter; the description mentions the
    current turn and that parked messages wait for a later send_message."""
    async with kit.boot() as b:
        tool = b.host.ctx.tools.get("interrupt_agent")
        assert tool is not None
        params = thaw_json(tool.parameters)
        assert params["required"] == ["agent_id"] and list(params["properties"]) == ["agent_id"]
        assert tool.description == INTERRUPT_AGENT_DESCRIPTION
        assert "current turn" in tool.description
        assert "until a later send_message" in tool.description


# -- send_message (CTL-1, CTL-2) -------------------------------------------------------------------


async def test_send_message_cold_resumes_a_settled_child_with_a_coordinator_source(
    kit: SimpleNamespace,
) -> None:
    """CTL-1, CTL-2: a follow-up to a settled child cold-resumes it; the result is
    {messageId} rendered "message queued as the next turn for subagent <id>", and the child's
    user message carries the coordinator relay source naming the parent."""
    async with kit.boot() as b:
        child = await b.start("first")
        await b.settled(child)
        assert b.host.ctx.agents.get(child) is None
        result = await b.call("send_message", {"subagent_id": child, "message": "hold second"})
        assert result.ok, result.error
        assert kit.text(result) == f"message queued as the next turn for subagent {child}"
        message_id = result.value["messageId"]
        resumed = b.agent(child)
        await b.until(lambda: kit.user_texts(resumed)[-1:] == ["hold second"])
        assert kit.user_texts(resumed) == ["first", "hold second"]
        (sent,) = [m for m in resumed.session.derive_messages() if m.id == message_id]
        assert sent.source == CoordinatorMessageSource(sender_session_id=b.parent.id)
        assert sent.source.form == "relay"


async def test_send_message_queues_behind_a_running_turn(kit: SimpleNamespace) -> None:
    """CTL-2: a running child queues the message behind its open turn; the logged prompts
    appear in order."""
    async with kit.boot() as b:
        child = await b.start("hold one")
        agent = await b.asked(child, "hold one")
        result = await b.call("send_message", {"subagent_id": child, "message": "hold two"})
        assert result.ok, result.error
        assert kit.user_texts(agent) == ["hold one"]
        b.model.release("hold one")
        await b.until(lambda: kit.user_texts(agent) == ["hold one", "hold two"])
        assert b.agent(child) is agent  # the same Activation: no resume


async def test_send_message_from_a_real_turn(kit: SimpleNamespace) -> None:
    """CTL-1: a parent model calling send_message in its turn gets the rendered result (not an
    error) and the child runs the message."""
    async with kit.boot() as b:
        child = await b.start("hold work")
        b.model.parent_replies[:] = [
            tool_call_reply(("send_message", {"subagent_id": child, "message": "more please"})),
            "sent",
        ]
        assert await b.host.run(b.parent, "delegate") == "sent"
        results = [m for m in b.parent.session.derive_messages() if m.role == "tool"]
        (block,) = results[-1].content
        assert not block.is_error
        assert blocks_text(block.content) == (
            f"message queued as the next turn for subagent {child}"
        )
        agent = b.agent(child)
        b.model.release("hold work")
        await b.until(lambda: kit.user_texts(agent)[-1:] == ["more please"])


async def test_send_message_to_an_unknown_id_is_unavailable(kit: SimpleNamespace) -> None:
    """CTL-2: an unknown id gives an errored result containing "unavailable", with what to do."""
    async with kit.boot() as b:
        result = await b.call("send_message", {"subagent_id": "nobody", "message": "hi"})
        assert result.error is not None and result.error.code == "NOT_RESUMABLE"
        assert "unavailable" in kit.text(result)
        assert "check the subagent_id" in kit.text(result)


async def test_send_message_to_a_one_shot_child_says_not_to_retry(kit: SimpleNamespace) -> None:
    """CTL-2, CONT-10: a one-shot child cannot be continued; the seam's text already says what
    to do ("do not retry send_message with this id") and gets no other hint."""
    async with kit.boot() as b:
        run = await b.start_one_shot("finish")
        await run.result
        await run.dispose()
        result = await b.call("send_message", {"subagent_id": run.id, "message": "again"})
        assert result.error is not None and result.error.code == "NOT_RESUMABLE"
        assert kit.text(result).endswith("do not retry send_message with this id")


async def test_send_message_to_another_parents_child_is_refused(kit: SimpleNamespace) -> None:
    """CTL-2: a caller that is not the child's parent gets "another parent session", and the
    child receives nothing."""
    async with kit.boot() as b:
        child = await b.start("hold mine")
        await b.asked(child, "hold mine")
        other = (await b.host.create_agent()).agent
        result = await b.call(
            "send_message", {"subagent_id": child, "message": "steal"}, agent=other
        )
        assert result.error is not None and result.error.code == "UNAUTHORIZED"
        assert "another parent session" in kit.text(result)
        assert "only to subagents you started yourself" in kit.text(result)
        agent = b.agent(child)
        assert not agent.inbox.next_turn and kit.user_texts(agent) == ["hold mine"]


async def test_send_message_without_an_agent(kit: SimpleNamespace) -> None:
    """CTL-2: no calling agent gives "send_message requires a calling agent (exec.agent was
    undefined)"."""
    async with kit.boot() as b:
        result = await b.call("send_message", {"subagent_id": "x", "message": "y"}, agent=None)
        assert result.error is not None and result.error.code == "NO_AGENT"
        assert kit.text(result) == (
            "Error: send_message requires a calling agent (exec.agent was undefined)"
        )


# -- interrupt_agent (CTL-3, INT-1, INT-2) ------------------------------------------------------


async def test_interrupt_stops_the_current_turn_and_parks_queued_messages(
    kit: SimpleNamespace,
) -> None:
    """CTL-3, INT-1, INT-2: interrupt_agent returns {accepted: true} once the stop was issued
    (the model request is already aborted); the child's turn ends, a message queued before
    stays parked (the child stays resident and idle) until a later send_message, which runs
    it first."""
    async with kit.boot() as b:
        child = await b.start("hold task")
        agent = await b.asked(child, "hold task")
        assert (await b.call("send_message", {"subagent_id": child, "message": "queued"})).ok
        (request,) = [r for r in b.model.requests if r.session_id == child]
        assert not request.signal.aborted
        result = await b.call("interrupt_agent", {"agent_id": child})
        assert result.ok, result.error
        assert request.signal.aborted  # synchronous: the cancel was issued before the result
        assert thaw_json(result.value) == {"accepted": True}
        assert kit.text(result) == f"interrupt requested for agent {child}"
        await b.until(lambda: agent.status == "idle")
        assert kit.turn_ends(agent) == ["aborted"]
        assert b.agent(child) is agent and [
            blocks_text(m.content) for m in agent.inbox.next_turn
        ] == ["queued"]
        assert kit.user_texts(agent) == ["hold task"]
        assert (await b.call("send_message", {"subagent_id": child, "message": "hold later"})).ok
        await b.until(lambda: kit.user_texts(agent) == ["hold task", "queued", "hold later"])


async def test_interrupt_reaches_a_deeper_descendant(kit: SimpleNamespace) -> None:
    """CTL-3: the root interrupts a grandchild (a descendant below its direct child)."""
    async with kit.boot() as b:
        child = await b.start("hold child")
        grandchild = await b.start("hold grandchild", parent=b.agent(child))
        agent = await b.asked(grandchild, "hold grandchild")
        result = await b.call("interrupt_agent", {"agent_id": grandchild})
        assert result.ok, result.error
        await b.until(lambda: agent.status == "idle")
        assert kit.turn_ends(agent) == ["aborted"]
        assert kit.turn_ends(b.agent(child)) == []  # an ancestor is never signalled


async def test_interrupt_refuses_itself_and_siblings(kit: SimpleNamespace) -> None:
    """CTL-3: an agent cannot interrupt itself, nor a sibling ("not a live descendant")."""
    async with kit.boot() as b:
        first = await b.start("hold first")
        second = await b.start("hold second")
        caller = await b.asked(first, "hold first")
        await b.asked(second, "hold second")
        own = await b.call("interrupt_agent", {"agent_id": first}, agent=caller)
        assert own.error is not None and own.error.code == "UNAUTHORIZED"
        assert "cannot interrupt itself" in kit.text(own)
        sibling = await b.call("interrupt_agent", {"agent_id": second}, agent=caller)
        assert sibling.error is not None and sibling.error.code == "UNAUTHORIZED"
        assert "not a live descendant" in kit.text(sibling)
        assert "only agents created under you" in kit.text(sibling)
        assert b.agent(second).status == "running" and kit.turn_ends(b.agent(second)) == []


async def test_interrupt_of_settled_or_unknown_targets_succeeds_without_resume(
    kit: SimpleNamespace,
) -> None:
    """CTL-3, INT-1: a settled child and an unknown id are accepted no-ops: no cold resume."""
    async with kit.boot() as b:
        child = await b.start("done soon")
        await b.settled(child)
        for target in (child, "nobody"):
            result = await b.call("interrupt_agent", {"agent_id": target})
            assert result.ok, result.error
            assert kit.text(result) == f"interrupt requested for agent {target}"
        assert b.host.ctx.agents.get(child) is None
        assert b.svc._state.continuation.activations == {}


async def test_interrupt_without_an_agent(kit: SimpleNamespace) -> None:
    """CTL-3: no calling agent gives "interrupt_agent requires a calling agent"."""
    async with kit.boot() as b:
        result = await b.call("interrupt_agent", {"agent_id": "x"}, agent=None)
        assert result.error is not None and result.error.code == "NO_AGENT"
        assert "interrupt_agent requires a calling agent" in kit.text(result)


# -- bad input (issue 15: bad model input is the normal case) -----------------------------------


async def test_mistyped_or_missing_fields_name_the_field(kit: SimpleNamespace) -> None:
    """CTL-1, CTL-3: wrong types, missing and unknown fields are errored results that name the
    field (core's schema check), and nothing is sent."""
    async with kit.boot() as b:
        child = await b.start("hold c")
        agent = await b.asked(child, "hold c")
        cases = [
            ("send_message", {"subagent_id": child}, "message"),
            ("send_message", {"subagent_id": 7, "message": "x"}, "subagent_id"),
            ("send_message", {"subagent_id": child, "message": ["x"]}, "message"),
            ("interrupt_agent", {}, "agent_id"),
            ("interrupt_agent", {"agent_id": child, "now": True}, "now"),
        ]
        for name, arguments, field in cases:
            result = await b.call(name, arguments)
            assert result.error is not None and result.error.code == "INVALID_ARGS", name
            assert field in kit.text(result)
        assert not agent.inbox.next_turn and kit.turn_ends(agent) == []


async def test_odd_and_huge_ids_on_a_file_store(kit: SimpleNamespace, tmp_path: Path) -> None:
    """CTL-2, CTL-3: on the JSONL store an empty, path-like or 100 000-character id is
    "unavailable" to send_message and an accepted no-op to interrupt_agent; nothing is
    created."""
    async with kit.boot(store_root=tmp_path) as b:
        before = _files(tmp_path)
        for odd in ("", "../escape", "a/b", "x" * 100_000):
            sent = await b.call("send_message", {"subagent_id": odd, "message": "hi"})
            assert sent.error is not None and sent.error.code == "NOT_RESUMABLE"
            assert "unavailable" in kit.text(sent)
            assert (await b.call("interrupt_agent", {"agent_id": odd})).ok
        assert _files(tmp_path) == before


@pytest.mark.parametrize("odd", ["", "../escape", "a\nb", "\x00", "['x']", "x" * 100_000])
async def test_a_hostile_id_is_repeated_quoted_and_bounded(
    kit: SimpleNamespace, tmp_path: Path, odd: str
) -> None:
    """ROB-95: an id the model made up is repeated in the refusal JSON-quoted and cut after
    64 characters (never raw control characters, never 100 000 characters back), the seam's
    words kept around it."""
    async with kit.boot(store_root=tmp_path) as b:
        sent = await b.call("send_message", {"subagent_id": odd, "message": "hi"})
    text = kit.text(sent)
    shown = json.dumps(odd if len(odd) <= 64 else odd[:64] + "…", ensure_ascii=False)
    assert text.startswith(f"Error: subagent {shown} is unavailable; check the subagent_id")
    assert repr_markers(text) == [] and len(text) < 300


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*"))


async def test_send_message_the_store_cannot_write_delivers_nothing(
    kit: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-33: on the JSONL store, a follow-up the child's log cannot take is an errored
    result (SESSION_IO) saying nothing was delivered, and nothing waits in the child's inbox;
    once the store writes again, the result's id is in the child's file."""
    from dsh_core import SessionError
    from dsh_core._sessions import Session

    original = Session.checkpoint

    async with kit.boot(store_root=tmp_path) as b:
        child = await b.start("hold one")
        agent = await b.asked(child, "hold one")

        def full(self: Session) -> None:
            if self.header.id == child:
                raise SessionError("cannot write session file: no space left", code="SESSION_IO")
            original(self)

        monkeypatch.setattr(Session, "checkpoint", full)
        result = await b.call("send_message", {"subagent_id": child, "message": "two"})
        assert not result.ok and result.error is not None
        assert result.error.code == "SESSION_IO"
        assert "the message was not delivered" in kit.text(result)
        assert not agent.inbox.next_turn
        monkeypatch.setattr(Session, "checkpoint", original)
        result = await b.call("send_message", {"subagent_id": child, "message": "three"})
        assert result.ok, result.error
        assert result.value["messageId"] in (tmp_path / f"{child}.jsonl").read_text()
