"""``scripted_host``: boot a real host for a test in one call (plugins + config + store).

Every host it builds mounts the invariant companions, and leaving the block raises if any
invariant was broken, so a violation fails the test even when the runtime contained it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from .. import plugin as core_plugin
from .._agent import Agent, AgentHandle, AgentOptions, CreateAgentOptions, ResumeAgentOptions
from .._content import Message, blocks_text, user_message
from .._context import Context
from .._events import SessionEvent, SessionMeta
from .._host import HostRuntime, PluginRow, boot_host
from .._invariants import InvariantRegistry
from .._plugins import PluginSpec, make_plugin_manager
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
    """A booted host plus conveniences for tests (see ``docs/testing.md``)."""

    __test__ = False  # not a pytest test class

    def __init__(self, runtime: HostRuntime, model: ScriptedAdapter) -> None:
        self.runtime = runtime
        self.ctx: Context = runtime.ctx
        self.model = model

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
    modules: Mapping[str, ModuleType | object] | None = None,
    extra: Iterable[PluginSpec] = (),
    invariants: bool = True,
    query: bool = True,
) -> AsyncIterator[TestHost]:
    """Boot a host with the core plugins, ``store`` persistence, the invariants, a scripted
    model on provider ``scripted``, and then ``plugins`` (names of rows to add after the core).

    :param modules: extra plugin modules to register by name (autoload is always off), e.g.
        ``{"subagent": dsh_subagent.plugin}``.
    :param config: per-plugin config, by plugin name.
    """
    pm = make_plugin_manager(autoload=False, plugins={"core": core_plugin, **(modules or {})})
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
    runtime = await boot_host(rows, pm=pm, extra=extra)
    adapter = _adapter(model)
    runtime.ctx.llm.register_adapter("scripted", adapter)
    host = TestHost(runtime, adapter)
    registry = host.invariants if invariants else None
    try:
        yield host
    finally:
        await runtime.dispose()
        violations = list(registry.violations) if registry is not None else []
        if violations:
            raise AssertionError(
                "invariants broken during the test:\n" + "\n".join(f"  {v}" for v in violations)
            )
