"""Plugin discovery through the `dsh` entry-point group (host-core §1, [foundation] 2-3)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from dsh_core import PluginError, PluginSpec, hookimpl, make_plugin_manager
from dsh_core.cli import main
from dsh_core.testing import write_distribution

GOOD = """
from dsh_core import PluginSpec, hookimpl

@hookimpl
def dsh_plugins():
    return [PluginSpec(name="{spec}", apply=lambda ctx, config: None)]
"""


@pytest.fixture
def fake_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Three installed distributions: two good plugins and one that fails to import."""
    root = tmp_path / "site"
    write_distribution(
        root,
        "dsh-alpha",
        version="1.2.3",
        entry_points={"alpha": "alpha_plugin"},
        modules={"alpha_plugin": GOOD.format(spec="alpha")},
    )
    write_distribution(
        root,
        "dsh-beta",
        entry_points={"beta": "beta_plugin"},
        modules={"beta_plugin": GOOD.format(spec="beta")},
    )
    write_distribution(
        root,
        "dsh-broken",
        version="0.0.9",
        entry_points={"broken": "broken_plugin"},
        modules={"broken_plugin": "raise ImportError('this plugin is broken on purpose')\n"},
    )
    monkeypatch.syspath_prepend(str(root))
    return root


def test_broken_plugin_is_reported_not_fatal(fake_plugins: Path) -> None:
    """[foundation] A plugin failing to import is reported with name, distribution and error."""
    pm = make_plugin_manager(environ={}, only=["alpha", "beta", "broken"])
    assert sorted(d.name for d in pm.discovered) == ["alpha", "beta"]
    (failure,) = pm.failures
    assert (failure.name, failure.distribution, failure.version) == (
        "broken",
        "dsh-broken",
        "0.0.9",
    )
    assert "ImportError: this plugin is broken on purpose" in failure.message
    assert sorted(pm.collect_plugin_specs()) == ["alpha", "beta"]


def test_disable_autoload_env_loads_nothing(fake_plugins: Path) -> None:
    """[foundation] DSH_DISABLE_PLUGIN_AUTOLOAD=1 skips entry-point loading entirely."""
    pm = make_plugin_manager(environ={"DSH_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert pm.discovered == [] and pm.failures == []
    assert make_plugin_manager(environ={"DSH_DISABLE_PLUGIN_AUTOLOAD": "0"}).discovered


def test_dsh_plugins_env_selects_by_entry_point_or_distribution(fake_plugins: Path) -> None:
    """[foundation] DSH_PLUGINS=a,b loads only those names (entry point or distribution)."""
    pm = make_plugin_manager(environ={"DSH_PLUGINS": "alpha, dsh-beta"})
    assert sorted(d.name for d in pm.discovered) == ["alpha", "beta"]
    assert pm.failures == []
    assert make_plugin_manager(environ={"DSH_PLUGINS": ""}).discovered == []


def test_unknown_name_in_dsh_plugins_is_a_failure(fake_plugins: Path) -> None:
    """[foundation] A name in DSH_PLUGINS that matches nothing is reported, not ignored."""
    pm = make_plugin_manager(environ={"DSH_PLUGINS": "alpha,alhpa"})
    assert [d.name for d in pm.discovered] == ["alpha"]
    assert [f.name for f in pm.failures] == ["alhpa"]
    assert "no installed dsh plugin" in pm.failures[0].message


def test_discovered_plugin_records_distribution_and_version(fake_plugins: Path) -> None:
    """[foundation] Each loaded entry point knows its distribution, version and mounts."""
    pm = make_plugin_manager(environ={"DSH_PLUGINS": "alpha"})
    pm.collect_plugin_specs()
    (alpha,) = pm.discovered
    assert (alpha.distribution, alpha.version, alpha.value) == (
        "dsh-alpha",
        "1.2.3",
        "alpha_plugin",
    )
    assert [s.name for s in alpha.plugins] == ["alpha"]


def test_failing_hook_is_reported_and_others_survive() -> None:
    """[foundation] A plugin whose dsh_plugins hook raises is moved to failures."""

    class Bad:
        @hookimpl
        def dsh_plugins(self) -> list[PluginSpec]:
            raise RuntimeError("hook exploded")

    class Good:
        @hookimpl
        def dsh_plugins(self) -> list[PluginSpec]:
            return [PluginSpec(name="good", apply=lambda ctx, config: None)]

    pm = make_plugin_manager(autoload=False, plugins={"bad": Bad(), "good": Good()})
    assert list(pm.collect_plugin_specs()) == ["good"]
    assert [f.name for f in pm.failures] == ["bad"]
    assert "RuntimeError: hook exploded" in pm.failures[0].message
    assert pm.get_plugin("bad") is None
    assert [d.name for d in pm.discovered] == ["good"]


def test_misspelled_hook_is_a_validation_failure(
    fake_plugins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[foundation] A hookimpl matching no hookspec (a typo) is rejected, loudly."""
    write_distribution(
        fake_plugins / "typo",
        "dsh-typo",
        entry_points={"typo": "typo_plugin"},
        modules={
            "typo_plugin": "from dsh_core import hookimpl\n\n@hookimpl\ndef dsh_plugin():\n"
            "    return []\n"
        },
    )
    monkeypatch.syspath_prepend(str(fake_plugins / "typo"))
    pm = make_plugin_manager(environ={"DSH_PLUGINS": "typo"})
    assert [f.name for f in pm.failures] == ["typo"]
    assert "invalid hook implementation" in pm.failures[0].message
    assert pm.get_plugin("typo") is None


def test_duplicate_plugin_names_fail_loud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[foundation] Two distributions offering one plugin name fail with PLUGIN_DUPLICATE."""
    root = tmp_path / "dup"
    for dist in ("dsh-one", "dsh-two"):
        mod = dist.replace("-", "_")
        write_distribution(
            root, dist, entry_points={dist[4:]: mod}, modules={mod: GOOD.format(spec="same")}
        )
    monkeypatch.syspath_prepend(str(root))
    pm = make_plugin_manager(environ={"DSH_PLUGINS": "one,two"})
    with pytest.raises(PluginError) as info:
        pm.collect_plugin_specs()
    assert info.value.code == "PLUGIN_DUPLICATE"
    assert "'one'" in str(info.value) and "'two'" in str(info.value)


def test_cli_plugins_lists_and_exits_nonzero_on_failure(
    fake_plugins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[foundation] `dsh plugins` lists plugins with distribution and version; a failure -> 1."""
    monkeypatch.setenv("DSH_PLUGINS", "alpha,beta,broken")
    out = io.StringIO()
    assert main(["plugins"], out=out) == 1
    text = out.getvalue()
    assert "alpha" in text and "dsh-alpha" in text and "1.2.3" in text
    assert "broken (dsh-broken 0.0.9): import failed: ImportError" in text
    monkeypatch.setenv("DSH_PLUGINS", "alpha,beta")
    assert main(["plugins"], out=io.StringIO()) == 0


def test_cli_demo_runs_one_offline_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """[foundation] `dsh demo` lists the plugins and runs one turn on the scripted model."""
    monkeypatch.setenv("DSH_PLUGINS", "core")
    out = io.StringIO()
    assert main(["demo"], out=out) == 0
    text = out.getvalue()
    assert "mounts 'agents'" in text
    assert "assistant > hello from the demo" in text
    assert "turn/start" in text and "turn/end" in text
