"""The run tree's cap through the real ``subagent`` tool (ROB-65..67): a start beyond it is an
errored tool result that says so, the parent's turn goes on, and nothing ever waits for a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs

import dsh_subagent.plugin
import dsh_tool_subagent.plugin
from dsh_core import (
    AbortSignal,
    Agent,
    PluginRow,
    ToolExecutionInput,
    ToolExecutionResult,
    blocks_text,
)
from dsh_core.testing import (
    ScriptedReply,
    ScriptedRequest,
    ScriptedToolCall,
    TestHost,
    scripted_host,
)
from dsh_subagent import (
    SUBAGENTS,
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ResolvedSubagentStartRequest,
    SubagentRun,
    SubagentRunEndInfo,
)
from dsh_subagent.in_process import IN_PROCESS_CAPABILITIES, start_in_process_run

MODULES = {"subagent": dsh_subagent.plugin, "tool-subagent": dsh_tool_subagent.plugin}
BOUND = 10  # seconds: the bound on every wait


def refusal(limit: int) -> str:
    """The errored result's text (the seam's message after core's ``Error: ``)."""
    return (
        "Error: subagent limit reached: this run tree already has the maximum number of "
        f"running subagents (max_running_children_per_tree = {limit}); no subagent was "
        "started. Wait for one of them to finish, then try again."
    )


@attrs.define(eq=False)
class LocalProvider:
    name: str = "local"
    capabilities: Any = IN_PROCESS_CAPABILITIES
    inherits_parent_context: bool = False

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        return await start_in_process_run(request)

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        return ContinuableCreateSpec()


class Model:
    """``fan N`` calls ``subagent`` N times in one response (prompts ``hold k``); ``chain N``
    delegates ``chain N-1`` down to 0; ``hold <key>`` waits for ``release(key)``; a tool
    result is echoed back as ``got: <results joined by ' | '>``."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.changed = asyncio.Event()

    def release(self, *keys: str) -> None:
        for key in keys:
            self.gates.setdefault(key, asyncio.Event()).set()

    def __call__(self, request: ScriptedRequest) -> ScriptedReply | str:
        self.changed.set()
        last = request.messages[-1] if request.messages else None
        if last is not None and last.role == "tool":
            results = []
            for message in reversed(request.messages):
                if message.role != "tool":
                    break
                results.append(blocks_text(message.content[0].content))  # type: ignore[attr-defined]
            return "got: " + " | ".join(reversed(results))
        text = request.last_user_text
        if text.startswith("fan "):
            calls = tuple(
                ScriptedToolCall(
                    name="subagent",
                    arguments={"description": f"part {k}", "prompt": f"hold {k}"},
                    id=f"c{k}",
                )
                for k in range(int(text[4:]))
            )
            return ScriptedReply(tool_calls=calls)
        if text.startswith("chain "):
            n = int(text[6:])
            if n == 0:
                return "bottom"
            args = {"description": f"level {n}", "prompt": f"chain {n - 1}"}
            return ScriptedReply(tool_calls=(ScriptedToolCall(name="subagent", arguments=args),))
        if text.startswith("hold "):
            gate = self.gates.setdefault(text[5:], asyncio.Event())
            return ScriptedReply(text="held " + text[5:], wait=gate.wait)
        return "child says: " + text


@attrs.define
class Booted:
    host: TestHost
    parent: Agent
    model: Model
    ends: list[SubagentRunEndInfo]

    def running(self) -> int:
        return int(self.host.ctx[SUBAGENTS].running_in_tree(self.parent))

    async def run(self, text: str) -> str:
        async with asyncio.timeout(BOUND):
            return await self.host.run(self.parent, text)

    async def execute(self, arguments: Any, name: str = "subagent") -> ToolExecutionResult:
        async with asyncio.timeout(BOUND):
            return await self.parent.ctx.tools.execute(
                ToolExecutionInput(
                    call_id="call-1",
                    name=name,
                    arguments=arguments,
                    signal=AbortSignal(),
                    agent=self.parent,
                )
            )

    async def until(self, check: Callable[[], bool]) -> None:
        async with asyncio.timeout(BOUND):
            while not check():
                self.model.changed.clear()
                await self.model.changed.wait()


@contextlib.asynccontextmanager
async def boot(cap: int | None = None, **tool: Any) -> AsyncIterator[Booted]:
    config = {} if cap is None else {"subagent": {"max_running_children_per_tree": cap}}
    model = Model()
    row = PluginRow(plugin="tool-subagent", config={"provider": "local", **tool})
    async with scripted_host("subagent", row, model=model, modules=MODULES, config=config) as host:
        host.ctx.plugin("local-provider")[SUBAGENTS].register_provider(LocalProvider())
        ends: list[SubagentRunEndInfo] = []
        host.ctx.on("agent/status", lambda *_: model.changed.set())
        host.ctx.on("subagent/end", lambda info: (ends.append(info), model.changed.set()))
        parent = (await host.create_agent()).agent
        try:
            yield Booted(host=host, parent=parent, model=model, ends=ends)
        finally:
            model.release(*model.gates)


def text(result: ToolExecutionResult) -> str:
    return blocks_text(result.content)


def turn_ends(agent: Agent) -> list[str]:
    return [e.data.reason.kind for e in agent.session.events if e.type == "turn/end"]


# -- ROB-65: fan-out in one response --------------------------------------------------------------


async def test_a_fan_out_in_one_response_starts_the_default_cap_and_refuses_the_rest() -> None:
    """ROB-65: the finding: one response calling subagent (continuable) 40 times starts 32
    children (the default cap) and gives the other 8 calls the documented errored result;
    the parent's turn completes."""
    async with boot(background_mode="continuable") as b:
        answer = await b.run("fan 40")
        results = answer.removeprefix("got: ").split(" | ")
        started = [r for r in results if r.startswith("started subagent ")]
        refused = [r for r in results if r.startswith("Error: ")]
        assert (len(started), len(refused)) == (32, 8)
        assert set(refused) == {refusal(32)}
        assert b.running() == 32
        assert turn_ends(b.parent) == ["completed"]
        b.model.release(*(str(k) for k in range(40)))
        await b.until(lambda: b.running() == 0)


# -- ROB-66: a waiting parent holds a slot, and nothing deadlocks -------------------------------


async def test_a_foreground_parent_holding_the_last_slot_gets_a_refusal_below_it() -> None:
    """ROB-66: with a cap of 1, a parent blocked in a foreground subagent call holds the only
    slot; its child's own subagent call is refused at once (no wait for the slot its parent
    holds), the child answers with the refusal, and every turn completes in bounded time."""
    async with boot(cap=1) as b:
        answer = await b.run("chain 2")
        assert answer == f"got: got: {refusal(1)}"
        assert turn_ends(b.parent) == ["completed"]
        assert b.running() == 0


async def test_a_continuable_child_starting_grandchildren_in_a_full_tree_is_refused() -> None:
    """ROB-66: a continuable child that starts a grandchild while it holds the tree's only
    slot gets the errored result, finishes its turn, settles and frees the slot."""
    async with boot(cap=1, background_mode="continuable") as b:
        result = await b.execute({"description": "fan out", "prompt": "fan 1"})
        child_id = text(result).removeprefix("started subagent ")
        await b.until(lambda: b.running() == 0)
        (end,) = b.ends
        assert (end.id, end.stop_reason) == (child_id, "completed")
        assert blocks_text(end.last_assistant_message or ()) == f"got: {refusal(1)}"


# -- ROB-67: one-shot background jobs -------------------------------------------------------------


async def test_a_background_call_into_a_full_tree_is_refused_at_the_call() -> None:
    """ROB-67: a one-shot background call while the tree is full is an errored result at
    once (SUBAGENT_LIMIT, no job created), not a job that fails later."""
    async with boot(cap=1) as b:
        first = await b.execute({"description": "a", "prompt": "hold a", "run_in_background": True})
        assert text(first) == "started background subagent job subagent-1"
        await b.until(lambda: b.running() == 1)
        refused = await b.execute({"description": "b", "prompt": "b", "run_in_background": True})
        assert refused.error is not None and refused.error.code == "SUBAGENT_LIMIT"
        assert text(refused) == refusal(1)
        assert list(b.host.ctx.jobs.jobs) == ["subagent-1"]


async def test_a_background_job_admitted_past_the_cap_fails_with_the_same_text() -> None:
    """ROB-67: two background calls in one response both pass the call-time check (no child
    has started yet); the start that finds the tree full fails its job with the same text."""
    async with boot(cap=1) as b:
        calls = [{"description": k, "prompt": f"hold {k}", "run_in_background": True} for k in "ab"]
        results = await asyncio.gather(*(b.execute(c) for c in calls))
        assert [text(r) for r in results] == [
            "started background subagent job subagent-1",
            "started background subagent job subagent-2",
        ]
        output = await b.execute({"job_id": "subagent-2", "wait": True}, name="job_output")
        detail = refusal(1).removeprefix("Error: ")
        assert text(output) == f"(no new output)\n[status: failed, SubagentLimitError: {detail}]"
        assert b.running() == 1
