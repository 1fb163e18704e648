"""What a host's start leaves for later (PERF-10..PERF-21): work and imports a run may never
need are done on first use. The start-up figures are measured in benchmarks/cli_start.py,
never asserted here; these tests prove the laziness they rely on, and that it changes no
behaviour.
"""

from __future__ import annotations

import asyncio
import importlib.metadata as md
import inspect
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import attr._make
import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_core import (
    PluginError,
    PluginSpec,
    ToolDefinition,
    ToolResultBlock,
    ToolRunContext,
    _events,
    _frozen,
    _host,
    attrs_eq,
    attrs_hash,
    attrs_repr,
    blocks_text,
    dumps,
    make_plugin_manager,
    structure_config,
)
from dsh_core._converter import config_converter, converter
from dsh_core._entry_points import entry_points
from dsh_core._events import SessionHeader, encode_header
from dsh_core._frozen import speed_up_inits
from dsh_core._tools import _compiled
from dsh_core.testing import ScriptedReply, ScriptedToolCall, scripted_host


async def _echo(args: Any, run: ToolRunContext) -> str:
    return dumps(args)


def _tool(name: str, parameters: dict[str, Any]) -> ToolDefinition:
    return ToolDefinition(name=name, description="d", parameters=parameters, execute=_echo)


async def _call(tool: ToolDefinition, arguments: str) -> tuple[str | None, str]:
    """One turn that calls ``tool`` once: the result's error code and its text."""
    replies = [
        ScriptedReply(tool_calls=(ScriptedToolCall(name=tool.name, arguments=arguments),)),
        "done",
    ]
    async with scripted_host(model=replies) as host:
        host.ctx.tools.register(tool)
        agent = (await host.create_agent()).agent
        await asyncio.wait_for(host.run(agent, "go"), 10)
        result = next(e for e in agent.session.events if e.type == "tool/result")
        error = result.data.error
        (block,) = result.data.message.content
        assert isinstance(block, ToolResultBlock)
        return (error.code if error else None), blocks_text(block.content)


async def test_registering_a_tool_compiles_no_validator() -> None:
    """PERF-11: registering a tool compiles none of its schemas; its first call does, once,
    and validates exactly as an eagerly compiled one (a bad argument is INVALID_ARGS)."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 7}}}
    tool = _tool("lazy_check", schema)
    before = _compiled.cache_info()
    async with scripted_host() as host:
        host.ctx.tools.register(tool)
        assert _compiled.cache_info() == before
    assert await _call(tool, '{"n": 8}') == (None, '{"n":8}')
    code, text = await _call(tool, '{"n": 3}')
    assert code == "INVALID_ARGS"
    assert "lazy_check" in text


async def test_a_schema_the_validator_cannot_compile_fails_its_first_call() -> None:
    """PERF-11: a parameters schema fastjsonschema cannot compile no longer fails at
    registration (nothing compiles then): each call of the tool is an error result
    TOOL_SCHEMA_INVALID in plain words, and the turn goes on."""
    tool = _tool("broken", {"type": "object", "properties": {"s": {"pattern": "("}}})
    code, text = await _call(tool, '{"s": "x"}')
    assert code == "TOOL_SCHEMA_INVALID"
    assert text.startswith('Error: tool "broken" cannot be used')
    assert "fastjsonschema" not in text and "Exception" not in text


#: Imported by none of ``import dsh_core`` and a host's discovery and boot (PERF-10): each
#: is imported where it is used (a config file read, a schema validated) or not at all.
LAZY = ("fastjsonschema", "tomllib", "importlib.metadata", "email", "zipfile", "csv")

_BOOT = """
import asyncio, json, sys
import dsh_core
from dsh_core import PluginRow, boot_host, make_plugin_manager

async def main():
    pm = make_plugin_manager(autoload=True)
    names = ("sessions", "llm", "llm-scripted", "tools", "system-prompt", "agents")
    rows = [PluginRow(plugin=n) for n in names]
    host = await boot_host(rows, pm=pm)
    await host.dispose()

asyncio.run(main())
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in WATCH or m in WATCH)))
"""


def test_import_and_boot_leave_the_lazy_modules_alone() -> None:
    """PERF-10: `import dsh_core`, discovering every installed plugin and booting a host
    import none of fastjsonschema, tomllib, importlib.metadata (nor its email, zipfile and
    csv): each is imported on first use."""
    code = f"WATCH = {LAZY!r}\n" + _BOOT
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []


def _dsh_points(points: Any) -> list[tuple[str, str, str]]:
    return [(ep.name, ep.value, os.fspath(ep.dist._path)) for ep in points]


def test_discovery_lists_what_importlib_metadata_lists() -> None:
    """PERF-12: the entry points discovery reads itself are those of
    importlib.metadata.entry_points, in the same order, from the same distributions."""
    for group in ("dsh", "console_scripts", "pytest11"):
        ours = _dsh_points(entry_points(group))
        assert ours == _dsh_points(md.entry_points(group=group)), group
    assert entry_points("dsh"), "the project's own plugins are installed"


def _dist(root: Path, folder: str, text: str) -> None:
    (root / folder).mkdir(parents=True)
    (root / folder / "entry_points.txt").write_text(text, encoding="utf-8")


def test_discovery_order_and_shadowing_match_importlib_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PERF-12: on folders of its own (a name twice on the path, versions side by side,
    sections and comments), discovery keeps importlib.metadata's order and lets the first
    distribution of a normalized name shadow the later ones."""
    a, b = tmp_path / "a", tmp_path / "b"
    _dist(a, "zeta_pkg-1.0.dist-info", "[dsh]\nz = zeta.plugin\n[other]\nq = q\n")
    _dist(a, "Alpha.Pkg-2.0.dist-info", "# c\n[dsh]\n  one = alpha.one:hook \n\ntwo=alpha.two\n")
    _dist(a, "old-0.1.egg-info", "[dsh]\nold = old_mod\n")
    _dist(b, "alpha_pkg-3.0.dist-info", "[dsh]\nshadowed = never\n")
    _dist(b, "beta-1.0.dist-info", "[dsh]\nb = beta:x.y [extra]\n")
    monkeypatch.setattr(sys, "path", [str(a), str(tmp_path / "missing"), str(b)])
    md.FastPath.__new__.cache_clear()  # type: ignore[attr-defined]
    ours = _dsh_points(entry_points("dsh"))
    assert ours == _dsh_points(md.entry_points(group="dsh"))
    assert {name for name, _, _ in ours} == {"z", "one", "two", "old", "b"}


def test_discovery_leaves_what_it_does_not_reproduce_to_importlib_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PERF-12: a zip on the path, or a line importlib.metadata would refuse, makes
    discovery ask importlib.metadata itself (same answer, or the same error)."""
    _dist(tmp_path, "odd-1.0.dist-info", "[dsh]\nno equals sign here\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    md.FastPath.__new__.cache_clear()  # type: ignore[attr-defined]
    with pytest.raises(Exception) as theirs:
        list(md.entry_points(group="dsh"))
    with pytest.raises(theirs.type):
        list(entry_points("dsh"))
    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped-1.0.dist-info/entry_points.txt", "[dsh]\nzipped = zipped_mod\n")
        z.writestr("zipped-1.0.dist-info/METADATA", "Name: zipped\nVersion: 1.0\n")
    monkeypatch.setattr(sys, "path", [str(archive)])
    md.FastPath.__new__.cache_clear()  # type: ignore[attr-defined]
    found = list(entry_points("dsh"))
    assert [(ep.name, ep.value) for ep in found] == [("zipped", "zipped_mod")]
    assert isinstance(found[0], md.EntryPoint)


def _shared_repr_classes() -> list[type]:
    """Every attrs class of the installed dsh distributions that uses :func:`attrs_repr`."""
    import importlib
    import pkgutil

    found: list[type] = []
    for ep in entry_points("dsh"):
        top = ep.value.split(":")[0].split(".")[0]
        package = importlib.import_module(top)
        names = [top] + [
            m.name
            for m in pkgutil.walk_packages(package.__path__, f"{top}.")
            if ".tests" not in m.name and not m.name.endswith(("pytest_plugin", "__main__"))
        ]
        for name in names:
            module = importlib.import_module(name)
            for value in vars(module).values():
                if (
                    isinstance(value, type)
                    and value.__module__ == name
                    and attrs.has(value)
                    and value.__dict__.get("__repr__") is attrs_repr
                    and value not in found
                ):
                    found.append(value)
    return found


def _attrs_generated_repr(cls: type) -> Any:
    """The ``__repr__`` attrs itself would have compiled for ``cls``."""
    script, globs = attr._make._make_repr_script(attrs.fields(cls), None)
    exec(compile(script, "<attrs repr>", "exec"), globs)
    return globs["__repr__"]


def test_the_shared_repr_is_the_one_attrs_would_generate() -> None:
    """PERF-13: each class that says ``__repr__ = attrs_repr`` (the installed dsh packages'
    own) reprs exactly as attrs' generated ``__repr__`` does: every field shown, custom field
    reprs, unset fields, a value met again while being shown."""
    classes = _shared_repr_classes()
    assert len(classes) > 60  # dsh-core's own alone: about 90; more with the plugins installed
    samples: list[Any] = [1, "two", None, (3, "x"), {"k": [1.5]}, b"\x00"]
    for cls in classes:
        expected = _attrs_generated_repr(cls)
        fields = attrs.fields(cls)
        for round_ in range(3):
            value = object.__new__(cls)
            for i, field in enumerate(fields):
                if not field.init and round_ == 2:
                    continue  # left unset: attrs shows NOTHING, or fails as it would
                object.__setattr__(value, field.name, samples[(i + round_) % len(samples)])
            if round_ == 1 and fields:  # the value inside itself
                object.__setattr__(value, fields[0].name, [value])
            try:
                wanted = expected(value)
            except AttributeError:
                with pytest.raises(AttributeError):
                    attrs_repr(value)
                continue
            assert attrs_repr(value) == wanted == repr(value), cls


@attrs.frozen
class _Custom:
    __repr__ = attrs_repr

    shown: int
    hidden: int = attrs.field(repr=False)
    custom: int = attrs.field(repr=lambda v: f"<{v}>")
    later: int = attrs.field(init=False, default=5)


@attrs.frozen(repr=False)
class _Quiet(_Custom):
    extra: int = 0


def test_the_shared_repr_honours_field_options() -> None:
    """PERF-13: ``repr=False`` hides a field, a ``repr`` callable formats it, a field set
    outside ``__init__`` shows as attrs shows it, a subclass made with ``repr=False`` shows
    its base's fields; the same text as attrs' own."""
    value = _Custom(shown=1, hidden=2, custom=3)
    assert repr(value) == "_Custom(shown=1, custom=<3>, later=5)"
    assert repr(value) == _attrs_generated_repr(_Custom)(value)
    quiet = _Quiet(shown=1, hidden=2, custom=3, extra=4)  # inherits its base's repr
    assert repr(quiet) == "_Quiet(shown=1, custom=<3>, later=5)"
    assert repr(quiet) == _attrs_generated_repr(_Custom)(quiet)


def test_an_empty_config_is_built_as_the_converter_builds_it() -> None:
    """PERF-14: an empty config table of a class whose every field has a default is that
    class's defaults, equal to what the config converter structures (every installed
    plugin's config class), and no structure function is generated for it."""
    specs = make_plugin_manager(autoload=True).collect_plugin_specs()
    defaulted = [
        s
        for s in specs.values()
        if s.config_type is not None
        and attrs.has(s.config_type)
        and all(f.default is not attrs.NOTHING for f in attrs.fields(s.config_type) if f.init)
    ]
    assert len(defaulted) >= 4  # dsh-core's own alone: 6; more with the plugins installed
    for spec in defaulted:
        built = structure_config(spec, {})
        assert type(built) is spec.config_type
        expected = config_converter.structure({}, spec.config_type)
        assert attrs.asdict(built) == attrs.asdict(expected), spec.name

    @attrs.frozen(kw_only=True)
    class Fresh:
        size: int = 3
        names: tuple[str, ...] = ()

    dispatch = config_converter._structure_func.dispatch
    before = dispatch.cache_info().currsize  # type: ignore[attr-defined]
    fresh = structure_config(PluginSpec(name="f", apply=lambda c, x: None, config_type=Fresh), {})
    assert fresh == Fresh()
    assert dispatch.cache_info().currsize == before  # type: ignore[attr-defined]


def test_a_config_with_keys_or_a_required_field_still_goes_through_the_converter() -> None:
    """PERF-14: a table with keys, or a class with a required field, is structured (and
    refused) by the converter exactly as before."""

    @attrs.frozen(kw_only=True)
    class Needs:
        name: str
        size: int = 3

    spec = PluginSpec(name="needs", apply=lambda ctx, config: None, config_type=Needs)
    with pytest.raises(PluginError) as info:
        structure_config(spec, {})
    assert "'name'" in str(info.value) and "is required" in str(info.value)
    assert structure_config(spec, {"name": "x"}) == Needs(name="x")
    with pytest.raises(PluginError, match="size"):
        structure_config(spec, {"name": "x", "size": "3"})


def test_a_faster_init_is_made_at_the_first_construction() -> None:
    """PERF-15: speed_up_inits compiles nothing for a class until it is first constructed:
    before, the class has attrs' signature and is built by attrs' rules; its first
    construction puts the faster __init__ in place, once, and builds the same value."""

    @attrs.frozen(kw_only=True)
    class Late:
        name: str
        size: int = 2
        tags: tuple[str, ...] = attrs.field(factory=tuple, converter=tuple)

    original = Late.__init__
    signature = inspect.signature(Late)
    speed_up_inits({"__name__": Late.__module__, "Late": Late})
    assert _frozen._pending[Late] is original
    assert Late not in _frozen._originals
    assert inspect.signature(Late) == signature
    assert _frozen.is_generated_init(Late)
    built = Late(name="a", tags=["x"])
    assert built == Late(name="a", size=2, tags=("x",))
    assert Late not in _frozen._pending and _frozen._originals[Late] is original
    fast = Late.__dict__["__init__"]
    assert fast.__code__.co_filename.startswith(_frozen._PREFIX)
    Late(name="b")
    assert Late.__dict__["__init__"] is fast
    assert inspect.signature(Late) == signature


def test_importing_core_makes_no_init_for_classes_it_does_not_build() -> None:
    """PERF-15: after `import dsh_core`, most of core's frozen classes still wait for their
    first construction (a request error's context, say, has no faster __init__ yet)."""
    code = (
        "import dsh_core; from dsh_core import _frozen\n"
        "print(len(_frozen._pending), len(_frozen._originals),"
        " dsh_core.RequestErrorContext in _frozen._pending)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    pending, made, lineage = done.stdout.split()
    assert int(pending) > 2 * int(made) and lineage == "True"


def test_the_checked_chunk_builder_is_compiled_at_the_first_chunk() -> None:
    """PERF-16: importing core compiles no checked chunk builder (nothing before a run's
    first request streams a chunk); the first chunk compiles it, once, and it is used from
    then on."""
    code = """
import asyncio
from dsh_core import _agent
from dsh_core.testing import scripted_host

print(_agent._checked_chunk_data is _agent._first_checked_chunk_data)

async def main():
    async with scripted_host(model=["one", "two"]) as host:
        agent = (await host.create_agent()).agent
        await asyncio.wait_for(host.run(agent, "go"), 10)
        first = _agent._checked_chunk_data
        await asyncio.wait_for(host.run(agent, "again"), 10)
        print(first is _agent._checked_chunk_data, first.__name__, agent.session.events[-1].type)

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["True", "True", "build", "turn/end"]


def _shared_eq_classes() -> list[type]:
    """Every class of the installed dsh distributions with the shared eq and hash (the
    stand-in, or what it compiled when the class was first compared)."""

    def shared(cls: type) -> bool:
        eq = cls.__dict__.get("__eq__")
        code = getattr(eq, "__code__", None)
        return eq is attrs_eq or (code is not None and code.co_filename.startswith("<dsh __eq__"))

    return [c for c in _shared_repr_classes() if shared(c)]


def _attrs_generated_eq(cls: type) -> Any:
    """The ``__eq__`` attrs itself would have compiled for ``cls``."""
    script, globs = attr._make._make_eq_script(list(attrs.fields(cls)))
    exec(compile(script, "<attrs eq>", "exec"), globs)
    return globs["__eq__"]


def _filled(cls: type, values: list[Any]) -> Any:
    value = object.__new__(cls)
    for i, field in enumerate(attrs.fields(cls)):
        object.__setattr__(value, field.name, values[i % len(values)])
    return value


def test_the_shared_eq_and_hash_behave_as_attrs_own() -> None:
    """PERF-18: each class with ``__eq__ = attrs_eq`` and ``__hash__ = attrs_hash`` (the
    installed dsh packages' frozen classes) is frozen, no exception, compares exactly as
    attrs' generated ``__eq__`` (equal, unequal in any compared field, another class), and
    equal values hash equal; the first call puts the compiled methods in place."""
    classes = _shared_eq_classes()
    assert len(classes) > 60  # dsh-core's own alone: about 90; more with the plugins installed
    for cls in classes:
        assert not issubclass(cls, BaseException)
        expected = _attrs_generated_eq(cls)
        a = _filled(cls, [1, "x", (2,)])
        b = _filled(cls, [1, "x", (2,)])
        assert (a == b) is expected(a, b) is True, cls
        assert hash(a) == hash(b), cls
        assert a.__eq__(object()) is NotImplemented
        for field in attrs.fields(cls):
            c = _filled(cls, [1, "x", (2,)])
            object.__setattr__(c, field.name, ["other"])
            assert (a == c) == expected(a, c), (cls, field.name)
            assert (a != c) == (not expected(a, c)), (cls, field.name)
        assert cls.__dict__["__eq__"] is not attrs_eq  # compiled and in place
        assert cls.__dict__["__hash__"] is not attrs_hash


@attrs.frozen
class _Keyed:
    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    name: str = attrs.field(eq=str.lower)
    ignored: int = attrs.field(eq=False)
    size: int = 0


@attrs.frozen(eq=False)
class _Plain(_Keyed):
    extra: int = 0


def test_the_shared_eq_and_hash_honour_field_options() -> None:
    """PERF-18: an ``eq`` key compares and hashes through the key, a field with ``eq=False``
    takes no part, a subclass that leaves equality to its base compares by the base's
    fields; as attrs' own would."""
    assert _Keyed("Ab", 1) == _Keyed("aB", 2)
    assert hash(_Keyed("Ab", 1)) == hash(_Keyed("aB", 2))
    assert _Keyed("Ab", 1) != _Keyed("Ab", 1, size=3)
    assert _Keyed("a", 1) != _Plain("a", 1)
    assert _Plain("a", 1, extra=1) == _Plain("a", 2, extra=5)
    assert len({_Keyed("X", 1), _Keyed("x", 2)}) == 1


def test_names_a_start_does_not_need_are_imported_on_first_use() -> None:
    """PERF-19: `import dsh_core` imports neither the consumed-work fold, the invariant
    replay nor the in-memory store; their public names resolve on first use, to the same
    objects as their modules', and stay in `__all__`."""
    code = """
import json, sys
import dsh_core
print(json.dumps(sorted(m for m in sys.modules if m in (
    "dsh_core._fold", "dsh_core._invariants", "dsh_core._persistence._memory"))))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout) == []
    import dsh_core
    from dsh_core import _fold, _invariants
    from dsh_core._persistence import _memory

    assert dsh_core.fold_consumed_work is _fold.fold_consumed_work
    assert dsh_core.InvariantRegistry is _invariants.InvariantRegistry
    assert dsh_core.MemorySessionPersistence is _memory.MemorySessionPersistence
    assert {"ConsumedWork", "InvariantError", "install_memory_persistence"} <= set(dsh_core.__all__)
    with pytest.raises(AttributeError):
        dsh_core.no_such_name  # noqa: B018


# -- a flat config table is built without the converter (PERF-20) ---------------------------------


def _positive(instance: Any, attribute: Any, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive")


@attrs.frozen(kw_only=True)
class _FlatConfig:
    name: str
    size: int = attrs.field(default=3, validator=_positive)
    on: bool = True
    label: str | None = None
    ratio: float = 1.0
    tags: tuple[str, ...] = ()
    _hidden: str = "h"
    later: int = attrs.field(init=False, default=0)


@attrs.frozen(kw_only=True)
class _Converted:
    word: str = attrs.field(default="a", converter=str.upper)
    nested: _FlatConfig | None = None


#: The same fields with real (not postponed) annotations.
_Eager = attrs.make_class(
    "_Eager",
    {
        "name": attrs.field(type=str),
        "size": attrs.field(type=int, default=3),
        "on": attrs.field(type=bool, default=True),
        "label": attrs.field(type=str | None, default=None),
        "items": attrs.field(type=list[int], factory=list),
    },
    kw_only=True,
    frozen=True,
)

_KEYS = ["name", "size", "on", "label", "ratio", "tags", "hidden", "_hidden", "later", "word"]
_KEYS += ["nested", "items", "extra", "provider", "tool_name", "root", "sync", "max_depth"]
_VALUES = st.one_of(
    st.sampled_from(["", "x", "spawn", "continuable", "batch", 0, 1, -2, 3, True, False, None]),
    st.sampled_from([1.5, 2.0, [], [1], ["a"], {}, {"name": "n"}, (1,), "one-shot", "ab"]),
)


def _outcome(spec: PluginSpec, raw: dict[str, Any]) -> tuple[str, Any]:
    try:
        value = structure_config(spec, raw)
    except PluginError as exc:
        return "error", (exc.code, str(exc))
    return "value", (type(value), attrs.asdict(value) if attrs.has(type(value)) else value)


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_a_flat_config_table_is_structured_as_the_converter_structures_it(
    data: st.DataObject,
) -> None:
    """PERF-20: any config table, for config classes with scalar, optional, float, array,
    nested, private, uninitialised, validated and converted fields, and for every installed
    plugin's config class, gives the value (type and fields) or the PLUGIN_CONFIG error text
    the converter alone gives."""
    specs = make_plugin_manager(autoload=True).collect_plugin_specs()
    classes = [_FlatConfig, _Converted, _Eager]
    classes += [s.config_type for s in specs.values() if s.config_type is not None]
    cls = data.draw(st.sampled_from(classes))
    own = sorted({k for f in attrs.fields(cls) for k in (f.name, f.alias)})
    keys = st.one_of(st.sampled_from(own), st.sampled_from(_KEYS))
    raw = data.draw(st.dictionaries(keys, _VALUES, max_size=5))
    spec = PluginSpec(name="p", apply=lambda ctx, config: None, config_type=cls)
    fast = _outcome(spec, raw)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_host, "_flat_config", lambda cls, raw: None)
        assert _outcome(spec, raw) == fast


_TRICKY = [
    {"name": "x", "size": True},
    {"name": "x", "size": 2.0},
    {"name": "x", "on": 1},
    {"name": 1},
    {"name": None},
    {"name": "x", "label": 3},
    {"name": "x", "label": "l"},
    {"name": "x", "size": -1},
    {"name": "x", "extra": 1},
    {"name": "x", "hidden": "y"},
    {"name": "x", "_hidden": "y"},
    {"name": "x", "later": 1},
    {"size": 2},
]


@pytest.mark.parametrize("raw", _TRICKY)
@pytest.mark.parametrize("cls", [_FlatConfig, _Eager])
def test_a_near_flat_config_table_is_refused_as_the_converter_refuses_it(
    cls: type, raw: dict[str, Any]
) -> None:
    """PERF-20: the tables a fast path could get wrong (a boolean for an integer, a number
    for a boolean or a string, a validator's refusal, an unknown, aliased or uninitialised
    key, a required key missing) give what the converter alone gives."""
    spec = PluginSpec(name="p", apply=lambda ctx, config: None, config_type=cls)
    fast = _outcome(spec, raw)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_host, "_flat_config", lambda cls, raw: None)
        assert _outcome(spec, raw) == fast


def test_a_flat_config_table_generates_no_structure_function() -> None:
    """PERF-20: a table of scalar keys the class accepts is built as ``cls(**table)``: no
    structure function is generated for the class (a start's few small tables)."""

    @attrs.frozen(kw_only=True)
    class Fresh:
        name: str
        size: int = 3
        label: str | None = None
        on: bool = False

    dispatch = config_converter._structure_func.dispatch
    before = dispatch.cache_info().currsize
    spec = PluginSpec(name="f", apply=lambda ctx, config: None, config_type=Fresh)
    built = structure_config(spec, {"name": "x", "size": 4, "label": None, "on": True})
    assert built == Fresh(name="x", size=4, label=None, on=True)
    assert dispatch.cache_info().currsize == before


# -- a session header is encoded without the converter (PERF-21) ----------------------------------


def _converter_header(header: SessionHeader) -> dict[str, Any]:
    out: dict[str, Any] = converter.unstructure(header)
    out["version"] = header.version
    return out


class _Text(str):
    pass


_INTS = st.one_of(st.integers(-5, 2**60), st.booleans())
_MAYBE_INT = st.one_of(st.none(), _INTS)
_MAYBE_TEXT = st.one_of(st.none(), st.text(max_size=5), st.just(_Text("t")), st.just("subagent"))


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.just(1), _INTS),
    st.one_of(st.text(max_size=8), st.just(_Text("s"))),
    _INTS,
    _MAYBE_TEXT,
    _MAYBE_TEXT,
    _MAYBE_INT,
    _MAYBE_TEXT,
    _MAYBE_INT,
)
def test_a_header_is_encoded_as_the_converter_encodes_it(
    version: Any,
    sid: Any,
    created: Any,
    cwd: Any,
    parent: Any,
    seed: Any,
    origin: Any,
    depth: Any,
) -> None:
    """PERF-21: any session header (defaults or not, values of other types than their
    fields' too) encodes to the converter's keys, values and key order, ``version`` set."""
    header = SessionHeader(
        version=version,
        id=sid,
        created_at=created,
        cwd=cwd,
        parent_session=parent,
        seed_length=seed,
        origin=origin,
        delegation_depth=depth,
    )
    fast = encode_header(header)
    expected = _converter_header(header)
    assert list(fast.items()) == list(expected.items())
    assert [type(v) for v in fast.values()] == [type(v) for v in expected.values()]


def test_a_header_does_not_go_through_the_converter(monkeypatch: pytest.MonkeyPatch) -> None:
    """PERF-21: encoding a header of its fields' own types never asks the durable converter
    (so no function of its is generated for it)."""
    asked: list[object] = []
    monkeypatch.setattr(_events, "converter", type("Spy", (), {"unstructure": asked.append})())
    header = SessionHeader(id="s", created_at=1, cwd="/", origin="subagent", seed_length=2)
    assert encode_header(header) == {
        "id": "s",
        "created_at": 1,
        "cwd": "/",
        "seed_length": 2,
        "origin": "subagent",
        "version": 1,
    }
    assert asked == []
