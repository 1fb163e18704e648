"""Plugin config is structured strictly: a wrong type is an error naming the row and the key,
never a ``str()`` of it (host-core §1, dx 12.5)."""

from __future__ import annotations

import collections.abc as cabc
import datetime as dt
import types
import typing
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core import PluginError, PluginSpec, make_plugin_manager
from dsh_core._converter import type_name
from dsh_core._host import PluginRow, boot_host, load_composition, structure_config

#: Every installed plugin that takes config, found the way a host finds it.
CONFIGURED: dict[str, PluginSpec] = {
    name: spec
    for name, spec in make_plugin_manager(autoload=True, environ={}).collect_plugin_specs().items()
    if spec.config_type is not None
}


def field_types(cls: type) -> dict[str, Any]:
    return dict(typing.get_type_hints(cls))


def required_keys(cls: type) -> set[str]:
    """The keys a config must give (no default): a composition that leaves one out is refused."""
    return {f.name for f in attrs.fields(cls) if f.default is attrs.NOTHING}


def accepts(tp: Any, value: object) -> bool:
    """Whether a strict structuring of ``tp`` takes ``value`` as it is."""
    if tp is type(None):
        return value is None
    if tp is bool:
        return value is True or value is False
    if tp is int or tp is str:
        return type(value) is tp
    if tp is float:
        return type(value) in (int, float)
    if attrs.has(tp):  # a nested table: known keys only, each strictly of its type
        fields = field_types(tp)
        return (
            type(value) is dict
            and value.keys() <= fields.keys()
            and all(accepts(fields[k], v) for k, v in value.items())
        )
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(accepts(a, value) for a in typing.get_args(tp))
    if origin is tuple and typing.get_args(tp)[1:] == (Ellipsis,):
        item = typing.get_args(tp)[0]
        return type(value) is list and all(accepts(item, v) for v in value)
    if origin is list:
        (item,) = typing.get_args(tp)
        return type(value) is list and all(accepts(item, v) for v in value)
    if origin in (dict, cabc.Mapping):
        key, item = typing.get_args(tp)
        return (
            type(value) is dict
            and all(accepts(key, k) for k in value)
            and all(accepts(item, v) for v in value.values())
        )
    raise AssertionError(f"no strictness rule for config field type {tp!r}: add one here")


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.datetimes().map(lambda d: d.replace(tzinfo=dt.UTC)),  # TOML has date-times
)
config_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def values_of(tp: Any) -> st.SearchStrategy[Any]:
    """Values a strict structuring of ``tp`` accepts."""
    if attrs.has(tp):
        fields = field_types(tp)
        return st.fixed_dictionaries({}, optional={k: values_of(t) for k, t in fields.items()})
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([values_of(a) for a in typing.get_args(tp)])
    if origin is list or (origin is tuple and typing.get_args(tp)[1:] == (Ellipsis,)):
        return st.lists(values_of(typing.get_args(tp)[0]), max_size=3)
    if origin in (dict, cabc.Mapping):
        key, item = typing.get_args(tp)
        return st.dictionaries(values_of(key), values_of(item), max_size=3)
    simple: dict[Any, st.SearchStrategy[Any]] = {
        type(None): st.none(),
        bool: st.booleans(),
        int: st.integers(),
        float: st.floats(allow_nan=False),
        str: st.text(max_size=8),
    }
    return simple[tp]


def _table(tp: Any) -> bool:
    """Whether ``tp`` is a nested config table (an attrs class, optionally ``| None``)."""
    return attrs.has(tp) or any(attrs.has(a) for a in typing.get_args(tp))


def test_every_config_class_is_covered() -> None:
    """dx 12.5: the config classes of every installed plugin are found (dsh-core's at least;
    tests/test_discovery.py checks the subagent providers' are found with everything installed)."""
    assert set(CONFIGURED) >= {"session-persistence-jsonl", "llm-scripted", "system-prompt", "jobs"}
    for spec in CONFIGURED.values():
        assert spec.config_type is not None
        for tp in field_types(spec.config_type).values():
            accepts(tp, None)  # every field type has a strictness rule in this test


@given(data=st.data())
def test_a_wrong_typed_value_for_any_config_key_is_plugin_config(data: st.DataObject) -> None:
    """host-core §1, dx 12.5: for every plugin's config class, a config with wrong-typed values
    for some keys (and right ones for others) is refused with PLUGIN_CONFIG naming the row, the
    plugin, and each wrong key with its type."""
    name = data.draw(st.sampled_from(sorted(CONFIGURED)))
    spec = CONFIGURED[name]
    assert spec.config_type is not None
    fields = field_types(spec.config_type)
    wrong = data.draw(st.sets(st.sampled_from(sorted(fields)), min_size=1))
    config = {
        key: data.draw(
            config_values.filter(lambda v, k=key: not accepts(fields[k], v))
            if key in wrong
            else values_of(fields[key])
        )
        for key in data.draw(st.permutations(sorted(fields)))
        if key in wrong or key in required_keys(spec.config_type) or data.draw(st.booleans())
    }
    row = data.draw(st.integers(0, 20))
    with pytest.raises(PluginError) as err:
        structure_config(spec, config, row=row)
    message = str(err.value)
    assert err.value.code == "PLUGIN_CONFIG"
    assert message.startswith(f"plugins[{row}] (plugin {name!r}) config: ")
    for key in fields:  # every wrong key is named with its type; no right one is
        named = f"key {key!r} ({type_name(fields[key])}): " in message
        if _table(fields[key]):  # or a key inside it, by its dotted path
            named = named or f"key '{key}." in message
        assert named == (key in wrong)


@given(data=st.data())
def test_a_right_typed_value_is_taken_as_it_is(data: st.DataObject) -> None:
    """host-core §1, dx 12.5: a value of the declared type is structured unchanged, unless the
    key's own check refuses it (a timeout must be positive, say): then PLUGIN_CONFIG names the
    key, and never as a wrong type."""
    name = data.draw(st.sampled_from(sorted(CONFIGURED)))
    spec = CONFIGURED[name]
    assert spec.config_type is not None
    fields = field_types(spec.config_type)
    key = data.draw(st.sampled_from(sorted(fields)))
    value = data.draw(values_of(fields[key]))
    given = {k: data.draw(values_of(fields[k])) for k in sorted(required_keys(spec.config_type))}
    given[key] = value
    refused: PluginError | None = None
    try:
        config = structure_config(spec, given)
    except PluginError as err:
        refused = err
    if refused is not None:
        message = str(refused)
        assert refused.code == "PLUGIN_CONFIG"
        # A required key's check may refuse; a table's key is named with its entry ('k.e').
        assert any(f"key {k!r}" in message or f"key '{k}." in message for k in given)
        assert f"({type_name(fields[key])})" not in message
        return
    got = getattr(config, key)
    if _table(fields[key]) and value is not None:  # a table: each given key taken as it is
        for k, v in value.items():
            assert getattr(got, k) == (tuple(v) if type(v) is list else v)
        return
    assert got == value
    assert type(got) is type(value)


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        pytest.param({"cap": "3"}, "key 'cap' (int): expected an integer, got '3'", id="int-str"),
        pytest.param({"cap": 2.0}, "key 'cap' (int)", id="int-float"),
        pytest.param({"cap": True}, "key 'cap' (int)", id="int-bool"),
        pytest.param({"capp": 3}, "key 'capp' is unknown (known keys: ['cap'])", id="unknown"),
        pytest.param({"cap": 0}, "key 'cap' must be at least 1, got 0", id="zero"),
        pytest.param({"cap": -1}, "key 'cap' must be at least 1, got -1", id="negative"),
    ],
)
def test_jobs_cap_is_an_integer_and_nothing_else(config: dict[str, Any], needle: str) -> None:
    """host-core §1, dx 12.5: no int("3"), no int from a float or a boolean, no unknown key;
    a cap under 1 is refused by the config, naming the row and key (not at mount, unnamed)."""
    with pytest.raises(PluginError) as err:
        structure_config(CONFIGURED["jobs"], config, row=5)
    assert err.value.code == "PLUGIN_CONFIG"
    assert str(err.value).startswith("plugins[5] (plugin 'jobs') config: ")
    assert needle in str(err.value)


def test_scripted_model_provider_must_not_be_empty() -> None:
    """host-core §1, dx 12.5: `llm-scripted` with `provider = ""` is refused by the config,
    naming the row and key (an empty provider name routes nothing a request can name)."""
    with pytest.raises(PluginError) as err:
        structure_config(CONFIGURED["llm-scripted"], {"provider": ""}, row=3)
    assert err.value.code == "PLUGIN_CONFIG"
    assert str(err.value).startswith("plugins[3] (plugin 'llm-scripted') config: ")
    assert "key 'provider' must not be empty" in str(err.value)


@attrs.frozen(kw_only=True)
class Inner:
    """A nested config table."""

    level: int = 0


@attrs.frozen(kw_only=True)
class Outer:
    """A config class with every shape of field a plugin may use."""

    names: tuple[str, ...] = ()
    weights: dict[str, float] = attrs.field(factory=dict)
    inner: Inner = Inner()
    either: int | str = 0
    ratio: float = 1.0
    flag: bool = False


def test_nested_and_collection_fields_are_strict_and_name_the_path() -> None:
    """host-core §1, dx 12.5: arrays, tables, nested classes and unions are strict too."""

    spec = PluginSpec(name="outer", apply=lambda ctx, config: None, config_type=Outer)
    good = structure_config(
        spec, {"names": ["a"], "weights": {"w": 1}, "inner": {"level": 2}, "either": "x"}
    )
    assert good == Outer(names=("a",), weights={"w": 1}, inner=Inner(level=2), either="x")
    for config, needle in [
        ({"names": "ab"}, "key 'names'"),
        ({"names": ["a", 3]}, "item 1: expected a string, got 3"),
        ({"weights": {"w": "1"}}, "entry 'w': expected a number"),
        ({"weights": ["w"]}, "expected an object"),
        ({"inner": {"level": "2"}}, "key 'inner.level' (int)"),
        ({"inner": {"levle": 2}}, "key 'inner.levle' is unknown"),
        ({"either": 1.5}, "key 'either' (int | str): expected int | str, got 1.5"),
        ({"ratio": True}, "key 'ratio' (float): expected a number, got True"),
        ({"flag": "no"}, "key 'flag' (bool): expected a boolean, got 'no'"),
        ({"flag": 0}, "key 'flag' (bool)"),
    ]:
        with pytest.raises(PluginError) as err:
            structure_config(spec, config)
        assert err.value.code == "PLUGIN_CONFIG"
        assert needle in str(err.value), (config, str(err.value))


@attrs.frozen(kw_only=True)
class Needs:
    """A config class with a required key."""

    url: str


def test_a_required_key_that_is_missing_is_named() -> None:
    """host-core §1, dx 12.5: a config class field without a default is a named required key."""

    spec = PluginSpec(name="needs", apply=lambda ctx, config: None, config_type=Needs)
    with pytest.raises(PluginError) as err:
        structure_config(spec, {})
    assert "key 'url' (str): is required" in str(err.value)


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        pytest.param("plugin = 3", "`plugin` must be a string, got 3", id="plugin-int"),
        pytest.param(
            'plugin = "jobs"\ndisabled = "no"',
            "`disabled` must be a boolean, got 'no'",
            id="disabled-str",
        ),
        pytest.param('plugin = "jobs"\nconfig = 3', "`config` must be a table", id="config-int"),
    ],
)
def test_a_composition_row_is_strict_too(tmp_path: Path, row: str, needle: str) -> None:
    """host-core §1, dx 12.5: `disabled = "no"` does not disable a row, `plugin = 3` is not
    the plugin '3': each is PLUGIN_CONFIG naming the row."""
    path = tmp_path / "host.toml"
    path.write_text(f'[[plugins]]\nplugin = "sessions"\n\n[[plugins]]\n{row}\n')
    with pytest.raises(PluginError) as err:
        load_composition(path)
    assert err.value.code == "PLUGIN_CONFIG"
    assert "plugins[1]" in str(err.value) and needle in str(err.value)


async def test_rows_in_code_are_checked_like_rows_in_a_file() -> None:
    """host-core §1, dx 12.5: a mapping row in code with a wrong type fails PLUGIN_CONFIG."""
    pm = make_plugin_manager(autoload=False, plugins={})
    for rows in ([{"plugin": "x", "disabled": 1}], [{"plugin": "x", "confg": {}}], [3]):
        with pytest.raises(PluginError) as err:
            await boot_host(rows, pm=pm)  # type: ignore[arg-type]
        assert err.value.code == "PLUGIN_CONFIG"
        assert "plugins[0]" in str(err.value)


def test_a_plugin_row_made_in_code_is_checked() -> None:
    """host-core §1, dx 12.5: PluginRow itself refuses a wrong-typed field with PLUGIN_CONFIG."""
    for fields in ({"plugin": 3}, {"plugin": "x", "disabled": "no"}, {"plugin": "x", "config": 3}):
        with pytest.raises(PluginError) as err:
            PluginRow(**fields)  # type: ignore[arg-type]
        assert err.value.code == "PLUGIN_CONFIG"
    assert PluginRow(plugin="x", disabled=True).disabled is True
