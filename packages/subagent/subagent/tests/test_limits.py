"""The cap on subagents running at once per run tree, through ``ctx.subagents`` (ROB-60..65).

The set-up: a host with ``subagent`` (its row's ``max_running_children_per_tree`` set per test),
an in-process test provider that can also create continuable children, and a scripted model
whose ``hold <key>`` prompts wait until the test releases them (every other prompt is echoed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import pytest

import dsh_subagent.plugin
from dsh_core import (
    AbortController,
    Agent,
    PluginError,
    text_blocks,
)
from dsh_core._host import structure_config
from dsh_core.testing import ScriptedReply, ScriptedRequest, TestHost, scripted_host
from dsh_subagent import (
    DEFAULT_MAX_RUNNING_CHILDREN_PER_TREE,
    MAX_SAFE_INTEGER,
    SUBAGENTS,
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ContinuableStartSpec,
    CoordinatorMessageSource,
    ResolvedSubagentStartRequest,
    SubagentConfig,
    SubagentFollowupOptions,
    SubagentLimitError,
    SubagentRun,
    SubagentService,
    SubagentStartRequest,
)
from dsh_subagent._continuation import ContinuationManager
from dsh_subagent.in_process import IN_PROCESS_CAPABILITIES, start_in_process_run

BOUND = 10  # seconds: the bound on every wait


def limit_text(limit: int, refused: str = "no subagent was started") -> str:
    return (
        "subagent limit reached: this run tree already has the maximum number of running "
        f"subagents (max_running_children_per_tree = {limit}); {refused}. Wait for one of "
        "them to finish, then try again."
    )


@attrs.define(eq=False)
class LocalProvider:
    """The in-process driver; ``fail`` makes one-shot starts raise."""

    name: str = "local"
    capabilities: Any = IN_PROCESS_CAPABILITIES
    inherits_parent_context: bool = False
    fail: BaseException | None = None
    started: int = 0

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        self.started += 1
        if self.fail is not None:
            raise self.fail
        return await start_in_process_run(request)

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        return ContinuableCreateSpec()


class Model:
    """``hold <key>`` waits for ``release(key)``; anything else is echoed."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.changed = asyncio.Event()

    def release(self, key: str) -> None:
        self.gates.setdefault(key, asyncio.Event()).set()

    def __call__(self, request: ScriptedRequest) -> ScriptedReply | str:
        self.changed.set()
        text = request.last_user_text
        if text.startswith("hold "):
            gate = self.gates.setdefault(text[5:], asyncio.Event())
            return ScriptedReply(text="held " + text[5:], wait=gate.wait)
        return "answer: " + text


@attrs.define
class Booted:
    host: TestHost
    parent: Agent
    provider: LocalProvider
    model: Model

    @property
    def svc(self) -> SubagentService:
        return self.host.ctx[SUBAGENTS]

    @property
    def manager(self) -> ContinuationManager:
        manager: ContinuationManager = self.svc._state.continuation
        return manager

    def request(self, prompt: str, parent: Agent | None = None) -> SubagentStartRequest:
        return SubagentStartRequest(prompt=text_blocks(prompt), parent=parent or self.parent)

    async def start(self, prompt: str, parent: Agent | None = None) -> str:
        spec = ContinuableStartSpec(
            provider="local",
            label="helper",
            prompt=text_blocks(prompt),
            parent=parent or self.parent,
            signal=AbortController().signal,
        )
        async with asyncio.timeout(BOUND):
            return (await self.svc.start_continuable(spec)).child_id

    async def send(self, child_id: str, text: str) -> str:
        options = SubagentFollowupOptions(
            source=CoordinatorMessageSource(sender_session_id=self.parent.id)
        )
        async with asyncio.timeout(BOUND):
            return await self.svc.followup(self.parent, child_id, text_blocks(text), options)

    def running(self, agent: Agent | None = None) -> int:
        return self.svc.running_in_tree(agent or self.parent)

    async def until(self, check: Callable[[], bool]) -> None:
        """Wait (bounded) until ``check()`` holds; re-checked whenever the model is asked, an
        agent's status changes, a subagent ends, or a host task finishes."""
        async with asyncio.timeout(BOUND):
            while not check():
                self.model.changed.clear()
                waiter = asyncio.ensure_future(self.model.changed.wait())
                try:
                    await asyncio.wait(
                        [waiter, *[t for t in self.host.ctx.host.tasks if not t.done()]],
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    waiter.cancel()

    async def settled(self, child_id: str) -> None:
        manager = self.manager
        await self.until(
            lambda: child_id not in manager.activations and child_id not in manager.retiring
        )

    def agent(self, child_id: str) -> Agent:
        return self.manager.activations[child_id].agent


@contextlib.asynccontextmanager
async def boot(cap: int | None = None) -> AsyncIterator[Booted]:
    config = {} if cap is None else {"subagent": {"max_running_children_per_tree": cap}}
    model = Model()
    async with scripted_host(
        "subagent", model=model, modules={"subagent": dsh_subagent.plugin}, config=config
    ) as host:
        provider = LocalProvider()
        host.ctx.plugin("local-provider")[SUBAGENTS].register_provider(provider)
        for name in ("agent/status", "agent/disposed", "subagent/end"):
            host.ctx.on(name, lambda *_: model.changed.set())
        parent = (await host.create_agent()).agent
        yield Booted(host=host, parent=parent, provider=provider, model=model)


# -- ROB-60: the config ---------------------------------------------------------------------------


async def test_the_default_cap_is_32_and_the_row_sets_it() -> None:
    """ROB-60: without config the cap is the documented 32; the row's key sets it."""
    assert DEFAULT_MAX_RUNNING_CHILDREN_PER_TREE == 32
    assert SubagentConfig().max_running_children_per_tree == 32
    async with boot() as b:
        assert b.svc.max_running_children_per_tree == 32
    async with boot(cap=5) as b:
        assert b.svc.max_running_children_per_tree == 5


SPEC = dsh_subagent.plugin.dsh_plugins()[0]


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        pytest.param(
            {"max_running_children_per_tree": 0},
            "key 'max_running_children_per_tree' must be an integer from 1 to "
            f"{MAX_SAFE_INTEGER}, got 0",
            id="zero",
        ),
        pytest.param(
            {"max_running_children_per_tree": -3},
            "key 'max_running_children_per_tree' must be an integer from 1",
            id="negative",
        ),
        pytest.param(
            {"max_running_children_per_tree": 2**53},
            f"got {2**53}",
            id="unsafe",
        ),
        pytest.param(
            {"max_running_children_per_tree": "8"},
            "key 'max_running_children_per_tree' (int): expected an integer, got '8'",
            id="str",
        ),
        pytest.param(
            {"max_running_children_per_tree": True},
            "key 'max_running_children_per_tree' (int)",
            id="bool",
        ),
        pytest.param(
            {"max_running_children_per_tree": 8.0},
            "key 'max_running_children_per_tree' (int)",
            id="float",
        ),
        pytest.param(
            {"max_children": 8},
            "key 'max_children' is unknown (known keys: ['max_running_children_per_tree'])",
            id="unknown",
        ),
    ],
)
def test_a_bad_cap_is_plugin_config_naming_the_row_and_the_key(
    config: dict[str, Any], needle: str
) -> None:
    """ROB-60: a cap that is not an integer from 1 to 2**53 - 1 (or an unknown key) is
    PLUGIN_CONFIG naming the row, the plugin and the key."""
    with pytest.raises(PluginError) as err:
        structure_config(SPEC, config, row=4)
    assert err.value.code == "PLUGIN_CONFIG"
    assert str(err.value).startswith("plugins[4] (plugin 'subagent') config: ")
    assert needle in str(err.value)


async def test_a_bad_cap_fails_the_boot() -> None:
    """ROB-60: the same refusal fails a real boot (nothing runs with an unchecked cap)."""
    with pytest.raises(PluginError) as err:
        async with boot(cap=0):
            pass
    assert err.value.code == "PLUGIN_CONFIG"
    assert "max_running_children_per_tree" in str(err.value)


# -- ROB-61: one-shot runs ----------------------------------------------------------------------


async def test_a_one_shot_start_beyond_the_cap_is_refused_until_a_result_settles() -> None:
    """ROB-61: with the tree full, ctx.subagents.start is refused with SUBAGENT_LIMIT and the
    documented text before the provider is called; a run's slot frees when its result
    settles (before subagent/end is emitted), and the next start is accepted."""
    async with boot(cap=2) as b:
        at_end: list[int] = []
        b.host.ctx.on("subagent/end", lambda *_: at_end.append(b.running()))
        first = await b.svc.start("local", b.request("hold a"))
        second = await b.svc.start("local", b.request("hold b"))
        assert b.running() == 2
        agents = len(b.host.ctx.agents.list())
        with pytest.raises(SubagentLimitError) as err:
            await b.svc.start("local", b.request("hold c"))
        assert err.value.code == "SUBAGENT_LIMIT"
        assert err.value.limit == 2
        assert str(err.value) == limit_text(2)
        assert b.provider.started == 2
        assert len(b.host.ctx.agents.list()) == agents
        b.model.release("a")
        async with asyncio.timeout(BOUND):
            await first.result
        assert b.running() == 1
        assert at_end == [1]
        third = await b.svc.start("local", b.request("three"))
        async with asyncio.timeout(BOUND):
            assert (await third.result).stop_reason == "completed"
        assert b.running() == 1
        b.model.release("b")
        async with asyncio.timeout(BOUND):
            await second.result
        assert b.running() == 0
        assert b.svc._state.limits.running == {}  # nothing left behind for an idle tree
        for run in (first, second, third):
            await run.dispose()


async def test_a_failed_provider_start_gives_the_slot_back() -> None:
    """ROB-61: a provider start that raises holds no slot: with a cap of 1, a second start
    reaches the provider again (and fails its own way, not SUBAGENT_LIMIT)."""
    async with boot(cap=1) as b:
        b.provider.fail = RuntimeError("provider down")
        for _ in range(2):
            with pytest.raises(RuntimeError, match="provider down"):
                await b.svc.start("local", b.request("x"))
        assert b.provider.started == 2
        assert b.running() == 0


# -- ROB-62: continuable children ---------------------------------------------------------------


async def test_a_continuable_start_beyond_the_cap_is_refused_until_a_child_settles() -> None:
    """ROB-62: with the tree full, start_continuable is refused with SUBAGENT_LIMIT and leaves
    no agent or session; a child's slot frees once it settled and was released (before its
    subagent/end is emitted)."""
    async with boot(cap=2) as b:
        at_end: list[int] = []
        b.host.ctx.on("subagent/end", lambda *_: at_end.append(b.running()))
        a = await b.start("hold a")
        await b.start("hold b")
        assert b.running() == 2
        agents, sessions = len(b.host.ctx.agents.list()), len(b.host.ctx.sessions.list())
        with pytest.raises(SubagentLimitError) as err:
            await b.start("hold c")
        assert str(err.value) == limit_text(2)
        assert len(b.host.ctx.agents.list()) == agents
        assert len(b.host.ctx.sessions.list()) == sessions
        b.model.release("a")
        await b.settled(a)
        assert b.running() == 1
        assert at_end == [1]
        await b.start("three")
        b.model.release("b")


async def test_a_drain_frees_the_slots_of_the_released_children() -> None:
    """ROB-62: releasing children by a drain (not by settling) frees their slots, the
    grandchildren's too."""
    async with boot(cap=3) as b:
        a = await b.start("hold a")
        await b.start("hold g", parent=b.agent(a))
        await b.start("hold b")
        assert b.running() == 3
        async with asyncio.timeout(BOUND):
            await b.svc.drain_continuable_children(b.parent, [a])
        assert b.running() == 1
        await b.start("again")


async def test_a_cold_resume_beyond_the_cap_is_refused_and_not_resumed() -> None:
    """ROB-62: a follow-up that would cold-resume a settled child into a full tree is
    refused with SUBAGENT_LIMIT ("was not resumed"); once a slot is free it resumes."""
    async with boot(cap=1) as b:
        done = await b.start("first")
        await b.settled(done)
        busy = await b.start("hold busy")
        with pytest.raises(SubagentLimitError) as err:
            await b.send(done, "more")
        assert str(err.value) == limit_text(1, f"subagent {done} was not resumed")
        assert done not in b.manager.activations
        b.model.release("busy")
        await b.settled(busy)
        assert await b.send(done, "more")
        await b.settled(done)
        assert b.running() == 0


async def test_a_start_rolled_back_after_publication_gives_the_slot_back() -> None:
    """ROB-62: a start whose published child is rolled back (a vetoing subagent/start
    listener) holds no slot afterwards."""
    async with boot(cap=1) as b:

        def veto(*_: object) -> None:
            raise RuntimeError("vetoed")

        remove = b.host.ctx.on("subagent/start", veto)
        with pytest.raises(RuntimeError, match="vetoed"):
            await b.start("x")
        remove()
        assert b.running() == 0
        child = await b.start("y")
        await b.settled(child)


# -- ROB-63: the tree is the root's -------------------------------------------------------------


async def test_every_level_counts_in_the_roots_tree_and_trees_are_apart() -> None:
    """ROB-63: a grandchild (continuable or one-shot) takes a slot of its root's tree, so a
    full tree refuses a start at any depth; another root's tree is counted apart."""
    async with boot(cap=3) as b:
        child = await b.start("hold child")
        child_agent = b.agent(child)
        await b.start("hold grandchild", parent=child_agent)
        run = await b.svc.start("local", b.request("hold one-shot", parent=child_agent))
        assert b.running() == b.running(child_agent) == 3
        with pytest.raises(SubagentLimitError):
            await b.start("hold more", parent=child_agent)
        with pytest.raises(SubagentLimitError):
            await b.svc.start("local", b.request("more"))
        other = (await b.host.create_agent()).agent
        for key in ("x", "y", "z"):
            await b.start(f"hold {key}", parent=other)
        assert (b.running(other), b.running()) == (3, 3)
        for key in ("child", "grandchild", "one-shot", "x", "y", "z"):
            b.model.release(key)
        async with asyncio.timeout(BOUND):
            await run.result
        await run.dispose()
        await b.until(lambda: b.running() == 0 and b.running(other) == 0)


# -- ROB-64: waiting never blocks ------------------------------------------------------------------


async def test_a_waiting_parent_keeps_its_slot_and_a_full_tree_refuses_at_once() -> None:
    """ROB-64: a continuable child idle but waiting for its own child keeps its slot; a start
    in the full tree is refused at once (never queued behind the parent's own slot), and the
    tree empties when the work below finishes."""
    async with boot(cap=2) as b:
        child = await b.start("hold child")
        child_agent = b.agent(child)
        grandchild = await b.start("hold grandchild", parent=child_agent)
        b.model.release("child")
        await b.until(lambda: child_agent.status == "idle")
        assert child in b.manager.activations  # waiting: it owns a resident child
        assert b.running() == 2
        async with asyncio.timeout(BOUND):  # bounded: a refusal, never a wait for a slot
            with pytest.raises(SubagentLimitError):
                await b.start("hold more", parent=child_agent)
            with pytest.raises(SubagentLimitError):
                await b.svc.start("local", b.request("more", parent=child_agent))
        b.model.release("grandchild")
        await b.settled(grandchild)
        await b.settled(child)
        assert b.running() == 0
