"""Faster constructors for the frozen attrs classes on the hot path.

attrs builds a frozen slotted instance through ``object.__setattr__(self, name, value)`` per
field: a generic attribute store that looks the slot up by name every time, about twice what
the store itself costs. A turn builds some forty payloads, messages and blocks, and a streamed
answer one chunk payload per token, so :func:`speed_up_inits` gives each frozen class of a
module an ``__init__`` that fills the slots through their descriptors directly.

The replacement takes the same keyword-only parameters with the same defaults, runs the same
factories and converters in the same order, and leaves validators, equality, hashing, ``repr``
and immutability to attrs. A class it cannot reproduce exactly (validators, pre- or post-init
hooks, a field alias, a factory that takes ``self``, a positional parameter, a field without a
slot) keeps attrs' own ``__init__``.
"""

from __future__ import annotations

import linecache
import types
from collections.abc import Callable, Mapping
from typing import Any

import attrs

__all__ = ["attrs_init", "filled_fields", "is_generated_init", "slot_setter", "speed_up_inits"]

_PREFIX = "<dsh fast init "
#: attrs' own ``__init__`` of every class given a faster one (tests compare the two).
_originals: dict[type, Callable[..., None]] = {}


def attrs_init(cls: type) -> Callable[..., None] | None:
    """attrs' ``__init__`` of ``cls`` if :func:`speed_up_inits` replaced it."""
    return _originals.get(cls)


def is_generated_init(cls: type) -> bool:
    """Whether ``cls.__init__`` is attrs-generated or its faster equivalent from here: either
    way constructing ``cls`` is exactly filling its fields, nothing of the class's own runs."""
    init = cls.__dict__.get("__init__")
    if cls in _originals:
        return init is not None and init.__code__.co_filename.startswith(_PREFIX)
    return bool(
        getattr(getattr(init, "__code__", None), "co_filename", "").startswith("<attrs generated")
    )


def filled_fields(cls: type) -> tuple[Any, ...] | None:
    """The fields of attrs class ``cls`` when building one is exactly filling its slots: its
    own attrs-generated (or faster) ``__init__``, no init hooks, and slots that hold the fields
    and nothing else (no ``__dict__``, no cached hash). ``None`` otherwise."""
    if "__attrs_attrs__" not in cls.__dict__ or getattr(cls, "__dictoffset__", 1) != 0:
        return None
    if not is_generated_init(cls):
        return None  # an __init__ of its own: only calling it builds the value
    if hasattr(cls, "__attrs_pre_init__") or hasattr(cls, "__attrs_post_init__"):
        return None
    slots = {s for klass in cls.__mro__ for s in klass.__dict__.get("__slots__", ())}
    slots.discard("__weakref__")
    fields: tuple[Any, ...] = attrs.fields(cls)
    if slots != {f.name for f in fields}:
        return None  # instances hold more than their fields (a cached hash, say)
    return fields


def speed_up_inits(namespace: Mapping[str, object]) -> None:
    """Replace the ``__init__`` of each frozen attrs class defined in module ``namespace``
    (pass ``globals()`` at the end of the module) by an equivalent, faster one."""
    module = namespace["__name__"]
    for value in list(namespace.values()):
        if isinstance(value, type) and value.__module__ == module:
            _speed_up(value)


def slot_setter(cls: type, name: str) -> Callable[[Any, Any], None] | None:
    """The descriptor store of slot ``name`` of ``cls``; ``None`` if it is not a plain slot."""
    for klass in cls.__mro__:
        descriptor = klass.__dict__.get(name)
        if descriptor is not None:
            if type(descriptor) is not types.MemberDescriptorType:
                return None
            setter: Callable[[Any, Any], None] = descriptor.__set__
            return setter
    return None


def _speed_up(cls: type) -> None:
    if cls in _originals:
        return
    if getattr(getattr(cls, "__setattr__", None), "__name__", "") != "_frozen_setattrs":
        return  # not frozen (attrs' plain attribute stores are fast), or an attrs we do not know
    fields = filled_fields(cls)
    if fields is None:
        return
    env: dict[str, Any] = {"NOTHING": attrs.NOTHING}
    params: list[str] = []
    body: list[str] = []
    for i, f in enumerate(fields):
        setter = slot_setter(cls, f.name)
        if setter is None or f.validator is not None or f.alias != f.name:
            return
        if f.init and not f.kw_only:
            return
        converter = f.converter
        if converter is not None and (
            isinstance(converter, attrs.Converter) or not callable(converter)
        ):
            return
        env[f"set_{i}"] = setter
        value = f.name
        default = f.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            if default.takes_self:
                return
            env[f"factory_{i}"] = default.factory
            if f.init:
                params.append(f"{f.name}=NOTHING")
                body.append(f"if {value} is NOTHING: {value} = factory_{i}()")
            else:
                value = f"factory_{i}()"
        elif default is not attrs.NOTHING:
            env[f"default_{i}"] = default
            if f.init:
                params.append(f"{f.name}=default_{i}")
            else:
                value = f"default_{i}"
        elif f.init:
            params.append(f.name)
        else:
            return  # attrs leaves such a slot empty
        if converter is not None:
            env[f"convert_{i}"] = converter
            value = f"convert_{i}({value})"
        body.append(f"set_{i}(self, {value})")
    signature = f"self, *, {', '.join(params)}" if params else "self"
    source = f"def __init__({signature}):\n    " + "\n    ".join(body or ["pass"]) + "\n"
    filename = f"{_PREFIX}{cls.__module__}.{cls.__qualname__}>"
    exec(compile(source, filename, "exec"), env)
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    init = env["__init__"]
    original = cls.__dict__["__init__"]
    init.__qualname__ = original.__qualname__
    init.__module__ = original.__module__
    init.__annotations__ = dict(original.__annotations__)
    init.__doc__ = original.__doc__
    _originals[cls] = original
    cls.__init__ = init  # type: ignore[misc]
