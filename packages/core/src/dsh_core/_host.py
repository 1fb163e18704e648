"""Booting a host from a composition: ordered plugin rows, applied by dependency, disposed in
reverse (host-core §1).

A composition is a list of rows ``{plugin, config, disabled}``, written in code or a TOML file
(``[[plugins]]`` tables). Rows are applied in a stable topological order over the services
each plugin ``requires``/``provides`` (and optionally wants ``after``); a missing required
service or a cycle fails loud at boot with ``PLUGIN_UNRESOLVED``. A row's config is structured
into the plugin's attrs ``config_type`` strictly (a wrong type is refused, never converted); a
wrong key or type fails with ``PLUGIN_CONFIG`` naming the row, the plugin and the key.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs
import cattrs
from cattrs.errors import AttributeValidationNote, ForbiddenExtraKeysError

from ._content import SOURCES
from ._context import Context, Host
from ._converter import config_converter, type_name
from ._events import EventTypeRegistry, EventTypeSpec
from ._frozen import attrs_eq, attrs_hash, attrs_repr
from ._plugins import DshPluginManager, PluginError, PluginSpec, make_plugin_manager

__all__ = ["HostRuntime", "PluginRow", "boot_host", "load_composition", "structure_config"]


#: Each row field's test and what it must be (a file's table is not typed: check it).
_ROW_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "plugin": (lambda v: type(v) is str, "a string"),
    "config": (lambda v: isinstance(v, Mapping), "a table"),
    "disabled": (lambda v: v is True or v is False, "a boolean"),
}


def _check_row_field(row: PluginRow, attribute: attrs.Attribute[Any], value: Any) -> None:
    test, kind = _ROW_FIELDS[attribute.name]
    if not test(value):
        raise PluginError(f"`{attribute.name}` must be {kind}, got {value!r}", code="PLUGIN_CONFIG")


@attrs.frozen(kw_only=True)
class PluginRow:
    """One row of a composition. Checked when made, as strictly as its config: ``plugin`` a
    string, ``config`` a table, ``disabled`` a boolean (``disabled = "no"`` must not disable
    a plugin); otherwise ``PLUGIN_CONFIG``."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    plugin: str = attrs.field(validator=_check_row_field)
    config: Mapping[str, Any] = attrs.field(factory=dict, validator=_check_row_field)
    disabled: bool = attrs.field(default=False, validator=_check_row_field)


def structure_config(spec: PluginSpec, raw: object, *, row: int | None = None) -> Any:
    """Structure a row's config into ``spec.config_type``, strictly (see
    :data:`dsh_core._converter.config_converter`): a wrong type is refused, never converted.

    Errors are ``PLUGIN_CONFIG`` naming the row (``plugins[row]`` when given), the plugin, each
    offending key with its expected type, and the value found.
    """
    where = f"plugin {spec.name!r}" if row is None else f"plugins[{row}] (plugin {spec.name!r})"
    if not isinstance(raw, Mapping):
        raise PluginError(f"{where}: config must be a table, got {raw!r}", code="PLUGIN_CONFIG")
    if spec.config_type is None:
        if raw:
            raise PluginError(
                f"{where} takes no config, got keys {sorted(raw)}", code="PLUGIN_CONFIG"
            )
        return None
    if not raw and _all_defaulted(spec.config_type):
        try:  # what the converter would build, without generating its structure function
            return spec.config_type()
        except Exception:  # pragma: no cover - a validator refused a default: let it report
            pass
    flat = _flat_config(spec.config_type, raw)
    if flat is not None:
        return flat
    try:
        return config_converter.structure(dict(raw), spec.config_type)
    except cattrs.ClassValidationError as exc:
        problems = "; ".join(_problems(exc, ()))
        raise PluginError(f"{where} config: {problems}", code="PLUGIN_CONFIG") from exc
    except (TypeError, ValueError, KeyError) as exc:
        raise PluginError(f"{where} config: {exc}", code="PLUGIN_CONFIG") from exc


#: The strict test of each scalar field type the config converter checks without converting
#: (its hooks for ``str``, ``int``, ``bool`` and ``str | None`` return the value as it is), by
#: the type and by its name as a postponed annotation reads it.
_SCALAR_TESTS: dict[object, Callable[[Any], bool]] = {
    str: lambda v: type(v) is str,
    int: lambda v: type(v) is int,
    bool: lambda v: v is True or v is False,
    str | None: lambda v: v is None or type(v) is str,
}
_SCALAR_TESTS.update({"str": _SCALAR_TESTS[str], "int": _SCALAR_TESTS[int]})
_SCALAR_TESTS.update({"bool": _SCALAR_TESTS[bool], "str | None": _SCALAR_TESTS[str | None]})
#: Each config class's ``__init__`` fields by name with their tests (``None``: not flat).
_flat: dict[type, dict[str, Callable[[Any], bool]] | None] = {}


def _flat_config(cls: type, raw: Mapping[str, Any]) -> Any:
    """``cls(**raw)`` when that is exactly what the config converter would build: every key
    names an ``__init__`` field (no alias) of a scalar type above and every value passes that
    type's strict test, so the converter would pass each value through unchanged and call
    ``cls`` with them. Otherwise, or when ``cls`` refuses them (a validator), ``None``: the
    converter then structures the table and reports the problem in its own words. A start
    structures a few small tables; generating a structure function for each class was most
    of what that cost (PERF-20)."""
    tests = _flat.get(cls, _SENTINEL)
    if tests is _SENTINEL:
        tests = _flat[cls] = _flat_fields(cls)
    if tests is None:
        return None
    for key, value in raw.items():
        test = tests.get(key)
        if test is None or not test(value):
            return None
    try:
        return cls(**raw)
    except Exception:
        return None


_SENTINEL: Any = object()


def _flat_fields(cls: type) -> dict[str, Callable[[Any], bool]] | None:
    if not attrs.has(cls):
        return None
    module = getattr(inspect.getmodule(cls), "__dict__", {})
    if any(name in module for name in ("str", "int", "bool")):
        return None  # a postponed annotation could name something else
    tests: dict[str, Callable[[Any], bool]] = {}
    for f in attrs.fields(cls):
        try:
            test = _SCALAR_TESTS.get(f.type)
        except TypeError:  # an unhashable annotation: not one of them
            test = None
        if f.init and f.alias == f.name and test is not None:
            tests[f.name] = test
    return tests


#: Config classes every ``__init__`` field of which has a default, and those not so.
_defaulted: dict[type, bool] = {}


def _all_defaulted(cls: type) -> bool:
    """Whether the config converter structures an empty table into ``cls`` as ``cls()``: an
    attrs class whose every ``__init__`` field has a default (nothing to read from the table,
    no key to refuse; the converter would call ``cls()`` with no argument). The mounts of a
    start read empty tables mostly, and generating each class's structure function is most
    of what checking them costs (PERF-14)."""
    known = _defaulted.get(cls)
    if known is None:
        known = _defaulted[cls] = attrs.has(cls) and all(
            f.default is not attrs.NOTHING for f in attrs.fields(cls) if f.init
        )
    return known


def _problems(group: BaseExceptionGroup[Exception], path: tuple[str, ...]) -> list[str]:
    """One line per bad key of a cattrs validation group: its dotted path, expected type and
    what was wrong."""
    out: list[str] = []
    for exc in group.exceptions:
        if isinstance(exc, ForbiddenExtraKeysError):
            known = sorted(a.name for a in attrs.fields(exc.cl)) if attrs.has(exc.cl) else []
            out.extend(
                f"key {'.'.join((*path, key))!r} is unknown (known keys: {known})"
                for key in sorted(exc.extra_fields)
            )
            continue
        notes = getattr(exc, "__notes__", ())
        note = next((n for n in notes if isinstance(n, AttributeValidationNote)), None)
        here = (*path, note.name) if note is not None else path
        if isinstance(exc, BaseExceptionGroup):
            out += _problems(exc, here)
            continue
        expected = f" ({type_name(note.type)})" if note is not None else ""
        message = "is required" if isinstance(exc, KeyError) else str(exc)
        if message.startswith("key '"):  # a class validator that names its own key
            out.append(message)
            continue
        out.append(f"key {'.'.join(here)!r}{expected}: {message}")
    return out


def load_composition(path: str | Path) -> list[PluginRow]:
    """Read ``[[plugins]]`` rows (``plugin``, ``config``, ``disabled``) from a TOML file."""
    import tomllib  # only when a file is read: a start reads none (PERF-10)

    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: not UTF-8, not TOML
        raise PluginError(f"cannot read composition {p}: {exc}", code="PLUGIN_CONFIG") from exc
    rows = data.get("plugins")
    if not isinstance(rows, list) or set(data) - {"plugins"}:
        raise PluginError(
            f"{p}: a composition is a list of [[plugins]] tables", code="PLUGIN_CONFIG"
        )
    out: list[PluginRow] = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise PluginError(f"{p}: plugins[{i}] is not a table", code="PLUGIN_CONFIG")
        out.append(_checked_row(row, f"{p}: plugins[{i}]"))
    return out


def _checked_row(row: Mapping[str, Any], where: str) -> PluginRow:
    """A row from plain data (a file's table, a mapping in code); errors name the row."""
    if "plugin" not in row or set(row) - {"plugin", "config", "disabled"}:
        raise PluginError(
            f"{where} needs `plugin` and may have `config`, `disabled` (got keys {sorted(row)})",
            code="PLUGIN_CONFIG",
        )
    try:
        return PluginRow(**row)
    except PluginError as exc:
        raise PluginError(f"{where}: {exc}", code="PLUGIN_CONFIG") from exc


def _order(
    rows: Sequence[tuple[PluginRow, PluginSpec]], existing: set[str]
) -> list[tuple[PluginRow, PluginSpec]]:
    """Stable topological order: each row waits for the rows providing what it requires (and,
    when present, what it wants ``after``)."""
    providers: dict[str, int] = {}
    for i, (_, spec) in enumerate(rows):
        for service in spec.provides:
            providers.setdefault(service, i)
    deps: list[set[int]] = []
    for row, spec in rows:
        need: set[int] = set()
        for service in spec.requires:
            if service in providers:
                need.add(providers[service])
            elif service not in existing:
                raise PluginError(
                    f"plugin {row.plugin!r} requires service {service!r}, which no plugin in "
                    "the composition provides",
                    code="PLUGIN_UNRESOLVED",
                )
        for service in spec.after:
            if service in providers:
                need.add(providers[service])
        deps.append(need)
    done: list[int] = []
    placed: set[int] = set()
    while len(done) < len(rows):
        ready = [i for i in range(len(rows)) if i not in placed and deps[i] - {i} <= placed]
        if not ready:
            stuck = [rows[i][0].plugin for i in range(len(rows)) if i not in placed]
            raise PluginError(
                f"plugins {stuck} depend on each other in a cycle", code="PLUGIN_UNRESOLVED"
            )
        done.append(ready[0])
        placed.add(ready[0])
    return [rows[i] for i in done]


class HostRuntime:
    """A booted host: its root context, plugin manager and mounted plugins.

    ``async with`` disposes it (plugins in reverse order of application).
    """

    def __init__(self, host: Host, pm: DshPluginManager) -> None:
        self.host = host
        self.pm = pm
        self.ctx = Context(host, host.root)
        self.mounted: list[tuple[str, Context]] = []

    async def dispose(self) -> None:
        """Unmount every plugin in reverse, then await host-owned tasks."""
        while self.mounted:
            _, ctx = self.mounted.pop()
            await ctx.dispose()
        await self.host.root.dispose()
        await self.host.drain_tasks()

    async def __aenter__(self) -> HostRuntime:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.dispose()


def _rows(items: Iterable[PluginRow | Mapping[str, Any] | str]) -> list[PluginRow]:
    out: list[PluginRow] = []
    for i, item in enumerate(items):
        if isinstance(item, PluginRow):
            out.append(item)
        elif isinstance(item, str):
            out.append(PluginRow(plugin=item))
        elif isinstance(item, Mapping):
            out.append(_checked_row(item, f"plugins[{i}]"))
        else:
            raise PluginError(
                f"plugins[{i}]: a row is a plugin name, a mapping or a PluginRow, got {item!r}",
                code="PLUGIN_CONFIG",
            )
    return out


def _unknown(name: str, specs: Mapping[str, PluginSpec], pm: DshPluginManager) -> str:
    """PLUGIN_UNKNOWN's message: the known names, and the entry points that failed to load (the
    one named like the row, else all of them, since any might have mounted it)."""
    message = f"no installed plugin mounts {name!r} (known: {sorted(specs)})"
    related = pm.failures_for(name)
    if related:
        return (
            message
            + "; "
            + "; ".join(
                f"entry point {f.name!r}"
                + (f" ({f.distribution} {f.version})" if f.distribution else "")
                + f" failed to load: {f.message}"
                for f in related
            )
        )
    if pm.failures:
        n = len(pm.failures)
        listed = "; ".join(f.describe() for f in pm.failures)
        plural = "" if n == 1 else "s"
        return f"{message}; {n} plugin{plural} failed to load and may mount it: {listed}"
    return message


async def boot_host(
    rows: Iterable[PluginRow | Mapping[str, Any] | str],
    *,
    pm: DshPluginManager | None = None,
    extra: Iterable[PluginSpec] = (),
    event_types: Iterable[EventTypeSpec] = (),
) -> HostRuntime:
    """Boot a host from ``rows``: discover plugin specs (``pm``, by default from the installed
    entry points), register the plugins' event types and source kinds, then apply each row.

    A failure while applying disposes what was already applied, in reverse, and re-raises.
    """
    pm = pm or make_plugin_manager()
    specs = pm.collect_plugin_specs()
    for spec in extra:
        specs[spec.name] = spec
    registry = EventTypeRegistry()
    for et in (*pm.collect_event_types(), *event_types):
        registry.register(et)
    for kind in pm.collect_source_kinds():
        SOURCES.register(kind)
    host = Host(event_types=registry)
    runtime = HostRuntime(host, pm)
    chosen: list[tuple[PluginRow, PluginSpec]] = []
    position: dict[int, int] = {}
    for i, row in enumerate(_rows(rows)):
        if row.disabled:
            continue
        position[id(row)] = i
        found = specs.get(row.plugin)
        if found is None:
            raise PluginError(_unknown(row.plugin, specs, pm), code="PLUGIN_UNKNOWN")
        chosen.append((row, found))
    ordered = _order(chosen, set())
    configs = [structure_config(spec, row.config, row=position[id(row)]) for row, spec in ordered]
    try:
        for (row, spec), config in zip(ordered, configs, strict=True):
            ctx = runtime.ctx.plugin(row.plugin)
            runtime.mounted.append((row.plugin, ctx))
            result = spec.apply(ctx, config)
            if inspect.isawaitable(result):
                await result
            missing = [s for s in spec.provides if s not in host.services]
            if missing:
                raise PluginError(
                    f"plugin {row.plugin!r} promised {missing} but did not provide them",
                    code="PLUGIN_UNRESOLVED",
                )
    except BaseException:
        await runtime.dispose()
        raise
    return runtime
