"""The runtime context: services, fibers and effects, scoped events (host-core §1)."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core import Context, ContextError, Fiber, Host, Scope, ServiceKey
from dsh_core._context import ScopedCache


async def _suspend() -> None:
    """Give the loop one turn (a real suspension point inside code under test)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    loop.call_soon(fut.set_result, None)
    await fut


def make_ctx() -> Context:
    """A bare host and its root context (no plugins)."""
    host = Host()
    return Context(host, host.root)


def scoped(ctx: Context, key: str, parent: Scope | None = None) -> Context:
    """A child owner routed on a fresh scope ``key``."""
    return ctx.plugin(f"owner:{key}", scope=Scope(key, parent))


# -- services ---------------------------------------------------------------------------------


def test_missing_service_fails_loud_but_get_returns_none() -> None:
    """host-core §1: ctx.<key> and ctx[key] raise MISSING_SERVICE; ctx.get(key) is None."""
    ctx = make_ctx()
    with pytest.raises(ContextError) as by_attr:
        _ = ctx.nothing_here
    assert by_attr.value.code == "MISSING_SERVICE"
    with pytest.raises(ContextError) as by_key:
        ctx["nothing_here"]
    assert by_key.value.code == "MISSING_SERVICE"
    assert ctx.get("nothing_here") is None


async def test_host_service_attributes_behave_like_keyed_lookups() -> None:
    """host-core §1: ctx.tools (and the other host services) is ctx["tools"]: the bound view,
    rebound after the service is replaced, MISSING_SERVICE when nobody provides it."""
    root = make_ctx()
    with pytest.raises(ContextError) as missing:
        _ = root.tools
    assert missing.value.code == "MISSING_SERVICE"
    owner = root.plugin("tools")
    first = _Bindable()
    owner.provide("tools", first)
    child = scoped(root, "a")
    view: Any = child.tools
    assert view == ("view", child)
    assert child.tools is view is child["tools"]
    assert first.binds.count(child) == 1
    await owner.dispose()
    second = _Bindable()
    root.provide("tools", second)
    rebound: Any = child.tools
    assert rebound == ("view", child)
    assert second.binds == [child]


async def test_provide_is_an_effect_and_a_second_provider_fails() -> None:
    """host-core §1: a second provider for one key fails DUPLICATE_SERVICE; disposal withdraws."""
    ctx = make_ctx()
    first = ctx.plugin("first")
    service = object()
    first.provide("thing", service)
    assert ctx.thing is service
    assert ctx["thing"] is service
    second = ctx.plugin("second")
    with pytest.raises(ContextError) as err:
        second.provide("thing", object())
    assert err.value.code == "DUPLICATE_SERVICE"
    assert ctx.thing is service
    await first.dispose()
    assert ctx.get("thing") is None
    replacement = object()
    second.provide("thing", replacement)
    assert ctx.thing is replacement


def test_typed_service_key_reads_the_same_service() -> None:
    """host-core §1: a ServiceKey names the same service as its string."""
    ctx = make_ctx()
    key: ServiceKey[list[int]] = ServiceKey("numbers")
    ctx.provide(key, [1, 2])
    assert ctx[key] == [1, 2]
    assert ctx.numbers == [1, 2]


class _Bindable:
    """A service whose views know which context asked for them."""

    def __init__(self) -> None:
        self.binds: list[Context] = []

    def __dsh_bind__(self, ctx: Context) -> tuple[str, Context]:
        self.binds.append(ctx)
        return ("view", ctx)


def test_service_with_dsh_bind_gives_a_caller_bound_view() -> None:
    """host-core §1: __dsh_bind__(ctx) returns a view bound to the calling context."""
    root = make_ctx()
    service = _Bindable()
    root.provide("bound", service)
    child = scoped(root, "a")
    assert root.bound == ("view", root)
    assert child.bound == ("view", child)
    assert child.get("bound") == ("view", child)
    # one view per context: the second read reuses it
    assert [c is child for c in service.binds].count(True) == 1


def test_extend_shares_owner_and_services_and_carries_the_agent() -> None:
    """host-core §1: ctx.extend shares fiber and services; plain contexts read ctx.agent None."""
    root = make_ctx()
    root.provide("svc", 1)
    marker: Any = object()  # a stand-in that cannot be weakly referenced is kept as it is
    extended = root.extend(agent=marker)
    assert root.agent is None
    assert extended.agent is marker
    assert extended.fiber is root.fiber
    assert extended.svc == 1
    assert isinstance(root.logger, logging.Logger)


# -- fibers and effects -----------------------------------------------------------------------


async def test_effects_unwind_in_reverse_registration_order() -> None:
    """host-core §1: disposing a fiber undoes its effects in reverse order."""
    ctx = make_ctx().plugin("p")
    order: list[str] = []
    for name in ("a", "b", "c"):
        ctx.effect(lambda name=name: lambda: order.append(name))
    await ctx.dispose()
    assert order == ["c", "b", "a"]


async def test_generator_effect_yields_disposers_that_unwind_in_reverse() -> None:
    """host-core §1: a generator effect's disposers unwind in reverse (ordered teardown)."""
    ctx = make_ctx().plugin("p")
    order: list[str] = []

    def chain() -> Generator[Callable[[], None], None, None]:
        order.append("setup-1")
        yield lambda: order.append("undo-1")
        order.append("setup-2")
        yield lambda: order.append("undo-2")

    ctx.effect(chain)
    assert order == ["setup-1", "setup-2"]
    await ctx.dispose()
    assert order == ["setup-1", "setup-2", "undo-2", "undo-1"]


def test_generator_effect_failing_midway_unwinds_what_it_yielded() -> None:
    """host-core §1: a generator that raises unwinds what it already yielded, then re-raises."""
    ctx = make_ctx()
    order: list[str] = []

    def chain() -> Generator[Callable[[], None], None, None]:
        yield lambda: order.append("undo-1")
        yield lambda: order.append("undo-2")
        raise RuntimeError("setup failed")

    with pytest.raises(RuntimeError, match="setup failed"):
        ctx.effect(chain)
    assert order == ["undo-2", "undo-1"]


async def test_effect_returns_the_exact_disposer_which_runs_once() -> None:
    """host-core §1: ctx.effect returns the disposer; calling it early runs it once only."""
    ctx = make_ctx().plugin("p")
    calls: list[int] = []
    dispose = ctx.effect(lambda: lambda: calls.append(1))
    dispose()
    dispose()
    await ctx.dispose()
    assert calls == [1]


async def test_async_disposers_are_awaited_in_order() -> None:
    """host-core §1: an async disposer is awaited before the next (older) effect unwinds."""
    ctx = make_ctx().plugin("p")
    order: list[str] = []

    async def slow() -> None:
        await _suspend()
        order.append("async")

    ctx.effect(lambda: lambda: order.append("older"))
    ctx.effect(lambda: slow)
    await ctx.dispose()
    assert order == ["async", "older"]


async def test_registering_on_a_disposed_fiber_is_inactive_effect() -> None:
    """host-core §1: effects, listeners, services and children on a disposed fiber fail."""
    ctx = make_ctx().plugin("p")
    await ctx.dispose()
    assert not ctx.active
    attempts: list[Callable[[], object]] = [
        lambda: ctx.effect(lambda: lambda: None),
        lambda: ctx.on("x", lambda: None),
        lambda: ctx.provide("late", object()),
        lambda: ctx.plugin("child"),
    ]
    for attempt in attempts:
        with pytest.raises(ContextError) as err:
            attempt()
        assert err.value.code == "INACTIVE_EFFECT"


async def test_fiber_dispose_is_idempotent_and_shared_by_concurrent_callers() -> None:
    """host-core §1: concurrent dispose() calls await one completion; effects run once."""
    fiber = Fiber("f")
    gate, started = asyncio.Event(), asyncio.Event()
    runs: list[str] = []

    async def slow() -> None:
        runs.append("start")
        started.set()
        await gate.wait()
        runs.append("end")

    fiber.add(slow)
    first = asyncio.ensure_future(fiber.dispose())
    second = asyncio.ensure_future(fiber.dispose())
    await started.wait()
    assert fiber.state == "disposing"
    assert not second.done()
    gate.set()
    await asyncio.gather(first, second)
    await fiber.dispose()
    assert runs == ["start", "end"]
    assert fiber.state == "disposed"


async def test_a_failing_disposer_does_not_stop_the_unwind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """host-core §1: a disposer that raises is logged; older effects still unwind."""
    ctx = make_ctx().plugin("p")
    order: list[str] = []

    def boom() -> None:
        raise RuntimeError("disposer broke")

    ctx.effect(lambda: lambda: order.append("older"))
    ctx.effect(lambda: boom)
    with caplog.at_level(logging.ERROR, logger="dsh"):
        await ctx.dispose()
    assert order == ["older"]
    assert "disposer broke" in caplog.text


async def test_plugin_child_is_disposed_with_its_parent_in_stack_order() -> None:
    """host-core §1: ctx.plugin() makes a child fiber unwound at its place in the parent's stack."""
    parent = make_ctx().plugin("parent")
    order: list[str] = []
    parent.effect(lambda: lambda: order.append("parent-before"))
    child = parent.plugin("child")
    child.effect(lambda: lambda: order.append("child"))
    parent.effect(lambda: lambda: order.append("parent-after"))
    await parent.dispose()
    assert order == ["parent-after", "child", "parent-before"]
    assert not child.active


async def test_plugin_child_disposed_early_leaves_its_parent_alone() -> None:
    """host-core §1: disposing a child first runs its effects once and detaches it."""
    parent = make_ctx().plugin("parent")
    order: list[str] = []
    child = parent.plugin("child")
    child.effect(lambda: lambda: order.append("child"))
    await child.dispose()
    assert order == ["child"]
    assert parent.active
    parent.effect(lambda: lambda: order.append("parent"))
    await parent.dispose()
    assert order == ["child", "parent"]


# -- events: routing --------------------------------------------------------------------------


def test_scoped_listener_sees_only_its_scope_and_unscoped_sees_all() -> None:
    """host-core §1: a scoped listener admits only its scope; an unscoped one admits all."""
    root = make_ctx()
    a, b = scoped(root, "a"), scoped(root, "b")
    seen: list[tuple[str, str]] = []
    a.on("ping", lambda who: seen.append(("a", who)))
    b.on("ping", lambda who: seen.append(("b", who)))
    root.on("ping", lambda who: seen.append(("root", who)))
    a.emit("ping", "from-a")
    b.emit("ping", "from-b")
    root.emit("ping", "from-root")
    assert seen == [
        ("a", "from-a"),
        ("root", "from-a"),
        ("b", "from-b"),
        ("root", "from-b"),
        ("root", "from-root"),
    ]


def test_scoped_events_flow_up_the_scope_chain_never_down() -> None:
    """host-core §1: a tagged listener admits dispatches on descendants of its tag only."""
    root = make_ctx()
    parent_scope = Scope("parent")
    parent = root.plugin("parent", scope=parent_scope)
    child = root.plugin("child", scope=Scope("child", parent_scope))
    seen: list[str] = []
    parent.on("ping", lambda who: seen.append(f"parent<-{who}"))
    child.on("ping", lambda who: seen.append(f"child<-{who}"))
    child.emit("ping", "child")
    parent.emit("ping", "parent")
    assert seen == ["parent<-child", "child<-child", "parent<-parent"]


def test_global_listener_from_a_scoped_context_sees_every_dispatch() -> None:
    """host-core §1: global_=True lifts the scope filter."""
    root = make_ctx()
    a, b = scoped(root, "a"), scoped(root, "b")
    seen: list[str] = []
    a.on("ping", lambda who: seen.append(who), global_=True)
    b.emit("ping", "b")
    root.emit("ping", "root")
    assert seen == ["b", "root"]


def test_routing_follows_listeners_added_and_removed_in_any_order() -> None:
    """host-core §1: while only global listeners exist a dispatch reaches exactly them (the
    fast path); a scoped listener added later is reached from its scope, in registration
    order among the global ones, and once it is removed only the global ones remain."""
    root = make_ctx()
    a = scoped(root, "a")
    seen: list[str] = []
    root.on("ping", lambda: seen.append("g1"))
    a.emit("ping")
    remove = a.on("ping", lambda: seen.append("a"))
    root.on("ping", lambda: seen.append("g2"))
    a.emit("ping")
    root.emit("ping")
    remove()
    a.emit("ping")
    assert seen == ["g1", "g1", "a", "g2", "g1", "g2", "g1", "g2"]


def test_explicit_dispatch_scope_overrides_the_emitter_scope() -> None:
    """host-core §1: emit(..., scope=) routes on the given scope (the routing carrier)."""
    root = make_ctx()
    a_scope = Scope("a")
    a = root.plugin("a", scope=a_scope)
    seen: list[str] = []
    a.on("ping", lambda: seen.append("a"))
    root.emit("ping")
    root.emit("ping", scope=a_scope)
    assert seen == ["a"]


async def test_listener_remover_and_owner_disposal_stop_delivery() -> None:
    """host-core §1: ctx.on returns a remover and the listener dies with its owner."""
    root = make_ctx()
    owner = root.plugin("owner")
    seen: list[str] = []
    remove = owner.on("x", lambda: seen.append("removed"))
    owner.on("x", lambda: seen.append("owned"))
    remove()
    root.emit("x")
    await owner.dispose()
    root.emit("x")
    assert seen == ["owned"]
    assert not root.has_listeners("x")


def test_prepend_puts_a_listener_first() -> None:
    """host-core §1: prepend=True runs the listener before earlier ones."""
    ctx = make_ctx()
    seen: list[str] = []
    ctx.on("x", lambda: seen.append("first"))
    ctx.on("x", lambda: seen.append("prepended"), prepend=True)
    ctx.emit("x")
    assert seen == ["prepended", "first"]


# -- events: dispatch modes -------------------------------------------------------------------


async def test_emit_contains_sync_and_async_listener_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """host-core §1: emit logs listener failures (sync or awaited) and reaches later listeners."""
    ctx = make_ctx()
    seen: list[str] = []
    done = asyncio.Event()

    def bad(_: str) -> None:
        raise RuntimeError("sync listener broke")

    async def bad_async(_: str) -> None:
        done.set()
        raise RuntimeError("async listener broke")

    ctx.on("x", bad)
    ctx.on("x", bad_async)
    ctx.on("x", seen.append)
    with caplog.at_level(logging.ERROR, logger="dsh"):
        ctx.emit("x", "payload")
        assert seen == ["payload"]
        await done.wait()
        await ctx.host.drain_tasks()
    assert "sync listener broke" in caplog.text
    assert "async listener broke" in caplog.text


def test_emit_veto_propagates_the_first_raise_and_stops() -> None:
    """host-core §1/§9: a creation veto listener's raise propagates; later listeners don't run."""
    ctx = make_ctx()
    seen: list[str] = []

    def veto(_: object) -> None:
        raise PermissionError("vetoed")

    ctx.on("made", seen.append)
    ctx.on("made", veto)
    ctx.on("made", lambda x: seen.append("late"))
    with pytest.raises(PermissionError, match="vetoed"):
        ctx.emit_veto("made", "it")
    assert seen == ["it"]


async def test_waterfall_chains_listeners_around_the_default() -> None:
    """host-core §1: each waterfall listener gets (*args, next) and delegates with next()."""
    ctx = make_ctx()
    trace: list[str] = []

    async def outer(x: int, next_: Callable[..., Awaitable[int]]) -> int:
        trace.append("outer-in")
        result = await next_()
        trace.append("outer-out")
        return result + 1

    def inner(x: int, next_: Callable[..., Awaitable[int]]) -> Awaitable[int]:
        trace.append("inner")
        return next_()

    async def default(x: int) -> int:
        trace.append(f"default({x})")
        return x * 10

    ctx.on("calc", outer)
    ctx.on("calc", inner)
    assert await ctx.waterfall("calc", 4, default=default) == 41
    assert trace == ["outer-in", "inner", "default(4)", "outer-out"]


async def test_waterfall_next_with_new_args_replaces_them_downstream() -> None:
    """host-core §1: next(*new_args) passes new arguments to the rest of the chain."""
    ctx = make_ctx()
    seen: list[int] = []

    async def double(x: int, next_: Callable[..., Awaitable[int]]) -> int:
        return await next_(x * 2)

    async def record(x: int, next_: Callable[..., Awaitable[int]]) -> int:
        seen.append(x)
        return await next_()

    async def default(x: int) -> int:
        return x + 1

    ctx.on("calc", double)
    ctx.on("calc", record)
    assert await ctx.waterfall("calc", 5, default=default) == 11
    assert seen == [10]


async def test_waterfall_short_circuits_when_a_listener_does_not_call_next() -> None:
    """host-core §1: returning without next() short-circuits later listeners and the default."""
    ctx = make_ctx()
    reached: list[str] = []

    async def stop(x: int, next_: Callable[..., Awaitable[int]]) -> int:
        return -1

    async def later(x: int, next_: Callable[..., Awaitable[int]]) -> int:
        reached.append("later")
        return await next_()

    async def default(x: int) -> int:
        reached.append("default")
        return x

    ctx.on("calc", stop)
    ctx.on("calc", later)
    assert await ctx.waterfall("calc", 3, default=default) == -1
    assert reached == []
    ctx2 = make_ctx()
    assert await ctx2.waterfall("calc", 3, default=default) == 3


async def test_a_finished_waterfall_leaves_no_reference_cycle() -> None:
    """host-core §1: a waterfall's links hold its chain and default only while it runs, so
    they are freed by reference counting, without the cyclic collector."""
    ctx = make_ctx()

    def passthrough(x: int, next_: Callable[..., Awaitable[int]]) -> Awaitable[int]:
        return next_()

    async def default(x: int) -> int:
        return x

    ctx.on("calc", passthrough)
    ctx.on("calc", passthrough)
    ref = weakref.ref(default)
    gc.disable()
    try:
        assert await ctx.waterfall("calc", 7, default=default) == 7
        del default
        assert ref() is None
    finally:
        gc.enable()


async def test_serial_awaits_listeners_in_order_and_stops_at_a_failure() -> None:
    """host-core §1: serial awaits each listener in turn; the first failure propagates."""
    ctx = make_ctx()
    order: list[str] = []
    gate, started = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        order.append("first-start")
        started.set()
        await gate.wait()
        order.append("first-end")

    def second() -> None:
        order.append("second")
        raise ValueError("second failed")

    ctx.on("go", first)
    ctx.on("go", second)
    ctx.on("go", lambda: order.append("third"))
    task = asyncio.ensure_future(ctx.serial("go"))
    await started.wait()
    assert order == ["first-start"]
    gate.set()
    with pytest.raises(ValueError, match="second failed"):
        await task
    assert order == ["first-start", "first-end", "second"]


async def test_parallel_runs_all_then_raises_the_first_failure() -> None:
    """host-core §1: parallel runs every listener; after all settle the first failure is raised."""
    ctx = make_ctx()
    settled: list[str] = []
    gate, started = asyncio.Event(), asyncio.Event()

    async def fails_first() -> None:
        raise KeyError("first failure")

    async def fails_later() -> None:
        await gate.wait()
        raise ValueError("second failure")

    async def slow_ok() -> None:
        started.set()
        await gate.wait()
        settled.append("slow")

    ctx.on("flush", fails_first)
    ctx.on("flush", fails_later)
    ctx.on("flush", slow_ok)
    task = asyncio.ensure_future(ctx.parallel("flush"))
    await started.wait()
    assert not task.done()
    gate.set()
    with pytest.raises(KeyError, match="first failure"):
        await task
    assert settled == ["slow"]


async def test_parallel_returns_how_many_listeners_took_part() -> None:
    """host-core §3: parallel reports participation (session flush uses it)."""
    ctx = make_ctx()
    assert await ctx.parallel("flush") == 0
    ctx.on("flush", lambda: None)
    a = scoped(ctx, "a")
    a.on("flush", lambda: None)
    assert await ctx.parallel("flush") == 1
    assert await a.parallel("flush") == 2


@given(st.lists(st.tuples(st.sampled_from(["add", "forget", "early"]), st.integers(0, 50))))
async def test_dispose_runs_what_is_still_registered_newest_first_once(
    ops: list[tuple[str, int]],
) -> None:
    """host-core §1: after any mix of registrations, early undos and forgets, disposal runs
    exactly the effects still registered, each once, newest first (early undos ran once)."""
    fiber = Fiber("f")
    ran: list[int] = []
    registrations = []
    registered: list[int] = []  # the model: numbers still registered, oldest first
    early: list[int] = []
    for op, n in ops:
        if op == "add" or not registrations:
            number = len(registrations)
            registrations.append(fiber.add(lambda number=number: ran.append(number)))
            registered.append(number)
            continue
        number = n % len(registrations)
        if op == "forget":
            registrations[number].forget()
        else:
            registrations[number]()
            if number in registered:
                early.append(number)
        if number in registered:
            registered.remove(number)
        assert not registrations[number].active
    assert ran == early
    await fiber.dispose()
    assert ran == early + registered[::-1]


@given(
    st.lists(st.integers(-1, 6), min_size=1, max_size=8),
    st.lists(st.tuples(st.booleans(), st.integers(-1, 7)), max_size=40),
)
def test_scoped_cache_drops_exactly_the_scope_and_what_lies_below(
    parents: list[int], ops: list[tuple[bool, int]]
) -> None:
    """host-core §1: dropping a scope from a scoped cache forgets its entry and the entries
    of every scope below it, nothing else; dropping ``None`` forgets everything."""
    scopes: list[Scope] = []
    for i, p in enumerate(parents):
        parent = scopes[p] if 0 <= p < i else None
        scopes.append(Scope(f"s{i}", parent))

    def pick(n: int) -> Scope | None:
        return None if n < 0 else scopes[n % len(scopes)]

    cache: ScopedCache[int] = ScopedCache()
    model: dict[Scope | None, int] = {}
    for step, (store, n) in enumerate(ops):
        key = pick(n)
        if store:
            cache[key] = step
            model[key] = step
        elif key is None:
            cache.drop(None)
            model.clear()
        else:
            cache.drop(key)
            model = {k: v for k, v in model.items() if k is None or key not in k.chain()}
        assert len(cache) == len(model)
        assert all(cache.get(k) == v for k, v in model.items())


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["on", "remove", "emit"]),
            st.integers(-1, 3),  # a scope (-1: global / a global dispatch)
            st.booleans(),  # prepend
            st.integers(0, 30),
        ),
        max_size=40,
    )
)
def test_dispatch_reaches_the_admitted_listeners_in_registration_order(
    ops: list[tuple[str, int, bool, int]],
) -> None:
    """host-core §1: whatever was added (at the front or the end, globally or per scope) and
    removed, a dispatch on a scope calls the global listeners and those of the scope and its
    ancestors, each once, in the one order of all the registrations."""
    host = Host()
    parent = Scope("parent")
    child = Scope("child", parent)
    scopes = [parent, child, Scope("other"), Scope("grandchild", child)]
    root = Context(host, host.root)
    contexts = [root.extend(scope=s) for s in scopes]
    called: list[int] = []
    model: list[tuple[int, Scope | None]] = []  # the single ordered list the bus stands for
    removers: list[Callable[[], object]] = []
    for op, which, prepend, n in ops:
        if op == "on":
            number = len(removers)
            ctx = root if which < 0 else contexts[which]
            tag = None if which < 0 else scopes[which]
            removers.append(
                ctx.on("e", lambda number=number: called.append(number), prepend=prepend)
            )
            entry = (number, tag)
            model = [entry, *model] if prepend else [*model, entry]
        elif op == "remove" and removers:
            number = n % len(removers)
            removers[number]()
            model = [(k, t) for k, t in model if k != number]
        else:
            key = None if which < 0 else scopes[which]
            chain = list(key.chain()) if key is not None else []
            called.clear()
            (root if key is None else contexts[which]).emit("e")
            assert called == [k for k, t in model if t is None or t in chain]
    assert ("e" in host.listeners) == bool(model)
