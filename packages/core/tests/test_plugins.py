"""Plugin discovery through the `dsh` entry-point group (host-core §1, [foundation] 2-3)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dsh_core import PluginError, PluginSpec, hookimpl, make_plugin_manager
from dsh_core._host import boot_host
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


def test_disable_autoload_with_dsh_plugins_loads_exactly_the_named(fake_plugins: Path) -> None:
    """host-core §1, dx 12.6: DSH_DISABLE_PLUGIN_AUTOLOAD=1 with DSH_PLUGINS=a,b is honoured:
    only the named plugins load (the list is not silently ignored)."""
    env = {"DSH_DISABLE_PLUGIN_AUTOLOAD": "1", "DSH_PLUGINS": "alpha,dsh-beta"}
    pm = make_plugin_manager(environ=env)
    assert sorted(d.name for d in pm.discovered) == ["alpha", "beta"]
    assert pm.failures == []
    typo = make_plugin_manager(environ={**env, "DSH_PLUGINS": "alhpa"})
    assert [f.name for f in typo.failures] == ["alhpa"]


def test_explicit_autoload_false_ignores_dsh_plugins_from_the_environment(
    fake_plugins: Path,
) -> None:
    """host-core §1, dx 12.6: a caller that turns autoload off in code (a test host) loads no
    entry point, whatever DSH_PLUGINS says; an explicit `only` still loads those names."""
    assert make_plugin_manager(autoload=False, environ={"DSH_PLUGINS": "alpha"}).discovered == []
    pm = make_plugin_manager(autoload=False, only=["beta"], environ={"DSH_PLUGINS": "alpha"})
    assert [d.name for d in pm.discovered] == ["beta"]


def broken_distribution(root: Path, tag: str) -> str:
    """An installed distribution ``dsh-broken-<tag>`` whose plugin module fails to import."""
    module = f"broken_{tag}"
    write_distribution(
        root,
        f"dsh-broken-{tag}",
        version="0.3.0",
        entry_points={f"broken-{tag}": module},
        modules={module: f"raise ImportError('broken {tag} on purpose')\n"},
    )
    return f"broken-{tag}"


def test_an_import_failure_is_logged_once_per_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """host-core §1, dx 12.6: a plugin that fails to import is a warning on `dsh.plugins`
    naming the entry point, its distribution and the error, once however often it is
    discovered again."""
    tag = tmp_path.name.replace("-", "_")
    name = broken_distribution(tmp_path / "site", tag)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with caplog.at_level(logging.WARNING, logger="dsh.plugins"):
        for _ in range(3):
            pm = make_plugin_manager(environ={"DSH_PLUGINS": name})
            assert [f.name for f in pm.failures] == [name]
    records = [r for r in caplog.records if r.name == "dsh.plugins"]
    assert len(records) == 1
    (record,) = records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert f"{name!r} (dsh-broken-{tag} 0.3.0)" in message
    assert f"ImportError: broken {tag} on purpose" in message


async def test_plugin_unknown_names_the_import_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """host-core §1, dx 12.6: mounting a plugin whose entry point failed to import says
    PLUGIN_UNKNOWN *and* why: the failed entry point and its error."""
    tag = tmp_path.name.replace("-", "_")
    name = broken_distribution(tmp_path / "site", tag)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    pm = make_plugin_manager(environ={"DSH_PLUGINS": name})
    with pytest.raises(PluginError) as err:
        await boot_host([name], pm=pm)
    assert err.value.code == "PLUGIN_UNKNOWN"
    message = str(err.value)
    assert f"no installed plugin mounts {name!r}" in message
    assert f"entry point {name!r} (dsh-broken-{tag} 0.3.0) failed to load" in message
    assert f"ImportError: broken {tag} on purpose" in message


async def test_plugin_unknown_lists_every_failure_when_none_matches_the_name(
    fake_plugins: Path,
) -> None:
    """host-core §1, dx 12.6: when no failed entry point has the row's name, PLUGIN_UNKNOWN
    still lists the failures, any of which might have mounted it; without failures it does not."""
    pm = make_plugin_manager(environ={"DSH_PLUGINS": "alpha,broken"})
    with pytest.raises(PluginError) as err:
        await boot_host(["gamma"], pm=pm)
    assert err.value.code == "PLUGIN_UNKNOWN"
    assert "1 plugin failed to load and may mount it" in str(err.value)
    assert "broken (dsh-broken 0.0.9): import failed: ImportError" in str(err.value)
    with pytest.raises(PluginError) as clean:
        await boot_host(["gamma"], pm=make_plugin_manager(environ={"DSH_PLUGINS": "alpha"}))
    assert "failed to load" not in str(clean.value)


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
