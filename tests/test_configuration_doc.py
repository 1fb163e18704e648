"""docs/configuration.md documents every config key of every installed plugin (llm-openai 17.3)."""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from dsh_core import make_plugin_manager

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def _tables() -> dict[str, set[str]]:
    """Plugin name -> the keys its rows in the doc's tables name (a dsh-llm-openai key table
    has no plugin column: its rows belong to `llm-openai`)."""
    found: dict[str, set[str]] = {}
    current: str | None = None
    in_openai = False
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("### "):
            in_openai = "dsh-llm-openai" in line
            current = "llm-openai" if in_openai else None
            continue
        cells = (
            [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        )
        if len(cells) < 3 or (cells[0] and set(cells[0]) <= {"-"}):
            continue
        if not in_openai:
            plugin = re.fullmatch(r"`([\w-]+)`", cells[0])
            if plugin:
                current = plugin.group(1)
            key_cell = cells[1]
        else:
            key_cell = cells[0]
        key = re.fullmatch(r"`(\w+)`", key_cell)
        if current is not None:
            found.setdefault(current, set())
            if key:
                found[current].add(key.group(1))
    return found


def test_every_installed_plugin_and_config_key_is_documented() -> None:
    """llm-openai 17.3, dx 12.5: each plugin `dsh-subagents plugins` can mount has a row in
    docs/configuration.md, and each key of its config class is listed under it."""
    specs = make_plugin_manager(autoload=True, environ={}).collect_plugin_specs()
    documented = _tables()
    for name, spec in specs.items():
        assert name in documented, f"{name} is not in docs/configuration.md"
        keys = {f.name for f in attrs.fields(spec.config_type)} if spec.config_type else set()
        assert documented[name] == keys, (name, documented[name], keys)
