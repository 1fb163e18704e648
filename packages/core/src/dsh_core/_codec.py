"""Compiled JSON codecs for durable attrs values: the converter's fast path (host-core §5).

A session log is mostly small, regular payloads (``assistant/chunk`` above all), and the
generic route (cattrs hooks, then :func:`~dsh_core._json.dumps`; ``json.loads``, then strict
cattrs hooks) costs several microseconds per event. For every attrs class whose fields it
models, this module compiles once an encoder that writes the class's JSON text directly and a
decoder that builds the value from parsed JSON without ``__init__``.

Both are *fast paths only*. An encoder returns exactly the text ``dumps(unstructure(value))``
gives, a decoder exactly the value ``structure(data, cls)`` gives, or they raise (usually
:class:`Unfit`) as soon as anything is unusual: a value of another type than declared, an
unknown key or tag, a field the compiler does not model. The caller then takes the
converter's route, which gives the verdict and the error message. A fast path therefore never
accepts what the converter refuses, and never has to reproduce an error.

Modelled field types: ``int``, ``str``, ``bool``, ``Literal`` of strings, ``X | None``,
``tuple[X, ...]``, tagged-union bases (registered variants are compiled on first sight) and
attrs classes (compiled, or handed to the converter's hook when they cannot be), and a field
of free-form JSON that ``freeze_json`` converts and that defaults to ``None`` (decoded through
``freeze_json``, as ``__init__`` would; encoded only while it holds ``None``). A class is
compiled only if its instances hold nothing but their fields (slotted, attrs' own
``__init__``, no validators, other converters, factories or init hooks), so filling the slots
directly is what ``__init__`` does. The codecs mirror the converter as
:mod:`dsh_core._converter` configures it (strict scalars, arrays for tuples, defaults
omitted, tagged unions); that module's rule that hooks are registered only through its
helpers is what keeps the two in step.
"""

from __future__ import annotations

import linecache
import math
import threading
import types
import typing
from collections.abc import Callable
from json.encoder import encode_basestring
from typing import Any, Literal, cast

import attrs

from ._converter import converter, tagged_unions
from ._frozen import _plan as _builder_plan
from ._frozen import attrs_eq, attrs_hash, attrs_repr, filled_fields, open_twin, slot_setter
from ._json import _INT_HI, dumps, freeze_json
from ._tagged import TaggedUnion

__all__ = [
    "Unfit",
    "checked_builder",
    "checkers",
    "class_checker",
    "class_decoder",
    "class_encoder",
    "type_checker",
    "union_checkers",
]

Encoder = Callable[[Any], str]
#: Called with the parsed value; compiled decoders also accept (and ignore) the target class,
#: the calling convention of the converter's structure hooks.
Decoder = Callable[..., Any]
#: ``check(value, levels)``: returns, or raises ``Unfit`` (see "checkers" below).
Checker = Callable[[Any, int], None]


class Unfit(Exception):
    """The fast path does not handle this value; the converter's route decides."""


_MISSING = object()
_NOTHING = attrs.NOTHING


# -- shapes -----------------------------------------------------------------------------------
# A shape is what the compiler knows of a field type: ("int",), ("str",), ("bool",),
# ("lit", values), ("opt", shape), ("tuple", shape), ("union", TaggedUnion), ("class", cls).

Shape = tuple[Any, ...]


def _shape(tp: Any) -> Shape | None:
    if tp is int:
        return ("int",)
    if tp is str:
        return ("str",)
    if tp is bool:
        return ("bool",)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        if args and all(type(a) is str for a in args):
            return ("lit", frozenset(args))
        return None
    if origin is types.UnionType or origin is typing.Union:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            inner = _shape(rest[0])
            return ("opt", inner) if inner is not None else None
        return None
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            inner = _shape(args[0])
            return ("tuple", inner) if inner is not None else None
        return None
    if isinstance(tp, type):
        union = tagged_unions().get(tp)
        if union is not None:
            return ("union", union)
        if attrs.has(tp) and not any(
            tp is not u.base and issubclass(tp, u.base) for u in tagged_unions().values()
        ):
            return ("class", tp)
    return None


# -- per-shape encoders and decoders -----------------------------------------------------------


def _enc_int(v: Any) -> str:
    if v.__class__ is not int:
        raise Unfit
    return int.__repr__(v)


def _enc_str(v: Any) -> str:
    if v.__class__ is not str:
        raise Unfit
    return encode_basestring(v)


def _enc_bool(v: Any) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    raise Unfit


def _dec_int(v: Any) -> Any:
    if v.__class__ is not int:
        raise Unfit
    return v


def _dec_str(v: Any) -> Any:
    if v.__class__ is not str:
        raise Unfit
    return v


def _dec_bool(v: Any) -> Any:
    if v is not True and v is not False:
        raise Unfit
    return v


def _encoder(shape: Shape) -> Encoder:
    kind = shape[0]
    if kind == "int":
        return _enc_int
    if kind == "str" or kind == "lit":
        return _enc_str
    if kind == "bool":
        return _enc_bool
    if kind == "opt":
        inner = _encoder(shape[1])

        def enc_opt(v: Any) -> str:
            return "null" if v is None else inner(v)

        return enc_opt
    if kind == "tuple":
        item = _encoder(shape[1])

        def enc_tuple(v: Any) -> str:
            if v.__class__ is not tuple:
                raise Unfit
            return "[" + ",".join([item(e) for e in v]) + "]"

        return enc_tuple
    if kind == "union":
        return _union_encoder(shape[1])
    return _nested_encoder(shape[1])


def _decoder(shape: Shape) -> Decoder:
    kind = shape[0]
    if kind == "int":
        return _dec_int
    if kind == "str":
        return _dec_str
    if kind == "bool":
        return _dec_bool
    if kind == "lit":
        values = shape[1]

        def dec_lit(v: Any) -> Any:
            if v.__class__ is not str or v not in values:
                raise Unfit
            return v

        return dec_lit
    if kind == "opt":
        inner = _decoder(shape[1])

        def dec_opt(v: Any) -> Any:
            return None if v is None else inner(v)

        return dec_opt
    if kind == "tuple":
        item = _decoder(shape[1])

        def dec_tuple(v: Any) -> Any:
            if v.__class__ is not list:
                raise Unfit
            return tuple([item(e) for e in v])

        return dec_tuple
    if kind == "union":
        return _union_decoder(shape[1])
    return _nested_decoder(shape[1])


def _nested_encoder(cls: type) -> Encoder:
    """The compiled encoder of ``cls``, or the converter's hook followed by ``dumps``."""
    compiled = class_encoder(cls)
    if compiled is not None:
        return compiled
    hook = converter.get_unstructure_hook(cls)
    return lambda v: dumps(hook(v))


def _nested_decoder(cls: type) -> Decoder:
    compiled = class_decoder(cls)
    if compiled is not None:
        return compiled
    hook = converter.get_structure_hook(cls)
    return lambda v: hook(v, cls)


def _unfit(v: Any) -> Any:
    raise Unfit


def _unfit_check(v: Any, d: int) -> None:
    raise Unfit


class _Dispatch:
    """A tagged union's compiled variants, by class for encoding and by tag for decoding.

    Variants are compiled on first sight; one that does not compile, a class that is not the
    registered variant of its tag and an unclaimed tag map to a function raising ``Unfit``.
    Caching is safe because a tag never changes its class once registered.
    """

    __slots__ = ("checkers", "decoders", "encoders", "union")

    def __init__(self, union: TaggedUnion[Any]) -> None:
        self.union = union
        self.encoders: dict[type, Encoder] = {}
        self.decoders: dict[Any, Decoder] = {}  # by tag, as parsed
        self.checkers: dict[type, Checker] = {}

    def encoder(self, v: Any) -> Encoder:
        """The encoder of ``v``'s class (for a miss in ``encoders``)."""
        cls = v.__class__
        fn = _variant(self.union, cls, class_encoder)
        fn = self.encoders[cls] = fn if fn is not None else _unfit
        return fn

    def decoder(self, v: Any) -> Decoder:
        """The decoder of the parsed object ``v``'s tag (for a miss in ``decoders``)."""
        if v.__class__ is not dict:
            raise Unfit
        tag = v.get(self.union.tag)
        if type(tag) is not str:
            raise Unfit
        cls = self.union.variants.get(tag)
        fn = _variant(self.union, cls, class_decoder) if cls is not None else None
        fn = self.decoders[tag] = fn if fn is not None else _unfit
        return fn

    def checker(self, v: Any) -> Checker:
        """The checker of ``v``'s class (for a miss in ``checkers``): the registered variant's,
        the unknown variant's, or one raising ``Unfit`` for any other class."""
        cls = v.__class__
        union = self.union
        fn: Checker | None
        if cls is union.unknown_type:

            def fn(v: Any, d: int) -> None:
                _check_unknown(union, v, d)

        else:
            fn = _variant(union, cls, class_checker)
        fn = self.checkers[cls] = fn if fn is not None else _unfit_check
        return fn

    def check(self, v: Any, d: int) -> None:
        (self.checkers.get(v.__class__) or self.checker(v))(v, d)

    def encode(self, v: Any) -> str:
        fn = self.encoders.get(v.__class__) or self.encoder(v)
        return fn(v)

    def decode(self, v: Any) -> Any:
        if v.__class__ is not dict:
            raise Unfit
        return (self.decoders.get(v.get(self.union.tag)) or self.decoder(v))(v)


_dispatch: dict[type, _Dispatch] = {}


def _dispatch_of(union: TaggedUnion[Any]) -> _Dispatch:
    found = _dispatch.get(union.base)
    if found is None or found.union is not union:
        found = _dispatch[union.base] = _Dispatch(union)
    return found


def union_checkers(union: TaggedUnion[Any]) -> tuple[dict[type, Checker], Callable[[Any], Checker]]:
    """``(by_class, resolve)`` for the members of ``union``: ``(by_class.get(v.__class__) or
    resolve(v))(v, d)`` checks ``v`` as a member (a class that is not its tag's registered
    variant, or not of the union at all, raises ``Unfit``), as a payload's union field is."""
    dispatch = _dispatch_of(union)
    return dispatch.checkers, dispatch.checker


def _union_encoder(union: TaggedUnion[Any]) -> Encoder:
    return _dispatch_of(union).encode


def _union_decoder(union: TaggedUnion[Any]) -> Decoder:
    return _dispatch_of(union).decode


def _variant(union: TaggedUnion[Any], cls: type, compile: Callable[[type], Any]) -> Any:
    """``compile(cls)`` if ``cls`` is the variant registered for its tag (tags never move)."""
    field = attrs.fields_dict(cls).get(union.tag) if attrs.has(cls) else None
    if field is None or field.init or type(field.default) is not str:
        return None
    if union.variants.get(field.default) is not cls:
        return None
    return compile(cls)


# -- class compilation -------------------------------------------------------------------------


@attrs.frozen
class _Plan:
    """What compiling ``cls`` needs: its fields in order, and its tag if it is a variant."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    cls: type
    fields: tuple[tuple[str, Shape, Any], ...]  # (name, shape, default or NOTHING)
    tag: tuple[str, str] | None  # (tag key, tag value) of a tagged-union variant


#: Compiling happens once per class, in whichever thread first needs it (loads and flushes run
#: in worker threads); one lock keeps two threads from racing on the recursion guards.
_compiling = threading.RLock()
_plans: dict[type, _Plan | None] = {}
_encoders: dict[type, Encoder | None] = {}
_decoders: dict[type, Decoder | None] = {}


def _plan(cls: type) -> _Plan | None:
    if cls in _plans:
        return _plans[cls]
    try:
        plan = _make_plan(cls)
    except Exception:  # e.g. an annotation that does not resolve: the converter will say
        plan = None
    _plans[cls] = plan
    return plan


def _make_plan(cls: type) -> _Plan | None:
    fields = filled_fields(cls)
    if fields is None:
        return None
    attrs.resolve_types(cls)  # annotations to types, in place: the shapes below read them
    union = next(
        (u for u in tagged_unions().values() if cls is not u.base and issubclass(cls, u.base)),
        None,
    )
    tag: tuple[str, str] | None = None
    planned: list[tuple[str, Shape, Any]] = []
    for f in fields:
        if slot_setter(cls, f.name) is None or f.validator is not None:
            return None
        if f.alias != f.name or isinstance(f.default, attrs.Factory):  # type: ignore[arg-type]
            return None
        if f.converter is not None:
            # Free-form JSON that defaults to None (``tool/result`` meta): decoded as the
            # converter does (``freeze_json``), encoded only when it holds that default.
            if f.converter is not freeze_json or f.default is not None or not f.init:
                return None
            planned.append((f.name, ("json",), f.default))
            continue
        if not f.init:
            if union is None or f.name != union.tag or type(f.default) is not str:
                return None
            tag = (f.name, f.default)
            continue
        shape = _shape(f.type)
        if shape is None:
            return None
        planned.append((f.name, shape, f.default))
    if union is not None and tag is None:
        return None
    return _Plan(cls=cls, fields=tuple(planned), tag=tag)


def _inline_check(kind: str, v: str) -> str | None:
    """A statement that raises :class:`Unfit` unless ``v`` is a plain scalar of ``kind``."""
    if kind == "int" or kind == "str":
        return f"if {v}.__class__ is not {kind}: raise Unfit"
    if kind == "lit":
        return f"if {v}.__class__ is not str or {v} not in {v}_values: raise Unfit"
    if kind == "bool":
        return f"if {v} is not True and {v} is not False: raise Unfit"
    return None


def class_encoder(cls: type) -> Encoder | None:
    """The compiled encoder of ``cls``: value -> JSON text, as ``dumps(unstructure(value))``
    writes it (defaults omitted, a variant's tag last). ``None`` if ``cls`` does not compile.
    """
    fn = _encoders.get(cls, _MISSING)
    if fn is not _MISSING:
        return fn  # type: ignore[return-value]
    with _compiling:
        if cls in _encoders:  # compiled meanwhile, or being compiled by this thread
            return _encoders[cls]
        _encoders[cls] = None  # a class that contains itself uses the converter inside
        plan = _plan(cls)
        fn = _compile_encoder(plan) if plan is not None else None
        _encoders[cls] = fn
        return fn


def _compile_encoder(plan: _Plan) -> Encoder:
    env: dict[str, Any] = {"Unfit": Unfit, "cls": plan.cls, "encode_str": encode_basestring}
    body = ["if o.__class__ is not cls: raise Unfit"]
    parts: list[str] = []  # f-string parts of the fields that are always written
    conditional = False  # past a defaulted field: the text is built in ``s``
    for i, (name, shape, default) in enumerate(plan.fields):
        v = f"v{i}"
        env[f"k{i}"] = encode_basestring(name) + ":"
        kind = shape[0]
        check = _inline_check(kind, v)
        if kind == "int":
            text = v
        elif kind == "str" or kind == "lit":
            text = f"encode_str({v})"
            check = _inline_check("str", v)  # the converter writes any string it is given
        elif kind == "bool":
            text = f'("true" if {v} else "false")'
        elif kind == "union":
            dispatch = _dispatch_of(shape[1])
            env[f"by_class{i}"] = dispatch.encoders
            env[f"resolve{i}"] = dispatch.encoder
            text = f"(by_class{i}.get({v}.__class__) or resolve{i}({v}))({v})"
        elif kind == "json":  # written only as its default (omitted); any other value: Unfit
            env[f"enc{i}"] = _unfit
            text = f"enc{i}({v})"
        else:
            env[f"enc{i}"] = _encoder(shape)
            text = f"enc{i}({v})"
        body.append(f"{v} = o.{name}")
        if default is _NOTHING:
            if check:
                body.append(check)
            if conditional:
                body.append(f"s += f',{{k{i}}}{{{text}}}'")
            else:
                parts.append(f"{{k{i}}}{{{text}}}")
            continue
        if not conditional:
            conditional = True
            body.append(f"s = f',{','.join(parts)}'" if parts else "s = ''")
        env[f"d{i}"] = default
        body.append(f"if {v} != d{i}:")
        if check:
            body.append(f"    {check}")
        body.append(f"    s += f',{{k{i}}}{{{text}}}'")
    if plan.tag is not None:
        key, value = plan.tag
        env["tag_value"] = value
        env["tag"] = encode_basestring(key) + ":" + encode_basestring(value)
        # The converter writes whatever the tag attribute holds; it is the constant here.
        body.append(f"if o.{key}.__class__ is not str or o.{key} != tag_value: raise Unfit")
        if conditional:
            body.append("s += ',' + tag")
        else:
            parts.append("{tag}")
    if conditional:
        body.append("return '{' + s[1:] + '}'")  # ''[1:] is '': no field gives {}
    else:
        body.append(f"return f'{{{{{','.join(parts)}}}}}'")
    return cast("Encoder", _exec("encode", body, env, plan.cls))


def class_decoder(cls: type) -> Decoder | None:
    """The compiled decoder of ``cls``: parsed JSON -> value, as ``structure(data, cls)``
    builds it (strict types, no unknown keys). ``None`` if ``cls`` does not compile.
    """
    fn = _decoders.get(cls, _MISSING)
    if fn is not _MISSING:
        return fn  # type: ignore[return-value]
    with _compiling:
        if cls in _decoders:
            return _decoders[cls]
        _decoders[cls] = None
        plan = _plan(cls)
        fn = _compile_decoder(plan) if plan is not None else None
        _decoders[cls] = fn
        return fn


def _compile_decoder(plan: _Plan) -> Decoder:
    allowed = {name for name, _, _ in plan.fields}
    # Values are built as an open twin filled by plain attribute stores, then given their
    # class (see dsh_core._frozen.open_twin): a half-built one never leaves this function.
    env: dict[str, Any] = {
        "Unfit": Unfit,
        "cls": plan.cls,
        "new": object.__new__,
        "open": open_twin(plan.cls),
    }
    env["MISSING"] = _MISSING
    if plan.tag is not None:
        allowed.add(plan.tag[0])
    optional = any(default is not _NOTHING for _, _, default in plan.fields)
    if not optional:
        # Every key is fetched and must be there, so the count rules out any other key.
        body = [f"if o.__class__ is not dict or len(o) != {len(allowed)}: raise Unfit"]
    else:
        # Each absent optional key is counted (``k``); at the end the dict must hold exactly
        # the others, which rules out any unknown key (cheaper than a key-set comparison).
        body = ["if o.__class__ is not dict: raise Unfit", "k = 0"]
    if plan.tag is not None:
        key, value = plan.tag
        env["tag_value"] = value
        body.append(f"if o.get({key!r}) != tag_value: raise Unfit")
    body.append("obj = open()" if "__init__" in env["open"].__dict__ else "obj = new(open)")
    for i, (name, shape, default) in enumerate(plan.fields):
        v = f"v{i}"
        check = _inline_check(shape[0], v)
        if shape[0] == "lit":
            env[f"{v}_values"] = shape[1]
        value = v
        if shape[0] == "union":
            dispatch = _dispatch_of(shape[1])
            env[f"by_tag{i}"] = dispatch.decoders
            env[f"resolve{i}"] = dispatch.decoder
            check = f"if {v}.__class__ is not dict: raise Unfit"
            tag = shape[1].tag
            value = f"(by_tag{i}.get({v}.get({tag!r})) or resolve{i}({v}))({v})"
        elif shape[0] == "json":
            env[f"dec{i}"] = freeze_json  # raises on anything that is not JSON within limits
            value = f"dec{i}({v})"
        elif check is None:
            env[f"dec{i}"] = _decoder(shape)
            value = f"dec{i}({v})"
        # A missing key yields MISSING, which no check or decoder accepts.
        body.append(f"{v} = o.get({name!r}, MISSING)")
        if default is _NOTHING:
            if check:
                body.append(check)
            body.append(f"obj.{name} = {value}")
        else:
            env[f"d{i}"] = default
            body += [f"if {v} is MISSING:", f"    obj.{name} = d{i}", "    k += 1", "else:"]
            if check:
                body.append(f"    {check}")
            body.append(f"    obj.{name} = {value}")
    if optional:
        body.append(f"if len(o) + k != {len(allowed)}: raise Unfit")
    if plan.tag is not None:
        body.append(f"obj.{plan.tag[0]} = tag_value")
    body += ["obj.__class__ = cls", "return obj"]
    return _exec("decode", body, env, plan.cls)


def _exec(name: str, body: list[str], env: dict[str, Any], cls: type) -> Callable[..., Any]:
    """Define ``name(o)`` from ``body`` lines; registered with ``linecache`` so that
    tracebacks show the generated code."""
    source = f"def {name}(o, _=None):\n" + "".join(f"    {line}\n" for line in body)
    filename = f"<dsh codec {name} {cls.__module__}.{cls.__qualname__}>"
    exec(compile(source, filename, "exec"), env)
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    return cast("Callable[..., Any]", env[name])


# -- checkers ----------------------------------------------------------------------------------
# What ``Session.append`` commits, the JSONL log must write and read back equal. A compiled
# checker answers that for an attrs value at the cost of a few class checks: ``check(value, d)``
# returns if ``value`` surely round-trips and nests at most ``d`` levels, else raises
# ``Unfit``, and the caller takes the slow, exact route (EventTypeRegistry.snapshot), which
# gives the verdict and the error. Like the codecs, a checker never accepts what that route
# refuses. Besides the codecs' shapes it models ``float`` (finite, not -0.0) and fields frozen
# by :func:`~dsh_core._json.freeze_json` (walked for the nesting and the types again: a
# value's depth in its payload is only known here).

#: The compiled checkers by class (only classes that have one: the append fast path reads it).
checkers: dict[type, Checker] = {}
_unchecked: set[type] = set()  # classes without a checker, or being compiled


def _check_json(v: Any, d: int) -> None:
    """Raise ``Unfit`` unless ``v`` is frozen JSON within the limits, nesting at most ``d``."""
    c = v.__class__
    if c is str or v is None or c is bool:
        return
    if c is int:
        if abs(v) >= _INT_HI:
            raise Unfit
        return
    if c is float:
        _check_float(v, 0)
        return
    if d < 1:
        raise Unfit
    if c is tuple:
        for e in v:
            _check_json(e, d - 1)
        return
    if c is not types.MappingProxyType:
        raise Unfit
    for k, e in v.items():
        if k.__class__ is not str:
            raise Unfit
        _check_json(e, d - 1)


def _check_float(v: Any, _: int) -> None:
    if v.__class__ is not float or not math.isfinite(v) or (v == 0.0 and math.copysign(1.0, v) < 0):
        raise Unfit


def _check_shape(field: Any) -> Shape | None:
    """The shape a checker gives ``field``: the codecs' shapes, ``float`` and frozen JSON."""
    if field.converter is freeze_json:
        return ("json",)
    if field.converter is not None:
        return None
    tp = field.type
    if tp is float:
        return ("float",)
    if typing.get_origin(tp) in (types.UnionType, typing.Union) and set(typing.get_args(tp)) == {
        float,
        type(None),
    }:
        return ("opt", ("float",))
    return _shape(tp)


def _checker(shape: Shape) -> Checker:
    kind = shape[0]
    if kind == "json":
        return _check_json
    if kind == "float":
        return _check_float
    if kind in ("int", "str", "bool", "lit"):
        env: dict[str, Any] = {"Unfit": Unfit, "hi": _INT_HI, "o_values": shape[-1]}
        test = _inline_test(kind, "o")
        return _exec_checker([f"if {test}: raise Unfit"], env, f"<dsh codec check {kind}>")
    if kind == "opt":
        inner = _checker(shape[1])

        def check_opt(v: Any, d: int) -> None:
            if v is not None:
                inner(v, d)

        return check_opt
    if kind == "tuple":
        item = _checker(shape[1])

        def check_tuple(v: Any, d: int) -> None:
            if v.__class__ is not tuple or d < 1:
                raise Unfit
            d -= 1
            for e in v:
                item(e, d)

        return check_tuple
    if kind == "union":
        return _dispatch_of(shape[1]).check
    cls = shape[1]
    fn = class_checker(cls)
    if fn is not None:
        return fn

    def check_later(v: Any, d: int) -> None:  # a class being compiled (it contains itself)
        found = checkers.get(cls)
        if found is None:
            raise Unfit
        found(v, d)

    return check_later


def _scalar(shape: Shape) -> str:
    """The kind of a scalar or optional scalar shape, for :func:`_inline_test`."""
    return str(shape[1][0] if shape[0] == "opt" else shape[0])


def _inline_test(kind: str, v: str) -> str | None:
    """An expression true unless ``v`` is a plain scalar of ``kind`` the log can hold."""
    if kind == "int":
        return f"{v}.__class__ is not int or abs({v}) >= hi"
    if kind == "str":
        return f"{v}.__class__ is not str"
    if kind == "lit":
        return f"{v}.__class__ is not str or {v} not in {v}_values"
    if kind == "bool":
        return f"{v} is not True and {v} is not False"
    return None


def _check_unknown(union: TaggedUnion[Any], v: Any, d: int) -> None:
    """The unknown variant of ``union``: an unclaimed string tag and frozen JSON fields, none
    named like the tag (its line is the tag plus the fields, read back as the same value)."""
    tag = getattr(v, union.tag)
    fields = v.fields
    if tag.__class__ is not str or tag in union.variants or d < 1:
        raise Unfit
    if fields.__class__ is not types.MappingProxyType or union.tag in fields:
        raise Unfit
    for k, e in fields.items():
        if k.__class__ is not str:
            raise Unfit
        _check_json(e, d - 1)


def class_checker(cls: type) -> Checker | None:
    """The compiled checker of attrs class ``cls`` (see above); ``None`` if it has none."""
    fn = checkers.get(cls)
    if fn is not None or cls in _unchecked:
        return fn
    with _compiling:
        if cls in checkers or cls in _unchecked:
            return checkers.get(cls)
        _unchecked.add(cls)  # while compiling: a class that contains itself checks later
        try:
            fn = _compile_checker(cls)
        except Exception:  # e.g. an annotation that does not resolve: the slow route decides
            fn = None
        if fn is not None:
            checkers[cls] = fn
            _unchecked.discard(cls)
        return fn


#: What a checker reads of a class: its fields and shapes, and its (tag key, tag value).
_CheckPlan = tuple[tuple[tuple[str, Shape], ...], tuple[str, str] | None]
_check_plans: dict[type, _CheckPlan | None] = {}


def _check_plan(cls: type) -> _CheckPlan | None:
    if cls not in _check_plans:
        try:
            _check_plans[cls] = _make_check_plan(cls)
        except Exception:  # e.g. an annotation that does not resolve: the slow route decides
            _check_plans[cls] = None
    return _check_plans[cls]


def _make_check_plan(cls: type) -> _CheckPlan | None:
    if not attrs.has(cls) or any(cls is u.unknown_type for u in tagged_unions().values()):
        return None
    attrs.resolve_types(cls)
    union = next(
        (u for u in tagged_unions().values() if cls is not u.base and issubclass(cls, u.base)),
        None,
    )
    fields: list[tuple[str, Shape]] = []
    tag: tuple[str, str] | None = None
    for f in attrs.fields(cls):
        if f.alias != f.name:
            return None
        if not f.init:
            if union is None or f.name != union.tag or type(f.default) is not str:
                return None
            tag = (f.name, f.default)
            continue
        shape = _check_shape(f)
        if shape is None:
            return None
        fields.append((f.name, shape))
    if union is not None and (tag is None or union.variants.get(tag[1]) is not cls):
        return None  # not the registered variant of its tag: read back as another class
    return tuple(fields), tag


def _compile_checker(cls: type) -> Checker | None:
    plan = _check_plan(cls)
    if plan is None:
        return None
    env: dict[str, Any] = {"Unfit": Unfit, "hi": _INT_HI}
    body = _class_lines(cls, plan, "o", env, "d", frozenset())
    return _exec_checker(body, env, f"<dsh codec check {cls.__module__}.{cls.__qualname__}>")


def _none_left(d: str) -> str | None:
    """The test that no level is left of ``d`` (a name or a literal); ``None`` when ``d`` is
    a literal of at least one (the compiler folds no comparison: the test would run)."""
    if d.isdigit():
        return None if int(d) >= 1 else "True"
    return f"{d} < 1"


def _one_less(d: str) -> str:
    """``d`` minus one level, as a literal when ``d`` is one."""
    return str(int(d) - 1) if d.isdigit() else f"({d} - 1)"


def _class_lines(
    cls: type,
    plan: _CheckPlan,
    v: str,
    env: dict[str, Any],
    d: str,
    inlined: frozenset[type],
    src: str | None = None,
) -> list[str]:
    """Statements checking that ``src`` (by default the name ``v``, which also names what the
    statements define) is a ``cls`` (one level, ``d`` left) the log can hold."""
    fields, tag = plan
    o = src or v
    env[f"{v}_cls"] = cls
    none_left = _none_left(d)
    lines = [
        f"if {o}.__class__ is not {v}_cls{f' or {none_left}' if none_left else ''}: raise Unfit"
    ]
    inner = _one_less(d)
    if not inner.isdigit() and any(_inline_test(_scalar(f), "") is None for _, f in fields):
        lines.append(f"{v}_d = {inner}")  # the levels left inside, counted once
        inner = f"{v}_d"
    for i, (name, shape) in enumerate(fields):
        fv = f"{v}_{i}"
        lines.append(f"{fv} = {o}.{name}")
        lines += _check_lines(shape, fv, env, inner, inlined | {cls})
    if tag is not None:
        key, value = tag
        env[f"{v}_tag"] = value
        # Usually the very default string (attrs stores the default object): one identity test.
        lines.append(
            f"if {o}.{key} is not {v}_tag and ({o}.{key}.__class__ is not str or "
            f"{o}.{key} != {v}_tag): raise Unfit"
        )
    return lines


def _check_lines(
    shape: Shape, v: str, env: dict[str, Any], d: str, inlined: frozenset[type]
) -> list[str]:
    """Statements checking ``v`` (with ``d`` levels left) in a class checker: scalars,
    optional scalars, tuples of scalars or union members, union members and nested classes
    (a few levels, never a class inside itself) inline, anything else by a call."""
    kind = shape[0]
    if kind == "class" and shape[1] not in inlined and len(inlined) < 4:
        plan = _check_plan(shape[1])
        if plan is not None:
            return _class_lines(shape[1], plan, v, env, d, inlined)
    if kind == "lit" or (kind == "opt" and shape[1][0] == "lit"):
        env[f"{v}_values"] = shape[-1] if kind == "lit" else shape[1][1]
    test = _inline_test(kind, v)
    if test is not None:
        return [f"if {test}: raise Unfit"]
    if kind == "opt":
        test = _inline_test(shape[1][0], v)
        if test is not None:
            return [f"if {v} is not None and ({test}): raise Unfit"]
        lines = _check_lines(shape[1], v, env, d, inlined)
        return [f"if {v} is not None:", *(f"    {line}" for line in lines)]
    if kind == "union":
        dispatch = _dispatch_of(shape[1])
        env[f"{v}_by_class"] = dispatch.checkers
        env[f"{v}_resolve"] = dispatch.checker
        call = f"({v}_by_class.get({v}_c) or {v}_resolve({v}))({v}, {d})"
        lines = [f"{v}_c = {v}.__class__"]
        if len(inlined) < 3:
            # The variants registered by now whose fields are all scalars are checked inline
            # (an identity test each); any other class takes the union's dispatch.
            for j, cls in enumerate(shape[1].variants.values()):
                plan = _check_plan(cls)
                if plan is None or any(_inline_test(_scalar(f), "") is None for _, f in plan[0]):
                    continue
                w = f"{v}_v{j}"  # the value under a name of its own: names its fields' too
                env[f"{v}_c{j}"] = cls
                body = _class_lines(cls, plan, w, env, d, inlined)[1:]  # its class is known
                lines.append(f"{'elif' if len(lines) > 1 else 'if'} {v}_c is {v}_c{j}:")
                none_left = _none_left(d)
                if none_left:
                    lines.append(f"    if {none_left}: raise Unfit")
                lines.append(f"    {w} = {v}")
                lines += [f"    {line}" for line in body]
        if len(lines) == 1:
            return [lines[0], call]
        return [*lines, "else:", f"    {call}"]
    if kind == "tuple" and (shape[1][0] == "union" or _inline_test(shape[1][0], "") is not None):
        e = f"{v}_e"
        item = _check_lines(shape[1], e, env, f"{e}_d", inlined)
        none_left = _none_left(d)
        head = [
            f"if {v}.__class__ is not tuple{f' or {none_left}' if none_left else ''}: raise Unfit",
            f"{e}_d = {_one_less(d)}",
        ]
        return [*head, f"for {e} in {v}:"] + [f"    {line}" for line in item]
    env[f"{v}_check"] = _checker(shape)
    if kind == "json":  # usually absent (None): no call for that
        return [f"if {v} is not None: {v}_check({v}, {d})"]
    return [f"{v}_check({v}, {d})"]


def type_checker(tp: Any) -> Checker | None:
    """The compiled checker of a value of field type ``tp`` (a ``tuple[ContentBlock, ...]``,
    say): ``check(value, d)`` as a class checker checks a field of that type with ``d`` levels
    left at the field's value. ``None`` if ``tp`` has no shape the checkers model. Lets a
    caller that built a payload around such a value check that value alone."""
    shape = _shape(tp)
    if shape is None:
        return None
    with _compiling:
        env: dict[str, Any] = {"Unfit": Unfit, "hi": _INT_HI}
        body = _check_lines(shape, "o", env, "d", frozenset())
        return _exec_checker(body, env, f"<dsh codec check {tp!r}>")


def checked_builder(
    cls: type, name: str, levels: int, first: tuple[type, ...] = ()
) -> Callable[..., Any] | None:
    """A builder of frozen ``cls`` (as :func:`dsh_core._frozen.builder`'s) that first checks
    the value given for its field ``name`` as a class checker checks a field, with ``levels``
    left at the value, and raises :class:`Unfit` (building nothing) unless it vouches for it.

    One call where a build and a check took two, for a value that enters on a hot path (an
    adapter's chunk). A tagged-union field is checked inline for the variants whose fields
    are scalars or classes of scalars, ``first`` first (a test of the class each, in order),
    any other through the union's dispatch. Its parameters also take positions (in field
    order) when none has a default: a positional call skips matching keywords. ``None`` if
    either part does not compile.
    """
    plan = _builder_plan(cls)
    field = attrs.fields_dict(cls).get(name) if attrs.has(cls) else None
    if plan is None or field is None:
        return None
    with _compiling:
        attrs.resolve_types(cls)
        shape = _check_shape(attrs.fields_dict(cls)[name])
        if shape is None:
            return None
        signature, steps, env = plan
        if "=" not in signature:  # every parameter required: positions as well as keywords
            signature = signature.removeprefix("*, ")
        env.update({"Unfit": Unfit, "hi": _INT_HI, "_new": object.__new__})
        env["_open"], env["_cls"] = open_twin(cls), cls
        body: list[str] = []
        # The levels as a literal: the tests and sums on it are done here, not at each call.
        if shape[0] == "union":
            body += _union_chain(shape[1], first, env, str(int(levels)), name)
        else:
            body.append(f"_v = {name}")
            body += _check_lines(shape, "_v", env, str(int(levels)), frozenset({cls}))
        body.append("_o = _new(_open)")
        body += (step if isinstance(step, str) else f"_o.{step[1]} = {step[2]}" for step in steps)
        body += ["_o.__class__ = _cls", "return _o"]
        source = f"def build({signature}):\n" + "".join(f"    {line}\n" for line in body)
        filename = f"<dsh checked builder {cls.__module__}.{cls.__qualname__}>"
        exec(compile(source, filename, "exec"), env)
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        return cast("Callable[..., Any]", env["build"])


def _union_chain(
    union: TaggedUnion[Any], first: tuple[type, ...], env: dict[str, Any], d: str, v: str
) -> list[str]:
    """Statements checking ``v`` (a parameter name) as a member of ``union`` with ``d``
    levels left (see :func:`checked_builder`)."""
    dispatch = _dispatch_of(union)
    env["_by_class"], env["_resolve"] = dispatch.checkers, dispatch.checker
    variants = [*first, *(c for c in union.variants.values() if c not in first)]
    lines = [f"_c = {v}.__class__"]
    none_left = _none_left(d)
    for j, cls in enumerate(variants):
        plan = _check_plan(cls)
        if plan is None or not all(_flat(f) for _, f in plan[0]):
            continue
        env[f"_c{j}"] = cls
        body = _class_lines(cls, plan, f"_w{j}", env, d, frozenset(), v)[1:]  # class known
        lines.append(f"{'elif' if len(lines) > 1 else 'if'} _c is _c{j}:")
        if none_left:
            lines.append(f"    if {none_left}: raise Unfit")
        lines += [f"    {line}" for line in body]
    call = f"(_by_class.get(_c) or _resolve({v}))({v}, {d})"
    return [*lines, "else:", f"    {call}"] if len(lines) > 1 else [*lines, call]


def _flat(shape: Shape) -> bool:
    """Whether ``shape`` is a scalar, or an (optional) class whose fields are all scalars."""
    if _inline_test(_scalar(shape), "") is not None:
        return True
    inner = shape[1] if shape[0] == "opt" else shape
    if inner[0] != "class":
        return False
    plan = _check_plan(inner[1])
    return plan is not None and all(_inline_test(_scalar(f), "") is not None for _, f in plan[0])


def _exec_checker(body: list[str], env: dict[str, Any], filename: str) -> Checker:
    source = "def check(o, d):\n" + "".join(f"    {line}\n" for line in body)
    exec(compile(source, filename, "exec"), env)
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    return cast("Checker", env["check"])
