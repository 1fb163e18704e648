"""What a delegation leaves in memory: the memory store's bound on disposed logs, no reference
cycles, a disposed child freed by refcount under a durable store, and what a delegation in
flight keeps for the cyclic collector to walk (PERF-1..PERF-7)."""

from __future__ import annotations

import asyncio
import gc
import types
import weakref
from pathlib import Path
from typing import Any

import pytest

from dsh_core import Agent, AgentCancelCause, PluginRow, Session, user_message
from dsh_core.testing import ScriptedReply, ScriptedRequest, scripted_host, tool_call_reply

LOAD = ("dsh-subagent", "dsh-subagent-spawn", "dsh-tool-subagent")


def _model(request: ScriptedRequest) -> ScriptedReply | str:
    if request.last_user_text == "summarise X":
        return "child result"
    if request.last_tool_result is not None:
        return f"parent got: {request.last_tool_result}"
    return tool_call_reply(("subagent", {"description": "summarise", "prompt": "summarise X"}))


def _rows() -> tuple[Any, ...]:
    return (
        "subagent",
        "subagent-spawn",
        PluginRow(plugin="tool-subagent", config={"provider": "spawn"}),
    )


async def _delegate(host: Any) -> None:
    handle = await host.create_agent()
    try:
        async with asyncio.timeout(30):
            assert await host.run(handle.agent, "do the thing") == "parent got: child result"
    finally:
        await handle.dispose()


async def test_the_memory_store_keeps_only_the_newest_disposed_logs_within_its_bound() -> None:
    """PERF-1: with ``retain_disposed = 2`` the memory store keeps the logs of the two most
    recently disposed sessions only (the oldest go first), and never drops a session in use."""
    config = {"session-persistence-memory": {"retain_disposed": 2}}
    async with scripted_host(model=_model, config=config) as host:
        store = host.ctx.session_persistence
        kept = await host.create_agent(session_id="kept")
        ids = []
        for i in range(5):
            handle = await host.create_agent(session_id=f"s{i}")
            async with asyncio.timeout(30):
                await host.run(handle.agent, "hello")
            await handle.dispose()
            ids.append(f"s{i}")
        stored = [await store.stored(i) for i in ids]
        assert stored == [False, False, False, True, True]
        assert await store.stored("kept")
        assert sorted(h.id for h in await store.list()) == ["kept", "s3", "s4"]
        await kept.dispose()


async def test_a_one_shot_childs_log_leaves_the_memory_store_beyond_the_bound() -> None:
    """PERF-1: after 6 delegations through the `subagent` tool with ``retain_disposed = 2``,
    the memory store holds two logs: the disposed parents' and children's beyond the bound
    have left memory."""
    config = {"session-persistence-memory": {"retain_disposed": 2}}
    async with scripted_host(*_rows(), model=_model, config=config, load=LOAD) as host:
        for _ in range(6):
            await _delegate(host)
        assert len(await host.ctx.session_persistence.list()) == 2


@pytest.mark.parametrize("value", [-1, True, "3", 1.5])
async def test_retain_disposed_must_be_a_non_negative_integer(value: object) -> None:
    """PERF-2: the memory store's ``retain_disposed`` key refuses anything but a non-negative
    integer when the host boots."""
    with pytest.raises(Exception, match="retain_disposed"):
        async with scripted_host(
            model=_model, config={"session-persistence-memory": {"retain_disposed": value}}
        ):
            pass


def _collect_cyclic() -> list[str]:
    """Run a full collection keeping what it finds (DEBUG_SAVEALL); the type names of that
    garbage, which is then freed."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = [type(o).__qualname__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.collect()  # what was saved is unreachable again: free it now
    return found


@pytest.mark.parametrize("store", ["memory", "jsonl"])
async def test_a_delegation_creates_no_reference_cycle(store: str, tmp_path: Path) -> None:
    """PERF-3: delegations through the `subagent` tool leave no garbage that only the cyclic
    collector could free: every object of a finished delegation dies by its refcount."""
    async with scripted_host(
        *_rows(),
        model=_model,
        load=LOAD,
        store=store,
        store_root=tmp_path,  # type: ignore[arg-type]
    ) as host:
        for _ in range(2):  # warm caches: what the first run builds once is not per delegation
            await _delegate(host)
        gc.collect()  # what booting and warming made, cycles included, is gone
        for _ in range(5):
            await _delegate(host)
        assert _collect_cyclic() == []


async def test_a_disposed_one_shot_child_is_freed_when_a_durable_store_holds_its_log(
    tmp_path: Path,
) -> None:
    """PERF-4: under the JSONL store, a one-shot child's session object is gone once the
    delegation ends and the store has let go of its log, with the cyclic collector off: only
    refcounting freed it, so nothing in the host keeps it (not even the deferred fsync)."""
    created: list[str] = []
    async with scripted_host(
        *_rows(), model=_model, load=LOAD, store="jsonl", store_root=tmp_path
    ) as host:
        store = host.ctx.session_persistence
        host.ctx.on(
            "session/created",
            lambda s: created.append(s.header.id) if s.header.origin == "subagent" else None,
        )
        gc.collect()
        gc.disable()  # only refcounting may free it; restored below
        try:
            for _ in range(3):
                await _delegate(host)
            async with asyncio.timeout(30):
                for id in created:
                    await store.released(id)
            children = [
                o for o in gc.get_objects() if type(o) is Session and o.header.id in created
            ]
        finally:
            gc.enable()
        assert len(created) == 3
        assert children == []


# What one delegation in flight (a parent in its `subagent` call, the child waiting on its
# model, memory store, requests recorded) keeps for the cyclic collector to walk: measured 285
# (385 while a session's detach, an abort listener's remover, a prompt entry's remover and a
# child run's wiring were closures; 344 while the agent loop's chunk sink, the inbox's notifier,
# a shared result's done callback and Context.on's remover were closures, the tool call's
# frames kept comprehension cells, a context kept a tuple per bound service and a step's frame
# kept its request and assembler while its tools ran);
# benchmarks/memory.py counts the same way.
TRACKED_BUDGET = 288


async def _in_flight(n: int, check: Any) -> None:
    """Hold ``n`` delegations parked in their children's model calls, then ``check(new)``
    with the gc-tracked objects made since before they started (after a full collection)."""
    gate = asyncio.Event()
    parked: list[None] = []
    all_in = asyncio.Event()

    async def wait() -> object:
        parked.append(None)
        if len(parked) == n:
            all_in.set()
        return await gate.wait()

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if request.last_user_text == "summarise X" and not gate.is_set():
            return ScriptedReply(text="child result", wait=wait)
        return _model(request)

    async with scripted_host(*_rows(), model=model, load=LOAD, invariants=False) as host:
        gate.set()
        for _ in range(3):  # warm caches: what the first runs build once is not per delegation
            await _delegate(host)
        gate.clear()
        gc.collect()
        before = {id(o) for o in gc.get_objects()}
        tasks = [asyncio.ensure_future(_delegate(host)) for _ in range(n)]
        try:
            async with asyncio.timeout(30):
                await all_in.wait()
            gc.collect()
            check([o for o in gc.get_objects() if id(o) not in before])
        finally:
            gate.set()
            async with asyncio.timeout(30):
                await asyncio.gather(*tasks)


async def test_a_delegation_in_flight_keeps_few_objects_for_the_cyclic_collector() -> None:
    """PERF-5: a delegation held in flight keeps at most TRACKED_BUDGET gc-tracked objects,
    counted over 50 delegations parked in their children's model calls."""
    n = 50
    found: list[float] = []
    await _in_flight(n, lambda new: found.append(len(new) / n))
    assert found[0] <= TRACKED_BUDGET, found[0]


def _ours(code: types.CodeType) -> bool:
    return "/dsh_" in code.co_filename.replace("\\", "/")


async def test_a_delegation_in_flight_keeps_no_closure_of_ours() -> None:
    """PERF-6: a delegation held in flight keeps no closure made by dsh code (no function
    object of a dsh module made for it) and no dsh coroutine whose frame holds cells (what a
    closure or comprehension over its locals makes): each would be objects the cyclic
    collector walks for every delegation in flight."""
    closures: list[str] = []

    def check(new: list[object]) -> None:
        for o in new:
            if isinstance(o, types.FunctionType) and _ours(o.__code__):
                closures.append(f"function {o.__qualname__}")
            if isinstance(o, types.CoroutineType):
                code = o.cr_code
            elif isinstance(o, types.AsyncGeneratorType):
                code = o.ag_code
            elif isinstance(o, types.GeneratorType):
                code = o.gi_code
            else:
                continue
            if _ours(code) and code.co_cellvars:
                closures.append(f"frame of {code.co_qualname} keeps {code.co_cellvars}")

    await _in_flight(10, check)
    assert sorted(set(closures)) == []


async def test_finished_delegations_die_by_refcount_even_when_aborted_or_concurrent() -> None:
    """PERF-7: with the cyclic collector off, every agent of finished delegations (run at
    once, or aborted while the child's model waits: the parent's turn cancelled) is freed by
    refcount alone, and a full collection then finds no cyclic garbage."""
    gate = asyncio.Event()
    parked = asyncio.Event()

    async def wait() -> object:
        parked.set()
        return await gate.wait()

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        if request.last_user_text == "summarise X" and not gate.is_set():
            return ScriptedReply(text="child result", wait=wait)
        return _model(request)

    agents: list[weakref.ref[Agent]] = []
    async with scripted_host(*_rows(), model=model, load=LOAD, invariants=False) as host:
        host.ctx.on("agent/created", lambda a: agents.append(weakref.ref(a)))

        async def aborted() -> None:
            handle = await host.create_agent()
            try:
                async with asyncio.timeout(30):
                    handle.agent.followup(user_message("do the thing"))
                    await parked.wait()
                    handle.agent.cancel(AgentCancelCause(kind="user"))
                    await handle.agent.when_idle()
            finally:
                await handle.dispose()

        gate.set()
        for _ in range(2):  # warm caches: what the first runs build once is not per delegation
            await _delegate(host)
        gc.collect()
        agents.clear()
        gc.disable()  # only refcounting may free them; restored below
        try:
            await asyncio.gather(*(_delegate(host) for _ in range(5)))
            gate.clear()
            for _ in range(3):
                parked.clear()
                await aborted()
            gate.set()
            alive = [a().id for a in agents if a() is not None]  # type: ignore[union-attr]
        finally:
            gc.enable()
        assert len(agents) == 16  # 8 parents, 8 children
        assert alive == []
        assert _collect_cyclic() == []
