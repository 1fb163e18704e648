"""Booting a host from a composition: order, resolution, config, teardown (host-core §1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from dsh_core import Context, PluginError, PluginSpec, make_plugin_manager
from dsh_core import plugin as core_plugin
from dsh_core._host import PluginRow, boot_host, load_composition


@attrs.frozen(kw_only=True)
class GreeterConfig:
    """Config of the test plugin ``greeter``."""

    greeting: str = "hello"
    times: int = 1


class Recorder:
    """Plugins that record when they are applied and disposed."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def spec(
        self,
        name: str,
        *,
        requires: tuple[str, ...] = (),
        provides: tuple[str, ...] = (),
        config_type: type | None = None,
        fail: bool = False,
        skip_provide: bool = False,
    ) -> PluginSpec:
        events = self.events

        def apply(ctx: Context, config: Any) -> None:
            events.append(f"apply {name}" + (f" {config!r}" if config is not None else ""))
            ctx.effect(lambda: lambda: events.append(f"dispose {name}"))
            if fail:
                raise RuntimeError(f"{name} failed to apply")
            if not skip_provide:
                for service in provides:
                    ctx.provide(service, object())

        return PluginSpec(
            name=name,
            apply=apply,
            requires=requires,
            provides=provides,
            config_type=config_type,
        )


def pm() -> Any:
    """A plugin manager with autoload off and only the core plugins registered."""
    return make_plugin_manager(autoload=False, plugins={"core": core_plugin})


async def test_boot_from_rows_applies_in_dependency_order_and_disposes_in_reverse() -> None:
    """host-core §1: rows apply in a stable topological order; teardown runs in reverse."""
    rec = Recorder()
    specs = [
        rec.spec("app", requires=("db", "cache")),
        rec.spec("cache", requires=("db",), provides=("cache",)),
        rec.spec("db", provides=("db",)),
        rec.spec("standalone"),
    ]
    runtime = await boot_host(["app", "cache", "db", "standalone"], pm=pm(), extra=specs)
    assert rec.events == ["apply db", "apply cache", "apply app", "apply standalone"]
    assert [name for name, _ in runtime.mounted] == ["db", "cache", "app", "standalone"]
    await runtime.dispose()
    assert rec.events[4:] == [
        "dispose standalone",
        "dispose app",
        "dispose cache",
        "dispose db",
    ]


async def test_boot_from_a_toml_composition_with_config_and_disabled_rows(tmp_path: Path) -> None:
    """host-core §1: a TOML [[plugins]] composition boots alike; disabled rows are skipped."""
    path = tmp_path / "host.toml"
    path.write_text(
        """
[[plugins]]
plugin = "greeter"
config = { greeting = "hi", times = 2 }

[[plugins]]
plugin = "sessions"

[[plugins]]
plugin = "off"
disabled = true
""",
        encoding="utf-8",
    )
    rows = load_composition(path)
    assert rows == [
        PluginRow(plugin="greeter", config={"greeting": "hi", "times": 2}),
        PluginRow(plugin="sessions"),
        PluginRow(plugin="off", disabled=True),
    ]
    rec = Recorder()
    extra = [rec.spec("greeter", config_type=GreeterConfig), rec.spec("off")]
    async with await boot_host(rows, pm=pm(), extra=extra) as runtime:
        assert rec.events == ["apply greeter GreeterConfig(greeting='hi', times=2)"]
        assert runtime.ctx.get("sessions") is not None
    assert rec.events[-1] == "dispose greeter"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("plugins = 3", id="plugins-not-a-list"),
        pytest.param("[[plugins]]\nconfig = {}\n", id="row-without-plugin"),
        pytest.param('[[plugins]]\nplugin = "a"\nextra = 1\n', id="unknown-row-key"),
        pytest.param('other = 1\n[[plugins]]\nplugin = "a"\n', id="unknown-top-level-key"),
        pytest.param("[[plugins]\n", id="not-toml"),
        pytest.param('[[plugins]]\nplugin = "caf\xe9"\n', id="not-utf-8"),
        pytest.param("x = " + "[" * 100_000 + "]" * 100_000, id="nested-too-deep"),
    ],
)
def test_malformed_composition_file_fails_plugin_config(tmp_path: Path, text: str) -> None:
    """host-core §1: a malformed composition file fails PLUGIN_CONFIG (one not in UTF-8, or
    nested too deep to parse, too: never a UnicodeDecodeError or a RecursionError)."""
    path = tmp_path / "host.toml"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(PluginError) as err:
        load_composition(path)
    assert err.value.code == "PLUGIN_CONFIG"


async def test_missing_required_service_is_plugin_unresolved() -> None:
    """host-core §1: a row requiring a service nobody provides fails PLUGIN_UNRESOLVED at boot."""
    rec = Recorder()
    with pytest.raises(PluginError) as err:
        await boot_host(["app"], pm=pm(), extra=[rec.spec("app", requires=("db",))])
    assert err.value.code == "PLUGIN_UNRESOLVED"
    assert "db" in str(err.value)
    assert rec.events == []


async def test_dependency_cycle_is_plugin_unresolved() -> None:
    """host-core §1: a cycle over requires/provides fails PLUGIN_UNRESOLVED before any apply."""
    rec = Recorder()
    specs = [
        rec.spec("a", requires=("b",), provides=("a",)),
        rec.spec("b", requires=("a",), provides=("b",)),
    ]
    with pytest.raises(PluginError) as err:
        await boot_host(["a", "b"], pm=pm(), extra=specs)
    assert err.value.code == "PLUGIN_UNRESOLVED"
    assert "cycle" in str(err.value)
    assert rec.events == []


async def test_unknown_plugin_row_fails() -> None:
    """host-core §1: a row naming no installed plugin fails PLUGIN_UNKNOWN."""
    with pytest.raises(PluginError) as err:
        await boot_host(["nope"], pm=pm())
    assert err.value.code == "PLUGIN_UNKNOWN"


@pytest.mark.parametrize(
    ("config", "key"),
    [
        pytest.param({"greting": "hi"}, "greting", id="unknown-key"),
        pytest.param({"times": "many"}, "times", id="wrong-type"),
    ],
)
async def test_bad_config_is_plugin_config_naming_plugin_and_key(
    config: dict[str, Any], key: str
) -> None:
    """host-core §1: cattrs structures row config; a bad key/type names the plugin and key."""
    rec = Recorder()
    rows = [PluginRow(plugin="greeter", config=config)]
    with pytest.raises(PluginError) as err:
        await boot_host(rows, pm=pm(), extra=[rec.spec("greeter", config_type=GreeterConfig)])
    assert err.value.code == "PLUGIN_CONFIG"
    assert "greeter" in str(err.value)
    assert key in str(err.value)
    assert rec.events == []


async def test_config_for_a_plugin_without_config_type_fails() -> None:
    """host-core §1: a plugin without config_type refuses any config keys."""
    rec = Recorder()
    rows = [PluginRow(plugin="plain", config={"x": 1})]
    with pytest.raises(PluginError) as err:
        await boot_host(rows, pm=pm(), extra=[rec.spec("plain")])
    assert err.value.code == "PLUGIN_CONFIG"
    assert "plain" in str(err.value) and "x" in str(err.value)


async def test_failing_apply_disposes_what_was_applied_in_reverse() -> None:
    """host-core §1: a row failing to apply disposes itself and the earlier rows, in reverse."""
    rec = Recorder()
    specs = [
        rec.spec("first", provides=("one",)),
        rec.spec("second", requires=("one",), provides=("two",)),
        rec.spec("broken", requires=("two",), fail=True),
        rec.spec("never"),
    ]
    with pytest.raises(RuntimeError, match="broken failed"):
        await boot_host(["first", "second", "broken", "never"], pm=pm(), extra=specs)
    assert rec.events == [
        "apply first",
        "apply second",
        "apply broken",
        "dispose broken",
        "dispose second",
        "dispose first",
    ]


async def test_plugin_that_does_not_provide_what_it_promised_fails() -> None:
    """host-core §1: provides is checked after apply (PLUGIN_UNRESOLVED) and rolled back."""
    rec = Recorder()
    with pytest.raises(PluginError) as err:
        await boot_host(
            ["liar"], pm=pm(), extra=[rec.spec("liar", provides=("db",), skip_provide=True)]
        )
    assert err.value.code == "PLUGIN_UNRESOLVED"
    assert rec.events == ["apply liar", "dispose liar"]


async def test_core_plugins_boot_in_default_order_and_unwind_services() -> None:
    """host-core §1: the built-in plugins register through the same rows and unwind on dispose."""
    runtime = await boot_host(list(core_plugin.DEFAULT_COMPOSITION), pm=pm())
    ctx = runtime.ctx
    for service in ("sessions", "llm", "tools", "system_prompt", "agents", "jobs"):
        assert ctx.get(service) is not None
    await runtime.dispose()
    for service in ("sessions", "llm", "tools", "system_prompt", "agents", "jobs"):
        assert ctx.get(service) is None
