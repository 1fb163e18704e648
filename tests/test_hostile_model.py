"""A hostile model through every model-facing tool, on both stores (ROB-15).

Scripted responses make random tool calls: random names, and raw argument text that nests
far too deep, is huge, holds lone surrogates or NUL, has wrong types or repeated keys, or is no
JSON at all. They go through the real path of `subagent` (one-shot, in the foreground and as a
job), a continuable `delegate`, `send_message`, `interrupt_agent`, `list_agents`, `report` (a
continuable child calls it with the same kind of text), `job_output` and `job_kill`. After
every turn: it ended with a documented reason, every call has its result (the next request is
well-formed), and at the end every session's stored log reads back equal to the live one.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any, Literal

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh_core import PluginRow, Session, SessionLogChecker
from dsh_core._log_checker import unanswered_calls
from dsh_core._tools import MAX_ARGUMENT_CHARS, MAX_ARGUMENT_NESTING
from dsh_core.testing import ScriptedRequest, ScriptedToolCall, scripted_host, tool_call_reply

LOAD = (
    "dsh-subagent",
    "dsh-subagent-spawn",
    "dsh-tool-subagent",
    "dsh-tool-subagent-control",
    "dsh-tool-subagent-report",
)
ROWS = (
    "subagent",
    "subagent-spawn",
    PluginRow(plugin="tool-subagent", config={"provider": "spawn"}),
    PluginRow(
        plugin="tool-subagent",
        config={"provider": "spawn", "tool_name": "delegate", "background_mode": "continuable"},
    ),
    "tool-subagent-control",
    "tool-subagent-list-agents",
    "tool-subagent-report",
)
#: The reasons a turn may end with (docs/host.md); crash repair's `interrupted` never here.
DOCUMENTED = frozenset({"completed", "aborted", "blocked", "error", "max-tokens", "max-steps"})
TOOLS = (
    "subagent",
    "delegate",
    "send_message",
    "interrupt_agent",
    "list_agents",
    "report",
    "job_output",
    "job_kill",
)
FIELDS = (
    "description",
    "prompt",
    "run_in_background",
    "subagent_id",
    "message",
    "agent_id",
    "scope",
    "output",
    "job_id",
    "wait",
)
#: The default run stays short; `nox -s thorough` (its profile: 2000 examples) runs 2000.
EXAMPLES = 2000 if settings.default.max_examples >= 2000 else 12

_odd = st.sampled_from(["a", "é", "\x00", "\ud800", "\udfff", "\n", '"', "\\", "😀", "\u2028"])
_strings = st.text(alphabet=_odd, max_size=6) | st.sampled_from(
    ["children", "descendants", "lead", "x" * 500]
)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _strings
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_strings, inner, max_size=3),
    max_leaves=6,
)
_objects = st.dictionaries(st.sampled_from(FIELDS) | _strings, _values, max_size=4)
#: Arguments each tool takes, so its calls reach past validation into the tool itself
#: (``CHILD`` becomes the id of the latest child started, when there is one).
VALID: dict[str, list[dict[str, Any]]] = {
    "subagent": [
        {"description": "d", "prompt": "answer briefly"},
        {"description": "d\ud800", "prompt": "p\x00", "run_in_background": True},
    ],
    "delegate": [{"description": "d", "prompt": "work"}],
    "send_message": [
        {"subagent_id": "CHILD", "message": "more"},
        {"subagent_id": "x\ud800", "message": "m"},
    ],
    "interrupt_agent": [{"agent_id": "CHILD"}, {"agent_id": "lead"}],
    "list_agents": [{}, {"scope": "descendants"}],
    "report": [{"output": "done\ud800"}],
    "job_output": [{"job_id": "subagent-1", "wait": True}, {"job_id": "subagent-1"}],
    "job_kill": [{"job_id": "subagent-1"}, {"job_id": "subagent-2"}],
}


def _nest(depth: int, obj: bool) -> str:
    return '{"a":' * depth + "1" + "}" * depth if obj else "[" * depth + "]" * depth


_hostile = st.one_of(
    st.builds(json.dumps, _objects, ensure_ascii=st.booleans()),
    st.builds(
        lambda k, a, b: f'{{"{k}": {json.dumps(a)}, "{k}": {json.dumps(b)}}}',
        st.sampled_from(FIELDS),
        _values,
        _values,
    ),
    st.builds(  # expanded by the model (a short repr): see _expand
        "<<nest {} {}>>".format,
        st.sampled_from([MAX_ARGUMENT_NESTING, MAX_ARGUMENT_NESTING + 1, 1_000, 50_000]),
        st.sampled_from(["object", "array"]),
    ),
    st.sampled_from(
        [
            '{"prompt": "HUGE"}',  # the model makes it MAX_ARGUMENT_CHARS long (a short repr)
            "42",
            "null",
            "[]",
            '"x"',
            '{"a": NaN}',
            '{"job_id": 7}',
            '{"a": 1',
            "",
        ]
    ),
    st.text(max_size=12),
)


def _raw_for(name: str) -> st.SearchStrategy[str]:
    """Raw argument text for a call of ``name``: half of it what the tool takes."""
    taken = st.builds(json.dumps, st.sampled_from(VALID[name]), ensure_ascii=st.booleans())
    return st.one_of(taken, _hostile)


_call = st.one_of(
    st.sampled_from(TOOLS).flatmap(
        lambda name: st.builds(ScriptedToolCall, name=st.just(name), arguments=_raw_for(name))
    ),
    st.builds(ScriptedToolCall, name=st.text(max_size=8), arguments=_hostile),
)
_calls = st.lists(_call, min_size=1, max_size=4)


class _Watch:
    """Sessions, turn ends and settled runs as they happen, and a wake-up on every change."""

    def __init__(self, host: Any) -> None:
        #: By id, the latest live session (a resumed child is a new object on the same log).
        self.by_id: dict[str, Session] = {}
        self.ends: list[tuple[str, str]] = []
        self.started = self.settled = 0
        self.children: list[str] = []
        self.changed = asyncio.Event()
        host.ctx.on("session/created", lambda session: self.by_id.__setitem__(session.id, session))
        host.ctx.on("session/event", self._event)
        host.ctx.on("agent/status", lambda agent, status: self.changed.set())
        host.ctx.on("subagent/start", self._start)
        host.ctx.on("subagent/end", self._end)

    def _event(self, session: Session, event: Any) -> None:
        if event.type == "turn/end":
            self.ends.append((session.id, event.data.reason.kind))

    def _start(self, info: Any) -> None:
        self.started += 1
        self.children.append(info.id)

    def _end(self, info: Any) -> None:
        self.settled += 1
        self.changed.set()

    async def quiet(self, host: Any) -> None:
        """Until no agent runs and every started run has settled."""
        while True:
            self.changed.clear()
            running = [a for a in host.ctx.agents.list() if a.status == "running"]
            if not running and self.settled >= self.started:
                return
            await self.changed.wait()


def _expand(raw: str, child: str) -> str:
    """``raw`` with ``CHILD`` as ``child``, ``HUGE`` as a string longer than the argument
    limit, and ``<<nest DEPTH object|array>>`` as JSON nested DEPTH levels deep."""
    if raw.startswith("<<nest "):
        _, depth, kind = raw.strip("<>").split()
        return _nest(int(depth), kind == "object")
    return raw.replace("CHILD", child).replace("HUGE", "x" * MAX_ARGUMENT_CHARS)


def _check_requests(session: Session) -> None:
    """Every call the session's history holds has its result: a request now is well-formed."""
    assert unanswered_calls(session.derive_messages()) == [], session.id
    checker = SessionLogChecker()
    checker.replay(session.events)
    assert checker.unanswered == set(), session.id
    assert checker.request_problem() is None


async def _scenario(
    store: Literal["memory", "jsonl"], turns: list[list[ScriptedToolCall]], child_report: str
) -> None:
    prompts = {f"turn {i}": calls for i, calls in enumerate(turns)}

    def model(request: ScriptedRequest) -> Any:
        last = request.messages[-1] if request.messages else None
        if request.session_id != "lead":  # a child: report once, then answer
            if last is not None and last.role == "tool":
                return "child done"
            report = ScriptedToolCall(name="report", arguments=_expand(child_report, "nobody"))
            return tool_call_reply(report)
        if last is not None and last.role == "tool":
            return "done"
        calls = prompts.get(request.last_user_text or "")
        if calls is None or last is None or last.role != "user":
            return "ok"
        child = watch.children[-1] if watch.children else "nobody"
        return tool_call_reply(
            *(attrs.evolve(c, arguments=_expand(c.arguments, child)) for c in calls)
        )

    with tempfile.TemporaryDirectory() as tmp:
        async with scripted_host(
            *ROWS, model=model, load=LOAD, store=store, store_root=Path(tmp)
        ) as host:
            watch = _Watch(host)
            handle = await host.create_agent(session_id="lead")
            lead = handle.agent
            for prompt in prompts:
                async with asyncio.timeout(30):
                    await host.run(lead, prompt)
                    await watch.quiet(host)
                for session in watch.by_id.values():
                    _check_requests(session)
                kinds = {kind for _, kind in watch.ends}
                assert kinds <= DOCUMENTED, kinds
                assert all(kind == "completed" for sid, kind in watch.ends if sid == "lead")
            async with asyncio.timeout(30):
                await handle.dispose()
                await watch.quiet(host)
            persistence = host.ctx.session_persistence
            for session in watch.by_id.values():
                _, stored = await persistence.load(session.id)
                assert stored == tuple(session.events), session.id


@pytest.mark.parametrize("store", ["memory", "jsonl"])
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(turns=st.lists(_calls, min_size=1, max_size=2), child_report=_raw_for("report"))
async def test_a_hostile_model_never_ends_a_turn_or_leaves_a_call_unanswered(
    store: Literal["memory", "jsonl"], turns: list[list[ScriptedToolCall]], child_report: str
) -> None:
    """ROB-15: random tool calls with hostile raw arguments through every model-facing tool,
    on the memory and the JSONL store: each turn ends with a documented reason (the lead's
    `completed`), no session is left with a call lacking its result, and every stored log
    reads back equal to the live one."""
    await _scenario(store, turns, child_report)
