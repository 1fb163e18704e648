"""Booting a host from a composition: ordered plugin rows, applied by dependency, disposed in
reverse (host-core §1).

A composition is a list of rows ``{plugin, config, disabled}``, written in code or a TOML file
(``[[plugins]]`` tables). Rows are applied in a stable topological order over the services
each plugin ``requires``/``provides`` (and optionally wants ``after``); a missing required
service or a cycle fails loud at boot with ``PLUGIN_UNRESOLVED``. A row's config is structured
into the plugin's attrs ``config_type``; a wrong key or type fails with ``PLUGIN_CONFIG`` naming
the plugin and the key.
"""

from __future__ import annotations

import inspect
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs
import cattrs

from ._content import SOURCES
from ._context import Context, Host
from ._events import EventTypeRegistry, EventTypeSpec
from ._plugins import DshPluginManager, PluginError, PluginSpec, make_plugin_manager

__all__ = ["HostRuntime", "PluginRow", "boot_host", "load_composition", "structure_config"]


@attrs.frozen(kw_only=True)
class PluginRow:
    """One row of a composition."""

    plugin: str
    config: Mapping[str, Any] = attrs.field(factory=dict)
    disabled: bool = False


_config_converter = cattrs.Converter(forbid_extra_keys=True)


def structure_config(spec: PluginSpec, raw: Mapping[str, Any]) -> Any:
    """Structure a row's config into ``spec.config_type``; errors name the plugin and key."""
    if spec.config_type is None:
        if raw:
            raise PluginError(
                f"plugin {spec.name!r} takes no config, got keys {sorted(raw)}",
                code="PLUGIN_CONFIG",
            )
        return None
    try:
        return _config_converter.structure(dict(raw), spec.config_type)
    except cattrs.ClassValidationError as exc:
        problems = "; ".join(cattrs.transform_error(exc))
        raise PluginError(f"plugin {spec.name!r} config: {problems}", code="PLUGIN_CONFIG") from exc
    except (TypeError, ValueError) as exc:
        raise PluginError(f"plugin {spec.name!r} config: {exc}", code="PLUGIN_CONFIG") from exc


def load_composition(path: str | Path) -> list[PluginRow]:
    """Read ``[[plugins]]`` rows (``plugin``, ``config``, ``disabled``) from a TOML file."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PluginError(f"cannot read composition {p}: {exc}", code="PLUGIN_CONFIG") from exc
    rows = data.get("plugins")
    if not isinstance(rows, list) or set(data) - {"plugins"}:
        raise PluginError(
            f"{p}: a composition is a list of [[plugins]] tables", code="PLUGIN_CONFIG"
        )
    out: list[PluginRow] = []
    for i, row in enumerate(rows):
        if (
            not isinstance(row, dict)
            or "plugin" not in row
            or set(row) - {"plugin", "config", "disabled"}
        ):
            raise PluginError(
                f"{p}: plugins[{i}] needs `plugin` and may have `config`, `disabled`",
                code="PLUGIN_CONFIG",
            )
        out.append(
            PluginRow(
                plugin=str(row["plugin"]),
                config=row.get("config", {}),
                disabled=bool(row.get("disabled", False)),
            )
        )
    return out


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
    for item in items:
        if isinstance(item, PluginRow):
            out.append(item)
        elif isinstance(item, str):
            out.append(PluginRow(plugin=item))
        else:
            out.append(PluginRow(**dict(item)))
    return out


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
    for row in _rows(rows):
        if row.disabled:
            continue
        found = specs.get(row.plugin)
        if found is None:
            raise PluginError(
                f"no installed plugin mounts {row.plugin!r} (known: {sorted(specs)})",
                code="PLUGIN_UNKNOWN",
            )
        chosen.append((row, found))
    ordered = _order(chosen, set())
    configs = [structure_config(spec, row.config) for row, spec in ordered]
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
