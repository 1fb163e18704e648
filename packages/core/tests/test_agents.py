"""Agents: inbox verbs, the turn loop, cancellation, creation and disposal (host-core §9)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dsh_core import (
    AbortController,
    AbortedError,
    AgentCancelCause,
    Context,
    ContextError,
    EventTypeRegistry,
    Finish,
    Host,
    InboxSplicedData,
    LlmError,
    LlmFailure,
    Message,
    PluginSource,
    SessionEvent,
    SessionLogChecker,
    SessionMeta,
    SessionStoreService,
    StepData,
    StreamChunk,
    TextDelta,
    TurnEndData,
    TurnEndReason,
    TurnStartData,
    user_message,
)
from dsh_core._agent import (
    YIELD_EVERY_STEPS,
    Agent,
    AgentError,
    AgentHandle,
    AgentOptions,
    CreateAgentOptions,
    PreStep,
    PreStepDecision,
    RequestContext,
    RequestErrorContext,
    ResumeAgentOptions,
    current_initiator,
)
from dsh_core._fold import fold_consumed_work
from dsh_core._inbox import Inbox, InboxError, replay_inbox
from dsh_core._invariants import InvariantError
from dsh_core._llm import GenerateOptions
from dsh_core._tools import ToolDefinition, ToolRunContext
from dsh_core.testing import (
    SCRIPTED,
    ScriptedReply,
    ScriptedRequest,
    ScriptedToolCall,
    TestHost,
    last_answer,
    scripted_host,
)

T = TypeVar("T")
USER = AgentCancelCause(kind="user")


# -- helpers ----------------------------------------------------------------------------------


class Held:
    """Holds model requests open: ``reached`` fires once the reply's text is logged, the
    request then waits for ``gate`` (or finishes ``aborted`` when its signal fires)."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.gate = asyncio.Event()

    async def wait(self) -> None:
        self.reached.set()
        await self.gate.wait()

    def reply(self, text: str | None = None, **fields: Any) -> ScriptedReply:
        return ScriptedReply(text=text, wait=self.wait, **fields)


async def bounded(aw: Awaitable[Any], seconds: float = 5) -> Any:
    """Await ``aw`` but fail fast (TimeoutError) instead of hanging."""
    async with asyncio.timeout(seconds):
        return await aw


async def yield_once() -> None:
    """Give the event loop exactly one round (a suspension point, not a wait for anything)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    loop.call_soon(fut.set_result, None)
    await fut


def types(agent: Agent, since: int = 0) -> list[str]:
    return [e.type for e in agent.session.events[since:]]


def of_type(agent: Agent, type_: str) -> list[Any]:
    return [e.data for e in agent.session.events if e.type == type_]


def turn_ends(agent: Agent) -> list[TurnEndReason]:
    return [d.reason for d in of_type(agent, "turn/end")]


def entered_by_turn(agent: Agent) -> dict[int, list[list[str]]]:
    """User-message texts entered by each step, grouped by turn."""
    out: dict[int, list[list[str]]] = {}
    turn = 0
    for e in agent.session.events:
        if e.type == "turn/start":
            turn = e.data.turn
            out[turn] = []
        elif e.type == "step/start":
            out[turn].append([])
        elif e.type == "user/message" and turn in out and out[turn]:
            out[turn][-1].append(e.data.text)
    return out


def ids(messages: Sequence[Message]) -> list[str]:
    return [m.id for m in messages]


def tool(
    name: str,
    body: Callable[[Any, ToolRunContext], Awaitable[Any]],
    *,
    concurrency_safe: bool = False,
) -> ToolDefinition:
    return ToolDefinition(
        name=name,
        description=f"the {name} tool",
        execute=body,
        concurrency_safe=concurrency_safe,
    )


def calls(*names: str) -> ScriptedReply:
    return ScriptedReply(
        tool_calls=tuple(ScriptedToolCall(name=n, id=f"c{i}") for i, n in enumerate(names, 1))
    )


# -- inbox verbs ------------------------------------------------------------------------------


async def test_followups_run_in_fifo_order_one_turn_each() -> None:
    """host-core §9: followups queue as next turns and run FIFO, one turn per message."""
    held = Held()
    async with scripted_host(model=[held.reply("one"), "two", "three"]) as h:
        agent = (await h.create_agent()).agent
        claimed: list[tuple[str, int]] = []
        agent.ctx.on("agent/inbox/claimed", lambda a, m, turn: claimed.append((m.text, turn)))
        m1, m2, m3 = user_message("m1"), user_message("m2"), user_message("m3")
        agent.followup(m1)
        await bounded(held.reached.wait())
        agent.followup(m2)
        agent.followup(m3)
        assert ids(agent.inbox.next_turn) == [m2.id, m3.id]
        held.gate.set()
        await bounded(agent.when_idle())
        assert claimed == [("m1", 1), ("m2", 2), ("m3", 3)]
        assert entered_by_turn(agent) == {1: [["m1"]], 2: [["m2"]], 3: [["m3"]]}
        assert [r.kind for r in turn_ends(agent)] == ["completed"] * 3
        assert agent.status == "idle"
        assert last_answer(agent) == "three"


async def test_duplicate_pending_message_is_refused() -> None:
    """host-core §9: a message id may be pending at most once (DUPLICATE_PENDING)."""
    async with scripted_host() as h:
        agent = (await h.create_agent()).agent
        m = user_message("once")
        agent.inject(m)
        with pytest.raises(InboxError) as err:
            agent.followup(m)
        assert err.value.code == "DUPLICATE_PENDING"
        assert ids(agent.inbox.next_step) == [m.id]
        assert agent.inbox.next_turn == []
        assert agent.status == "idle"


async def test_steer_is_claimed_at_the_next_step_of_the_running_turn() -> None:
    """host-core §9: a steer during a tool call joins the next step of the same turn."""
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(args: Any, run: ToolRunContext) -> str:
        started.set()
        await release.wait()
        return "tool done"

    async with scripted_host(model=[calls("slow"), "after steering"]) as h:
        h.ctx.tools.register(tool("slow", slow))
        agent = (await h.create_agent()).agent
        agent.followup(user_message("start"))
        await bounded(started.wait())
        agent.steer(user_message("steered"))
        assert [m.text for m in agent.inbox.next_step] == ["steered"]
        release.set()
        await bounded(agent.when_idle())
        assert entered_by_turn(agent) == {1: [["start"], ["steered"]]}
        assert len(h.model.requests) == 2
        second = h.model.requests[1].messages
        assert [m.role for m in second[-2:]] == ["tool", "user"]
        assert second[-1].text == "steered"
        assert [r.kind for r in turn_ends(agent)] == ["completed"]


async def test_steer_during_the_final_request_adds_a_step_to_the_turn() -> None:
    """host-core §9: steering that arrives while the last step runs adds a step, not a turn."""
    held = Held()
    async with scripted_host(model=[held.reply("first"), "second"]) as h:
        agent = (await h.create_agent()).agent
        agent.followup(user_message("go"))
        await bounded(held.reached.wait())
        agent.steer(user_message("also this"))
        held.gate.set()
        await bounded(agent.when_idle())
        assert entered_by_turn(agent) == {1: [["go"], ["also this"]]}
        assert len(h.model.requests) == 2


async def test_inject_does_not_wake_an_idle_agent_and_joins_the_next_turn() -> None:
    """host-core §9: inject does not wake an idle agent; the next turn claims it first."""
    async with scripted_host() as h:
        agent = (await h.create_agent()).agent
        statuses: list[str] = []
        agent.ctx.on("agent/status", lambda a, s: statuses.append(s))
        quiet, loud = user_message("quiet"), user_message("loud")
        agent.inject(quiet)
        assert agent.status == "idle"
        assert statuses == []
        assert "turn/start" not in types(agent)
        assert ids(agent.inbox.next_step) == [quiet.id]
        agent.followup(loud)
        await bounded(agent.when_idle())
        assert entered_by_turn(agent) == {1: [["quiet", "loud"]]}
        assert statuses == ["running", "idle"]


async def test_inject_into_a_running_turn_is_claimed_by_a_further_step() -> None:
    """host-core §9 step 5: input injected while a turn runs is entered before the turn ends."""
    held = Held()
    async with scripted_host(model=[held.reply("first"), "second"]) as h:
        agent = (await h.create_agent()).agent
        agent.followup(user_message("go"))
        await bounded(held.reached.wait())
        agent.inject(user_message("note"))
        held.gate.set()
        await bounded(agent.when_idle())
        assert entered_by_turn(agent) == {1: [["go"], ["note"]]}


async def test_wake_prefix_is_synchronous_so_an_immediate_cancel_aborts_a_claimed_turn() -> None:
    """host-core §9: followup() claims at once; an immediate cancel aborts the claimed turn."""
    async with scripted_host() as h:
        agent = (await h.create_agent()).agent
        claimed: list[tuple[str, int]] = []
        agent.ctx.on("agent/inbox/claimed", lambda a, m, turn: claimed.append((m.id, turn)))
        before = agent.session.seq
        m = user_message("hello")
        agent.followup(m)
        assert agent.status == "running"
        assert types(agent, before) == ["agent/inbox/spliced", "turn/start", "agent/inbox/spliced"]
        assert claimed == [(m.id, 1)]
        assert len(agent.inbox) == 0
        agent.cancel(USER)
        await bounded(agent.when_idle())
        assert types(agent, before) == [
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "turn/end",
        ]
        assert turn_ends(agent) == [TurnEndReason(kind="aborted", cause=USER)]
        assert h.model.requests == []
        consumed = fold_consumed_work(agent.session.events)
        assert consumed.end is not None and consumed.end.reason.kind == "aborted"


async def test_cancel_keep_inbox_parks_queued_work_until_the_next_waking_send() -> None:
    """INT-2: cancel(keep_inbox) parks queued work; the next wake runs it, then the new one."""
    held = Held()
    async with scripted_host(model=[held.reply("one"), "two", "three"]) as h:
        agent = (await h.create_agent()).agent
        agent.followup(user_message("m1"))
        await bounded(held.reached.wait())
        parked = user_message("m2")
        agent.followup(parked)
        agent.cancel(USER, keep_inbox=True)
        await bounded(agent.when_idle())
        assert agent.status == "idle"
        assert ids(agent.inbox.next_turn) == [parked.id]
        assert len(h.model.requests) == 1
        assert turn_ends(agent) == [TurnEndReason(kind="aborted", cause=USER)]
        agent.followup(user_message("m3"))
        await bounded(agent.when_idle())
        assert entered_by_turn(agent) == {1: [["m1"]], 2: [["m2"]], 3: [["m3"]]}
        assert [r.kind for r in turn_ends(agent)] == ["aborted", "completed", "completed"]


async def test_bug6_send_right_after_cancel_runs_after_convergence() -> None:
    """BUG-6: cancel(keep_inbox) while running, send at once: it still runs after convergence."""
    held = Held()
    async with scripted_host(model=[held.reply("one"), "two"]) as h:
        agent = (await h.create_agent()).agent
        statuses: list[str] = []
        agent.ctx.on("agent/status", lambda a, s: statuses.append(s))
        agent.followup(user_message("m1"))
        await bounded(held.reached.wait())
        agent.cancel(USER, keep_inbox=True)
        agent.steer(user_message("after the abort"))
        assert [m.text for m in agent.inbox.next_turn] == ["after the abort"]
        assert agent.inbox.next_step == []
        await bounded(agent.when_idle())
        assert entered_by_turn(agent) == {1: [["m1"]], 2: [["after the abort"]]}
        assert [r.kind for r in turn_ends(agent)] == ["aborted", "completed"]
        assert statuses == ["running", "idle"]
        assert last_answer(agent) == "two"


async def test_bug6_latched_send_runs_after_the_items_parked_before_the_abort() -> None:
    """BUG-6/INT-2: the latch replays in FIFO order: items queued before the abort first."""
    held = Held()
    async with scripted_host(model=[held.reply("one"), "two", "three"]) as h:
        agent = (await h.create_agent()).agent
        agent.followup(user_message("m1"))
        await bounded(held.reached.wait())
        agent.followup(user_message("queued before"))
        agent.cancel(USER, keep_inbox=True)
        agent.followup(user_message("sent after"))
        await bounded(agent.when_idle())
        assert entered_by_turn(agent) == {
            1: [["m1"]],
            2: [["queued before"]],
            3: [["sent after"]],
        }


async def test_bug6_cancel_without_keep_inbox_clears_the_latch() -> None:
    """BUG-6: a later cancel without keep_inbox discards the latched send; nothing replays."""
    held = Held()
    async with scripted_host(model=[held.reply("one"), "two"]) as h:
        agent = (await h.create_agent()).agent
        discarded: list[str] = []
        agent.ctx.on("agent/inbox/discarded", lambda a, m: discarded.append(m.text))
        agent.followup(user_message("m1"))
        await bounded(held.reached.wait())
        agent.cancel(USER, keep_inbox=True)
        agent.followup(user_message("latched"))
        agent.cancel(USER)
        await bounded(agent.when_idle())
        assert discarded == ["latched"]
        assert len(agent.inbox) == 0
        assert [r.kind for r in turn_ends(agent)] == ["aborted"]
        assert agent.status == "idle"
        assert len(h.model.requests) == 1


async def test_latched_send_is_not_replayed_when_the_cause_is_disposal() -> None:
    """host-core §9: a wake latched under a `disposed` abort is not replayed."""
    held = Held()
    async with scripted_host(model=[held.reply("one"), "two"]) as h:
        agent = (await h.create_agent()).agent
        agent.followup(user_message("m1"))
        await bounded(held.reached.wait())
        agent.cancel(AgentCancelCause(kind="disposed"), keep_inbox=True)
        agent.followup(user_message("late"))
        await bounded(agent.when_idle())
        assert [r.kind for r in turn_ends(agent)] == ["aborted"]
        assert [m.text for m in agent.inbox.next_turn] == ["late"]
        assert agent.status == "idle"


async def test_cancel_with_nothing_active_arms_nothing() -> None:
    """host-core §9: cancel on an idle agent is a no-op for the next turn (no latch, no abort)."""
    async with scripted_host() as h:
        agent = (await h.create_agent()).agent
        agent.cancel(USER, keep_inbox=True)
        assert await h.run(agent, "still works") == "still works"
        assert [r.kind for r in turn_ends(agent)] == ["completed"]


# -- the turn loop: failures and outcomes -----------------------------------------------------

FAILURE = LlmFailure(message="service unavailable", code="HTTP_503", status=503)


async def _raise_failure() -> None:
    raise LlmError(FAILURE)


@pytest.mark.parametrize(
    "failing",
    [
        pytest.param(ScriptedReply(text="partial", wait=_raise_failure), id="llm-error-raised"),
        pytest.param(ScriptedReply(text="partial", failure=FAILURE), id="error-finish"),
    ],
)
async def test_adapter_failing_mid_stream_ends_the_turn_in_error_and_agent_stays_usable(
    failing: ScriptedReply,
) -> None:
    """host-core §2/§9: a mid-stream adapter failure ends the turn in error; agent stays usable."""
    async with scripted_host(model=[failing, "recovered"]) as h:
        agent = (await h.create_agent()).agent
        errors: list[BaseException] = []
        agent.ctx.on("agent/error", lambda a, exc: errors.append(exc))
        await h.run(agent, "first")
        (reason,) = turn_ends(agent)
        assert reason.kind == "error"
        assert reason.error is not None and reason.error.code == "HTTP_503"
        assert len(errors) == 1
        assert of_type(agent, "assistant/message") == []
        assert "step/end" in types(agent)
        assert agent.status == "idle"
        assert await h.run(agent, "second") == "recovered"
        assert [r.kind for r in turn_ends(agent)] == ["error", "completed"]


async def test_request_error_listener_may_retry_within_the_same_step() -> None:
    """host-core §9: agent/request-error may return `retry`; the request re-runs in the step."""
    async with scripted_host(model=[ScriptedReply(failure=FAILURE), "second try"]) as h:
        seen: list[tuple[int, str]] = []

        async def policy(err: RequestErrorContext, next_: Callable[[], Awaitable[str]]) -> str:
            seen.append((err.attempt, err.failure.code))
            return "retry" if err.attempt == 1 else await next_()

        h.ctx.on("agent/request-error", policy)
        agent = (await h.create_agent()).agent
        assert await h.run(agent, "go") == "second try"
        assert seen == [(1, "HTTP_503")]
        assert entered_by_turn(agent) == {1: [["go"]]}
        assert [r.kind for r in turn_ends(agent)] == ["completed"]
        first, second = h.model.requests
        assert first.messages == second.messages
        assert [d.reason for d in of_type(agent, "request/header")] == ["initial"]


async def test_request_error_without_a_retry_policy_is_terminal() -> None:
    """host-core §9: with no agent/request-error verdict the failed request ends the turn."""
    async with scripted_host(model=[ScriptedReply(failure=FAILURE), "unused"]) as h:
        agent = (await h.create_agent()).agent
        await h.run(agent, "go")
        assert [r.kind for r in turn_ends(agent)] == ["error"]
        assert len(h.model.requests) == 1


async def test_missing_route_or_adapter_fails_the_turn_with_its_code() -> None:
    """host-core §3/§9: no route or no adapter fails the turn with error code UNKNOWN (non-LLM
    failures flatten), the message naming NO_MODEL_ROUTE / NO_ADAPTER."""
    async with scripted_host() as h:
        routeless = (await h.create_agent(options=AgentOptions())).agent
        await h.run(routeless, "go")
        nowhere = (await h.create_agent(options=attrs.evolve(SCRIPTED, provider="nobody"))).agent
        await h.run(nowhere, "go")
        (no_route,) = turn_ends(routeless)
        (no_adapter,) = turn_ends(nowhere)
        assert no_route.kind == "error" and no_route.error is not None
        assert no_route.error.code == "UNKNOWN"
        assert "[NO_MODEL_ROUTE]" in no_route.error.message
        assert no_adapter.kind == "error" and no_adapter.error is not None
        assert no_adapter.error.code == "UNKNOWN"
        assert "[NO_ADAPTER]" in no_adapter.error.message


async def test_agent_request_waterfall_may_replace_the_call_config() -> None:
    """host-core §9: agent/request may return another config; a new header is `change`."""
    async with scripted_host(model=["a", "b"]) as h:

        async def route(req: RequestContext, next_: Callable[[], Awaitable[Any]]) -> Any:
            config = await next_()
            return attrs.evolve(config, model="bigger") if req.turn == 2 else config

        h.ctx.on("agent/request", route)
        agent = (await h.create_agent()).agent
        await h.run(agent, "one")
        await h.run(agent, "two")
        assert [r.model for r in h.model.requests] == ["scripted-1", "bigger"]
        assert [d.reason for d in of_type(agent, "request/header")] == ["initial", "change"]


async def test_max_tokens_is_sticky_for_the_turn_and_drops_tool_calls() -> None:
    """host-core §9: max-tokens drops the step's tool calls and stays the turn's end reason."""
    held = Held()
    cut = held.reply("cut off", finish="max-tokens", tool_calls=(ScriptedToolCall(name="x"),))
    async with scripted_host(model=[cut, "finished"]) as h:
        agent = (await h.create_agent()).agent
        agent.followup(user_message("go"))
        await bounded(held.reached.wait())
        agent.steer(user_message("keep going"))
        held.gate.set()
        await bounded(agent.when_idle())
        assert entered_by_turn(agent) == {1: [["go"], ["keep going"]]}
        assert of_type(agent, "tool/call") == []
        first_message = of_type(agent, "assistant/message")[0].message
        assert first_message.text == "cut off"
        assert [r.kind for r in turn_ends(agent)] == ["max-tokens"]


async def test_pre_step_can_reject_or_enter_nothing() -> None:
    """host-core §9: pre-step reject ends the turn blocked; an empty first enter completes it."""
    async with scripted_host() as h:
        verdicts = iter(
            [
                PreStepDecision(kind="reject", reason="policy"),
                PreStepDecision(kind="enter", messages=()),
            ]
        )

        async def gate(pre: PreStep, next_: Callable[[], Awaitable[PreStepDecision]]) -> Any:
            assert pre.turn in (1, 2) and pre.step == 1
            return next(verdicts)

        h.ctx.on("agent/pre-step", gate)
        agent = (await h.create_agent()).agent
        await h.run(agent, "one")
        await h.run(agent, "two")
        assert [r.kind for r in turn_ends(agent)] == ["blocked", "completed"]
        assert "step/start" not in types(agent)
        assert h.model.requests == []
        assert fold_consumed_work(agent.session.events).end == TurnEndData(
            turn=1, reason=TurnEndReason(kind="blocked")
        )


async def test_turn_stopping_listener_can_steer_another_step() -> None:
    """host-core §9: steering from agent/turn-stopping adds a step to the ending turn."""
    async with scripted_host(model=["first", "second"]) as h:
        agent = (await h.create_agent()).agent
        reminders = iter([user_message("reminder")])

        async def stopping(a: Agent, turn: int) -> None:
            nxt = next(reminders, None)
            if nxt is not None:
                a.steer(nxt)

        agent.ctx.on("agent/turn-stopping", stopping)
        assert await h.run(agent, "go") == "second"
        assert entered_by_turn(agent) == {1: [["go"], ["reminder"]]}


# -- tool calls in the loop -------------------------------------------------------------------


async def test_conclude_turn_ends_the_turn_after_the_step() -> None:
    """host-core §7/§9: a successful conclude_turn() ends the turn; a failed call does not."""

    async def concluding(args: Any, run: ToolRunContext) -> str:
        run.conclude_turn()
        return "concluded"

    async def failing(args: Any, run: ToolRunContext) -> str:
        run.conclude_turn()
        raise RuntimeError("nope")

    async with scripted_host(model=[calls("done"), calls("broken"), "after failure"]) as h:
        h.ctx.tools.register(tool("done", concluding))
        h.ctx.tools.register(tool("broken", failing))
        agent = (await h.create_agent()).agent
        await h.run(agent, "one")
        assert len(h.model.requests) == 1
        assert [r.kind for r in turn_ends(agent)] == ["completed"]
        await h.run(agent, "two")
        assert len(h.model.requests) == 3
        assert entered_by_turn(agent)[2] == [["two"], []]


async def test_concurrency_safe_calls_run_together_and_commit_in_model_order() -> None:
    """host-core §9: concurrency-safe calls overlap (gate-proven); results commit in model order."""
    inside = 0
    both_inside = asyncio.Event()
    second_done = asyncio.Event()
    finished: list[str] = []

    async def probe(args: Any, run: ToolRunContext) -> str:
        nonlocal inside
        inside += 1
        if inside == 2:
            both_inside.set()
        async with asyncio.timeout(5):
            await both_inside.wait()
            if run.call_id == "c1":
                await second_done.wait()
        finished.append(run.call_id)
        if run.call_id == "c2":
            second_done.set()
        return f"probe {run.call_id}"

    async with scripted_host(model=[calls("probe", "probe"), "done"]) as h:
        h.ctx.tools.register(tool("probe", probe, concurrency_safe=True))
        agent = (await h.create_agent()).agent
        assert await h.run(agent, "go") == "done"
        assert finished == ["c2", "c1"]
        events = agent.session.events
        call_seqs = {e.data.call_id: e.seq for e in events if e.type == "tool/call"}
        results = [e for e in events if e.type == "tool/result"]
        assert [r.data.message.content[0].tool_call_id for r in results] == ["c1", "c2"]
        assert [r.source_event_seqs for r in results] == [(call_seqs["c1"],), (call_seqs["c2"],)]
        assert all(r.data.error is None for r in results)


async def test_exclusive_calls_run_one_after_another() -> None:
    """host-core §7: calls that are not concurrency-safe never overlap."""
    inside = 0
    overlaps: list[int] = []

    async def exclusive(args: Any, run: ToolRunContext) -> str:
        nonlocal inside
        inside += 1
        overlaps.append(inside)
        await yield_once()  # a suspension point where an overlap would show
        inside -= 1
        return "ok"

    async with scripted_host(model=[calls("x", "x", "x"), "done"]) as h:
        h.ctx.tools.register(tool("x", exclusive))
        agent = (await h.create_agent()).agent
        await h.run(agent, "go")
        assert overlaps == [1, 1, 1]


async def test_calls_after_an_abort_get_synthetic_aborted_before_dispatch_results() -> None:
    """host-core §9: calls left after an abort get synthetic ABORTED_BEFORE_DISPATCH results."""
    ran: list[str] = []

    async def stopper(args: Any, run: ToolRunContext) -> str:
        ran.append("stopper")
        assert run.agent is not None
        run.agent.cancel(USER)
        return "stopped"

    async def never(args: Any, run: ToolRunContext) -> str:
        ran.append("never")
        return "ran"

    async with scripted_host(model=[calls("stopper", "never", "never")]) as h:
        h.ctx.tools.register(tool("stopper", stopper))
        h.ctx.tools.register(tool("never", never))
        agent = (await h.create_agent()).agent
        await h.run(agent, "go")
        assert ran == ["stopper"]
        codes = [d.error.code for d in of_type(agent, "tool/result")]
        assert codes == ["ABORTED", "ABORTED_BEFORE_DISPATCH", "ABORTED_BEFORE_DISPATCH"]
        assert len(of_type(agent, "tool/call")) == 3
        assert turn_ends(agent) == [TurnEndReason(kind="aborted", cause=USER)]
        assert types(agent)[-2:] == ["step/end", "turn/end"]


async def test_deferred_context_is_entered_by_the_next_step() -> None:
    """host-core §7/§9: a deferred context is queued after its result and entered next step."""

    async def noting(args: Any, run: ToolRunContext) -> str:
        run.defer_context(user_message("deferred note"))
        return "ok"

    async with scripted_host(model=[calls("noting"), "done"]) as h:
        h.ctx.tools.register(tool("noting", noting))
        agent = (await h.create_agent()).agent
        await h.run(agent, "go")
        assert entered_by_turn(agent) == {1: [["go"], ["deferred note"]]}
        second = h.model.requests[1].messages
        assert [m.role for m in second[-2:]] == ["tool", "user"]


async def test_tool_sees_the_calling_agent_as_exec_agent_and_initiator() -> None:
    """host-core §1/§11: a loop-run tool sees the calling agent as exec.agent and initiator."""
    seen: list[tuple[object, object]] = []

    async def who(args: Any, run: ToolRunContext) -> str:
        seen.append((run.agent, current_initiator()))
        return "ok"

    async with scripted_host(model=[calls("who"), "done"]) as h:
        h.ctx.tools.register(tool("who", who))
        agent = (await h.create_agent()).agent
        await h.run(agent, "go")
        assert seen == [(agent, agent)]
        assert current_initiator() is None


async def test_interrupted_assistant_message_keeps_streamed_text_on_abort() -> None:
    """host-core §9: on abort, streamed text is kept as an interrupted assistant/message."""
    held = Held()
    async with scripted_host(model=[held.reply("partial answer", reasoning="thinking")]) as h:
        agent = (await h.create_agent()).agent
        agent.followup(user_message("go"))
        await bounded(held.reached.wait())
        agent.cancel(USER)
        await bounded(agent.when_idle())
        events = agent.session.events
        (message,) = [e for e in events if e.type == "assistant/message"]
        assert message.data.interrupted is True
        assert message.data.message.text == "partial answer"
        chunk_seqs = tuple(e.seq for e in events if e.type == "assistant/chunk")
        assert message.source_event_seqs == chunk_seqs
        assert agent.session.derive_messages()[-1] == message.data.message
        assert turn_ends(agent) == [TurnEndReason(kind="aborted", cause=USER)]


async def test_abort_before_any_text_logs_no_assistant_message() -> None:
    """host-core §2/§9: an interrupted response with no non-blank text leaves no message."""
    held = Held()
    async with scripted_host(model=[held.reply(None)]) as h:
        agent = (await h.create_agent()).agent
        agent.followup(user_message("go"))
        await bounded(held.reached.wait())
        agent.cancel(USER)
        await bounded(agent.when_idle())
        assert of_type(agent, "assistant/message") == []
        assert [r.kind for r in turn_ends(agent)] == ["aborted"]


# -- creation transaction ---------------------------------------------------------------------


class Lifecycle:
    """Records created/disposed/session-start events (registered before any vetoing listener)."""

    def __init__(self, ctx: Context) -> None:
        self.events: list[tuple[str, str]] = []
        for name in ("session/created", "session/disposed"):
            ctx.on(name, lambda s, name=name: self.events.append((name, s.id)), global_=True)
        for name in ("agent/created", "agent/disposed", "agent/session-start"):
            ctx.on(name, lambda a, *_, name=name: self.events.append((name, a.id)), global_=True)

    def count(self, name: str) -> int:
        return sum(1 for event, _ in self.events if event == name)

    def paired(self) -> bool:
        """Every created event has its disposed counterpart (and vice versa)."""
        return self.count("session/created") == self.count("session/disposed") and self.count(
            "agent/created"
        ) == self.count("agent/disposed")


async def _failing_setup(ctx: Context) -> None:
    ctx.tools.register(tool("scoped", _ok))
    raise RuntimeError("setup failed")


async def _ok(args: Any, run: ToolRunContext) -> str:
    return "ok"


def _veto(*_: object) -> None:
    raise PermissionError("vetoed")


ROLLBACK_CASES = {
    "setup-raises": (RuntimeError, "setup failed"),
    "signal-pre-aborted": (AbortedError, "caller gave up"),
    "signal-aborts-during-setup": (AbortedError, "caller gave up"),
    "owner-disposed-during-setup": (AbortedError, "owner disposed"),
    "agent-veto": (PermissionError, "vetoed"),
    "session-veto": (PermissionError, "vetoed"),
}


@pytest.mark.parametrize("case", sorted(ROLLBACK_CASES))
async def test_failed_create_rolls_everything_back(case: str) -> None:
    """host-core §9: a failed create() leaves no agent, session, registration or unpaired event."""
    async with scripted_host() as h:
        life = Lifecycle(h.ctx)
        controller = AbortController()
        owner = h.ctx.plugin("owner")
        setup_entered = asyncio.Event()
        scopes: list[Any] = []

        def registering_setup(ctx: Context) -> None:
            ctx.tools.register(tool("scoped", _ok))
            scopes.append(ctx.scope)

        async def failing_setup(ctx: Context) -> None:
            registering_setup(ctx)
            raise RuntimeError("setup failed")

        async def slow_setup(ctx: Context) -> None:
            registering_setup(ctx)
            setup_entered.set()
            await asyncio.Event().wait()

        setup: Callable[[Context], Any] = registering_setup
        if case == "setup-raises":
            setup = failing_setup
        elif case == "signal-pre-aborted":
            controller.abort("caller gave up")
        elif case in ("signal-aborts-during-setup", "owner-disposed-during-setup"):
            setup = slow_setup
        elif case == "agent-veto":
            h.ctx.on("agent/created", _veto, global_=True)
        else:
            h.ctx.on("session/created", _veto, global_=True)

        creating = asyncio.ensure_future(
            owner.agents.create(
                CreateAgentOptions(session_id="child", signal=controller.signal, setup=setup)
            )
        )
        if case == "signal-aborts-during-setup":
            await bounded(setup_entered.wait())
            controller.abort("caller gave up")
        elif case == "owner-disposed-during-setup":
            await bounded(setup_entered.wait())
            await owner.dispose()
        error_type, expected = ROLLBACK_CASES[case]
        with pytest.raises(error_type) as err:
            await bounded(creating)
        assert expected in str(err.value)
        assert h.ctx.agents.list() == []
        assert h.ctx.agents.get("child") is None
        assert h.ctx.sessions.get("child") is None
        assert all(h.ctx.tools.get("scoped", scope) is None for scope in scopes)
        assert scopes or case == "signal-pre-aborted"
        assert life.paired(), life.events
        assert ("agent/session-start", "child") not in life.events
        if case == "agent-veto":
            assert life.events == [
                ("session/created", "child"),
                ("agent/created", "child"),
                ("agent/disposed", "child"),
                ("session/disposed", "child"),
            ]
        if "veto" not in case:
            assert life.events == []


async def test_the_id_of_a_rolled_back_create_can_be_reused() -> None:
    """host-core §9: neither id stays published after a rollback."""
    async with scripted_host() as h:
        with pytest.raises(RuntimeError):
            await h.create_agent(session_id="again", setup=_failing_setup)
        handle = await h.create_agent(session_id="again")
        assert await h.run(handle.agent, "hello") == "hello"


async def test_duplicate_live_id_fails_without_disturbing_the_live_agent() -> None:
    """host-core §9: creating a second agent on a live id fails; the live one is untouched."""
    async with scripted_host() as h:
        live = await h.create_agent(session_id="taken")
        with pytest.raises(Exception) as err:
            await h.create_agent(session_id="taken")
        assert getattr(err.value, "code", None) in ("DUPLICATE_SESSION", "DUPLICATE_AGENT")
        assert h.ctx.agents.get("taken") is live.agent
        assert h.ctx.sessions.get("taken") is live.agent.session


async def test_setup_commit_runs_before_publication() -> None:
    """host-core §9: setup's returned commit() runs synchronously before agent/created."""
    async with scripted_host() as h:
        order: list[str] = []
        h.ctx.on("agent/created", lambda a: order.append("created"), global_=True)

        async def setup(ctx: Context) -> Callable[[], None]:
            order.append("setup")
            return lambda: order.append("commit")

        handle = await h.create_agent(setup=setup)
        assert order == ["setup", "commit", "created"]
        assert handle.agent.ctx.agent is handle.agent


@pytest.mark.parametrize("returns", ["registration", "not-callable"])
async def test_setup_returning_no_commit_is_refused(returns: str) -> None:
    """host-core §9, dx 12: a setup that returns a Registration (``lambda c:
    c.tools.register(t)``) or any other non-commit fails AGENT_SETUP_INVALID and rolls the
    creation back, instead of silently undoing its own registration."""
    async with scripted_host() as h:

        def setup(ctx: Context) -> Any:
            registration = ctx.tools.register(tool("scoped", _ok))
            return registration if returns == "registration" else 42

        with pytest.raises(AgentError) as caught:
            await h.create_agent(setup=setup)
        assert caught.value.code == "AGENT_SETUP_INVALID"
        assert h.ctx.agents.list() == [] and h.ctx.sessions.list() == []


# -- disposal and ownership -------------------------------------------------------------------


async def test_a_disposed_agent_is_freed_without_the_cyclic_collector() -> None:
    """host-core §9: once disposed and let go, an agent, its context, inbox and live session
    are freed by reference counting alone (no cycle keeps a whole log alive until a full
    collection); its context still names it while it exists."""
    async with scripted_host(model=["done"], store="jsonl") as h:
        gc.collect()
        gc.disable()
        try:
            handle = await h.create_agent()
            agent = handle.agent
            assert agent.ctx.agent is agent
            assert await h.run(agent, "go") == "done"
            freed = weakref.ref(agent)
            await handle.dispose()
            del agent, handle
            # The finished driver's done-callback was scheduled before this: let it run (the
            # loop runs ready callbacks in order), then nothing refers to the agent any more.
            after = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(after.set_result, None)
            await after
            assert freed() is None
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            cyclic = {type(o).__name__ for o in gc.garbage}
            assert not cyclic & {"Agent", "Context", "Inbox", "Session", "Fiber"}
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()


async def test_handle_disposal_order() -> None:
    """host-core §9: dispose = cancel, idle, scope, agent/disposed, session/disposed, in order."""
    held = Held()
    async with scripted_host(model=[held.reply("working")]) as h:
        order: list[str] = []

        def setup(ctx: Context) -> None:
            ctx.effect(lambda: lambda: order.append("scope disposed"))
            ctx.tools.register(tool("scoped", _ok))

        handle = await h.create_agent(setup=setup)
        agent = handle.agent

        def on_event(session: Any, event: SessionEvent) -> None:
            if event.type == "turn/end":
                order.append(f"turn/end {event.data.reason.kind} {event.data.reason.cause.kind}")

        agent.ctx.on("session/event", on_event)
        h.ctx.on("agent/status", lambda a, s: order.append(f"status {s}"), global_=True)
        h.ctx.on("agent/disposed", lambda a: order.append("agent/disposed"), global_=True)
        h.ctx.on("session/disposed", lambda s: order.append("session/disposed"), global_=True)
        agent.followup(user_message("go"))
        await bounded(held.reached.wait())
        first, second = handle.dispose(), handle.dispose()
        await bounded(asyncio.gather(first, second))
        assert order == [
            "status running",
            "turn/end aborted disposed",
            "status idle",
            "scope disposed",
            "agent/disposed",
            "session/disposed",
        ]
        assert h.ctx.agents.get(agent.id) is None
        assert h.ctx.sessions.get(agent.id) is None
        assert h.ctx.tools.get("scoped", agent.ctx.scope) is None
        with pytest.raises(ContextError) as refused:
            agent.ctx.tools.register(tool("late", _ok))
        assert refused.value.code == "INACTIVE_EFFECT"
        assert h.ctx.tools.get("late", agent.ctx.scope) is None
        with pytest.raises(AgentError) as err:
            agent.followup(user_message("too late"))
        assert err.value.code == "AGENT_DISPOSED"


async def test_a_send_while_disposal_runs_is_kept_and_one_after_it_is_refused() -> None:
    """host-core §9, RPT-4 (tools 15.3): while an agent's disposal has started and it is still
    registered, a send is queued durably in its inbox without waking it (a resume finds it);
    once disposal completed the send fails AGENT_DISPOSED."""
    async with scripted_host(model=["one", "two"]) as h:
        handle = await h.create_agent(session_id="late")
        agent = handle.agent
        late = user_message("kept for later", id="late-report")
        seen: list[tuple[bool, str]] = []

        def during_disposal() -> None:
            seen.append((h.ctx.agents.get("late") is agent, agent.status))
            agent.steer(late)

        agent.ctx.fiber.add(during_disposal)
        await bounded(handle.dispose())
        assert seen == [(True, "idle")]
        assert h.model.requests == []  # queued, not woken
        assert replay_inbox(agent.session.events) == ([], [late])
        with pytest.raises(AgentError) as err:
            agent.steer(user_message("too late"))
        assert err.value.code == "AGENT_DISPOSED"
        resumed = (await h.resume_agent("late")).agent
        assert resumed.inbox.next_step == [late]


async def test_disposal_discards_pending_input_unless_asked_to_keep_it() -> None:
    """host-core §9, CLI-91: disposal discards pending input durably (a resume finds none);
    `dispose(keep_inbox=True)` leaves it pending in the log, and a resume finds it."""
    async with scripted_host(model=["never"]) as h:
        kept: dict[bool, list[Any]] = {}
        for keep in (False, True):
            sid = f"keep-{keep}"
            handle = await h.create_agent(session_id=sid)
            parked = user_message("a notice for later", id=f"n-{keep}")
            handle.agent.inject(parked)  # not woken: it stays pending
            await bounded(handle.dispose(keep_inbox=keep))
            kept[keep] = (await h.resume_agent(sid)).agent.inbox.next_step
        assert kept[False] == []
        assert [m.id for m in kept[True]] == ["n-True"]
        assert h.model.requests == []


async def test_owner_fiber_disposal_disposes_owned_agents() -> None:
    """host-core §9: an agent created through a plugin context dies with that context."""
    async with scripted_host() as h:
        owner = h.ctx.plugin("owner")
        disposed: list[str] = []
        h.ctx.on("agent/disposed", lambda a: disposed.append(a.id), global_=True)
        handle = await h.create_agent(owner=owner, session_id="owned")
        assert h.ctx.agents.owner_of("owned") is None  # a plugin context is not an agent
        assert [a.id for a in h.ctx.agents.roots()] == ["owned"]
        await owner.dispose()
        assert disposed == ["owned"]
        assert h.ctx.agents.get("owned") is None
        assert handle.disposed


async def test_agents_created_by_an_agent_are_owned_and_disposed_child_first() -> None:
    """host-core §9: an agent-made agent is owned (roots/is_owned_by) and disposed child first."""
    async with scripted_host() as h:
        parent = await h.create_agent(session_id="parent")
        child = await parent.agent.ctx.agents.create(CreateAgentOptions(session_id="child"))
        agents = h.ctx.agents
        assert [a.id for a in agents.roots()] == ["parent"]
        assert [a.id for a in agents.list()] == ["parent", "child"]
        assert agents.is_owned_by("child", parent.agent)
        assert not agents.is_owned_by("parent", child.agent)
        assert agents.owner_of("child") is parent.agent
        disposed: list[str] = []
        h.ctx.on("agent/disposed", lambda a: disposed.append(a.id), global_=True)
        await parent.dispose()
        assert disposed == ["child", "parent"]
        assert agents.list() == []


async def test_host_shutdown_disposes_live_agents() -> None:
    """host-core §9: unloading the agents plugin disposes every live agent."""
    disposed: list[str] = []
    async with scripted_host() as h:
        h.ctx.on("agent/disposed", lambda a: disposed.append(a.id), global_=True)
        await h.create_agent(session_id="a")
        await h.create_agent(session_id="b")
    assert sorted(disposed) == ["a", "b"]


# -- resume -----------------------------------------------------------------------------------


async def test_resume_via_persistence_continues_turn_numbering() -> None:
    """host-core §5/§9: a resumed agent continues numbering with a `resume` header and history."""
    async with scripted_host(model=["one", "two", "three"]) as h:
        sources: list[str] = []
        h.ctx.on("agent/session-start", lambda a, source: sources.append(source), global_=True)
        first = await h.create_agent(session_id="durable")
        await h.run(first.agent, "m1")
        await h.run(first.agent, "m2")
        await first.dispose()
        resumed = await h.resume_agent("durable")
        agent = resumed.agent
        assert agent is not first.agent
        assert await h.run(agent, "m3") == "three"
        assert [d.turn for d in of_type(agent, "turn/start")] == [1, 2, 3]
        assert [d.reason for d in of_type(agent, "request/header")] == ["initial", "resume"]
        assert [m.text for m in h.model.requests[2].messages] == ["m1", "one", "m2", "two", "m3"]
        assert sources == ["startup", "resume"]


async def test_a_resume_cancelled_as_its_log_is_prepared_lets_go_of_the_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """host-core §9, hardening 11.8: a resume(signal=...) whose caller is cancelled in the loop
    turn its preparation completes disposes that preparation, so the next resume of the same
    log succeeds instead of failing SESSION_LOCKED."""
    async with scripted_host(model=["one"]) as h:
        first = await h.create_agent(session_id="durable")
        await h.run(first.agent, "m1")
        await first.dispose()
        persistence = h.ctx.get("session_persistence")
        assert persistence is not None
        prepare = persistence.prepare
        started = asyncio.Event()
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def gated(id: str, signal: Any = None) -> Any:
            started.set()
            await gate
            return await prepare(id, signal)  # the memory store prepares without suspending

        monkeypatch.setattr(persistence, "prepare", gated)
        resuming = asyncio.ensure_future(
            h.ctx.agents.resume(
                ResumeAgentOptions(
                    resume_session_id="durable",
                    agent_options=SCRIPTED,
                    signal=AbortController().signal,
                )
            )
        )
        async with asyncio.timeout(5):
            await started.wait()
        gate.set_result(None)
        resuming.cancel()
        with pytest.raises(asyncio.CancelledError):
            await resuming
        monkeypatch.setattr(persistence, "prepare", prepare)
        again = await h.resume_agent("durable")
        assert again.agent.session.header.id == "durable"


async def test_resume_takes_over_a_preparation_without_reading_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """host-core §9, issue 13: resume(preparation=...) publishes that prepared session (the log
    is not read again); a preparation of another id fails RESUME_PREPARATION_MISMATCH and is
    disposed, so its log is not left held."""
    async with scripted_host(model=["one", "two", "three"]) as h:
        for sid in ("durable", "other"):
            handle = await h.create_agent(session_id=sid)
            await h.run(handle.agent, "m1")
            await handle.dispose()
        persistence = h.ctx.get("session_persistence")
        assert persistence is not None
        prepared = await persistence.prepare("durable")
        reads: list[str] = []
        read = persistence._read
        monkeypatch.setattr(
            persistence, "_read", lambda id, held: reads.append(id) or read(id, held)
        )
        resumed = await h.ctx.agents.resume(
            ResumeAgentOptions(
                resume_session_id="durable", agent_options=SCRIPTED, preparation=prepared
            )
        )
        assert resumed.agent.session is prepared.session
        assert reads == []
        assert await h.run(resumed.agent, "m2") == "three"
        wrong = await persistence.prepare("other")
        with pytest.raises(AgentError) as err:
            await h.ctx.agents.resume(
                ResumeAgentOptions(
                    resume_session_id="durable", agent_options=SCRIPTED, preparation=wrong
                )
            )
        assert err.value.code == "RESUME_PREPARATION_MISMATCH"
        again = await persistence.prepare("other")  # not held any more
        again.dispose()


async def test_resume_without_persistence_fails() -> None:
    """host-core §9: resume() without a persistence service fails PERSISTENCE_UNAVAILABLE."""
    async with scripted_host(store=None, query=False) as h:
        with pytest.raises(AgentError) as err:
            await h.resume_agent("anything")
        assert err.value.code == "PERSISTENCE_UNAVAILABLE"


# -- invariants -------------------------------------------------------------------------------


async def test_session_log_invariant_refuses_a_bad_append() -> None:
    """host-core §10: the session-log companion checks appends before they commit."""
    async with scripted_host() as h:
        agent = (await h.create_agent()).agent
        before = agent.session.seq
        with pytest.raises(InvariantError) as err:
            agent.session.append(
                "turn/end", TurnEndData(turn=1, reason=TurnEndReason(kind="completed"))
            )
        assert err.value.package_name == "session-log"
        with pytest.raises(InvariantError):
            agent.session.append("step/start", StepData(turn=1, step=1))
        with pytest.raises(InvariantError):
            agent.session.append("turn/start", TurnStartData(turn=2))
        assert agent.session.seq == before
        assert len(h.invariants.violations) == 3
        h.invariants.violations.clear()


async def test_agent_status_invariant_flags_a_repeated_status() -> None:
    """host-core §10: agent/status never repeats the same value for one agent."""
    async with scripted_host() as h:
        agent = (await h.create_agent()).agent
        await h.run(agent, "go")
        h.ctx.emit("agent/status", agent, "idle")
        assert [v.package_name for v in h.invariants.violations] == ["agent-status"]
        h.invariants.violations.clear()


async def test_request_reconstruction_invariant_rejects_a_forged_loop_request() -> None:
    """host-core §10: a loop-built request must equal what its log derives."""
    async with scripted_host() as h:
        agent = (await h.create_agent()).agent
        await h.run(agent, "go")
        forged = GenerateOptions(
            provider="scripted",
            model="scripted-1",
            messages=(user_message("not in the log"),),
            session_id=agent.id,
            loop_request=True,
        )
        with pytest.raises(InvariantError) as err:
            _ = [c async for c in h.ctx.llm.stream(forged)]
        assert err.value.package_name == "request-reconstruction"
        h.invariants.violations.clear()


async def test_a_broken_invariant_fails_the_test_host() -> None:
    """host-core §10: scripted_host raises on exit if any invariant was broken."""

    async def contained_violation() -> None:
        async with scripted_host() as h:
            agent = (await h.create_agent()).agent
            h.ctx.emit("agent/status", agent, "running")
            h.ctx.emit("agent/status", agent, "running")

    with pytest.raises(AssertionError, match="invariants broken"):
        await contained_violation()


# -- fold_consumed_work -----------------------------------------------------------------------


def log(*items: tuple[str, Any]) -> list[SessionEvent]:
    return [SessionEvent(type=t, seq=i, time=0, data=d) for i, (t, d) in enumerate(items)]


def splice(
    *, removed: int = 0, inserted: int = 0, outcome: Any = None, target: Any = "next-turn"
) -> tuple[str, InboxSplicedData]:
    return (
        "agent/inbox/spliced",
        InboxSplicedData(
            target=target,
            start=0,
            removed_count=removed,
            inserted=tuple(user_message(f"m{i}") for i in range(inserted)),
            outcome=outcome,
        ),
    )


def start(n: int) -> tuple[str, Any]:
    return ("turn/start", TurnStartData(turn=n))


def end(n: int, kind: str) -> tuple[str, Any]:
    return ("turn/end", TurnEndData(turn=n, reason=TurnEndReason(kind=kind)))


def step(n: int) -> tuple[str, Any]:
    return ("step/start", StepData(turn=n, step=1))


@pytest.mark.parametrize(
    ("events", "end_seq", "dropped"),
    [
        pytest.param(log(), None, False, id="empty"),
        pytest.param(
            log(splice(inserted=1), start(1), splice(removed=1), step(1), end(1, "completed")),
            4,
            False,
            id="stepped-turn",
        ),
        pytest.param(
            log(splice(inserted=1), start(1), splice(removed=1), end(1, "aborted")),
            3,
            False,
            id="claimed-then-aborted",
        ),
        pytest.param(
            log(splice(inserted=1), start(1), splice(removed=1), end(1, "blocked")),
            3,
            False,
            id="claimed-then-blocked",
        ),
        pytest.param(
            log(splice(inserted=1), start(1), splice(removed=1), end(1, "completed")),
            None,
            False,
            id="claimed-but-entered-nothing",
        ),
        pytest.param(log(start(1), end(1, "aborted")), None, False, id="empty-turn"),
        pytest.param(
            log(
                start(1),
                step(1),
                end(1, "completed"),
                splice(inserted=1),
                splice(removed=1, outcome="canceled"),
            ),
            2,
            True,
            id="dropped-unrun",
        ),
        pytest.param(
            log(
                start(1),
                step(1),
                end(1, "completed"),
                splice(inserted=1),
                splice(removed=1, inserted=1, outcome="canceled"),
            ),
            2,
            False,
            id="replaced-is-not-dropped",
        ),
        pytest.param(
            log(
                splice(inserted=2),
                splice(removed=1, outcome="canceled"),
                start(1),
                splice(removed=1),
                step(1),
                end(1, "error"),
            ),
            5,
            False,
            id="later-turn-accounts-for-the-drop",
        ),
    ],
)
def test_fold_consumed_work(events: list[SessionEvent], end_seq: int | None, dropped: bool) -> None:
    """host-core §9: fold_consumed_work picks the last accounting turn/end and dropped_unrun."""
    consumed = fold_consumed_work(events)
    assert consumed.end_seq == end_seq
    assert consumed.end == (events[end_seq].data if end_seq is not None else None)
    assert consumed.dropped_unrun is dropped


async def test_fold_consumed_work_on_a_live_log_with_a_cancelled_queue() -> None:
    """host-core §9: a real cancel() that discards queued work reports dropped_unrun."""
    held = Held()
    async with scripted_host(model=[held.reply("one")]) as h:
        agent = (await h.create_agent()).agent
        agent.followup(user_message("run"))
        await bounded(held.reached.wait())
        held.gate.set()
        await bounded(agent.when_idle())
        agent.inject(user_message("queued"))
        agent.cancel(USER)
        consumed = fold_consumed_work(agent.session.events)
        assert consumed.end is not None and consumed.end.reason.kind == "completed"
        assert consumed.dropped_unrun


# -- snapshot sources -------------------------------------------------------------------------


async def test_snapshot_messages_have_a_plugin_source_of_form_snapshot() -> None:
    """host-core §8/§9: runtime-context snapshots are user messages with form `snapshot`."""
    from dsh_core._prompt import PromptContext

    async with scripted_host() as h:
        h.ctx.system_prompt.context(PromptContext(name="c", order=120, text="ctx"))
        agent = (await h.create_agent()).agent
        await h.run(agent, "go")
        sources = [m.source for m in of_type(agent, "user/message")]
        assert PluginSource(plugin="system-prompt", form="snapshot") in sources


# -- seeds, routing, the inbox itself ---------------------------------------------------------


async def test_seeded_agent_continues_turn_numbering_without_inheriting_pending_work() -> None:
    """host-core §4/§9: a seeded child continues turn numbers and inherits no pending input."""
    held = Held()
    async with scripted_host(model=[held.reply("one"), "child answer"]) as h:
        parent = (await h.create_agent(session_id="parent")).agent
        parent.followup(user_message("m1"))
        await bounded(held.reached.wait())
        parent.followup(user_message("parked in the parent"))
        parent.cancel(USER, keep_inbox=True)
        await bounded(parent.when_idle())
        events = parent.session.events
        last_end = max(e.seq for e in events if e.type == "turn/end")
        seed = events[: last_end + 1]
        assert any(e.type == "agent/inbox/spliced" and e.data.inserted for e in seed[2:])
        meta = SessionMeta(cwd="/", parent_session="parent", seed_length=len(seed))
        child = (await h.create_agent(session_id="child", seed=seed, meta=meta)).agent
        assert len(child.inbox) == 0
        assert await h.run(child, "child task") == "child answer"
        assert [d.turn for d in of_type(child, "turn/start")] == [1, 2]
        assert [m.text for m in h.model.requests[-1].messages] == ["m1", "one", "child task"]
        assert [m.text for m in parent.inbox.next_turn] == ["parked in the parent"]


async def test_agent_scoped_listeners_see_only_their_agent() -> None:
    """host-core §1/§3: a listener registered through agent.ctx sees only that agent's events."""
    async with scripted_host() as h:
        a = (await h.create_agent(session_id="a")).agent
        b = (await h.create_agent(session_id="b")).agent
        seen: list[tuple[str, str]] = []
        a.ctx.on("agent/status", lambda agent, s: seen.append((agent.id, s)))
        a.ctx.on("session/event", lambda session, e: seen.append((session.id, e.type)))
        await h.run(b, "for b")
        assert seen == []
        await h.run(a, "for a")
        assert ("a", "running") in seen and ("a", "idle") in seen
        assert {who for who, _ in seen} == {"a"}


async def test_inbox_splices_are_logged_before_the_projection_changes() -> None:
    """host-core §9: splices log before the projection changes; clear() goes next-step first."""
    async with scripted_host() as h:
        agent = (await h.create_agent()).agent
        observed: list[tuple[str, int, int]] = []

        def on_event(session: Any, event: SessionEvent) -> None:
            if event.type == "agent/inbox/spliced":
                observed.append(
                    (event.data.target, len(agent.inbox.next_turn), len(agent.inbox.next_step))
                )

        discarded: list[str] = []
        agent.ctx.on("session/event", on_event)
        agent.ctx.on("agent/inbox/discarded", lambda a, m: discarded.append(m.text))
        agent.inject(user_message("step"))
        agent.inbox.insert("next-turn", user_message("turn"))
        assert observed == [("next-step", 0, 0), ("next-turn", 0, 1)]
        replacement = user_message("replacement")
        agent.inbox.replace(agent.inbox.next_turn[0].id, replacement)
        assert [m.text for m in agent.inbox.next_turn] == ["replacement"]
        assert discarded == ["turn"]
        with pytest.raises(InboxError) as err:
            agent.inbox.replace("not-pending", user_message("x"))
        assert err.value.code == "NOT_PENDING"
        agent.inbox.clear()
        assert discarded == ["turn", "step", "replacement"]
        assert observed[-2:] == [("next-step", 1, 1), ("next-turn", 1, 0)]
        assert replay_inbox(agent.session.events) == ([], [])


# -- an adapter that ignores its signal ------------------------------------------------------


class DeafAdapter:
    """Streams some text, then waits forever without looking at the request's signal."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.closed = asyncio.Event()

    async def stream(self, options: GenerateOptions) -> AsyncIterator[StreamChunk]:
        try:
            yield TextDelta(index=0, text="half")
            self.reached.set()
            await asyncio.Event().wait()
            yield Finish(reason="stop")
        finally:
            self.closed.set()


async def test_an_adapter_ignoring_the_signal_cannot_wedge_the_turn() -> None:
    """host-core §1/§9: cancel() ends a turn even when the adapter ignores its signal."""
    async with scripted_host() as h:
        deaf = DeafAdapter()
        h.ctx.llm.register_adapter("deaf", deaf)
        agent = (await h.create_agent(options=attrs.evolve(SCRIPTED, provider="deaf"))).agent
        agent.followup(user_message("go"))
        await bounded(deaf.reached.wait())
        agent.cancel(USER)
        await bounded(agent.when_idle())
        assert turn_ends(agent) == [TurnEndReason(kind="aborted", cause=USER)]
        (message,) = of_type(agent, "assistant/message")
        assert message.interrupted and message.message.text == "half"
        assert deaf.closed.is_set()
        assert agent.status == "idle"


# -- the inbox projection under random input (hypothesis) ------------------------------------


class InboxMachine(RuleBasedStateMachine):
    """Random sends, cancels, releases and a dispose against one live agent whose every model
    request is held open until released. After every step the inbox projection must equal a
    replay of the session's splices, and the log must stay valid (host-core §9, §10).

    Every run drives a fresh agent of one host on one event loop (``shared``, set up by the
    ``inbox_host`` fixture: booting a host per run was much of the test's time)."""

    shared: tuple[asyncio.AbstractEventLoop, TestHost]
    current: InboxMachine

    def __init__(self) -> None:
        super().__init__()
        self.loop, self.host = InboxMachine.shared
        InboxMachine.current = self
        self.gates: list[asyncio.Event] = []
        self.requested: asyncio.Event | None = None
        self.sent = 0
        self.disposed = False
        self.handle: AgentHandle = self.run(self.host.create_agent())
        self.agent = self.handle.agent

    def run(self, aw: Awaitable[T]) -> T:
        async def bounded_run() -> T:
            async with asyncio.timeout(10):
                return await aw

        return self.loop.run_until_complete(bounded_run())

    def call(self, fn: Callable[[], object]) -> None:
        """Run a synchronous agent verb inside the loop (waking needs a running loop)."""

        async def inside() -> None:
            fn()

        self.run(inside())

    def script(self, request: ScriptedRequest) -> ScriptedReply:
        gate = asyncio.Event()
        self.gates.append(gate)
        if self.requested is not None:
            self.requested.set()
        if request.index % 3 == 1 and request.last is not None and request.last.role == "user":
            return ScriptedReply(tool_calls=(ScriptedToolCall(name="noop"),), wait=gate.wait)
        return ScriptedReply(text=f"reply {request.index}", wait=gate.wait)

    @precondition(lambda self: not self.disposed)
    @rule(verb=st.sampled_from(["followup", "steer", "inject"]))
    def send(self, verb: str) -> None:
        self.sent += 1
        message = user_message(f"{verb} {self.sent}")
        self.call(lambda: getattr(self.agent, verb)(message))

    @precondition(lambda self: not self.disposed)
    @rule(keep_inbox=st.booleans(), kind=st.sampled_from(["user", "parent", "hook"]))
    def cancel(self, keep_inbox: bool, kind: Any) -> None:
        cause = AgentCancelCause(kind=kind)
        self.call(lambda: self.agent.cancel(cause, keep_inbox=keep_inbox))

    @rule()
    def tick(self) -> None:
        """Let the loop run one round (explores interleavings; asserts nothing by itself)."""
        self.run(yield_once())

    @rule()
    def release(self) -> None:
        """Open every held request; run until the agent is idle or held in a new request."""
        self.requested = asyncio.Event()
        for gate in self.gates:
            gate.set()

        async def settle() -> None:
            assert self.requested is not None
            waits = [
                asyncio.ensure_future(self.agent.when_idle()),
                asyncio.ensure_future(self.requested.wait()),
            ]
            _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for p in pending:
                p.cancel()

        self.run(settle())

    @precondition(lambda self: not self.disposed)
    @rule()
    def dispose(self) -> None:
        self.run(self.handle.dispose())
        self.disposed = True

    @precondition(lambda self: self.disposed)
    @rule()
    def send_after_dispose(self) -> None:
        with pytest.raises(AgentError):
            self.agent.followup(user_message("late"))

    @invariant()
    def inbox_projection_equals_the_replayed_splices(self) -> None:
        session = self.agent.session
        next_turn, next_step = replay_inbox(session.events_since(session.header.seed_length or 0))
        assert ids(self.agent.inbox.next_turn) == ids(next_turn)
        assert ids(self.agent.inbox.next_step) == ids(next_step)

    @invariant()
    def session_log_stays_valid(self) -> None:
        checker = SessionLogChecker()
        checker.replay(self.agent.session.events)
        assert (self.agent.status == "running") == (checker.open_turn is not None)
        if self.disposed:
            assert self.agent.status == "idle"
            assert len(self.agent.inbox) == 0

    def teardown(self) -> None:
        for gate in self.gates:
            gate.set()
        self.run(self.handle.dispose())


@pytest.fixture(scope="class")
def inbox_host() -> Iterator[None]:
    """The host and loop every run of the inbox machine shares (its model answers the
    running machine)."""
    loop = asyncio.new_event_loop()
    try:
        booting = scripted_host(model=lambda request: InboxMachine.current.script(request))
        host = loop.run_until_complete(booting.__aenter__())
        host.ctx.tools.register(tool("noop", _ok, concurrency_safe=True))
        InboxMachine.shared = (loop, host)
        yield
        loop.run_until_complete(asyncio.wait_for(booting.__aexit__(None, None, None), 10))
    finally:
        loop.close()


InboxMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestInboxMachine = pytest.mark.usefixtures("inbox_host")(InboxMachine.TestCase)


# -- when_idle ---------------------------------------------------------------------------------


async def test_when_idle_waiters_are_independent_and_wait_for_the_last_turn() -> None:
    """host-core §9: when_idle resolves only once no driver runs (queued turns included);
    cancelling one waiter leaves the others waiting."""
    held = Held()
    async with scripted_host(model=lambda r: held.reply("ok")) as h:
        agent = (await h.create_agent()).agent
        agent.followup(user_message("one"))
        agent.followup(user_message("two"))
        await bounded(held.reached.wait())
        first = asyncio.ensure_future(agent.when_idle())
        second = asyncio.ensure_future(agent.when_idle())
        await yield_once()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert not second.done()
        held.gate.set()
        await bounded(second)
        assert agent.status == "idle"
        assert [r.kind for r in turn_ends(agent)] == ["completed", "completed"]


async def test_when_idle_after_a_driver_cancelled_before_it_ran() -> None:
    """host-core §9: a driver task cancelled before its first step still leaves the agent idle
    and wakes when_idle."""
    async with scripted_host() as h:
        agent = (await h.create_agent()).agent
        agent.followup(user_message("hi"))
        driver = agent._driver
        assert driver is not None and agent.status == "running"
        waiter = asyncio.ensure_future(agent.when_idle())
        driver.cancel()
        await bounded(waiter)
        assert agent.status == "idle" and agent._driver is None


async def test_a_turn_of_steps_that_never_suspend_still_lets_the_loop_run() -> None:
    """host-core §9 (turn loop): a model and tools that never suspend (the scripted model calling
    a tool that fails at once) must not keep the event loop to one turn: other tasks run at
    least every YIELD_EVERY_STEPS steps, so Ctrl-C, a timeout or an abort reaches a turn that
    loops forever."""
    ran = asyncio.Event()
    requests = 0

    def model(request: Any) -> ScriptedReply | str:
        nonlocal requests
        requests += 1
        if ran.is_set() or requests > 50:  # bounded either way: the test cannot hang
            return "done"
        return ScriptedReply(tool_calls=(ScriptedToolCall(name="no_such_tool"),))

    async with scripted_host(model=model) as h:
        agent = (await h.create_agent()).agent
        agent.followup(user_message("loop"))
        asyncio.get_running_loop().call_soon(ran.set)
        await bounded(agent.when_idle())
        assert ran.is_set()
        assert requests <= YIELD_EVERY_STEPS + 1, f"the loop ran only after {requests} steps"


# -- run_followup: the turn in the calling task -----------------------------------------------


async def test_run_followup_runs_the_turn_in_the_calling_task_as_a_driver_would() -> None:
    """host-core §9: from idle, ``run_followup`` logs what ``followup`` logs (the splices, the
    turn) but runs the turn in the calling task, with the agent as its initiator, and returns
    once the agent is idle; the caller's context is left as it was."""
    seen: list[tuple[Any, Any]] = []

    def model(request: Any) -> str:
        seen.append((asyncio.current_task(), current_initiator()))
        return "pong"

    async with scripted_host(model=model) as h:
        inline = (await h.create_agent()).agent
        tasked = (await h.create_agent()).agent
        await bounded(inline.run_followup(user_message("ping")))
        assert inline.status == "idle" and inline._driver is None
        tasked.followup(user_message("ping"))
        await bounded(tasked.when_idle())
        assert types(inline) == types(tasked)
        assert last_answer(inline) == "pong"
        assert seen[0] == (asyncio.current_task(), inline)
        assert seen[1][0] is not asyncio.current_task() and seen[1][1] is tasked
        assert current_initiator() is None


async def test_run_followup_on_a_running_agent_queues_and_waits_for_idle() -> None:
    """host-core §9: while a turn runs, ``run_followup`` is ``followup`` (next turn, run by
    the driver) and returns once the agent is idle, both turns completed."""
    held = Held()
    replies = iter([held.reply("first"), "second"])
    async with scripted_host(model=lambda request: next(replies)) as h:
        agent = (await h.create_agent()).agent
        agent.followup(user_message("one"))
        await bounded(held.reached.wait())
        second = asyncio.ensure_future(agent.run_followup(user_message("two")))
        await yield_once()
        assert not second.done()
        held.gate.set()
        await bounded(second)
        assert agent.status == "idle"
        assert [r.kind for r in turn_ends(agent)] == ["completed", "completed"]
        assert entered_by_turn(agent) == {1: [["one"]], 2: [["two"]]}


async def test_run_followup_stops_on_abort_and_ends_error_when_its_task_is_cancelled() -> None:
    """host-core §9: a turn run by ``run_followup`` stops on ``cancel`` (``aborted``), and the
    cancellation of the calling task ends it ``error`` (``turn task cancelled``) and
    propagates; either way the agent is idle and takes the next follow-up."""
    held = Held()
    replies = iter([held.reply("one"), Held().reply("two"), "three"])
    async with scripted_host(model=lambda request: next(replies)) as h:
        agent = (await h.create_agent()).agent
        run = asyncio.ensure_future(agent.run_followup(user_message("one")))
        await bounded(held.reached.wait())
        agent.cancel(USER)
        await bounded(run)
        run = asyncio.ensure_future(agent.run_followup(user_message("two")))
        async with asyncio.timeout(5):
            while agent.session.events[-1].type != "assistant/chunk":  # "two" is held
                await yield_once()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await bounded(run)
        assert agent.status == "idle" and agent._driver is None
        await bounded(agent.run_followup(user_message("three")))
        reasons = turn_ends(agent)
        assert [r.kind for r in reasons] == ["aborted", "error", "completed"]
        assert reasons[1].error is not None and reasons[1].error.message == "turn task cancelled"


async def test_run_followup_on_a_disposed_agent_is_refused() -> None:
    """host-core §9: like ``followup``, ``run_followup`` on a disposed agent fails
    AGENT_DISPOSED."""
    async with scripted_host() as h:
        handle = await h.create_agent()
        await handle.dispose()
        with pytest.raises(AgentError) as refused:
            await bounded(handle.agent.run_followup(user_message("late")))
        assert refused.value.code == "AGENT_DISPOSED"


def test_an_inbox_reports_an_insertion_only_to_names_someone_hears() -> None:
    """host-core §9: the inbox reports ``agent/inbox/inserted`` through ``notify``; given the
    names anyone listens to (a live view), it skips the call while nobody listens to it, and
    makes it again once someone does. Without that view it always reports."""
    host = Host()
    ctx = Context(host, host.root)
    ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
    heard: set[str] = set()
    told: list[str] = []
    quiet = Inbox(ctx.sessions.create("a"), lambda name, m: told.append(m.text), heard=heard)
    loud = Inbox(ctx.sessions.create("b"), lambda name, m: told.append(m.text))
    quiet.insert("next-turn", user_message("unheard"))
    loud.insert("next-turn", user_message("always"))
    heard.add("agent/inbox/inserted")
    quiet.insert("next-turn", user_message("heard"))
    assert told == ["always", "heard"]
    assert [m.text for m in quiet.next_turn] == ["unheard", "heard"]
