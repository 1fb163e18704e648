"""Write a minimal installed distribution (dist-info + modules) into a folder on ``sys.path``.

Lets tests exercise real entry-point discovery through ``importlib.metadata`` without pip.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["write_distribution"]


def write_distribution(
    root: Path,
    name: str,
    *,
    version: str = "0.0.1",
    entry_points: Mapping[str, str] | None = None,
    modules: Mapping[str, str] | None = None,
) -> Path:
    """Create distribution ``name`` under ``root`` with ``dsh`` entry points and module sources.

    :param entry_points: entry-point name -> ``module`` (the ``dsh`` group).
    :param modules: module name -> source text, written as ``<root>/<module>.py``.
    :return: ``root``, ready for ``sys.path`` (e.g. ``monkeypatch.syspath_prepend``).
    """
    root.mkdir(parents=True, exist_ok=True)
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "".join(f"{ep} = {target}\n" for ep, target in (entry_points or {}).items())
    (info / "entry_points.txt").write_text(f"[dsh]\n{lines}")
    for module, source in (modules or {}).items():
        (root / f"{module}.py").write_text(source)
    return root
