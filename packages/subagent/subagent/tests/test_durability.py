"""What the seam acknowledges is on disk first (the JSONL store writes through): a continuable
child's header and descriptor before its id is returned, a follow-up in the child's log and a
report in the parent's log before their ids are; a store that cannot write refuses instead.

The store's file is read as bytes, as a fresh process would find it after a kill -9."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest

import dsh_subagent.plugin
from dsh_core import (
    AbortController,
    Agent,
    SessionError,
    text_blocks,
)
from dsh_core._sessions import Session
from dsh_core.testing import ScriptedReply, ScriptedRequest, TestHost, scripted_host
from dsh_subagent import (
    SUBAGENTS,
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ContinuableStartSpec,
    CoordinatorMessageSource,
    ResolvedSubagentStartRequest,
    SubagentCapabilities,
    SubagentError,
    SubagentFollowupOptions,
    SubagentReportOptions,
    SubagentRun,
)
from dsh_subagent.in_process import start_in_process_run

PARENT = "session-parent"


@attrs.define
class _Provider:
    name: str = "local"
    capabilities: SubagentCapabilities = attrs.field(factory=SubagentCapabilities)
    inherits_parent_context: bool = False

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        return await start_in_process_run(request)

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        return ContinuableCreateSpec()


class _Model:
    """Children hold every turn until ``gate`` opens; the parent echoes."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.asked: dict[str, asyncio.Event] = {}

    def __call__(self, request: ScriptedRequest) -> ScriptedReply | str:
        self.asked.setdefault(request.session_id or "", asyncio.Event()).set()
        if request.session_id != PARENT:
            return ScriptedReply(text="working", wait=self.gate.wait)
        return "ok"


@contextlib.asynccontextmanager
async def _host(
    tmp_path: Path, model: _Model, *, resume: bool = False
) -> AsyncIterator[tuple[TestHost, Agent]]:
    async with scripted_host(
        "subagent",
        model=model,
        modules={"subagent": dsh_subagent.plugin},
        store="jsonl",
        store_root=tmp_path,
    ) as host:
        host.ctx.plugin("local-provider")[SUBAGENTS].register_provider(_Provider())
        if resume:
            parent = (await host.resume_agent(PARENT)).agent
        else:
            parent = (await host.create_agent(session_id=PARENT)).agent
        try:
            yield host, parent
        finally:
            model.gate.set()


def _spec(parent: Agent) -> ContinuableStartSpec:
    return ContinuableStartSpec(
        provider="local",
        label="helper",
        prompt=text_blocks("child task"),
        parent=parent,
        signal=AbortController().signal,
    )


def _stored(tmp_path: Path, session_id: str) -> list[dict[str, Any]]:
    """The complete lines of a session's file, as a fresh process would read them."""
    raw = (tmp_path / f"{session_id}.jsonl").read_bytes()
    return [json.loads(line) for line in raw.split(b"\n")[:-1]]


def _inserted_ids(lines: list[dict[str, Any]]) -> list[str]:
    return [
        m["id"]
        for line in lines
        if line.get("type") == "agent/inbox/spliced"
        for m in line["data"].get("inserted", ())
    ]


def _fail_writes_of(monkeypatch: pytest.MonkeyPatch, *session_ids: str) -> None:
    """Every checkpoint of the named sessions fails as a full or read-only disk would."""
    original = Session.checkpoint

    def checkpoint(self: Session) -> None:
        if self.header.id in session_ids or (not session_ids and self.header.id != PARENT):
            raise SessionError("cannot write session file: no space left", code="SESSION_IO")
        original(self)

    monkeypatch.setattr(Session, "checkpoint", checkpoint)


async def test_a_child_id_is_returned_only_once_its_creation_is_written(tmp_path: Path) -> None:
    """DUR-31: when start_continuable returns a child id, the child's file already holds its
    header (parent, depth), its descriptor and its accepted prompt."""
    model = _Model()
    async with _host(tmp_path, model) as (host, parent):
        started = await host.ctx[SUBAGENTS].start_continuable(_spec(parent))
        lines = _stored(tmp_path, started.child_id)
        assert lines[0]["parent_session"] == PARENT
        assert lines[0]["delegation_depth"] == 1
        assert [line["type"] for line in lines[1:3]] == [
            "subagent/descriptor",
            "agent/inbox/spliced",
        ]
        assert started.message_id in _inserted_ids(lines)


async def test_a_child_whose_creation_cannot_be_written_is_not_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-31: a store that cannot write the new child fails start_continuable with the
    store's SESSION_IO, and no Activation or ownership is left behind."""
    model = _Model()
    async with _host(tmp_path, model) as (host, parent):
        _fail_writes_of(monkeypatch)
        with pytest.raises(SessionError) as caught:
            await host.ctx[SUBAGENTS].start_continuable(_spec(parent))
        assert caught.value.code == "SESSION_IO"
        manager = host.ctx[SUBAGENTS]._state.continuation
        assert not manager.activations and not manager.materializations


async def test_a_follow_up_id_is_returned_only_once_it_is_in_the_childs_log(
    tmp_path: Path,
) -> None:
    """DUR-34: the message id send_message's follow-up returns is already in the child's
    file, for a running child and for one cold-resumed from the store."""
    model = _Model()
    async with _host(tmp_path, model) as (host, parent):
        svc = host.ctx[SUBAGENTS]
        options = SubagentFollowupOptions(source=CoordinatorMessageSource(sender_session_id=PARENT))
        child = (await svc.start_continuable(_spec(parent))).child_id
        queued = await svc.followup(parent, child, text_blocks("more"), options)
        assert queued in _inserted_ids(_stored(tmp_path, child))
        model.gate.set()
        manager = svc._state.continuation
        async with asyncio.timeout(10):
            await manager.activations[child].ended()  # settled: the next one cold-resumes
        assert child not in manager.activations
        model.gate.clear()
        resumed = await svc.followup(parent, child, text_blocks("again"), options)
        assert resumed in _inserted_ids(_stored(tmp_path, child))


async def test_a_cold_resume_is_written_with_the_acceptance_before_the_id_is_returned(
    tmp_path: Path,
) -> None:
    """DUR-60: a follow-up that cold-resumes a settled child returns its id only once the
    child's file holds the resume's own events (its seed end) and, after them, the accepted
    message: the acceptance's write carries everything the resume logged before it."""
    model = _Model()
    model.gate.set()
    async with _host(tmp_path, model) as (host, parent):
        svc = host.ctx[SUBAGENTS]
        options = SubagentFollowupOptions(source=CoordinatorMessageSource(sender_session_id=PARENT))
        child = (await svc.start_continuable(_spec(parent))).child_id
        manager = svc._state.continuation
        async with asyncio.timeout(10):
            await manager.activations[child].ended()
        model.gate.clear()
        resumed = await svc.followup(parent, child, text_blocks("again"), options)
        lines = _stored(tmp_path, child)
        assert [line["type"] for line in lines[-2:]] == [
            "session/end-seed",
            "agent/inbox/spliced",
        ]
        assert _inserted_ids(lines[-1:]) == [resumed]


async def test_a_follow_up_the_store_cannot_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-34: a follow-up whose acceptance cannot be written raises SESSION_IO and is not
    left in the child's inbox."""
    model = _Model()
    async with _host(tmp_path, model) as (host, parent):
        svc = host.ctx[SUBAGENTS]
        options = SubagentFollowupOptions(source=CoordinatorMessageSource(sender_session_id=PARENT))
        child = (await svc.start_continuable(_spec(parent))).child_id
        _fail_writes_of(monkeypatch, child)
        with pytest.raises(SessionError) as caught:
            await svc.followup(parent, child, text_blocks("more"), options)
        assert caught.value.code == "SESSION_IO"
        agent = svc._state.continuation.activations[child].agent
        assert not agent.inbox.next_turn


async def test_a_report_id_is_returned_only_once_it_is_in_the_parents_log(
    tmp_path: Path,
) -> None:
    """DUR-32: the message id report_from returns is already in the parent's file."""
    model = _Model()
    async with _host(tmp_path, model) as (host, parent):
        svc = host.ctx[SUBAGENTS]
        child = (await svc.start_continuable(_spec(parent))).child_id
        agent = svc._state.continuation.activations[child].agent
        for delivery in ("quiet", "next-step", "wakeup"):
            report = await svc.report_from(
                agent, text_blocks(f"{delivery} news"), SubagentReportOptions(delivery=delivery)
            )
            assert report in _inserted_ids(_stored(tmp_path, PARENT))


async def test_a_report_the_parents_store_cannot_write_is_refused_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-32: a report the parent's log cannot take fails with the store's SESSION_IO (not
    PARENT_UNAVAILABLE: the parent is there), and the parent was not handed it."""
    model = _Model()
    async with _host(tmp_path, model) as (host, parent):
        svc = host.ctx[SUBAGENTS]
        child = (await svc.start_continuable(_spec(parent))).child_id
        agent = svc._state.continuation.activations[child].agent
        _fail_writes_of(monkeypatch, PARENT)
        with pytest.raises(SessionError) as caught:
            await svc.report_from(agent, text_blocks("news"), SubagentReportOptions())
        assert caught.value.code == "SESSION_IO"
        assert not isinstance(caught.value, SubagentError)
        assert not parent.inbox.next_step and not parent.inbox.next_turn


async def test_a_tree_copied_mid_turn_is_listed_and_resumed_top_down(tmp_path: Path) -> None:
    """DUR-35, DUR-36: the store's files as a kill -9 would leave them (copied while a child and its
    own child are both in a model request) give a fresh host the whole tree: the child is
    listed with its parent and depth, cold-resumes with its open turn closed `interrupted`,
    and, resumed, reaches its own child again."""
    import shutil

    live, copy = tmp_path / "live", tmp_path / "copy"
    model = _Model()
    async with _host(live, model) as (host, parent):
        svc = host.ctx[SUBAGENTS]
        child = (await svc.start_continuable(_spec(parent))).child_id
        child_agent = svc._state.continuation.activations[child].agent
        grandchild = (await svc.start_continuable(_spec(child_agent))).child_id
        async with asyncio.timeout(10):  # both in their model request (written before it)
            for agent_id in (child, grandchild):
                await model.asked.setdefault(agent_id, asyncio.Event()).wait()
        shutil.copytree(live, copy)  # what the disk holds right now: the process "dies"

    model = _Model()  # the fresh host's children hold their turns too (they stay resident)
    async with _host(copy, model, resume=True) as (host, parent):
        svc = host.ctx[SUBAGENTS]
        rows = {r.entry.id: r for r in await svc.list_descendants(PARENT)}
        assert (rows[child].parent_id, rows[child].depth) == (PARENT, 1)
        assert (rows[grandchild].parent_id, rows[grandchild].depth) == (child, 2)
        assert rows[child].entry.kind == rows[grandchild].entry.kind == "child"
        options = SubagentFollowupOptions(source=CoordinatorMessageSource(sender_session_id=PARENT))
        await svc.followup(parent, child, text_blocks("go on"), options)
        resumed = svc._state.continuation.activations[child].agent
        ends = [e.data.reason.kind for e in resumed.session.events if e.type == "turn/end"]
        assert ends == ["interrupted"]
        mine = SubagentFollowupOptions(source=CoordinatorMessageSource(sender_session_id=child))
        queued = await svc.followup(resumed, grandchild, text_blocks("you too"), mine)
        assert queued in _inserted_ids(_stored(copy, grandchild))
