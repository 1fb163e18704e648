"""The cattrs converters: one for durable JSON (session logs, descriptors), one for plugin
config.

Values unstructure to plain JSON (defaults omitted, tags added) and structure back strictly:
an unknown key is an error, so corruption is noticed instead of silently dropped. Tagged unions
(:mod:`dsh_core._tagged`) dispatch on their tag; an unclaimed tag becomes the union's unknown
variant and round-trips verbatim. :data:`config_converter` shares the scalar rules (no
coercion) but validates in detail, so a config error can name the key; the durable converter
stays lean, its errors reported by the caller with the file and line.
"""

from __future__ import annotations

import collections.abc as cabc
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn

from ._content import BLOCKS, CHUNKS, SOURCES
from ._json import freeze_json, thaw_json
from ._tagged import TaggedUnion, TaggedUnionError

__all__ = [
    "config_converter",
    "converter",
    "register_tagged_union",
    "structure",
    "tagged_unions",
    "unstructure",
]

T = TypeVar("T")

#: The library-owned converter. Register hooks on it only through this module's helpers.
#: Validation is strict but not "detailed": a durable-load error is reported by the caller
#: (naming the file and line), so the generated structure functions stay lean.
converter = cattrs.Converter(
    forbid_extra_keys=True, omit_if_default=True, detailed_validation=False
)


def _strict_int(value: Any, _: type) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _strict_str(value: Any, _: type) -> str:
    if type(value) is not str:
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _strict_bool(value: Any, _: type) -> bool:
    if value is not True and value is not False:
        raise TypeError(f"expected a boolean, got {value!r}")
    return bool(value)


def _strict_float(value: Any, _: type) -> float:
    if type(value) is float or type(value) is int:
        return float(value)
    raise TypeError(f"expected a number, got {value!r}")


# JSON scalars are taken as they are: no coercion of "5" into 5 or of 5 into "5".
converter.register_structure_hook(int, _strict_int)
converter.register_structure_hook(str, _strict_str)
converter.register_structure_hook(bool, _strict_bool)
converter.register_structure_hook(float, _strict_float)


def _is_homogeneous_tuple(t: Any) -> bool:
    args = typing.get_args(t)
    return typing.get_origin(t) is tuple and len(args) == 2 and args[1] is Ellipsis


def _strict_tuple(t: Any) -> Callable[[Any, Any], tuple[Any, ...]]:
    """``tuple[X, ...]`` from a JSON array only: cattrs alone would iterate anything, turning
    a string into a tuple of its characters and an object into a tuple of its keys."""
    item = typing.get_args(t)[0]
    hook = converter.get_structure_hook(item)

    def structure_tuple(value: Any, _: Any) -> tuple[Any, ...]:
        if type(value) is not list and type(value) is not tuple:
            raise TypeError(f"expected an array, got {value!r}")
        return tuple([hook(v, item) for v in value])

    return structure_tuple


converter.register_structure_hook_factory(_is_homogeneous_tuple, _strict_tuple)

_unions: dict[type, TaggedUnion[Any]] = {}


def tagged_unions() -> Mapping[type, TaggedUnion[Any]]:
    """Every registered tagged union, by base class (read-only use)."""
    return _unions


def register_tagged_union(union: TaggedUnion[Any]) -> None:
    """Teach the converter to (un)structure ``union``'s base and every present/future variant."""
    base = union.base
    tag = union.tag
    _unions[base] = union
    raw_un: dict[type, Callable[[Any], dict[str, Any]]] = {}
    raw_st: dict[type, tuple[frozenset[str], Callable[[Mapping[str, Any], Any], Any]]] = {}

    def unstructure_variant(obj: Any) -> dict[str, Any]:
        cls = type(obj)
        if cls is union.unknown_type:
            return {tag: getattr(obj, tag), **thaw_json(obj.fields)}
        fn = raw_un.get(cls)
        if fn is None:
            fn = raw_un[cls] = make_dict_unstructure_fn(
                cls, converter, _cattrs_omit_if_default=True
            )
        out = fn(obj)
        out[tag] = getattr(obj, tag)
        return out

    variants = union.variants

    def structure_any(data: Mapping[str, Any], cls: type) -> Any:
        if type(data) is not dict and not isinstance(data, Mapping):
            raise TaggedUnionError(f"{base.__name__} must be an object, not {type(data).__name__}")
        value = data.get(tag)
        if type(value) is not str:
            raise TaggedUnionError(f"{base.__name__} has no string {tag!r}")
        target = variants.get(value)
        if target is None:
            if cls is not base and cls is not union.unknown_type:
                raise TaggedUnionError(f"expected {cls.__name__}, got {tag} {value!r}")
            return union.unknown(value, freeze_json({k: v for k, v in data.items() if k != tag}))
        if cls is not base and target is not cls:
            raise TaggedUnionError(f"expected {cls.__name__}, got {tag} {value!r}")
        hook = raw_st.get(target)
        if hook is None:
            # Extra keys are checked here, against the fields plus the tag, so the payload
            # is structured in place instead of being copied without its tag.
            allowed = frozenset(a.name for a in attrs.fields(target)) | {tag}
            made = make_dict_structure_fn(target, converter, _cattrs_forbid_extra_keys=False)
            hook = raw_st[target] = (allowed, made)
        allowed_keys, fn = hook
        if not data.keys() <= allowed_keys:
            extra = sorted(set(data) - allowed_keys)
            raise TaggedUnionError(f"{target.__name__} has unknown keys {extra}")
        return fn(data, target)

    def is_member(t: Any) -> bool:
        return isinstance(t, type) and issubclass(t, base)

    converter.register_unstructure_hook_func(is_member, unstructure_variant)
    converter.register_structure_hook_func(is_member, structure_any)


for _union in (BLOCKS, SOURCES, CHUNKS):
    register_tagged_union(_union)
del _union


# -- plugin config --------------------------------------------------------------------------------

#: The converter for a user's plugin config (a composition row's ``config``): as strict as the
#: durable one about scalars and arrays, but with detailed validation, so an error can name the
#: key. A wrong type is refused, never converted: no ``str(3)``, no ``int("3")``, no ``bool("no")``.
config_converter = cattrs.Converter(
    forbid_extra_keys=True, omit_if_default=True, detailed_validation=True
)
config_converter.register_structure_hook(int, _strict_int)
config_converter.register_structure_hook(str, _strict_str)
config_converter.register_structure_hook(bool, _strict_bool)
config_converter.register_structure_hook(float, _strict_float)

_SCALARS: frozenset[Any] = frozenset({str, int, float, bool, type(None)})
_SEQUENCES: frozenset[Any] = frozenset({tuple, list, set, frozenset, cabc.Sequence, cabc.Set})
_MAPPINGS: frozenset[Any] = frozenset({dict, cabc.Mapping})


def type_name(t: Any) -> str:
    """A type as a user reads it in a config error (``str``, ``str | None``, ``list[int]``)."""
    if t is type(None):
        return "None"
    if isinstance(t, type) and not typing.get_args(t):
        return t.__name__
    if _is_union(t):
        return " | ".join(type_name(a) for a in typing.get_args(t))
    return str(t).replace("typing.", "").replace("collections.abc.", "")


def _is_union(t: Any) -> bool:
    return typing.get_origin(t) in (typing.Union, types.UnionType)


def _is_scalar_union(t: Any) -> bool:
    return _is_union(t) and all(a in _SCALARS for a in typing.get_args(t))


def _scalar_union(t: Any) -> Callable[[Any, Any], Any]:
    """``str | int | None`` and the like: the value's own type must be a member (an int counts
    for ``float``); ``None`` only when the union has it."""
    members = frozenset(typing.get_args(t))
    accepted = members | ({int} if float in members else set())
    name = type_name(t)

    def structure_union(value: Any, _: Any) -> Any:
        if type(value) not in accepted:
            raise TypeError(f"expected {name}, got {value!r}")
        return value

    return structure_union


def _is_sequence(t: Any) -> bool:
    origin = typing.get_origin(t)
    if origin not in _SEQUENCES:
        return False
    args = typing.get_args(t)
    return len(args) == 1 or (origin is tuple and len(args) == 2 and args[1] is Ellipsis)


def _sequence(t: Any) -> Callable[[Any, Any], Any]:
    """Homogeneous sequences and sets from an array only (never a string's characters or an
    object's keys); items are structured strictly, and an error names the item's index."""
    origin = typing.get_origin(t)
    item = typing.get_args(t)[0]
    hook = config_converter.get_structure_hook(item)
    make: Callable[[list[Any]], Any] = {list: list, set: set, frozenset: frozenset}.get(
        origin, frozenset if origin is cabc.Set else tuple
    )

    def structure_sequence(value: Any, _: Any) -> Any:
        if type(value) is not list and type(value) is not tuple:
            raise TypeError(f"expected an array, got {value!r}")
        out = []
        for i, v in enumerate(value):
            try:
                out.append(hook(v, item))
            except Exception as exc:
                raise TypeError(f"item {i}: {_first_message(exc)}") from exc
        return make(out)

    return structure_sequence


def _is_mapping(t: Any) -> bool:
    return typing.get_origin(t) in _MAPPINGS and len(typing.get_args(t)) == 2


def _mapping(t: Any) -> Callable[[Any, Any], Any]:
    """``dict[K, V]`` from an object only; keys and values structured strictly."""
    key_type, value_type = typing.get_args(t)
    key_hook = config_converter.get_structure_hook(key_type)
    value_hook = config_converter.get_structure_hook(value_type)

    def structure_mapping(value: Any, _: Any) -> dict[Any, Any]:
        if not isinstance(value, Mapping):
            raise TypeError(f"expected an object, got {value!r}")
        out: dict[Any, Any] = {}
        for k, v in value.items():
            try:
                out[key_hook(k, key_type)] = value_hook(v, value_type)
            except Exception as exc:
                raise TypeError(f"entry {k!r}: {_first_message(exc)}") from exc
        return out

    return structure_mapping


def _first_message(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc)


def _is_optional_table(t: Any) -> bool:
    args = typing.get_args(t)
    return (
        _is_union(t)
        and len(args) == 2
        and type(None) in args
        and any(attrs.has(a) for a in args if a is not type(None))
    )


def _optional_table(t: Any) -> Callable[[Any, Any], Any]:
    """``SomeConfig | None``: ``None``, or a table structured into the attrs class (anything
    else is refused as not a table, instead of cattrs' attribute error on it)."""
    (cls,) = [a for a in typing.get_args(t) if a is not type(None)]
    hook = config_converter.get_structure_hook(cls)

    def structure_optional(value: Any, _: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise TypeError(f"expected a table, got {value!r}")
        return hook(value, cls)

    return structure_optional


config_converter.register_structure_hook_factory(_is_optional_table, _optional_table)
config_converter.register_structure_hook_factory(_is_scalar_union, _scalar_union)
config_converter.register_structure_hook_factory(_is_sequence, _sequence)
config_converter.register_structure_hook_factory(_is_mapping, _mapping)


def unstructure(value: object) -> Any:
    """Plain JSON-ready data for a durable value."""
    return converter.unstructure(value)


def structure(data: object, cls: type[T]) -> T:
    """Rebuild a durable value of type ``cls`` from plain data (strict: unknown keys fail)."""
    return converter.structure(data, cls)
