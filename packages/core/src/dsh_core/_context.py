"""The runtime context: owners (fibers) with effect stacks, services, and scoped events.

Everything a plugin or an agent registers goes through a :class:`Context` and becomes an
*effect* of that context's :class:`Fiber`: disposing the fiber (plugin unload, agent disposal)
undoes the registrations in reverse order. Events are routed by :class:`Scope`: a listener
registered from an agent's context sees only dispatches made on that agent's scope (or a scope
below it); a listener registered from an unscoped context sees everything (host-core §1).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable, Container, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast, overload

from ._disposal import SharedDisposal
from ._errors import DshError
from ._events import EventTypeRegistry

if TYPE_CHECKING:
    from ._agent import Agent, AgentRegistry
    from ._invariants import InvariantRegistry
    from ._jobs import JobService
    from ._llm import LlmRuntime
    from ._persistence import SessionPersistence
    from ._prompt import SystemPromptRegistry
    from ._query import SessionQuery
    from ._sessions import SessionStore
    from ._tools import ToolRegistry

__all__ = [
    "Context",
    "ContextError",
    "Disposer",
    "Fiber",
    "Host",
    "Registration",
    "Scope",
    "ServiceKey",
]

T = TypeVar("T")
S = TypeVar("S")
Disposer = Callable[[], "Awaitable[None] | None"]
_UNSET: Any = object()
_log = logging.getLogger("dsh")


class ContextError(DshError):
    """Misuse of a context: a missing service, a disposed owner, a duplicate provider."""

    code = "CONTEXT_ERROR"


class ServiceKey(Generic[S]):
    """A typed service name: ``ctx[SUBAGENTS]`` is typed where ``ctx.subagents`` is ``Any``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"ServiceKey({self.name!r})"


class Scope:
    """A routing key for events and scoped registrations (an agent, or a private owner).

    ``parent`` links a scope to the one it sits under; agent scopes have none, so a child agent
    sees global registrations but never its parent's scoped ones.
    """

    __slots__ = ("key", "parent")

    def __init__(self, key: str, parent: Scope | None = None) -> None:
        self.key = key
        self.parent = parent

    def chain(self) -> Generator[Scope, None, None]:
        """This scope, then its ancestors, nearest first."""
        s: Scope | None = self
        while s is not None:
            yield s
            s = s.parent

    def __repr__(self) -> str:
        return f"Scope({self.key!r})"


def nearest_scope(scope: Scope | None, *layers: Container[Scope | None]) -> Scope | None:
    """The nearest scope in ``scope``'s chain present in any of ``layers`` (``None`` when only
    global entries apply). Registries key their caches by it, so a scope with no entries of
    its own shares the global cache entry and leaves nothing behind."""
    s = scope
    while s is not None:
        for layer in layers:
            if s in layer:
                return s
        s = s.parent
    return None


class ScopedCache(Generic[T]):
    """Values cached per scope (``None`` for the global entry). Dropping a scope forgets its
    entry and those of the scopes below it, in time proportional to what it forgets: a host
    with thousands of live agents, each with scoped sections or tools, pays nothing per
    change for the agents a change cannot affect."""

    __slots__ = ("_below", "_values")

    def __init__(self) -> None:
        self._values: dict[Scope | None, T] = {}
        self._below: dict[Scope, set[Scope]] = {}  # scope -> cached keys strictly below it

    def get(self, key: Scope | None) -> T | None:
        return self._values.get(key)

    def __setitem__(self, key: Scope | None, value: T) -> None:
        if key is not None and key not in self._values:
            parent = key.parent
            while parent is not None:
                self._below.setdefault(parent, set()).add(key)
                parent = parent.parent
        self._values[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)

    def drop(self, scope: Scope | None) -> None:
        """Forget what a change in ``scope`` can affect: everything for a global change, else
        the entries of ``scope`` and of the scopes below it."""
        if scope is None:
            self._values.clear()
            self._below.clear()
            return
        self._forget(scope)
        for key in self._below.pop(scope, ()):
            self._forget(key)

    def _forget(self, key: Scope) -> None:
        if key not in self._values:
            return
        del self._values[key]
        parent = key.parent
        while parent is not None:
            below = self._below.get(parent)
            if below is not None:
                below.discard(key)
                if not below:
                    del self._below[parent]
            parent = parent.parent


class _Effect:
    __slots__ = ("disposer", "done")

    def __init__(self, disposer: Disposer) -> None:
        self.disposer = disposer
        self.done = False


class Registration:
    """One effect on a fiber: call it to undo the effect early (once); ``forget()`` drops it
    without running it (ownership moved elsewhere)."""

    __slots__ = ("_effect", "_fiber")

    def __init__(self, fiber: Fiber, effect: _Effect) -> None:
        self._fiber = fiber
        self._effect = effect

    def __call__(self) -> Awaitable[None] | None:
        effect = self._effect
        if effect.done:
            return None
        self.forget()
        return effect.disposer()

    def forget(self) -> None:
        """Remove the effect from its fiber without running it."""
        effect = self._effect
        if effect.done:
            return
        effect.done = True
        self._fiber._effects.pop(effect, None)

    @property
    def active(self) -> bool:
        """Whether the effect is still registered."""
        return not self._effect.done


FiberState = Literal["active", "disposing", "disposed"]


class Fiber:
    """One owner's lifetime: an effect stack unwound in reverse when it is disposed.

    ``dispose()`` is idempotent and shared: concurrent callers await the same completion.
    Registering on a fiber that is no longer active raises ``INACTIVE_EFFECT``.
    """

    __slots__ = ("_disposal", "_effects", "name", "parent", "state")

    def __init__(self, name: str, parent: Fiber | None = None) -> None:
        self.name = name
        self.parent = parent
        self.state: FiberState = "active"
        # Insertion-ordered: disposal pops the newest first, and an owner of many short-lived
        # children (each one an effect until it goes) forgets any of them in constant time.
        self._effects: dict[_Effect, None] = {}
        self._disposal = SharedDisposal()

    def add(self, disposer: Disposer) -> Registration:
        """Push ``disposer``; the returned :class:`Registration` runs it early (once) when
        called, or drops it unrun with ``forget()``."""
        if self.state != "active":
            raise ContextError(
                f"cannot register on {self.name!r}: it is {self.state}", code="INACTIVE_EFFECT"
            )
        effect = _Effect(disposer)
        self._effects[effect] = None
        return Registration(self, effect)

    def dispose(self) -> Coroutine[Any, Any, None]:
        """Unwind every effect in reverse order; log failures and go on; idempotent. A caller
        that stops waiting never stops the unwinding (hardening 11.8). Returns the shared
        disposal's coroutine itself (``await fiber.dispose()``): one coroutine less."""
        return self._disposal.run(self._unwind)

    async def _unwind(self) -> None:
        self.state = "disposing"
        while self._effects:
            effect, _ = self._effects.popitem()
            if effect.done:
                continue
            effect.done = True
            try:
                result = effect.disposer()
                if result is not None and inspect.isawaitable(result):
                    await result
            except Exception:  # an owner's teardown must reach every effect
                _log.exception("disposer of %r failed", self.name)
        self.state = "disposed"


class _Listener:
    __slots__ = ("fn", "order", "tag")

    def __init__(self, fn: Callable[..., Any], tag: Scope | None, order: int) -> None:
        self.fn = fn
        self.tag = tag
        self.order = order  # the dispatch order among every listener of the name


class _Unlisten:
    """The remover :meth:`Context.on` returns: one slotted object rather than a closure (a
    function, its cell tuple and four cells), each an object the cyclic collector walks
    while the listening context lives (PERF-6)."""

    __slots__ = ("_bus", "_entry", "_name", "_tag")

    def __init__(
        self, bus: dict[str, _Channel], name: str, tag: Scope | None, entry: _Listener
    ) -> None:
        self._bus = bus
        self._name = name
        self._tag = tag
        self._entry = entry

    def __call__(self) -> None:
        bus = self._bus
        channel = bus.get(self._name)
        entries = channel.by_tag.get(self._tag) if channel is not None else None
        if channel is None or not entries or self._entry not in entries:
            return
        entry = self._entry
        channel.put(self._tag, [e for e in entries if e is not entry])
        if not channel.by_tag:
            del bus[self._name]


def _order_of(entry: _Listener) -> int:
    return entry.order


class _Channel:
    """The listeners of one event name, by scope tag (``None``: global).

    A dispatch on a key reaches the global listeners and those of the key's scope chain, so it
    looks at a handful of lists however many agents listen elsewhere. Each list is replaced,
    never changed in place: a dispatch under way keeps the list it started with.
    """

    __slots__ = ("by_tag", "everywhere")

    def __init__(self) -> None:
        self.by_tag: dict[Scope | None, list[_Listener]] = {}
        # The global listeners while no scoped one exists: then every dispatch, on any key,
        # reaches exactly these, and needs no walk of its key's scope chain (``None`` else).
        self.everywhere: list[_Listener] | None = None

    def put(self, tag: Scope | None, entries: list[_Listener]) -> None:
        """Set (or, with no ``entries``, drop) the listeners of ``tag``."""
        by_tag = self.by_tag
        if entries:
            by_tag[tag] = entries
        else:
            del by_tag[tag]
        self.everywhere = by_tag.get(None) if len(by_tag) == 1 else None

    def admitted(self, key: Scope | None) -> list[_Listener]:
        """The listeners a dispatch on ``key`` reaches, in registration order (read only)."""
        by_tag = self.by_tag
        found = by_tag.get(None)
        merged: list[_Listener] | None = None
        s = key
        while s is not None:
            entries = by_tag.get(s)
            if entries:
                if not found:
                    found = entries
                else:
                    merged = [*(merged or found), *entries]
            s = s.parent
        if merged is not None:
            merged.sort(key=_order_of)
            return merged
        return found or []


class Host:
    """What every context of one host shares: services, the event bus, background tasks."""

    def __init__(self, name: str = "host", event_types: EventTypeRegistry | None = None) -> None:
        self.root = Fiber(name)
        self.event_types = event_types or EventTypeRegistry()
        self.services: dict[str, object] = {}
        self.listeners: dict[str, _Channel] = {}
        self._appended = 0  # the order of the latest listener added at the end
        self._prepended = 0  # the order of the latest listener added at the front
        self.tasks: set[asyncio.Task[Any]] = set()
        self.logger = _log

    def spawn(self, aw: Awaitable[Any], *, name: str | None = None) -> asyncio.Task[Any]:
        """Run ``aw`` as a host-owned task: failures are logged, disposal awaits it."""
        task = asyncio.ensure_future(aw)
        if name:
            task.set_name(name)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.logger.error("background task failed", exc_info=task.exception())

    async def drain_tasks(self) -> None:
        """Await every host-owned task (tasks spawned meanwhile included).

        Finished tasks are dropped here rather than left to their done-callbacks: awaiting
        tasks that are already done need not yield to the loop, so the callbacks might never
        get the chance to run while this loop spins.
        """
        while True:
            pending = [t for t in self.tasks if not t.done()]
            self.tasks.difference_update([t for t in self.tasks if t.done()])
            if not pending:
                return
            await asyncio.gather(*pending, return_exceptions=True)


def _service_property(name: str) -> Any:
    """A read-only attribute for the host service ``name``: the context's bound view, exactly
    as ``__getattr__`` gives it (``MISSING_SERVICE`` when nobody provides it)."""

    def get(self: Context) -> Any:
        service = self.host.services.get(name)
        if service is not None and self._bound_to.get(name) is service:
            return self._bound[name]
        return self._required(name)

    get.__name__ = name
    return property(get, doc=f"The ``{name}`` service, bound to this context.")


def _link(agent: Agent) -> Callable[[], Agent | None]:
    """A weak link to ``agent``; a strong one for a stand-in that cannot be weakly referenced
    (a test double), which forms no cycle worth breaking."""
    try:
        return weakref.ref(agent)
    except TypeError:
        return lambda: agent


class Context:
    """A view of a :class:`Host` from one owner: its fiber, its routing scope, its agent.

    Services are attributes (``ctx.sessions``); a service with ``__dsh_bind__(ctx)`` returns a
    view bound to the calling context, so ``agent.ctx.tools.register(...)`` is scoped to that
    agent and owned by its fiber.
    """

    __slots__ = ("_agent", "_bound", "_bound_to", "_detach", "fiber", "host", "scope")

    def __init__(
        self, host: Host, fiber: Fiber, scope: Scope | None = None, agent: Agent | None = None
    ) -> None:
        self.host = host
        self.fiber = fiber
        self.scope = scope
        self._agent = _link(agent) if agent is not None else None
        # The views bound here, by service name, and the service each was bound from: two
        # dicts rather than one of (service, view) pairs, which made a tuple per bound service
        # for the cyclic collector to walk while the context lives (PERF-5).
        self._bound: dict[str, object] = {}
        self._bound_to: dict[str, object] = {}
        self._detach: Callable[[], Awaitable[None]] | None = None

    @property
    def agent(self) -> Agent | None:
        """The agent this context belongs to, while that agent exists.

        The link is weak: an agent refers to its context, and a strong link back would make
        every agent a reference cycle that only the cyclic collector frees, together with its
        whole live log, long after its disposal.
        """
        ref = self._agent
        return ref() if ref is not None else None

    # -- ownership -----------------------------------------------------------------------------

    @property
    def logger(self) -> logging.Logger:
        """The host's logger."""
        return self.host.logger

    @property
    def active(self) -> bool:
        """Whether this context's fiber still accepts registrations."""
        return self.fiber.state == "active"

    def effect(
        self, body: Callable[[], Disposer | Generator[Disposer, None, None]]
    ) -> Callable[[], Awaitable[None] | None]:
        """Run ``body`` and own what it returns: a disposer, or a generator of disposers.

        A generator's disposers unwind in reverse order (that is how ordered teardown chains
        are written). Returns the function that disposes the effect early.
        """
        self._require_active()
        produced = body()
        if inspect.isgenerator(produced):
            disposers: list[Disposer] = []
            try:
                for d in cast("Generator[Disposer, None, None]", produced):
                    disposers.append(d)  # noqa: PERF402 - what was yielded before a raise unwinds
            except BaseException:
                for d in reversed(disposers):
                    _run_sync(d)
                raise

            async def unwind() -> None:
                for d in reversed(disposers):
                    r = d()
                    if r is not None and inspect.isawaitable(r):
                        await r

            return self.fiber.add(unwind)
        return self.fiber.add(cast("Disposer", produced))

    def plugin(self, name: str, *, scope: Scope | object | None = _UNSET) -> Context:
        """A child owner: a new fiber disposed with this one (or earlier, by itself)."""
        self._require_active()
        fiber = Fiber(name, self.fiber)
        remove = self.fiber.add(fiber.dispose)

        async def detach() -> None:
            await fiber.dispose()
            remove.forget()

        fiber_ctx = Context(
            self.host,
            fiber,
            self.scope if scope is _UNSET else cast("Scope | None", scope),
            self.agent,
        )
        fiber_ctx._detach = detach
        return fiber_ctx

    async def dispose(self) -> None:
        """Dispose this context's fiber (every registration it owns, in reverse)."""
        if self._detach is not None:
            await self._detach()
        else:
            await self.fiber.dispose()

    def extend(
        self, *, agent: Agent | None = None, scope: Scope | object | None = _UNSET
    ) -> Context:
        """The same owner seen with another agent attribute or routing scope."""
        return Context(
            self.host,
            self.fiber,
            self.scope if scope is _UNSET else cast("Scope | None", scope),
            agent if agent is not None else self.agent,
        )

    def _require_active(self) -> None:
        if self.fiber.state != "active":
            raise ContextError(
                f"inactive context: {self.fiber.name!r} is {self.fiber.state}",
                code="INACTIVE_EFFECT",
            )

    # -- services ------------------------------------------------------------------------------

    def provide(self, name: str | ServiceKey[Any], service: object) -> Callable[[], object]:
        """Provide a service for as long as this context lives; a second provider fails loud."""
        key = name.name if isinstance(name, ServiceKey) else name
        services = self.host.services
        if key in services:
            raise ContextError(f"service {key!r} is already provided", code="DUPLICATE_SERVICE")
        self._require_active()
        services[key] = service

        def withdraw() -> None:
            if services.get(key) is service:
                del services[key]

        return self.fiber.add(withdraw)

    @overload
    def get(self, name: ServiceKey[S]) -> S | None: ...
    @overload
    def get(self, name: str) -> Any: ...
    def get(self, name: str | ServiceKey[Any]) -> Any:
        """The service, bound to this context, or ``None`` when nobody provides it."""
        return self._service(name.name if isinstance(name, ServiceKey) else name)

    @overload
    def __getitem__(self, name: ServiceKey[S]) -> S: ...
    @overload
    def __getitem__(self, name: str) -> Any: ...
    def __getitem__(self, name: str | ServiceKey[Any]) -> Any:
        return self._required(name.name if isinstance(name, ServiceKey) else name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._required(name)

    def _service(self, key: str) -> Any:
        """The one service lookup: the view bound to this context (made once per provider),
        the service itself when it binds nothing, ``None`` when nobody provides it."""
        service = self.host.services.get(key)
        if service is None:
            return None
        if self._bound_to.get(key) is service:
            return self._bound[key]
        bind = getattr(service, "__dsh_bind__", None)
        if bind is None:
            return service
        view = bind(self)
        self._bound[key] = view
        self._bound_to[key] = service
        return view

    def _unbind(self) -> None:
        """Forget the views bound here (each refers back to this context)."""
        self._bound_to.clear()
        self._bound.clear()

    def _required(self, key: str) -> Any:
        found = self._service(key)
        if found is None:
            raise ContextError(f"no service {key!r} is provided", code="MISSING_SERVICE")
        return found

    # The host's own services are typed properties: they skip the failed normal lookup that
    # precedes ``__getattr__`` (the agent loop reads them every step). Same result and errors
    # as ``ctx[name]``; other services (``ctx.subagents``) go through ``__getattr__``.
    if TYPE_CHECKING:

        @property
        def sessions(self) -> SessionStore: ...
        @property
        def session_persistence(self) -> SessionPersistence: ...
        @property
        def session_query(self) -> SessionQuery: ...
        @property
        def agents(self) -> AgentRegistry: ...
        @property
        def tools(self) -> ToolRegistry: ...
        @property
        def llm(self) -> LlmRuntime: ...
        @property
        def system_prompt(self) -> SystemPromptRegistry: ...
        @property
        def jobs(self) -> JobService: ...
        @property
        def invariants(self) -> InvariantRegistry: ...
    else:
        sessions = _service_property("sessions")
        session_persistence = _service_property("session_persistence")
        session_query = _service_property("session_query")
        agents = _service_property("agents")
        tools = _service_property("tools")
        llm = _service_property("llm")
        system_prompt = _service_property("system_prompt")
        jobs = _service_property("jobs")
        invariants = _service_property("invariants")

    # -- events --------------------------------------------------------------------------------

    def on(
        self,
        name: str,
        listener: Callable[..., Any],
        *,
        prepend: bool = False,
        global_: bool = False,
    ) -> Callable[[], Awaitable[None] | None]:
        """Listen to ``name`` for as long as this context lives; returns the remover.

        From a scoped context the listener sees only dispatches on that scope (or below it);
        ``global_=True`` lifts the filter.
        """
        self._require_active()
        host = self.host
        tag = None if global_ else self.scope
        if prepend:
            host._prepended -= 1
            entry = _Listener(listener, tag, host._prepended)
        else:
            host._appended += 1
            entry = _Listener(listener, tag, host._appended)
        bus = host.listeners
        channel = bus.get(name)
        if channel is None:
            channel = bus[name] = _Channel()
        current = channel.by_tag.get(tag, ())
        channel.put(tag, [entry, *current] if prepend else [*current, entry])

        return self.fiber.add(_Unlisten(bus, name, tag, entry))

    def has_listeners(self, name: str) -> bool:
        """Whether anything listens to ``name`` (cheap; lets hot paths skip building payloads)."""
        return name in self.host.listeners

    def _key(self, scope: Scope | object | None) -> Scope | None:
        """The routing key of a dispatch: this context's scope unless one is given."""
        return self.scope if scope is _UNSET else cast("Scope | None", scope)

    def _admitted(self, name: str, key: Scope | None) -> list[_Listener]:
        channel = self.host.listeners.get(name)
        return channel.admitted(key) if channel is not None else []

    def emit(self, name: str, *args: Any, scope: Scope | object | None = _UNSET) -> None:
        """Call the listeners of ``name`` synchronously; failures are logged and contained.

        A listener that returns an awaitable has it run as a host-owned task.
        """
        channel = self.host.listeners.get(name)
        if channel is None:
            return
        entries = channel.everywhere  # the usual case, without a call to find them
        if entries is None:
            entries = channel.admitted(self.scope if scope is _UNSET else scope)  # type: ignore[arg-type]
        for e in entries:
            try:
                result = e.fn(*args)
            except Exception:
                self.host.logger.exception("listener of %r failed", name)
                continue
            if result is not None and inspect.isawaitable(result):
                self.host.spawn(_contained(result, name, self.host.logger))

    def emit_veto(self, name: str, *args: Any, scope: Scope | object | None = _UNSET) -> None:
        """Like :meth:`emit`, but the first listener that raises vetoes: its error propagates."""
        key = self._key(scope)
        for e in self._admitted(name, key):
            result = e.fn(*args)
            if result is not None and inspect.isawaitable(result):
                self.host.spawn(_contained(result, name, self.host.logger))

    async def waterfall(
        self,
        name: str,
        *args: Any,
        default: Callable[..., Awaitable[T]],
        scope: Scope | object | None = _UNSET,
    ) -> T:
        """Around-middleware: each listener gets ``(*args, next)`` and decides.

        ``await next()`` delegates with the same arguments, ``await next(*new)`` with others;
        returning without calling it short-circuits. ``default(*args)`` ends the chain.
        """
        key = self._key(scope)
        chain = self._admitted(name, key)
        if not chain:
            return await default(*args)
        return await _Next(chain, 0, args, default)()

    async def serial(self, name: str, *args: Any, scope: Scope | object | None = _UNSET) -> None:
        """Await the listeners one after another; the first failure propagates."""
        key = self._key(scope)
        for e in self._admitted(name, key):
            result = e.fn(*args)
            if result is not None and inspect.isawaitable(result):
                await result

    async def parallel(self, name: str, *args: Any, scope: Scope | object | None = _UNSET) -> int:
        """Run the listeners concurrently; after all settle, raise the first failure.

        Returns how many listeners took part.
        """
        key = self._key(scope)
        entries = self._admitted(name, key)
        pending: list[Awaitable[Any]] = []
        first: BaseException | None = None
        for e in entries:
            try:
                result = e.fn(*args)
            except Exception as exc:
                first = first or exc
                continue
            if result is not None and inspect.isawaitable(result):
                pending.append(result)
        if len(pending) == 1 and first is None:
            # The common case (one storage backend flushing): await it directly, which saves
            # the loop iterations gather's bookkeeping costs.
            await pending[0]
        elif pending:
            for outcome in await asyncio.gather(*pending, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    if not isinstance(outcome, Exception):
                        raise outcome
                    first = first or outcome
        if first is not None:
            raise first
        return len(entries)

    def __repr__(self) -> str:
        return f"Context(fiber={self.fiber.name!r}, scope={self.scope!r})"


class _Next(Generic[T]):
    """The ``next`` a waterfall listener receives: link ``i`` of ``chain`` with the arguments
    it was given. An object rather than a closure per link, so a chain leaves no reference
    cycle behind for the cyclic collector."""

    __slots__ = ("args", "chain", "default", "i")

    def __init__(
        self,
        chain: list[_Listener],
        i: int,
        args: tuple[Any, ...],
        default: Callable[..., Awaitable[T]],
    ) -> None:
        self.chain = chain
        self.i = i
        self.args = args
        self.default = default

    async def __call__(self, *replacement: Any) -> T:
        use = replacement if replacement else self.args
        i = self.i
        chain = self.chain
        if i == len(chain):
            return await self.default(*use)
        result = chain[i].fn(*use, _Next(chain, i + 1, use, self.default))
        if inspect.isawaitable(result):
            return cast("T", await result)
        return cast("T", result)


async def _contained(aw: Awaitable[Any], name: str, logger: logging.Logger) -> None:
    try:
        await aw
    except Exception:
        logger.exception("async listener of %r failed", name)


def _run_sync(d: Disposer) -> None:
    try:
        r = d()
        if r is not None and inspect.iscoroutine(r):
            r.close()
    except Exception:
        _log.exception("rollback disposer failed")
