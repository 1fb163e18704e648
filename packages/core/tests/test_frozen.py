"""The faster constructors of frozen payload classes build exactly what attrs builds (host-core
§3: payloads are immutable values made by their declared keyword constructor)."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core import _frozen
from dsh_core._frozen import attrs_init, builder, speed_up_inits

_HOT = ("_content", "_events", "_llm", "_tools", "_agent", "_prompt", "_scripted")


def _is_frozen_without_validators(value: object, module: str) -> bool:
    return (
        isinstance(value, type)
        and value.__module__ == module
        and "__attrs_attrs__" in vars(value)  # an attrs class itself, not a subclass
        and "__setattr__" in vars(value)
        and bool(attrs.fields(value))
        and all(f.validator is None for f in attrs.fields(value))
    )


def _frozen_classes() -> list[type]:
    out: list[type] = []
    for name in _HOT:
        module = sys.modules[f"dsh_core.{name}"]
        out.extend(
            v for v in vars(module).values() if _is_frozen_without_validators(v, module.__name__)
        )
    return sorted(out, key=lambda c: c.__qualname__)


CLASSES = _frozen_classes()
_MISSING = object()


def test_every_frozen_hot_class_is_sped_up() -> None:
    """host-core §3: each frozen class of the hot modules without validators got the faster
    constructor (an attrs upgrade that changes what is recognised fails here, not silently)."""
    assert len(CLASSES) > 50
    slow = [c.__qualname__ for c in CLASSES if attrs_init(c) is None]
    assert slow == []


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__qualname__)
def test_the_signature_is_attrs_signature(cls: type) -> None:
    """host-core §3: same keyword-only parameters, same defaults, same annotations."""
    original = attrs_init(cls)
    assert original is not None
    assert inspect.signature(cls.__init__) == inspect.signature(original)
    assert cls.__init__.__annotations__ == original.__annotations__


def _json() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=5)
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        ),
        max_leaves=6,
    )


@st.composite
def _cases(draw: st.DrawFn) -> tuple[type, dict[str, Any]]:
    cls = draw(st.sampled_from(CLASSES))
    kwargs: dict[str, Any] = {}
    for f in attrs.fields(cls):
        if not f.init:
            continue
        required = f.default is attrs.NOTHING
        if not required and draw(st.booleans()):
            continue  # use the default
        if required and draw(st.integers(0, 9)) == 0:
            continue  # leave a required argument out: both must refuse alike
        kwargs[f.name] = draw(_json()) if f.converter is not None else object()
    if draw(st.integers(0, 9)) == 0:
        kwargs["not_a_field"] = 1
    return cls, kwargs


def _build(init: Any, cls: type, kwargs: dict[str, Any]) -> tuple[str, Any]:
    obj = object.__new__(cls)
    try:
        init(obj, **kwargs)
    except Exception as exc:
        return "raised", type(exc)
    return "built", obj


@given(_cases())
def test_fast_init_builds_what_attrs_builds(case: tuple[type, dict[str, Any]]) -> None:
    """host-core §3: for any arguments, the same field values (identical objects where no
    converter runs, equal frozen copies where one does), or the same error type."""
    cls, kwargs = case
    fast = _build(cls.__init__, cls, kwargs)
    slow = _build(attrs_init(cls), cls, kwargs)
    assert fast[0] == slow[0]
    if fast[0] == "raised":
        assert fast[1] is slow[1]
        return
    for f in attrs.fields(cls):
        mine, theirs = getattr(fast[1], f.name), getattr(slow[1], f.name)
        if f.converter is None and f.name in kwargs:
            assert mine is theirs
        else:
            assert mine == theirs
            assert type(mine) is type(theirs)
    assert fast[1] == slow[1]


def _build_with(build: Any, kwargs: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "built", build(**kwargs)
    except Exception as exc:
        return "raised", type(exc)


@given(_cases())
def test_builder_builds_what_the_constructor_builds(case: tuple[type, dict[str, Any]]) -> None:
    """host-core §3: a builder gives, for any arguments, an instance of exactly the class
    (never its open twin) with the constructor's field values, or the same error type."""
    cls, kwargs = case
    fast = _build_with(builder(cls), kwargs)
    slow = _build(attrs_init(cls), cls, kwargs)
    assert fast[0] == slow[0]
    if fast[0] == "raised":
        assert fast[1] is slow[1]
        return
    built = fast[1]
    assert type(built) is cls
    for f in attrs.fields(cls):
        mine, theirs = getattr(built, f.name), getattr(slow[1], f.name)
        if f.converter is None and f.name in kwargs:
            assert mine is theirs
        else:
            assert mine == theirs
            assert type(mine) is type(theirs)
    assert built == slow[1]
    try:
        expected = hash(slow[1])
    except TypeError:  # a field holds an unhashable value: so does the built one
        with pytest.raises(TypeError):
            hash(built)
    else:
        assert hash(built) == expected
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        built.__setattr__(attrs.fields(cls)[0].name, None)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__qualname__)
def test_the_builder_signature_is_the_constructor_signature(cls: type) -> None:
    """host-core §3: a builder takes the constructor's keyword-only parameters and defaults;
    there is one per class, whichever module asks."""
    build = builder(cls)
    assert build is not cls
    assert builder(cls) is build
    assert inspect.signature(build).parameters == inspect.signature(cls).parameters


def test_a_class_a_builder_cannot_reproduce_is_its_own_builder() -> None:
    """host-core §3: where the fast path would differ (a validator), the builder is the class."""

    @attrs.frozen(kw_only=True)
    class Validated:
        x: int = attrs.field(validator=attrs.validators.instance_of(int))

    assert builder(Validated) is Validated


def test_instances_stay_frozen() -> None:
    """host-core §3: a payload built by the fast constructor cannot be changed."""
    from dsh_core import StepData, TextDelta

    step = StepData(turn=1, step=2)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        step.turn = 3  # type: ignore[misc]
    assert step == StepData(turn=1, step=2)
    assert hash(step) == hash(StepData(turn=1, step=2))
    assert TextDelta(index=0, text="a").type == "text-delta"


def test_classes_it_cannot_reproduce_keep_attrs_init() -> None:
    """host-core §3: validators, post-init hooks and positional parameters stay with attrs."""

    @attrs.frozen(kw_only=True)
    class Validated:
        x: int = attrs.field(validator=attrs.validators.instance_of(int))

    @attrs.frozen(kw_only=True)
    class Hooked:
        x: int

        def __attrs_post_init__(self) -> None:
            object.__setattr__(self, "x", self.x + 1)

    @attrs.frozen
    class Positional:
        x: int

    @attrs.frozen(kw_only=True)
    class Plain:
        x: int
        y: list[int] = attrs.field(factory=list)

    namespace = {
        "__name__": __name__,
        "Validated": Validated,
        "Hooked": Hooked,
        "Positional": Positional,
        "Plain": Plain,
    }
    speed_up_inits(namespace)
    assert attrs_init(Validated) is None
    assert attrs_init(Hooked) is None
    assert attrs_init(Positional) is None
    assert attrs_init(Plain) is not None
    with pytest.raises(TypeError):
        Validated(x="1")  # type: ignore[arg-type]
    assert Hooked(x=1).x == 2
    a, b = Plain(x=1), Plain(x=1)
    assert a.y == [] and a.y is not b.y  # a factory runs per instance
    assert _frozen.is_generated_init(Plain) and _frozen.is_generated_init(Positional)
