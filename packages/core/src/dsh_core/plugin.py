"""The ``core`` entry point of dsh-core: the host's own plugins, registered like any other.

Mountable plugins (a composition names them):

========================== ======================== =============================================
plugin                     provides                 config
========================== ======================== =============================================
``sessions``               ``sessions``             —
``session-persistence-memory`` ``session_persistence`` ``retain_disposed`` (default: every log)
``session-persistence-jsonl`` ``session_persistence``  ``root`` (default
                                                    ``$DSH_SUBAGENTS_HOME/sessions``),
                                                    ``sync`` (``always``/``batch``/``detach``,
                                                    default ``batch``)
``session-query``          ``session_query``        —
``llm``                    ``llm``                  —
``llm-scripted``           (adapter ``scripted``)   ``provider``, ``script`` (JSON/TOML path)
``tools``                  ``tools``                —
``system-prompt``          ``system_prompt``        ``persona`` (the ``deployment:persona`` text)
``agents``                 ``agents``               ``max_steps`` (default 100)
``jobs``                   ``jobs``                 ``cap`` (default 10)
``invariants``             ``invariants``           —
========================== ======================== =============================================
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import attrs

from ._agent import DEFAULT_MAX_STEPS, AgentRegistryService
from ._context import Context
from ._events import CORE_EVENT_TYPES, EventTypeSpec
from ._frozen import attrs_eq, attrs_hash, attrs_repr
from ._jobs import DEFAULT_CAP, install_jobs
from ._llm import LlmRuntimeService
from ._plugins import PluginSpec, hookimpl
from ._prompt import PERSONA_SECTION, AssembleContext, PromptSection, SystemPromptService
from ._scripted import ScriptedAdapter
from ._sessions import SessionStoreService
from ._tools import ToolRegistryService
from ._words import check_positive_int

if TYPE_CHECKING:
    from ._persistence import SyncMode

__all__ = [
    "AgentsConfig",
    "JobsConfig",
    "JsonlPersistenceConfig",
    "MemoryPersistenceConfig",
    "ScriptedModelConfig",
    "SystemPromptConfig",
    "dsh_plugins",
    "dsh_session_event_types",
]


def _sync_mode(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    from ._persistence import SYNC_MODES

    if value not in SYNC_MODES:
        raise ValueError(f"key {attribute.name!r} must be one of {list(SYNC_MODES)}, got {value!r}")


def _retain(instance: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and (type(value) is not int or value < 0):
        raise ValueError(f"key {attribute.name!r} must be a non-negative integer, got {value!r}")


@attrs.frozen(kw_only=True)
class MemoryPersistenceConfig:
    """``session-persistence-memory``: how many disposed sessions' logs stay in memory
    (``retain_disposed``; unset keeps every log for the life of the process). The oldest
    disposed log is dropped first; a log in use is never dropped."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    retain_disposed: int | None = attrs.field(default=None, validator=_retain)


@attrs.frozen(kw_only=True)
class JsonlPersistenceConfig:
    """``session-persistence-jsonl``: where session files live, and when what a checkpoint
    wrote is synced (``sync``: ``"always"`` before the checkpoint returns, ``"batch"`` by a
    group commit within about 20 ms, ``"detach"``: checkpoints write nothing, lines reach
    the file at a flush or the session's disposal)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    root: str | None = None
    sync: str = attrs.field(default="batch", validator=_sync_mode)


def _non_empty(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not value:
        raise ValueError(f"key {attribute.name!r} must not be empty")


@attrs.frozen(kw_only=True)
class ScriptedModelConfig:
    """``llm-scripted``: the provider name it answers and an optional script file.

    Without ``script`` it echoes the latest user message. ``provider`` must not be empty.
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    provider: str = attrs.field(default="scripted", validator=_non_empty)
    script: str | None = None


@attrs.frozen(kw_only=True)
class SystemPromptConfig:
    """``system-prompt``: the deployment persona (empty: no persona section)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    persona: str = ""


def _at_least_one(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"key {attribute.name!r} must be at least 1, got {value!r}")


def _positive_key(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    check_positive_int(f"key {attribute.name!r}", value)


@attrs.frozen(kw_only=True)
class JobsConfig:
    """``jobs``: unfinished jobs allowed per owner (at least 1)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    cap: int = attrs.field(default=DEFAULT_CAP, validator=_at_least_one)


@attrs.frozen(kw_only=True)
class AgentsConfig:
    """``agents``: the step limit of a turn (model requests, at least 1) for every agent whose
    own ``AgentOptions.max_steps`` is unset."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    max_steps: int = attrs.field(default=DEFAULT_MAX_STEPS, validator=_positive_key)


def _sessions(ctx: Context, _: None) -> None:
    ctx.provide("sessions", SessionStoreService(ctx.host.event_types))


def _memory(ctx: Context, config: MemoryPersistenceConfig) -> None:
    from ._persistence import install_memory_persistence

    install_memory_persistence(ctx, config.retain_disposed)


def _jsonl(ctx: Context, config: JsonlPersistenceConfig) -> None:
    from ._persistence import install_jsonl_persistence

    install_jsonl_persistence(
        ctx,
        Path(config.root) if config.root else None,
        sync=cast("SyncMode", config.sync),
    )


def _query(ctx: Context, _: None) -> None:
    from ._query import install_session_query

    install_session_query(ctx)


def _llm(ctx: Context, _: None) -> None:
    ctx.provide("llm", LlmRuntimeService())


def _scripted(ctx: Context, config: ScriptedModelConfig) -> None:
    adapter = (
        ScriptedAdapter.from_file(config.script, record=False)
        if config.script
        else ScriptedAdapter.echo(record=False)
    )
    ctx.llm.register_adapter(config.provider, adapter)


def _tools(ctx: Context, _: None) -> None:
    ctx.provide("tools", ToolRegistryService())


def _prompt(ctx: Context, config: SystemPromptConfig) -> None:
    ctx.provide("system_prompt", SystemPromptService())
    ctx.system_prompt.section(PromptSection(name=PERSONA_SECTION, order=0, text=config.persona))


def _model_var(actx: AssembleContext) -> str | None:
    return actx.agent.options.model if actx.agent is not None else None


def _cwd_var(actx: AssembleContext) -> str | None:
    return actx.agent.session.header.cwd if actx.agent is not None else None


def _agents(ctx: Context, config: AgentsConfig) -> None:
    service = AgentRegistryService(ctx, max_steps=config.max_steps)
    ctx.provide("agents", service)
    ctx.fiber.add(service.dispose)
    ctx.system_prompt.variable("model", _model_var)
    ctx.system_prompt.variable("cwd", _cwd_var)


def _jobs(ctx: Context, config: JobsConfig) -> None:
    install_jobs(ctx, cap=config.cap)


def _invariants(ctx: Context, _: None) -> None:
    from ._invariants import install_core_invariants  # test-only: imported when mounted

    install_core_invariants(ctx)


CORE_PLUGINS: tuple[PluginSpec, ...] = (
    PluginSpec(
        name="sessions",
        apply=_sessions,
        provides=("sessions",),
        description="the live session store",
    ),
    PluginSpec(
        name="session-persistence-memory",
        apply=_memory,
        requires=("sessions",),
        provides=("session_persistence",),
        config_type=MemoryPersistenceConfig,
        description="sessions kept in memory",
    ),
    PluginSpec(
        name="session-persistence-jsonl",
        apply=_jsonl,
        requires=("sessions",),
        provides=("session_persistence",),
        config_type=JsonlPersistenceConfig,
        description="sessions as JSONL files, group-committed",
    ),
    PluginSpec(
        name="session-query",
        apply=_query,
        requires=("sessions",),
        after=("session_persistence",),
        provides=("session_query",),
        description="lineage traces and reads over live and persisted sessions",
    ),
    PluginSpec(name="llm", apply=_llm, provides=("llm",), description="the LLM adapter registry"),
    PluginSpec(
        name="llm-scripted",
        apply=_scripted,
        requires=("llm",),
        config_type=ScriptedModelConfig,
        description="the offline scripted model",
    ),
    PluginSpec(name="tools", apply=_tools, provides=("tools",), description="the tool registry"),
    PluginSpec(
        name="system-prompt",
        apply=_prompt,
        provides=("system_prompt",),
        config_type=SystemPromptConfig,
        description="system prompt sections",
    ),
    PluginSpec(
        name="agents",
        apply=_agents,
        requires=("sessions", "llm", "tools", "system_prompt"),
        provides=("agents",),
        after=("session_persistence", "invariants"),
        config_type=AgentsConfig,
        description="the agent loop and registry",
    ),
    PluginSpec(
        name="jobs",
        apply=_jobs,
        requires=("tools",),
        after=("agents",),
        provides=("jobs",),
        config_type=JobsConfig,
        description="background jobs with job_output and job_kill",
    ),
    PluginSpec(
        name="invariants",
        apply=_invariants,
        requires=("sessions",),
        provides=("invariants",),
        description="invariant replay (tests)",
    ),
)

#: The plugins a plain host mounts, in order (persistence, query and invariants are opt-in).
DEFAULT_COMPOSITION: tuple[str, ...] = (
    "sessions",
    "llm",
    "tools",
    "system-prompt",
    "agents",
    "jobs",
)


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The host plugins dsh-core can mount."""
    return list(CORE_PLUGINS)


@hookimpl
def dsh_session_event_types() -> list[EventTypeSpec]:
    """The core session event types."""
    return list(CORE_EVENT_TYPES)
