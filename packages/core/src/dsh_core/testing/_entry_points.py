"""Prove a distribution's ``dsh`` entry point resolves from its installed wheel."""

from __future__ import annotations

import importlib.metadata as md
import json
from pathlib import Path

from .._plugins import ENTRY_POINT_GROUP, make_plugin_manager

__all__ = ["check_entry_point"]


def check_entry_point(name: str, *, distribution: str, module: str) -> None:
    """Assert that entry point ``name`` belongs to ``distribution`` and loads ``module``.

    The module must be the installed copy inside the distribution (not a source tree), carry at
    least one ``dsh`` hook implementation and register cleanly. An editable install cannot prove
    "from the wheel", so it skips with that reason; the nox sessions always install wheels.
    """
    found = [ep for ep in md.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    assert len(found) == 1, f"expected one {ENTRY_POINT_GROUP!r} entry point {name!r}, got {found}"
    (ep,) = found
    assert ep.value == module, f"{name!r} points at {ep.value!r}, expected {module!r}"
    dist = ep.dist
    assert dist is not None, f"{name!r} has no distribution"
    declared = dist.metadata["Name"]
    assert declared == distribution, f"{name!r} is declared by {declared!r}, not {distribution!r}"
    direct = dist.read_text("direct_url.json")
    if direct and json.loads(direct).get("dir_info", {}).get("editable"):
        import pytest  # only a test calls this; the rest of dsh_core.testing needs no pytest

        pytest.skip(f"{distribution} is installed editable; the wheel check runs under nox")
    loaded = ep.load()
    origin = Path(loaded.__file__ or "").resolve()
    files = {Path(str(dist.locate_file(f))).resolve() for f in dist.files or ()}
    assert origin in files, (
        f"{module} was imported from {origin}, not from the {distribution} wheel"
    )
    pm = make_plugin_manager(autoload=True, only=[name])
    assert not pm.failures, pm.failures
    assert pm.get_plugin(name) is loaded
    assert pm.get_hookcallers(loaded), f"{module} implements no dsh hook"
