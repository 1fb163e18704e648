"""``scripted_host``: boot a real host for a test in one call (plugins + config + store).

Every host it builds mounts the invariant companions, and leaving the block raises if any
invariant was broken, so a violation fails the test even when the runtime contained it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Literal

from .. import plugin as core_plugin
from .._agent import Agent, AgentHandle, AgentOptions, CreateAgentOptions, ResumeAgentOptions
from .._content import Message, blocks_text, user_message
from .._context import Context
from .._events import SessionEvent, SessionMeta
from .._host import HostRuntime, PluginRow, boot_host
from .._invariants import InvariantRegistry
from .._plugins import PluginError, PluginSpec, make_plugin_manager
from .._scripted import ReplyLike, ScriptedAdapter, ScriptedReply, ScriptedRequest

__all__ = ["SCRIPTED", "TestHost", "default_options", "scripted_host"]

#: The agent options every test agent uses unless told otherwise: the scripted model.
SCRIPTED = AgentOptions(provider="scripted", model="scripted-1")

Store = Literal["memory", "jsonl"] | None


def default_options(**changes: Any) -> AgentOptions:
    """:data:`SCRIPTED` with some fields changed."""
    import attrs

    return attrs.evolve(SCRIPTED, **changes)


class TestHost:
    """A booted host plus conveniences for tests (see ``docs/testing.md``).

    Make one with ``await TestHost.start(...)`` (same arguments as :func:`scripted_host`) and
    close it with ``await host.aclose()``, e.g. in a fixture; or use it as an async context
    manager. Closing raises ``AssertionError`` if any invariant was broken meanwhile.
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self, runtime: HostRuntime, model: ScriptedAdapter, *, check_invariants: bool = True
    ) -> None:
        self.runtime = runtime
        self.ctx: Context = runtime.ctx
        self.model = model
        self._registry: InvariantRegistry | None = self.ctx.invariants if check_invariants else None
        self._closed = False

    @classmethod
    async def start(
        cls,
        *plugins: str | PluginRow,
        model: ScriptedAdapter
        | Callable[[ScriptedRequest], Any]
        | Sequence[ReplyLike | ScriptedReply]
        | None = None,
        store: Store = "memory",
        store_root: Path | None = None,
        config: Mapping[str, Mapping[str, Any]] | None = None,
        load: Iterable[str] = (),
        modules: Mapping[str, ModuleType | object] | None = None,
        extra: Iterable[PluginSpec] = (),
        invariants: bool = True,
        query: bool = True,
    ) -> TestHost:
        """Boot a test host (see :func:`scripted_host` for the arguments)."""
        pm = make_plugin_manager(autoload=False, plugins={"core": core_plugin, **(modules or {})})
        names = list(load)
        if names:
            pm.load_entry_points(only=names)
            if pm.failures:
                raise PluginError(
                    "cannot load the plugins a test named: "
                    + "; ".join(f.describe() for f in pm.failures),
                    code="PLUGIN_UNKNOWN",
                )
        rows = _test_rows(plugins, config, store, store_root, invariants=invariants, query=query)
        runtime = await boot_host(rows, pm=pm, extra=extra)
        adapter = _adapter(model)
        runtime.ctx.llm.register_adapter("scripted", adapter)
        return cls(runtime, adapter, check_invariants=invariants)

    async def aclose(self) -> None:
        """Dispose the host; then raise ``AssertionError`` listing any invariant broken while
        it ran. Idempotent: a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        await self.runtime.dispose()
        violations = list(self._registry.violations) if self._registry is not None else []
        if violations:
            raise AssertionError(
                "invariants broken during the test:\n" + "\n".join(f"  {v}" for v in violations)
            )

    async def __aenter__(self) -> TestHost:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def invariants(self) -> InvariantRegistry:
        """The invariant registry (``violations`` lists what broke)."""
        registry: InvariantRegistry = self.ctx.invariants
        return registry

    async def create_agent(
        self,
        *,
        options: AgentOptions = SCRIPTED,
        owner: Context | None = None,
        session_id: str | None = None,
        meta: SessionMeta | None = None,
        seed: Sequence[SessionEvent] | None = None,
        setup: Callable[[Context], Any] | None = None,
    ) -> AgentHandle:
        """Create an agent owned by ``owner`` (default: the host root)."""
        ctx = owner or self.ctx
        return await ctx.agents.create(
            CreateAgentOptions(
                session_id=session_id,
                meta=meta or SessionMeta(cwd=os.getcwd()),
                seed=seed,
                agent_options=options,
                setup=setup,
            )
        )

    async def resume_agent(
        self, session_id: str, *, options: AgentOptions = SCRIPTED
    ) -> AgentHandle:
        """Resume a persisted session as a live agent owned by the host root."""
        return await self.ctx.agents.resume(
            ResumeAgentOptions(resume_session_id=session_id, agent_options=options)
        )

    async def run(self, agent: Agent, text: str | Message) -> str:
        """``followup`` one message, wait until idle, return the last assistant text."""
        agent.followup(user_message(text) if isinstance(text, str) else text)
        await agent.when_idle()
        return last_answer(agent)


def last_answer(agent: Agent) -> str:
    """The text of the latest non-empty assistant message of ``agent``."""
    for m in reversed(agent.session.derive_messages()):
        if m.role == "assistant":
            return blocks_text(m.content)
    return ""


def _adapter(
    model: ScriptedAdapter | Callable[[ScriptedRequest], Any] | Sequence[ReplyLike] | None,
) -> ScriptedAdapter:
    if model is None:
        return ScriptedAdapter.echo()
    if isinstance(model, ScriptedAdapter):
        return model
    if callable(model):
        return ScriptedAdapter(model)
    return ScriptedAdapter.replies(*model)


def _test_rows(
    plugins: Iterable[str | PluginRow],
    config: Mapping[str, Mapping[str, Any]] | None,
    store: Store,
    store_root: Path | None,
    *,
    invariants: bool,
    query: bool,
) -> list[PluginRow]:
    cfg = dict(config or {})
    rows: list[PluginRow] = []

    def add(name: str) -> None:
        rows.append(PluginRow(plugin=name, config=cfg.pop(name, {})))

    for name in ("sessions", "llm", "tools", "system-prompt"):
        add(name)
    if store == "memory":
        add("session-persistence-memory")
    elif store == "jsonl":
        cfg.setdefault("session-persistence-jsonl", {"root": str(store_root)} if store_root else {})
        add("session-persistence-jsonl")
    if invariants:
        add("invariants")
    if query:
        add("session-query")
    for name in ("agents", "jobs"):
        add(name)
    for p in plugins:
        if isinstance(p, PluginRow):
            rows.append(p)
        else:
            add(p)
    if cfg:
        raise ValueError(f"config given for plugins not in the host: {sorted(cfg)}")
    return rows


@contextlib.asynccontextmanager
async def scripted_host(
    *plugins: str | PluginRow,
    model: ScriptedAdapter
    | Callable[[ScriptedRequest], Any]
    | Sequence[ReplyLike | ScriptedReply]
    | None = None,
    store: Store = "memory",
    store_root: Path | None = None,
    config: Mapping[str, Mapping[str, Any]] | None = None,
    load: Iterable[str] = (),
    modules: Mapping[str, ModuleType | object] | None = None,
    extra: Iterable[PluginSpec] = (),
    invariants: bool = True,
    query: bool = True,
) -> AsyncIterator[TestHost]:
    """Boot a host with the core plugins, ``store`` persistence, the invariants, a scripted
    model on provider ``scripted``, and then ``plugins`` (names of rows to add after the core).

    :param load: installed entry-point or distribution names to load (e.g.
        ``("dsh-subagent", "dsh-subagent-spawn")``), by the rules of discovery: a name that
        matches nothing, or a plugin that fails to load, fails the start (``PLUGIN_UNKNOWN``).
        Entry points are otherwise never autoloaded, whatever the environment says.
    :param modules: extra plugin modules (or objects) to register by name, e.g. a module of
        the test suite that is not installed.
    :param config: per-plugin config, by plugin name.
    """
    host = await TestHost.start(
        *plugins,
        model=model,
        store=store,
        store_root=store_root,
        config=config,
        load=load,
        modules=modules,
        extra=extra,
        invariants=invariants,
        query=query,
    )
    try:
        yield host
    finally:
        await host.aclose()
