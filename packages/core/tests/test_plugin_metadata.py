"""Discovery reads a plugin's distribution name and version from its metadata file's head
(CLI-75): what parsing the whole file gives, without parsing it whole."""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

import pytest

from dsh_core import make_plugin_manager
from dsh_core._plugins import _dist_of
from dsh_core.testing import write_distribution

PLUGIN = """
from dsh_core import hookimpl

@hookimpl
def dsh_plugins():
    return []
"""


def test_every_installed_plugin_is_named_as_its_parsed_metadata_names_it() -> None:
    """CLI-75: for every installed `dsh` entry point, the distribution and version discovery
    records are the parsed metadata's `Name` and `Version`."""
    eps = list(md.entry_points(group="dsh"))
    assert eps
    for ep in eps:
        assert ep.dist is not None
        assert _dist_of(ep) == (ep.dist.metadata["Name"], ep.dist.version), ep.name


@pytest.mark.parametrize(
    "metadata",
    [
        "Metadata-Version: 2.1\nName: dsh-odd\nSummary: one\n  folded\nVersion: 4.5.6\n",
        "Metadata-Version: 2.1\nName: dsh-odd\n\nVersion: 9.9.9 (in the body)\n",
        "Metadata-Version: 2.1\nVersion: 4.5.6\nName:  dsh-odd \n\nlong description\n",
        "Metadata-Version: 2.1\nName: dsh-odd\n  -folded\nVersion: 4.5.6\n",
    ],
)
def test_a_metadata_head_read_plainly_or_parsed_names_the_same(
    metadata: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CLI-75: a folded header, a value only in the body or one with spaces around it: the
    plugin's distribution and version are what the parsed metadata says."""
    root = write_distribution(
        tmp_path / "site",
        "dsh-odd",
        version="4.5.6",
        entry_points={"odd": "odd_plugin"},
        modules={"odd_plugin": PLUGIN},
    )
    (root / "dsh_odd-4.5.6.dist-info" / "METADATA").write_text(metadata)
    monkeypatch.syspath_prepend(str(root))
    (ep,) = [e for e in md.entry_points(group="dsh") if e.name == "odd"]
    assert ep.dist is not None
    parsed = (ep.dist.metadata.get("Name"), ep.dist.metadata.get("Version"))
    assert _dist_of(ep) == parsed
    pm = make_plugin_manager(autoload=False, only=["odd"])
    (found,) = pm.discovered
    assert (found.distribution, found.version) == parsed
