"""The `dsh` console script over every installed distribution ([foundation] 2-3)."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsh_core import PluginError, make_plugin_manager
from dsh_core.testing import scripted_host, write_distribution

EVERY_ENTRY_POINT = {
    "core", "llm-openai", "acp-agent", "subagent", "subagent-spawn", "subagent-fork",
    "subagent-acp", "tool-subagent", "tool-subagent-control", "tool-subagent-report",
    "tool-subagent-list-agents", "subagents-cli",
}  # fmt: skip


def _dsh(
    *args: str, pythonpath: Path | None = None, dsh_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
    env.update(dsh_env or {})
    # The script imports the code this test process imports (a checkout's sources come first).
    paths = [*([str(pythonpath)] if pythonpath is not None else []), *filter(None, sys.path)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    script = Path(sys.executable).with_name("dsh-subagents")
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_every_distribution_announces_itself() -> None:
    """[foundation] Every distribution declares an entry point in the `dsh` group."""
    names = {ep.name for ep in md.entry_points(group="dsh")}
    assert names >= EVERY_ENTRY_POINT


def test_dsh_plugins_lists_everything_installed() -> None:
    """[foundation] `dsh-subagents plugins` lists every installed plugin and exits 0 when all
    load."""
    done = _dsh("plugins")
    assert done.returncode == 0, done.stdout + done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines()[1:] if line.strip()}
    assert listed == EVERY_ENTRY_POINT


def _install_broken(root: Path) -> None:
    """A distribution ``dsh-broken-fixture`` 9.9.9 under ``root`` whose entry point raises."""
    write_distribution(
        root,
        "dsh-broken-fixture",
        version="9.9.9",
        entry_points={"broken-fixture": "broken_fixture"},
        modules={"broken_fixture": "raise RuntimeError('broken on purpose')\n"},
    )


@pytest.fixture(scope="module")
def broken_listed(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """One `dsh-subagents plugins` with the broken distribution installed: its stdout and
    stderr are checked by the two tests below."""
    root = tmp_path_factory.mktemp("broken")
    _install_broken(root)
    return _dsh("plugins", pythonpath=root)


def test_broken_plugin_is_reported_by_the_cli(
    broken_listed: subprocess.CompletedProcess[str],
) -> None:
    """[foundation] A broken installed plugin is named with its distribution; others still load."""
    done = broken_listed
    assert done.returncode == 1
    assert "broken-fixture (dsh-broken-fixture 9.9.9)" in done.stdout
    assert "RuntimeError: broken on purpose" in done.stdout
    listed = {line.split()[0] for line in done.stdout.split("\n\n")[0].splitlines()[1:]}
    assert listed == EVERY_ENTRY_POINT


def test_disabled_autoload_with_a_plugin_list_loads_the_list(tmp_path: Path) -> None:
    """host-core §1, dx 12.6: `DSH_DISABLE_PLUGIN_AUTOLOAD=1 DSH_PLUGINS=core,dsh-subagent`
    lists exactly those two; a broken plugin not named is neither loaded nor reported."""
    _install_broken(tmp_path)
    env = {"DSH_DISABLE_PLUGIN_AUTOLOAD": "1", "DSH_PLUGINS": "core,dsh-subagent"}
    done = _dsh("plugins", pythonpath=tmp_path, dsh_env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines()[1:] if line.strip()}
    assert listed == {"core", "subagent"}


def test_a_broken_plugin_is_a_warning_on_stderr(
    broken_listed: subprocess.CompletedProcess[str],
) -> None:
    """host-core §1, dx 12.6: the import failure is also logged (logger `dsh.plugins`), once."""
    done = broken_listed
    warned = [line for line in done.stderr.splitlines() if "broken-fixture" in line]
    assert len(warned) == 1, done.stderr
    assert "'broken-fixture' (dsh-broken-fixture 9.9.9) failed to load" in warned[0]
    assert "RuntimeError: broken on purpose" in warned[0]


def test_the_config_property_covers_the_providers_config_classes() -> None:
    """dx 12.5: with every distribution installed, the strict-config property test of dsh-core
    (packages/core/tests/test_config.py) sees the spawn and fork config classes too."""
    specs = make_plugin_manager(autoload=True, environ={}).collect_plugin_specs()
    configured = {name for name, spec in specs.items() if spec.config_type is not None}
    assert configured >= {"subagent-spawn", "subagent-fork"}


@pytest.mark.parametrize("value", [3, ["a"], None, True, {"a": 1}])
async def test_a_provider_name_that_is_not_a_string_registers_nothing(value: object) -> None:
    """SVC-12, dx 12.5: `provider_name = 3` or `["a"]` fails the boot with PLUGIN_CONFIG; it
    does not register a provider named '3' or "['a']"."""
    for plugin in ("subagent-spawn", "subagent-fork"):
        with pytest.raises(PluginError) as err:
            async with scripted_host(
                "subagent",
                plugin,
                load=("dsh-subagent", f"dsh-{plugin}"),
                config={plugin: {"provider_name": value}},
            ):
                pass
        assert err.value.code == "PLUGIN_CONFIG"
        assert f"(plugin {plugin!r})" in str(err.value)
        assert "key 'provider_name' (str): expected a string" in str(err.value)


async def test_a_test_host_loads_installed_plugins_by_distribution_name() -> None:
    """host-core §1, dx 12.7: `load=` takes installed entry-point or distribution names, with
    no hand-made modules map; the rows then mount what they offer."""
    async with scripted_host(
        "subagent", "subagent-spawn", load=("subagent", "dsh-subagent-spawn")
    ) as h:
        assert h.ctx.subagents.get_provider("spawn") is not None
        spawn = next(d for d in h.runtime.pm.discovered if d.name == "subagent-spawn")
        assert spawn.distribution == "dsh-subagent-spawn"
