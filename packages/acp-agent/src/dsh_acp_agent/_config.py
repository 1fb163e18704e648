"""``dsh-acp-agent``'s config file: which plugins to load and mount, the model, the store.

Plain data, read with the standard library only, so ``--help`` and a bad file cost no import
of the host or the SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from dsh_core import attrs_eq, attrs_hash, attrs_repr

__all__ = ["AgentServerConfig", "ConfigError", "load_config"]

#: The dsh-core plugins every served host mounts (persistence and the model come on top).
CORE_ROWS = ("sessions", "llm", "tools", "system-prompt", "agents", "jobs")


class ConfigError(ValueError):
    """The config file cannot be read or holds something it may not."""


@attrs.frozen(kw_only=True)
class AgentServerConfig:
    """What ``dsh-acp-agent`` serves (every key optional; the defaults run offline).

    ``load``: installed entry points or distributions to load besides dsh-core (nothing else
    is scanned). ``modules``: plugin modules by import path, for plugins that are not
    installed. ``plugins``: composition rows mounted after the core ones (``plugin``,
    ``config``, ``disabled``). ``model``: the route of every session (default: the scripted
    model's echo). ``store``: ``memory`` (default) or ``jsonl``; with ``jsonl``,
    ``session/load`` resumes sessions across processes (``store_root``, default
    ``$DSH_SUBAGENTS_HOME/sessions``).
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    load: tuple[str, ...] = ()
    modules: Mapping[str, str] = attrs.field(factory=dict)
    plugins: tuple[Mapping[str, Any], ...] = ()
    provider: str = "scripted"
    model: str = "echo"
    max_tokens: int | None = None
    store: str = "memory"
    store_root: str | None = None
    #: The file the config was read from (errors about its rows name it).
    source: str | None = None

    @property
    def durable(self) -> bool:
        """Whether sessions outlive the process (``session/load`` is offered)."""
        return self.store == "jsonl"

    @property
    def first_file_row(self) -> int:
        """The index in :meth:`rows` of the file's ``plugins[0]`` (the rows before it are the
        ones this class adds)."""
        return len(self.rows()) - len(self.plugins) - 1

    def rows(self) -> list[Any]:
        """The composition: the core rows, the store, the scripted model (unless a row of
        its own names it), ``plugins``, then ``acp-agent`` with the model route."""
        named = {row.get("plugin") for row in self.plugins}
        rows: list[Any] = list(CORE_ROWS)
        if self.durable:
            root = {"root": self.store_root} if self.store_root else {}
            rows.append({"plugin": "session-persistence-jsonl", "config": root})
        else:
            rows.append("session-persistence-memory")
        if "llm-scripted" not in named:
            rows.append("llm-scripted")
        rows.extend(dict(row) for row in self.plugins)
        route: dict[str, Any] = {"provider": self.provider, "model": self.model}
        if self.max_tokens is not None:
            route["max_tokens"] = self.max_tokens
        rows.append({"plugin": "acp-agent", "config": route})
        return rows


_KEYS = {"load", "modules", "plugins", "model", "store"}


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of strings")
    return tuple(value)


def load_config(path: str | Path | None) -> AgentServerConfig:
    """Read the config file (``None``: the defaults)."""
    if path is None:
        return AgentServerConfig()
    import tomllib  # only when a file is read: a start reads none (PERF-10)

    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: not UTF-8, not TOML
        raise ConfigError(f"cannot read {p}: {exc}") from exc
    unknown = set(data) - _KEYS
    if unknown:
        raise ConfigError(f"{p}: unknown keys {sorted(unknown)} (known: {sorted(_KEYS)})")
    fields: dict[str, Any] = {"source": str(p)}
    if "load" in data:
        fields["load"] = _strings(data["load"], f"{p}: load")
    modules = data.get("modules", {})
    if not isinstance(modules, dict) or not all(isinstance(v, str) for v in modules.values()):
        raise ConfigError(f"{p}: modules must map plugin names to module import paths")
    fields["modules"] = modules
    plugins = data.get("plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(r, dict) for r in plugins):
        raise ConfigError(f"{p}: plugins must be a list of [[plugins]] tables")
    fields["plugins"] = tuple(plugins)
    model = data.get("model", {})
    if not isinstance(model, dict) or set(model) - {"provider", "model", "max_tokens"}:
        raise ConfigError(f"{p}: [model] takes provider, model and max_tokens")
    for key in ("provider", "model"):
        if key in model:
            if not isinstance(model[key], str) or not model[key]:
                raise ConfigError(f"{p}: model.{key} must be a non-empty string")
            fields[key] = model[key]
    if "max_tokens" in model:
        if type(model["max_tokens"]) is not int or model["max_tokens"] <= 0:
            raise ConfigError(f"{p}: model.max_tokens must be a positive integer")
        fields["max_tokens"] = model["max_tokens"]
    store = data.get("store", {})
    if not isinstance(store, dict) or set(store) - {"kind", "root"}:
        raise ConfigError(f"{p}: [store] takes kind and root")
    if "kind" in store:
        if store["kind"] not in ("memory", "jsonl"):
            raise ConfigError(f"{p}: store.kind must be 'memory' or 'jsonl'")
        fields["store"] = store["kind"]
    if "root" in store:
        if not isinstance(store["root"], str) or not store["root"]:
            raise ConfigError(f"{p}: store.root must be a non-empty string")
        fields["store_root"] = str((p.parent / store["root"]).resolve())
    return AgentServerConfig(**fields)
