"""Root sessions of ``dsh-subagents run --store`` and ``dsh-subagents demo`` are written per turn:
whenever an
agent goes idle, every turn it ended is already in its file (read as bytes, as a process
started after a kill -9 would find it), not only once the run ends and the session closes."""

from __future__ import annotations

import io
import types
from pathlib import Path
from typing import Any

import pytest

from dsh_core import PluginSpec, hookimpl, make_plugin_manager
from dsh_core import plugin as core_plugin
from dsh_core._host import PluginRow
from dsh_subagents import _demo as demo
from dsh_subagents._run import RunOptions, run_agent


def _probe(store: Path, seen: list[tuple[str, int, int]]) -> types.ModuleType:
    """A plugin that, at every agent's turn end (it goes idle), counts the ``turn/end``
    lines of its file against the turn ends its session holds."""

    def apply(ctx: Any, _: Any) -> None:
        def on_status(agent: Any, status: str) -> None:
            if status != "idle":
                return
            path = store / f"{agent.id}.jsonl"
            raw = path.read_bytes() if path.exists() else b""
            stored = sum(b'"type":"turn/end"' in line for line in raw.split(b"\n")[:-1])
            ended = sum(e.type == "turn/end" for e in agent.session.events)
            seen.append((agent.id, stored, ended))

        ctx.on("agent/status", on_status, global_=True)

    module = types.ModuleType("durability_probe")

    @hookimpl
    def dsh_plugins() -> list[PluginSpec]:
        return [PluginSpec(name="durability-probe", apply=apply, description="probe")]

    module.dsh_plugins = dsh_plugins  # type: ignore[attr-defined]
    return module


async def test_dsh_run_store_writes_the_turn_before_it_is_over(tmp_path: Path) -> None:
    """DUR-40: `dsh-subagents run --store DIR`: when the agent goes idle, its ended turn is in its
    file already (a kill right then loses nothing `--resume` would show)."""
    seen: list[tuple[str, int, int]] = []
    store = tmp_path / "store"
    pm = make_plugin_manager(
        autoload=False, plugins={"core": core_plugin, "probe": _probe(store, seen)}
    )
    out, err = io.StringIO(), io.StringIO()
    status = await run_agent(RunOptions(prompt="hello", store=str(store)), pm, out, err=err)
    assert status == 0, err.getvalue()
    assert seen and all(stored == ended >= 1 for _, stored, ended in seen), seen


async def test_dsh_demo_writes_every_turn_before_it_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUR-40: `dsh-subagents demo`: whenever the coordinator or a child goes idle, every turn
    it ended is in its file already."""
    seen: list[tuple[str, int, int]] = []
    store = tmp_path / "demo"
    pm = make_plugin_manager()
    pm.register(_probe(store, seen), name="probe")
    rows = demo._tour_rows
    monkeypatch.setattr(
        demo,
        "_tour_rows",
        lambda where, model: [*rows(where, model), PluginRow(plugin="durability-probe")],
    )
    missing = demo.missing_tour_plugins(pm)
    assert not missing
    out = io.StringIO()
    status = await demo.run_tour(out, pm, script=None, prompt=demo.DEFAULT_PROMPT, store=store)
    assert status == 0, out.getvalue()
    assert len({sid for sid, _, _ in seen}) >= 4  # the coordinator and its children
    assert all(stored == ended >= 1 for _, stored, ended in seen), seen
