"""Plugin discovery: the ``dsh`` entry-point group, loaded through pluggy.

Discovery is the only place dsh uses pluggy hooks; :class:`DshPluginManager` is also the only
module that calls ``pm.hook.*``. A plugin that fails to import, fails validation or fails its
hook is recorded as a :class:`PluginLoadFailure` and left out; the others load regardless.
Each failure is also a warning on the ``dsh.plugins`` logger, once per process for the same
entry point and error (a host that discovers again does not repeat it).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import attrs
import pluggy

from . import hookspecs
from ._entry_points import entry_points as _installed
from ._errors import DshError
from ._frozen import attrs_eq, attrs_hash, attrs_repr

if TYPE_CHECKING:
    import importlib.metadata as md

    from ._entry_points import EntryPoint, PathDistribution

__all__ = [
    "ENTRY_POINT_GROUP",
    "DiscoveredPlugin",
    "DshPluginManager",
    "PluginError",
    "PluginLoadFailure",
    "PluginSpec",
    "hookimpl",
    "make_plugin_manager",
]

ENTRY_POINT_GROUP = "dsh"
#: Marks a function in an entry-point module as a ``dsh`` hook implementation.
hookimpl = pluggy.HookimplMarker("dsh")

_FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})

_log = logging.getLogger("dsh.plugins")
#: Failures already warned about in this process: (entry point, target, message).
_warned: set[tuple[str, str | None, str]] = set()


class PluginError(DshError):
    """A plugin could not be discovered, resolved or configured (see ``code``)."""

    code = "PLUGIN_ERROR"


@attrs.frozen(kw_only=True)
class PluginSpec:
    """One mountable plugin: a row a host composition may name.

    ``apply(ctx, config)`` mounts it into a context (sync or async); every registration it makes
    through ``ctx`` is undone when that context is disposed. ``requires`` names services that
    must exist before it is applied, ``provides`` those it promises to provide, ``after`` names
    optional services it wants applied first when they are present, and ``config_type`` is an
    attrs class the row's config is structured into (``None``: the plugin takes no config).
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    name: str
    apply: Callable[[Any, Any], Awaitable[None] | None]
    requires: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    config_type: type | None = None
    description: str = ""


@attrs.frozen(kw_only=True)
class DiscoveredPlugin:
    """An entry point that loaded: its name, distribution, version and mountable plugins."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    name: str
    value: str
    distribution: str | None
    version: str | None
    plugins: tuple[PluginSpec, ...] = ()


@attrs.frozen(kw_only=True)
class PluginLoadFailure:
    """An entry point that did not load; ``message`` names the error, the others stay loaded."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    name: str
    value: str | None
    distribution: str | None
    version: str | None
    message: str
    error: BaseException | None = attrs.field(default=None, eq=False, repr=False)

    def describe(self) -> str:
        """``name (distribution version): message``, as ``dsh plugins`` prints it."""
        where = f" ({self.distribution} {self.version})" if self.distribution else ""
        return f"{self.name}{where}: {self.message}"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dist_of(ep: md.EntryPoint | EntryPoint) -> tuple[str | None, str | None]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    found = _name_version(dist)
    if found is not None:
        return found
    meta = dist.metadata  # parsed once for both (``dist.version`` would parse it again)
    # ``get``: a missing header is None without the deprecation warning of ``[]`` (3.12+).
    return meta.get("Name"), meta.get("Version")


def _name_version(dist: md.Distribution | PathDistribution) -> tuple[str, str] | None:
    """``Name`` and ``Version`` from the head of the distribution's metadata file, read as
    the plain ``Key: value`` lines it starts with; ``None`` when they are not both there
    plainly (the caller then parses it whole). Discovery needs only these two, and parsing
    every plugin's metadata as a message (the long description included) is a measurable
    part of a command's start-up."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
    if not text:
        return None
    found: dict[str, str] = {}
    lines = text.split("\n", 64)[:64]
    for i, line in enumerate(lines):
        if not line.strip():
            break  # the headers end at the first blank line
        key, _, value = line.partition(": ")
        if key not in ("Name", "Version"):
            continue
        folded = i + 1 < len(lines) and lines[i + 1][:1] in (" ", "\t")
        if folded or not value or value != value.strip():
            return None  # a folded value, or spaces the parse keeps or drops: let it decide
        found[key] = value
        if len(found) == 2:
            return found["Name"], found["Version"]
    return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class DshPluginManager(pluggy.PluginManager):
    """A pluggy manager for the ``dsh`` project that records what loaded and what failed."""

    def __init__(self) -> None:
        super().__init__("dsh")
        self.add_hookspecs(hookspecs)
        self.discovered: list[DiscoveredPlugin] = []
        self.failures: list[PluginLoadFailure] = []

    # -- loading -------------------------------------------------------------------------------

    def load_entry_points(
        self,
        *,
        only: Collection[str] | None = None,
        entry_points: Iterable[md.EntryPoint] | None = None,
    ) -> None:
        """Load the ``dsh`` entry points, each under its entry-point name.

        ``only`` restricts loading to entry points whose name or distribution name is listed;
        a listed name that matches nothing is recorded as a failure, so a typo is loud.
        """
        eps = list(_installed(ENTRY_POINT_GROUP) if entry_points is None else entry_points)
        wanted = None if only is None else {_normalize(n): n for n in only}
        matched: set[str] = set()
        for ep in eps:
            dist_name, version = _dist_of(ep)
            if wanted is not None:
                keys = {_normalize(ep.name)} | ({_normalize(dist_name)} if dist_name else set())
                hit = keys & wanted.keys()
                if not hit:
                    continue
                matched |= hit
            if self.get_plugin(ep.name) is not None or self.is_blocked(ep.name):
                continue
            self._load_one(ep, dist_name, version)
        for key, original in (wanted or {}).items():
            if key not in matched:
                self._fail(
                    PluginLoadFailure(
                        name=original,
                        value=None,
                        distribution=None,
                        version=None,
                        message=f"no installed dsh plugin or distribution is named {original!r}",
                    )
                )

    def _load_one(
        self, ep: md.EntryPoint | EntryPoint, dist_name: str | None, version: str | None
    ) -> None:
        def fail(exc: BaseException, stage: str) -> None:
            self._fail(
                PluginLoadFailure(
                    name=ep.name,
                    value=ep.value,
                    distribution=dist_name,
                    version=version,
                    message=f"{stage}: {_describe(exc)}",
                    error=exc,
                )
            )

        try:
            module = ep.load()
        except Exception as exc:
            fail(exc, "import failed")
            return
        try:
            self.register(module, name=ep.name)
        except Exception as exc:
            fail(exc, "invalid hook implementation")
            return
        try:
            self.check_pending()
        except Exception as exc:
            self.unregister(name=ep.name)
            fail(exc, "invalid hook implementation")
            return
        self.discovered.append(
            DiscoveredPlugin(name=ep.name, value=ep.value, distribution=dist_name, version=version)
        )

    def add_plugin(
        self,
        plugin: object,
        *,
        name: str,
        distribution: str | None = None,
        version: str | None = None,
    ) -> None:
        """Register a plugin object by hand (tests, embedding hosts); validated like discovery."""
        self.register(plugin, name=name)
        self.check_pending()
        value = getattr(plugin, "__name__", type(plugin).__name__)
        self.discovered.append(
            DiscoveredPlugin(name=name, value=value, distribution=distribution, version=version)
        )

    # -- hook calls (the only place dsh calls pm.hook.*) ---------------------------------------

    def collect_plugin_specs(self) -> dict[str, PluginSpec]:
        """Call ``dsh_plugins`` on every registered plugin; attribute each spec to its plugin.

        A plugin whose hook raises is moved to :attr:`failures`. Two plugins offering the same
        spec name fail loud with ``PLUGIN_DUPLICATE``.
        """
        specs: dict[str, PluginSpec] = {}
        owners: dict[str, str] = {}
        by_plugin: dict[str, tuple[PluginSpec, ...]] = {}
        for impl in reversed(self.hook.dsh_plugins.get_hookimpls()):
            try:
                offered = tuple(cast("Iterable[PluginSpec]", impl.function()))
            except Exception as exc:
                self._hook_failed(impl.plugin_name, exc, "dsh_plugins")
                continue
            by_plugin[impl.plugin_name] = offered
            for spec in offered:
                if spec.name in specs:
                    raise PluginError(
                        f"plugin name {spec.name!r} is offered by both {owners[spec.name]!r} "
                        f"and {impl.plugin_name!r}",
                        code="PLUGIN_DUPLICATE",
                    )
                specs[spec.name] = spec
                owners[spec.name] = impl.plugin_name
        self.discovered = [
            attrs.evolve(d, plugins=by_plugin.get(d.name, ()))
            for d in self.discovered
            if self.get_plugin(d.name) is not None
        ]
        return specs

    def collect_event_types(self) -> list[Any]:
        """Call ``dsh_session_event_types`` on every plugin (registration order)."""
        out: list[Any] = []
        for impl in reversed(self.hook.dsh_session_event_types.get_hookimpls()):
            try:
                out.extend(cast("Iterable[Any]", impl.function()))
            except Exception as exc:
                self._hook_failed(impl.plugin_name, exc, "dsh_session_event_types")
        return out

    def collect_source_kinds(self) -> list[type]:
        """Call ``dsh_message_source_kinds`` on every plugin (registration order)."""
        out: list[type] = []
        for impl in reversed(self.hook.dsh_message_source_kinds.get_hookimpls()):
            try:
                out.extend(cast("Iterable[type]", impl.function()))
            except Exception as exc:
                self._hook_failed(impl.plugin_name, exc, "dsh_message_source_kinds")
        return out

    def _fail(self, failure: PluginLoadFailure) -> None:
        """Record ``failure``; warn about it unless this process already did."""
        self.failures.append(failure)
        key = (failure.name, failure.value, failure.message)
        if key not in _warned:
            _warned.add(key)
            where = f" ({failure.distribution} {failure.version})" if failure.distribution else ""
            _log.warning("dsh plugin %r%s failed to load: %s", failure.name, where, failure.message)

    def failures_for(self, name: str) -> list[PluginLoadFailure]:
        """The failures whose entry-point or distribution name is ``name`` (normalised)."""
        key = _normalize(name)
        return [
            f
            for f in self.failures
            if key == _normalize(f.name) or (f.distribution and key == _normalize(f.distribution))
        ]

    def _hook_failed(self, plugin_name: str, exc: BaseException, hook: str) -> None:
        found = next((d for d in self.discovered if d.name == plugin_name), None)
        self._fail(
            PluginLoadFailure(
                name=plugin_name,
                value=found.value if found else None,
                distribution=found.distribution if found else None,
                version=found.version if found else None,
                message=f"hook {hook} failed: {_describe(exc)}",
                error=exc,
            )
        )
        self.unregister(name=plugin_name)


def _env_flag(environ: Mapping[str, str], key: str) -> bool:
    return environ.get(key, "").strip().lower() not in _FALSE_WORDS


def make_plugin_manager(
    *,
    autoload: bool | None = None,
    only: Collection[str] | None = None,
    plugins: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
    entry_points: Iterable[md.EntryPoint] | None = None,
) -> DshPluginManager:
    """Build a fresh plugin manager; never a module global.

    :param autoload: load every installed ``dsh`` entry point; ``None`` reads the environment
        (``DSH_DISABLE_PLUGIN_AUTOLOAD`` set to a true value turns it off). ``False`` given in
        code also ignores ``DSH_PLUGINS`` (a test host loads only what it names).
    :param only: load exactly these entry-point or distribution names, whatever ``autoload``
        says; ``None`` reads ``DSH_PLUGINS`` (comma separated; set but empty loads nothing)
        unless ``autoload=False`` was passed. So ``DSH_DISABLE_PLUGIN_AUTOLOAD=1`` with
        ``DSH_PLUGINS=a,b`` loads ``a`` and ``b`` only, as ``DSH_PLUGINS`` alone does.
    :param plugins: extra plugin modules or objects to register by name, before autoload.
    :param environ: the environment to read (default ``os.environ``).
    :param entry_points: the entry points to consider (default: the installed ``dsh`` group).
    """
    env = os.environ if environ is None else environ
    pm = DshPluginManager()
    for name, plugin in (plugins or {}).items():
        pm.add_plugin(plugin, name=name)
    from_env = autoload is None
    if autoload is None:
        autoload = not _env_flag(env, "DSH_DISABLE_PLUGIN_AUTOLOAD")
    if only is None and (from_env or autoload) and "DSH_PLUGINS" in env:
        only = [n.strip() for n in env["DSH_PLUGINS"].split(",") if n.strip()]
    if only is not None:
        pm.load_entry_points(only=only, entry_points=entry_points)
    elif autoload:
        pm.load_entry_points(entry_points=entry_points)
    return pm
