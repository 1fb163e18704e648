"""``dsh-subagents run``: one agent on the composed plugins, until its whole tree settles.

The composition is a TOML file (``--config``, docs/configuration.md) or, without one, the core
plugins plus every other installed plugin that mounts with no config, plus a ``subagent`` tool
on the ``spawn`` provider whose background children are continuable (CLI-7). The model route is
``--model PROVIDER:MODEL``, else the first row whose config names a ``model``, else the offline
scripted model (``scripted:echo``). Sessions are stored as JSONL files under the home's
``sessions/`` folder (``--store DIR`` chooses another, ``--no-store`` keeps them in memory);
``--resume ID`` (or a unique prefix of it) and ``-c`` continue a stored session.

The run lasts until the tree settles (CLI-1): the root's turn ends, and every background or
continuable child below it runs to completion; their reports and settlement notices wake the
root, which answers again. Ctrl-C, ``--timeout`` and a closed output stop it the same way:
the root's turn is cancelled, the children are drained child-first (each sends the root its
settlement notice, without waking it), and the tree is disposed (CLI-3..5).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
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
    boot_host,
    load_composition,
    structure_config,
    user_message,
)

from ._home import home
from ._ids import SessionsError, match_id
from ._view import Transcript

__all__ = ["RunOptions", "compose_run", "run_agent"]

#: The core rows of a run without ``--config`` (persistence is chosen by the store flags).
_CORE_ROWS = ("sessions", "session-query", "llm", "llm-scripted", "tools", "system-prompt",
              "agents", "jobs")  # fmt: skip
_PERSISTENCE = ("session-persistence-memory", "session-persistence-jsonl")
#: Core plugins a default run leaves out (the test-only invariant replay).
_NOT_BY_DEFAULT = frozenset({"invariants", *_PERSISTENCE})
#: The model's tools that act on continuable children: mounted by default only together
#: with a ``subagent`` tool, which is what makes such children (CLI-7).
_CONTROL_TOOLS = frozenset({"tool-subagent-control", "tool-subagent-list-agents"})
#: The ``subagent`` tool of a default run: the ``spawn`` provider, background children
#: continuable, so their settlement notices wake the root (CLI-7).
_DEFAULT_TOOL = PluginRow(
    plugin="tool-subagent", config={"provider": "spawn", "background_mode": "continuable"}
)
#: The distribution that mounts each plugin of this project, for "install it" hints.
DISTRIBUTIONS: Mapping[str, str] = {
    **dict.fromkeys((*_CORE_ROWS, *_PERSISTENCE, "invariants"), "dsh-core"),
    "subagent": "dsh-subagent",
    "subagent-spawn": "dsh-subagent-spawn",
    "subagent-fork": "dsh-subagent-fork",
    "subagent-acp": "dsh-subagent-acp",
    "tool-subagent": "dsh-tool-subagent",
    "tool-subagent-control": "dsh-tool-subagent-control",
    "tool-subagent-list-agents": "dsh-tool-subagent-control",
    "tool-subagent-report": "dsh-tool-subagent-report",
    "llm-openai": "dsh-llm-openai",
    "acp-agent": "dsh-acp-agent",
}
#: ``dsh-subagents run``'s exit status when its output closed: 128 + SIGPIPE, as a shell
#: reports it.
EXIT_OUTPUT_CLOSED = 141
#: Exit statuses of a run stopped from outside: Ctrl-C (128 + SIGINT), ``--timeout`` (as
#: coreutils' ``timeout`` reports it).
EXIT_INTERRUPTED = 130
EXIT_TIMEOUT = 124
#: How many turns the root may take in one run (the prompt's, then one per wake by its
#: children): a model that keeps starting children that wake it is stopped there (CLI-6).
MAX_ROOT_TURNS = 200
#: How long a stopped run waits for its children to drain before it disposes them.
DRAIN_GRACE = 30.0
#: After a stop, how long before the run says that a second Ctrl-C quits at once.
STILL_STOPPING = 2.0


@attrs.frozen(kw_only=True)
class RunOptions:
    """What ``dsh-subagents run`` was asked: the prompt and its flags (``model`` is
    ``PROVIDER[:MODEL]``; ``resume`` an id or a unique prefix of one; ``latest`` is ``-c``).

    ``live`` draws the live tree (the output is a terminal); ``signals`` makes Ctrl-C drain
    the tree (the command's own process, in its main thread)."""

    prompt: str
    model: str | None = None
    config: str | None = None
    store: str | None = None
    no_store: bool = False
    resume: str | None = None
    latest: bool = False
    system: str | None = None
    max_steps: int | None = None
    timeout: float | None = None
    usage: bool = False
    live: bool = False
    signals: bool = False


@attrs.frozen(kw_only=True)
class Composition:
    """The rows to boot and the model route of the agent."""

    rows: tuple[PluginRow, ...]
    provider: str
    model: str
    #: Why no route could be chosen (``RUN_MODEL``), raised once the rows have booted, so an
    #: unknown plugin or a missing service in them is reported first (it may be the cause).
    no_route: str | None = None

    @property
    def store(self) -> str | None:
        """The folder the sessions are kept in, or ``None`` when they are not stored."""
        for row in self.rows:
            if row.plugin == "session-persistence-jsonl" and not row.disabled:
                root = row.config.get("root")
                return str(root) if isinstance(root, str) else str(home() / "sessions")
        return None


def _where(options: RunOptions) -> str:
    return options.config or "the default composition"


def _default_rows(specs: Mapping[str, PluginSpec]) -> list[PluginRow]:
    """The core rows, then every other installed plugin that mounts with no config, whose
    required services the composition provides and whose services nothing else provides;
    then the ``subagent`` tool on ``spawn`` (continuable in the background) when the seam
    and that provider are there. ``send_message``, ``interrupt_agent`` and ``list_agents``
    are mounted only together with that tool (CLI-7)."""
    rows = [PluginRow(plugin=name) for name in _CORE_ROWS if name in specs]
    provided = {s for r in rows for s in specs[r.plugin].provides} | {"session_persistence"}
    chosen = {r.plugin for r in rows} | _NOT_BY_DEFAULT
    candidates: list[PluginSpec] = []
    for name in sorted(specs):
        spec = specs[name]
        if name in chosen or set(spec.provides) & provided:
            continue
        if not _mounts_without_config(spec):
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
    mounted = {r.plugin for r in rows}
    if {"subagent", "subagent-spawn"} <= mounted and "tool-subagent" in specs:
        rows.append(_DEFAULT_TOOL)
    else:  # no tool makes continuable children: the tools that act on them would mislead
        rows = [r for r in rows if r.plugin not in _CONTROL_TOOLS]
    return rows


def _mounts_without_config(spec: PluginSpec) -> bool:
    """Whether ``structure_config(spec, {})`` accepts the empty table. A config class with a
    required ``__init__`` field never does (the converter reports the missing key), so that
    is answered without generating the class's structure function, which the probe then
    throws away (CLI-101); any other class is asked of the converter itself."""
    config = spec.config_type
    if (
        config is not None
        and attrs.has(config)
        and any(f.init and f.default is attrs.NOTHING for f in attrs.fields(config))
    ):
        return False
    try:
        structure_config(spec, {})
    except PluginError:
        return False
    return True


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
    if options.store is not None or options.no_store:
        # A file's row keeps its index (errors name it): a replaced row is disabled in place.
        rows = [attrs.evolve(r, disabled=True) if r.plugin in _PERSISTENCE else r for r in rows]
    if options.no_store:
        rows.append(PluginRow(plugin="session-persistence-memory"))
    elif options.store is not None:
        rows.append(PluginRow(plugin="session-persistence-jsonl", config={"root": options.store}))
    elif not has_store:  # stored by default, under the home (CLI-10)
        root = str(home() / "sessions")
        rows.append(PluginRow(plugin="session-persistence-jsonl", config={"root": root}))
    if options.system is not None:
        rows = _set_key(rows, "system-prompt", "persona", options.system)
    if options.max_steps is not None:
        rows = _set_key(rows, "agents", "max_steps", options.max_steps)
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


def _set_key(rows: list[PluginRow], plugin: str, key: str, value: object) -> list[PluginRow]:
    """``key = value`` in the config of every enabled row of ``plugin`` (a flag wins over
    the file); a composition without one gets one."""
    out = [
        attrs.evolve(r, config={**r.config, key: value})
        if r.plugin == plugin and not r.disabled
        else r
        for r in rows
    ]
    if not any(r.plugin == plugin and not r.disabled for r in out):
        out.append(PluginRow(plugin=plugin, config={key: value}))
    return out


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


def check_store(composition: Composition) -> None:
    """``RUN_STORE`` when the folder the sessions go to names something that is not a
    folder (a file, say): nothing boots, nothing is written (CLI-24)."""
    folder = composition.store
    if folder is None:
        return
    try:
        is_dir = Path(folder).is_dir()
        exists = is_dir or os.path.lexists(folder)
    except (OSError, ValueError):
        return  # the store reports what it cannot open, with its own code
    if exists and not is_dir:
        raise DshError(
            f"the session store {folder} is not a directory: pass --store DIR naming a folder "
            "(it is created when missing), or --no-store",
            code="RUN_STORE",
        )


def _autoload_off() -> bool:
    value = os.environ.get("DSH_DISABLE_PLUGIN_AUTOLOAD", "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def _plugin_hint(missing: Sequence[str], specs: Mapping[str, PluginSpec]) -> str:
    """Why the plugins ``missing`` are not there and what to do: autoload is off, the
    selection leaves them out, their distribution is not installed, or a near name."""
    if _autoload_off() and "DSH_PLUGINS" not in os.environ:
        return (
            "plugin autoload is off (DSH_DISABLE_PLUGIN_AUTOLOAD is set), so no plugin was "
            "loaded: unset it, or name the distributions to load in DSH_PLUGINS "
            "(DSH_PLUGINS=dsh-core,...)"
        )
    hints: list[str] = []
    for name in missing:
        dist = DISTRIBUTIONS.get(name)
        if dist is not None:
            if _installed(dist):
                hints.append(
                    f"{name!r} is mounted by {dist}, which is installed but not loaded "
                    f"(DSH_PLUGINS={os.environ.get('DSH_PLUGINS', '')!r} selects the plugins): "
                    f"add {dist} to it"
                )
            else:
                hints.append(f"{name!r} is mounted by {dist}: pip install {dist}")
            continue
        import difflib

        near = difflib.get_close_matches(name, [*specs, *DISTRIBUTIONS], n=1)
        if near:
            hints.append(f"did you mean {near[0]!r}?")
    return "; ".join(hints)


def _installed(distribution: str) -> bool:
    from importlib import metadata

    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


@contextlib.contextmanager
def _explaining_unknown(
    rows: Sequence[PluginRow], specs: Mapping[str, PluginSpec]
) -> Iterator[None]:
    """``PLUGIN_UNKNOWN`` raised inside says what to do about the missing plugins (CLI-23,
    CLI-25)."""
    try:
        yield
    except PluginError as exc:
        if exc.code != "PLUGIN_UNKNOWN":
            raise
        missing = [r.plugin for r in rows if not r.disabled and r.plugin not in specs]
        hint = _plugin_hint(missing, specs)
        if not hint:
            raise
        raise PluginError(f"{exc}; {hint}", code=exc.code) from exc


def check_route(ctx: Any, composition: Composition, options: RunOptions) -> None:
    """After boot: an adapter answers the route's provider, and a model was chosen.

    ``--model NAME`` with no colon that no adapter answers is most often a model name: the
    error suggests ``openai:NAME`` (CLI-22). A provider no row answers names the
    distribution to install when it is a known one."""
    provider = composition.provider
    given = options.model or ""
    if provider and ctx.llm.adapter(provider) is None:
        if given and ":" not in given:
            raise DshError(
                f"no model provider is named {given!r}: --model takes PROVIDER:MODEL; "
                f"for a model of an OpenAI-compatible endpoint, --model openai:{given}",
                code="RUN_MODEL",
            )
        install = (
            "; install dsh-llm-openai (pip install dsh-llm-openai)"
            if provider == "openai" and not _installed("dsh-llm-openai")
            else ""
        )
        raise LlmSeamError(
            f"no model adapter answers provider {provider!r} in {_where(options)}: mount a "
            "row that provides it (llm-openai's `provider` key, say; see "
            f"docs/configuration.md){install}",
            code="NO_ADAPTER",
        )
    if composition.no_route is not None:
        raise DshError(composition.no_route, code="RUN_MODEL")


async def _session_to_resume(ctx: Any, options: RunOptions) -> str | None:
    """The stored session ``--resume`` names (an id or a unique prefix of one), or the
    latest root session for ``-c`` (CLI-11, CLI-12); ``None`` for a new session."""
    if options.resume is None and not options.latest:
        return None
    persistence = ctx.session_persistence
    headers = await persistence.list()
    where = getattr(persistence, "root", None)
    place = f" in {where}" if where is not None else ""
    if options.latest:
        roots = [h for h in headers if h.parent_session is None]
        if not roots:
            raise DshError(f"no stored session to continue{place}", code="SESSION_NOT_FOUND")
        path_of = getattr(persistence, "path_of", None)
        latest: str = max(roots, key=lambda h: (_last_write(path_of, h.id), h.created_at, h.id)).id
        return latest
    try:
        return match_id((h.id for h in headers), options.resume or "", where or "the store")
    except SessionsError as exc:
        raise DshError(str(exc), code=exc.code) from None


def _last_write(path_of: Callable[[str], Path] | None, session_id: str) -> int:
    """When the log of ``session_id`` was last written (0 when the store cannot tell)."""
    if path_of is None:
        return 0
    try:
        return os.stat(path_of(session_id), follow_symlinks=False).st_mtime_ns
    except (OSError, ValueError, DshError):
        return 0


def resume_command(options: RunOptions, composition: Composition, session_id: str) -> str:
    """The command that continues ``session_id`` with a next prompt."""
    import shlex

    parts = ["dsh-subagents", "run"]
    if options.config:
        parts += ["--config", options.config]
    if options.store is not None:
        parts += ["--store", options.store]
    parts += ["--resume", session_id]
    return shlex.join(parts) + ' "..."'


async def run_agent(
    options: RunOptions, pm: DshPluginManager, out: TextIO, err: TextIO | None = None
) -> int:
    """Boot the composition, send ``options.prompt`` to a new or resumed root agent, stream
    what the tree does to ``out`` and wait until it settles (see the module's docstring).

    0 when the root's last turn completed, 1 otherwise (the reason goes to ``err``), 124 at
    ``--timeout``, 130 at Ctrl-C, 141 (:data:`EXIT_OUTPUT_CLOSED`) when ``out`` closed:
    the tree was stopped and disposed, and nothing more is printed."""
    err = err or sys.stderr
    cwd = _working_directory()
    specs = pm.collect_plugin_specs()
    composition = compose_run(options, specs)
    check_store(composition)
    with _naming_file(options), _explaining_unknown(composition.rows, specs):
        runtime = await boot_host(composition.rows, pm=pm)
    restore: Callable[[], None] | None = None
    try:
        async with runtime as host:
            ctx = host.ctx
            check_route(ctx, composition, options)
            resume_id = await _session_to_resume(ctx, options)
            agent_options = AgentOptions(
                provider=composition.provider, model=composition.model, max_steps=options.max_steps
            )
            if resume_id is not None:
                handle = await ctx.agents.resume(
                    ResumeAgentOptions(resume_session_id=resume_id, agent_options=agent_options)
                )
            else:
                handle = await ctx.agents.create(
                    CreateAgentOptions(meta=SessionMeta(cwd=cwd), agent_options=agent_options)
                )
            run = _Run(ctx, handle, options, composition, out, err)
            restore = run.catch_sigint()
            status = await run.go()
    finally:
        if restore is not None:
            restore()
    return status


class _Run:
    """One run of ``dsh-subagents run``: the root's turns until the tree settles, or a stop."""

    def __init__(
        self,
        ctx: Any,
        handle: Any,
        options: RunOptions,
        composition: Composition,
        out: TextIO,
        err: TextIO,
    ) -> None:
        self.ctx = ctx
        self.handle = handle
        self.agent = handle.agent
        self.options = options
        self.composition = composition
        self.err = err
        root = self.agent.id
        if options.live:
            from ._live import LiveTranscript

            self.view: Transcript = LiveTranscript(out, root, ctx)
        else:
            self.view = Transcript(out, root)
        self.view.on_closed = lambda: self.stop("closed")
        self.meter = None
        if options.usage:
            from ._usage import UsageMeter

            self.meter = UsageMeter(root)
            self.view.on_message = self.meter.on_message
        #: Why the run was stopped before the tree settled: interrupted, timeout, closed,
        #: turns; ``None`` while it runs on.
        self.why: str | None = None
        self.wake = asyncio.Event()
        self.root_turns = 0
        self.first_seq = len(self.agent.session.events)
        self.hint: asyncio.TimerHandle | None = None

    # -- stopping ----------------------------------------------------------------------------

    def catch_sigint(self) -> Callable[[], None]:
        """Ctrl-C (SIGINT) stops the run and drains its children; a second one quits at
        once (CLI-3, CLI-4). Only in the main thread of the command's own process; returns
        the undo."""
        if not self.options.signals or threading.current_thread() is not threading.main_thread():
            return lambda: None
        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGINT)
        heard = 0

        def on_sigint(signum: int, frame: Any) -> None:
            nonlocal heard
            heard += 1
            if heard == 1:
                loop.call_soon_threadsafe(self.stop, "interrupted")
            else:
                self.quit_now()

        signal.signal(signal.SIGINT, on_sigint)

        def restore() -> None:
            signal.signal(signal.SIGINT, previous)

        return restore

    def quit_now(self) -> None:
        """The second Ctrl-C: leave the terminal clean and end the process now. What was
        handed out is already written to the OS (a crash, as far as the store is concerned)."""
        with contextlib.suppress(Exception):
            self.view.abandon()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        with contextlib.suppress(OSError):
            os.write(2, b"dsh-subagents run: interrupted again: quitting at once\n")
        os._exit(EXIT_INTERRUPTED)

    def stop(self, why: str) -> None:
        """Stop the run (the first reason wins): the root's turn is cancelled (its pending
        input parked, not discarded); :meth:`go` then drains the children."""
        if self.why is not None:
            return
        self.why = why
        if why != "closed":
            self.view.pause()
        if why == "interrupted":
            self.note("interrupted" + self._stopping())
        elif why == "timeout":
            self.note(f"--timeout {self.options.timeout:g} s reached" + self._stopping())
        elif why == "turns":
            self.note(
                f"the root agent took {MAX_ROOT_TURNS} turns in this run without its tree "
                "settling" + self._stopping()
            )
        self.agent.cancel(AgentCancelCause(kind="user", reason=why), keep_inbox=True)
        self.wake.set()
        if self.options.signals and why != "closed":
            loop = asyncio.get_running_loop()
            self.hint = loop.call_later(
                STILL_STOPPING, self.note, "still stopping: Ctrl-C again quits at once"
            )

    def _stopping(self) -> str:
        n = self._running_below()
        if not n:
            return ""
        return f": stopping {n} running subagent{'' if n == 1 else 's'}"

    def note(self, text: str) -> None:
        # One write with its newline (print writes the end apart): a second Ctrl-C that lands
        # between the two would leave this line unended before its own.
        with contextlib.suppress(OSError, ValueError):
            self.err.write(f"dsh-subagents run: {text}\n")
            self.err.flush()

    # -- the tree ----------------------------------------------------------------------------

    def _running_below(self) -> int:
        subagents = self.ctx.get("subagents")
        running: int = subagents.running_in_tree(self.agent) if subagents is not None else 0
        return running + len(self._unfinished_jobs())

    def _unfinished_jobs(self) -> list[Any]:
        jobs = self.ctx.get("jobs")
        if jobs is None:
            return []
        return [j for j in jobs.jobs.values() if not j.finished]

    def on_session_event(self, session: Any, event: Any) -> None:
        self.view.on_session_event(session, event)
        if event.type == "turn/start" and session.header.id == self.agent.id:
            self.root_turns += 1
            if self.root_turns > MAX_ROOT_TURNS:
                self.stop("turns")

    def _poke(self, *_: Any) -> None:
        self.wake.set()

    async def _first(self, *waits: Awaitable[Any]) -> None:
        """Until one of ``waits`` is done or something woke the run."""
        tasks = [asyncio.ensure_future(w) for w in (*waits, self.wake.wait())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()

    async def _settle(self) -> None:
        """Until the root is idle with nothing running below it (CLI-1, CLI-2), or a stop.

        A child settling wakes the root (its notice is sent before its slot is given back),
        so "idle with no slot held and no unfinished job" is the settled tree."""
        agent = self.agent
        while self.why is None:
            self.wake.clear()
            if agent.status == "running":
                await self._first(agent.when_idle())
            elif self._running_below():
                await self._first(*(j.wait() for j in self._unfinished_jobs()))
            else:
                return

    async def _drain(self) -> None:
        """After a stop: the children released child-first (continuable ones send the root
        their notices without waking it), jobs killed, all within a grace."""
        subagents = self.ctx.get("subagents")
        try:
            async with asyncio.timeout(DRAIN_GRACE):
                if subagents is not None:
                    try:
                        await subagents.drain_continuable_descendants([self.agent])
                    except DshError as exc:
                        if self.why != "closed":
                            self.note(f"draining the subagents: {exc} [{exc.code}]")
                jobs = self.ctx.get("jobs")
                for job in self._unfinished_jobs():
                    jobs.kill(job.id, "the run was stopped")
                for job in self._unfinished_jobs():
                    await job.wait()
                await self.agent.when_idle()
        except TimeoutError:
            if self.why != "closed":
                self.note(f"the subagents did not stop within {DRAIN_GRACE:g} s: disposing them")

    # -- the run -----------------------------------------------------------------------------

    async def go(self) -> int:
        ctx = self.ctx
        removers = [
            ctx.on("session/event", self.on_session_event),
            ctx.on("subagent/start", self.view.on_child_start),
            ctx.on("subagent/end", self.view.on_child_end),
            ctx.on("subagent/start", self._poke),
            ctx.on("subagent/end", self._poke),
            ctx.on("agent/status", self.view.on_status),
            ctx.on("agent/status", self._poke),
        ]
        loop = asyncio.get_running_loop()
        timer = None
        if self.options.timeout is not None:
            timer = loop.call_later(self.options.timeout, self.stop, "timeout")
        try:
            self.agent.followup(user_message(self.options.prompt))
            await self._settle()
            if self.why is not None:
                await self._drain()
        finally:
            for handle in (timer, self.hint):
                if handle is not None:
                    handle.cancel()
            self.view.finish()
            # What the root has not taken yet (the notices of children a stop drained) stays
            # pending in its log for `--resume` (CLI-91).
            await self.handle.dispose(keep_inbox=True)
            for remove in removers:
                remove()
        return self.report()

    def report(self) -> int:
        """What the run ends with on standard error, and its exit status."""
        if self.view.closed or self.why == "closed":
            return EXIT_OUTPUT_CLOSED  # quietly: the reader is gone, like a shell's SIGPIPE
        err = self.err
        if self.meter is not None:
            for line in self.meter.lines():
                print(line, file=err)
        root = self.agent.id
        if self.composition.store is not None:
            command = resume_command(self.options, self.composition, root)
            print(f"session {root} (continue: {command})", file=err)
        else:
            print(f"session {root} (not stored)", file=err)
        if self.why == "interrupted":
            return EXIT_INTERRUPTED
        if self.why == "timeout":
            return EXIT_TIMEOUT
        if self.why == "turns":
            return 1
        events = self.agent.session.events
        ends = [e for e in events[self.first_seq :] if e.type == "turn/end"]
        reason = ends[-1].data.reason if ends else None
        if reason is None or reason.kind == "completed":
            return 0
        detail = f": {reason.error.message} [{reason.error.code}]" if reason.error else ""
        print(f"dsh-subagents run: the turn ended {reason.kind}{detail}", file=err)
        return 1
