"""``dsh-subagents run``: one agent on the composed plugins, its answer streamed to the terminal.

The composition is a TOML file (``--config``, docs/configuration.md) or, without one, the core
plugins plus every other installed plugin that mounts with no config. The model route is
``--model PROVIDER:MODEL``, else the first row whose config names a ``model``, else the offline
scripted model (``scripted:echo``). ``--store DIR`` keeps the session as JSONL files under DIR;
``--resume ID`` continues a stored session.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import attrs

from dsh_core import (
    AgentCancelCause,
    AgentOptions,
    CreateAgentOptions,
    DshError,
    DshPluginManager,
    LlmSeamError,
    PluginError,
    PluginRow,
    PluginSpec,
    ResumeAgentOptions,
    SessionMeta,
    TextDelta,
    blocks_text,
    boot_host,
    load_composition,
    structure_config,
    user_message,
)

__all__ = ["RunOptions", "compose_run", "run_agent"]

#: The core rows of a run without ``--config`` (persistence is chosen by ``--store``).
_CORE_ROWS = ("sessions", "session-query", "llm", "llm-scripted", "tools", "system-prompt",
              "agents", "jobs")  # fmt: skip
_PERSISTENCE = ("session-persistence-memory", "session-persistence-jsonl")
#: Core plugins a default run leaves out (the test-only invariant replay).
_NOT_BY_DEFAULT = frozenset({"invariants", *_PERSISTENCE})
#: A tool argument or result longer than this is cut when shown.
_SHOWN = 200
#: ``dsh-subagents run``'s exit status when its output closed: 128 + SIGPIPE, as a shell reports it.
EXIT_OUTPUT_CLOSED = 141


@attrs.frozen(kw_only=True)
class RunOptions:
    """What ``dsh-subagents run`` was asked: the prompt and its flags (``model`` is
    ``PROVIDER[:MODEL]``)."""

    prompt: str
    model: str | None = None
    config: str | None = None
    store: str | None = None
    resume: str | None = None


@attrs.frozen(kw_only=True)
class Composition:
    """The rows to boot and the model route of the agent."""

    rows: tuple[PluginRow, ...]
    provider: str
    model: str
    #: Why no route could be chosen (``RUN_MODEL``), raised once the rows have booted, so an
    #: unknown plugin or a missing service in them is reported first (it may be the cause).
    no_route: str | None = None


def _where(options: RunOptions) -> str:
    return options.config or "the default composition"


def _default_rows(specs: Mapping[str, PluginSpec]) -> list[PluginRow]:
    """The core rows, then every other installed plugin that mounts with no config, whose
    required services the composition provides and whose services nothing else provides."""
    rows = [PluginRow(plugin=name) for name in _CORE_ROWS if name in specs]
    provided = {s for r in rows for s in specs[r.plugin].provides} | {"session_persistence"}
    chosen = {r.plugin for r in rows} | _NOT_BY_DEFAULT
    candidates: list[PluginSpec] = []
    for name in sorted(specs):
        spec = specs[name]
        if name in chosen or set(spec.provides) & provided:
            continue
        try:
            structure_config(spec, {})
        except PluginError:
            continue  # it needs config: only a composition file can mount it
        candidates.append(spec)
    added = True
    while added:  # add those whose requirements are met, until nothing changes
        added = False
        for spec in list(candidates):
            if set(spec.requires) <= provided and not set(spec.provides) & provided:
                rows.append(PluginRow(plugin=spec.name))
                provided |= set(spec.provides)
                candidates.remove(spec)
                added = True
    return rows


def _route_of_rows(
    rows: Sequence[PluginRow], specs: Mapping[str, PluginSpec], provider: str | None
) -> tuple[str, str] | None:
    """The first enabled row whose config names a ``model`` (of ``provider``, when given).
    A bad config in such a row is ``PLUGIN_CONFIG`` naming it (``plugins[i]``), as at boot."""
    for i, row in enumerate(rows):
        spec = specs.get(row.plugin)
        if row.disabled or spec is None or "model" not in row.config:
            continue
        config = structure_config(spec, row.config, row=i)
        model, name = getattr(config, "model", None), getattr(config, "provider", None)
        if isinstance(model, str) and model and isinstance(name, str) and provider in (None, name):
            return name, model
    return None


def compose_run(options: RunOptions, specs: Mapping[str, PluginSpec]) -> Composition:
    """The rows and the route of a run (nothing is booted). Errors are ``PLUGIN_CONFIG``
    naming the file; a route that cannot be chosen is ``no_route`` (``RUN_MODEL`` after boot).
    """
    rows = load_composition(options.config) if options.config else _default_rows(specs)
    with _naming_file(options):
        return _compose(options, specs, rows)


@contextlib.contextmanager
def _naming_file(options: RunOptions) -> Iterator[None]:
    """A ``PluginError`` raised inside names the composition file (once): a row's error
    says ``plugins[i]``, and the file it is in comes from here."""
    try:
        yield
    except PluginError as exc:
        if options.config and options.config not in str(exc):
            raise PluginError(f"{options.config}: {exc}", code=exc.code) from exc
        raise


def _compose(
    options: RunOptions, specs: Mapping[str, PluginSpec], rows: list[PluginRow]
) -> Composition:
    has_store = any(r.plugin in _PERSISTENCE and not r.disabled for r in rows)
    if options.store is not None:
        # A file's row keeps its index (errors name it): a replaced row is disabled in place.
        rows = [attrs.evolve(r, disabled=True) if r.plugin in _PERSISTENCE else r for r in rows]
        rows.append(PluginRow(plugin="session-persistence-jsonl", config={"root": options.store}))
    elif not has_store:
        rows.append(PluginRow(plugin="session-persistence-memory"))
    provider, _, model = (options.model or "").partition(":")
    if not options.model:
        route = _route_of_rows(rows, specs, None)
        if route is not None:
            return Composition(rows=tuple(rows), provider=route[0], model=route[1])
        if options.config and not any(r.plugin == "llm-scripted" for r in rows):
            return Composition(
                rows=tuple(rows),
                provider="",
                model="",
                no_route=f"no row of {options.config} sets `model`: pass --model PROVIDER:MODEL",
            )
        provider = "scripted"  # nothing named a model: the offline one
    if provider == "scripted":
        return _scripted(rows, model or None)
    if not model:
        route = _route_of_rows(rows, specs, provider)
        if route is None:
            return Composition(
                rows=tuple(rows),
                provider=provider,
                model="",
                no_route=(
                    f"--model {provider!r} names no model, and no row of {_where(options)} for "
                    f"provider {provider!r} sets `model`: pass --model {provider}:MODEL"
                ),
            )
        model = route[1]
    return Composition(rows=tuple(rows), provider=provider, model=model)


def _scripted(rows: list[PluginRow], script: str | None) -> Composition:
    """The scripted model on provider ``scripted``: echo, or ``script`` (a file) as the
    ``llm-scripted`` row's script (the row is added when the composition has none)."""
    config = {"script": str(Path(script).resolve())} if script else {}
    for i, row in enumerate(rows):
        mine = row.plugin == "llm-scripted" and not row.disabled
        if mine and row.config.get("provider", "scripted") == "scripted":
            rows[i] = attrs.evolve(row, config={**row.config, **config})
            break
    else:
        rows.append(PluginRow(plugin="llm-scripted", config=config))
    return Composition(rows=tuple(rows), provider="scripted", model="script" if script else "echo")


class _Printer:
    """Writes what the agent does as it happens: the root agent's text as it streams, every
    tool call and result (a child's prefixed with its session id), each child run's start
    and end.

    The first write that finds the output closed (``dsh-subagents run | head -1``) calls
    ``on_closed`` and makes every later write a no-op (ROB-44): the listener never raises, so
    the event that carried the write is not logged as a failed listener, once per event.
    """

    def __init__(self, out: TextIO, root: str) -> None:
        self.out = out
        self.root = root
        self.mid_line = False
        self.closed = False
        self.on_closed: Callable[[], None] | None = None

    def _write(self, text: str) -> None:
        if self.closed:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except BrokenPipeError:
            self.closed = True
            if self.on_closed is not None:
                self.on_closed()

    def _line(self, text: str) -> None:
        if self.mid_line:
            self.mid_line = False
            text = "\n" + text
        self._write(text + "\n")

    def _who(self, session_id: str) -> str:
        return "" if session_id == self.root else f"[{session_id}] "

    def on_session_event(self, session: Any, event: Any) -> None:
        kind = event.type
        sid = session.header.id
        if kind == "assistant/chunk":
            chunk = event.data.chunk
            if sid == self.root and chunk.__class__ is TextDelta and chunk.text:
                self._write(chunk.text)
                self.mid_line = not chunk.text.endswith("\n")
        elif kind == "tool/call":
            self._line(f"{self._who(sid)}→ {event.data.name} {_cut(event.data.arguments)}")
        elif kind == "tool/result":
            text = blocks_text(
                b for block in event.data.message.content for b in getattr(block, "content", ())
            )
            failed = " (error)" if event.data.error is not None else ""
            self._line(f"{self._who(sid)}← {_cut(text)}{failed}")

    def on_child_start(self, info: Any) -> None:
        self._line(f"⇢ child {info.id} started ({info.provider})")

    def on_child_end(self, info: Any) -> None:
        self._line(f"⇠ child {info.id} ended: {info.stop_reason}")

    def finish(self) -> None:
        if self.mid_line:
            self.mid_line = False
            self._write("\n")
        elif not self.closed:
            self._write("")


def _cut(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _SHOWN else flat[: _SHOWN - 1] + "…"


def _working_directory() -> str:
    """The working directory, which the session's header records: a path that is not UTF-8
    would put bytes no reader can decode into the log, so it stops the run (``RUN_CWD``,
    exit 2) before anything boots (ROB-45)."""
    cwd = os.getcwd()
    raw = os.fsencode(cwd)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DshError(
            f"the working directory's path is not UTF-8 (byte 0x{raw[exc.start]:02x} at "
            f"offset {exc.start} of {raw!a}): the session would record it; run from another "
            "directory",
            code="RUN_CWD",
        ) from None
    return cwd


async def run_agent(
    options: RunOptions, pm: DshPluginManager, out: TextIO, err: TextIO | None = None
) -> int:
    """Boot the composition, run one turn of one agent on ``options.prompt``, stream it to
    ``out``; 0 when the turn completed, 1 otherwise (the reason goes to ``err``), 141
    (:data:`EXIT_OUTPUT_CLOSED`) when ``out`` closed: the turn was cancelled and the tree
    disposed, and nothing more is printed."""
    err = err or sys.stderr
    cwd = _working_directory()
    specs = pm.collect_plugin_specs()
    composition = compose_run(options, specs)
    with _naming_file(options):
        runtime = await boot_host(composition.rows, pm=pm)
    async with runtime as host:
        ctx = host.ctx
        if composition.no_route is not None:
            raise DshError(composition.no_route, code="RUN_MODEL")
        if ctx.llm.adapter(composition.provider) is None:
            raise LlmSeamError(
                f"no model adapter answers provider {composition.provider!r} in "
                f"{_where(options)}: mount a row that provides it (llm-openai's `provider` "
                "key, say; see docs/configuration.md)",
                code="NO_ADAPTER",
            )
        agent_options = AgentOptions(provider=composition.provider, model=composition.model)
        if options.resume is not None:
            handle = await ctx.agents.resume(
                ResumeAgentOptions(resume_session_id=options.resume, agent_options=agent_options)
            )
        else:
            handle = await ctx.agents.create(
                CreateAgentOptions(meta=SessionMeta(cwd=cwd), agent_options=agent_options)
            )
        agent = handle.agent
        printer = _Printer(out, agent.id)
        # The output closed: the turn is cancelled from inside the write that found it (the
        # agent's own task, so no model request follows); disposal below ends the tree.
        printer.on_closed = lambda: agent.cancel(
            AgentCancelCause(kind="user", reason="the output closed")
        )
        ctx.on("session/event", printer.on_session_event)
        ctx.on("subagent/start", printer.on_child_start)
        ctx.on("subagent/end", printer.on_child_end)
        try:
            agent.followup(user_message(options.prompt))
            await agent.when_idle()
        finally:
            printer.finish()
            await handle.dispose()
        if printer.closed:
            return EXIT_OUTPUT_CLOSED  # quietly: the reader is gone, like a shell's SIGPIPE
        ends = [e for e in agent.session.events if e.type == "turn/end"]
        reason = ends[-1].data.reason if ends else None
        where = f" (--store {options.store} --resume {agent.id})" if options.store else ""
        print(f"session {agent.id}{where}", file=err)
        if reason is None or reason.kind == "completed":
            return 0
        detail = f": {reason.error.message} [{reason.error.code}]" if reason.error else ""
        print(f"dsh-subagents run: the turn ended {reason.kind}{detail}", file=err)
        return 1
