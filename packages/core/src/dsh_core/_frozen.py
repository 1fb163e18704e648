"""Faster construction of the frozen attrs classes on the hot path.

attrs builds a frozen slotted instance through ``object.__setattr__(self, name, value)`` per
field: a generic attribute store that looks the slot up by name every time, about twice what
the store itself costs. A turn builds some forty payloads, messages and blocks, and a streamed
answer one chunk payload per token, so:

- :func:`speed_up_inits` gives each frozen class of a module an ``__init__`` that fills the
  slots through their descriptors directly (every ``Cls(...)`` call benefits), made at the
  class's first construction;
- :func:`builder` goes further for the hottest call sites: calling a class at all (argument
  tuple, keyword dict, ``__init__`` lookup) costs more than filling a small payload, so a
  builder is a plain function that fills an :func:`open_twin` with ordinary attribute stores
  and swaps the class in. It is about 2.5 times as fast as the class call.

Both take the same keyword-only parameters with the same defaults, run the same factories and
converters in the same order, and leave validators, equality, hashing, ``repr`` and
immutability to attrs. A class they cannot reproduce exactly (validators, pre- or post-init
hooks, a field alias, a factory that takes ``self``, a positional parameter, a field without a
slot) keeps attrs' own ``__init__`` and is its own builder.
"""

from __future__ import annotations

import linecache
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

import attrs

__all__ = [
    "attrs_eq",
    "attrs_hash",
    "attrs_init",
    "attrs_repr",
    "builder",
    "filled_fields",
    "is_generated_init",
    "open_twin",
    "slot_setter",
    "speed_up_inits",
]

P = ParamSpec("P")
T = TypeVar("T")

_PREFIX = "<dsh fast init "
#: attrs' own ``__init__`` of every class given a faster one (tests compare the two).
_originals: dict[type, Callable[..., None]] = {}
#: The open twin of each frozen class that has one.
_twins: dict[type, type] = {}
#: The builder of each class asked for one (a module asking again gets the same function).
_builders: dict[type, Callable[..., Any]] = {}


try:  # attrs' own record, so a cycle through generated and shared reprs reads the same
    from attr._compat import repr_context as _repring
except ImportError:  # pragma: no cover - another attrs: the same rule, a record of our own
    _repring = threading.local()


def attrs_repr(self: Any) -> str:
    """The ``repr`` attrs would generate for ``self``'s class, by one shared function.

    attrs compiles a ``__repr__`` per class when the class is made, about two fifths of what
    building a class compiles; a class that says ``__repr__ = attrs_repr`` in its body gets
    none compiled (attrs sees a ``__repr__`` of its own) and the same text: the class's
    ``__qualname__`` (after the last ``>.``), each field with ``repr`` on as
    ``name=<its repr or the field's repr callable>`` (a field not in ``__init__`` that is
    unset shows ``NOTHING``), and ``...`` for a value met again while its own repr is being
    built (attrs' own record of those: a cycle through both kinds reads the same; PERF-13).
    A repr is never on the hot path; reading the fields costs little more.
    """
    try:
        seen: set[int] = _repring.already_repring
    except AttributeError:
        seen = _repring.already_repring = set()
    key = id(self)
    if key in seen:
        return "..."
    seen.add(key)
    try:
        parts = []
        # The fields of the class this repr is the ``__repr__`` of, as attrs' own would show
        # (a subclass made with ``repr=False`` inherits it and shows its base's fields).
        mro = type(self).__mro__
        owner = next((k for k in mro if k.__dict__.get("__repr__") is attrs_repr), type(self))
        for a in attrs.fields(owner):
            show = a.repr
            if show is False:
                continue
            value = getattr(self, a.name) if a.init else getattr(self, a.name, attrs.NOTHING)
            parts.append(f"{a.name}={value!r}" if show is True else f"{a.name}={show(value)}")
        name = self.__class__.__qualname__.rsplit(">.", 1)[-1]
        return f"{name}({', '.join(parts)})"
    finally:
        seen.remove(key)


def attrs_eq(self: Any, other: object) -> Any:
    """A stand-in for the ``__eq__`` attrs would generate: a frozen class that says
    ``__eq__ = attrs_eq`` and ``__hash__ = attrs_hash`` in its body gets neither compiled when
    it is made (attrs sees methods of its own), and each is compiled on its first call, the
    same code as attrs', then put in the stand-in's place (PERF-18). Most classes a start
    makes are never compared or hashed before its first request, many never at all."""
    return _settle_method(type(self), "__eq__", attrs_eq)(self, other)


def attrs_hash(self: Any) -> Any:
    """A stand-in for the ``__hash__`` attrs would generate for a frozen class (see
    :func:`attrs_eq`): the fields that take part in equality, after a per-class constant."""
    return _settle_method(type(self), "__hash__", attrs_hash)(self)


def _settle_method(cls: type, name: str, stand_in: Callable[..., Any]) -> Callable[..., Any]:
    """Compile method ``name`` of the class whose own it ``stand_in`` is (``cls`` or a base),
    put it there and return it."""
    owner = next((k for k in cls.__mro__ if k.__dict__.get(name) is stand_in), cls)
    fields = attrs.fields(owner)
    env: dict[str, Any] = {}

    def value(f: Any, obj: str) -> str:  # an attrs.Attribute (its stub lacks eq_key)
        """What equality and the hash see of field ``f`` of ``obj``: its ``eq_key`` of it."""
        if f.eq_key:
            env[f"_{f.name}_key"] = f.eq_key
            return f"_{f.name}_key({obj}.{f.name})"
        return f"{obj}.{f.name}"

    if name == "__eq__":
        terms = [f"{value(f, 'self')} == {value(f, 'other')}" for f in fields if f.eq]
        body = [
            "if other.__class__ is not self.__class__:",
            "    return NotImplemented",
            f"return ({' and '.join(terms)})" if terms else "return True",
        ]
        head = "def __eq__(self, other):"
    else:
        hashed = [f for f in fields if f.hash is True or (f.hash is None and f.eq is True)]
        items = [f"{hash(f'<dsh hash {owner.__module__}.{owner.__qualname__}>')}"]
        items.extend(value(f, "self") for f in hashed)
        body = [f"return hash(({', '.join(items)},))"]
        head = "def __hash__(self):"
    filename = f"<dsh {name} {owner.__module__}.{owner.__qualname__}>"
    method: Callable[..., Any] = _define(head, body, env, filename)
    method.__qualname__ = f"{owner.__qualname__}.{name}"
    method.__module__ = owner.__module__
    setattr(owner, name, method)
    return method


def attrs_init(cls: type) -> Callable[..., None] | None:
    """attrs' ``__init__`` of ``cls`` if :func:`speed_up_inits` replaced it."""
    if cls in _pending:
        _settle(cls)
    return _originals.get(cls)


def is_generated_init(cls: type) -> bool:
    """Whether ``cls.__init__`` is attrs-generated or its faster equivalent from here: either
    way constructing ``cls`` is exactly filling its fields, nothing of the class's own runs."""
    init = cls.__dict__.get("__init__")
    if cls in _pending:
        return True  # attrs' own until the first call settles it
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
    (pass ``globals()`` at the end of the module) by an equivalent, faster one.

    Made when the class is first constructed (PERF-15): until then the class has a stand-in
    ``__init__`` (attrs' signature, through ``__wrapped__``) that makes the faster one, puts
    it in its own place and runs it. A start imports many classes it never builds, and
    compiling an ``__init__`` for each was a measurable part of importing them."""
    module = namespace["__name__"]
    for value in list(namespace.values()):
        if isinstance(value, type) and value.__module__ == module and _is_frozen(value):
            _defer(value)


#: attrs' ``__init__`` of each class whose faster one is made at its first construction.
_pending: dict[type, Callable[..., None]] = {}


def _is_frozen(cls: type) -> bool:
    """Frozen by attrs (the first thing :func:`_plan` requires), with an ``__init__`` of its
    own not yet replaced."""
    return (
        getattr(getattr(cls, "__setattr__", None), "__name__", "") == "_frozen_setattrs"
        and "__init__" in cls.__dict__
        and cls not in _originals
        and cls not in _pending
    )


def _defer(cls: type) -> None:
    original = cls.__dict__["__init__"]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _settle(cls)(self, *args, **kwargs)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__.__qualname__ = original.__qualname__
    __init__.__module__ = original.__module__
    __init__.__doc__ = original.__doc__
    __init__.__annotations__ = dict(original.__annotations__)
    _pending[cls] = original
    cls.__init__ = __init__  # type: ignore[misc]


def _settle(cls: type) -> Callable[..., None]:
    """Give ``cls`` its faster ``__init__`` (or attrs' back, when there is none) and return
    the one in place. Once per class; a second thread finds it done."""
    original = _pending.pop(cls, None)
    if original is not None:
        cls.__init__ = original  # type: ignore[misc]
        _speed_up(cls)
    init: Callable[..., None] = cls.__dict__["__init__"]
    return init


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


def open_twin(cls: type[T]) -> type[T]:
    """The open twin of frozen slotted class ``cls``: a subclass with no slots of its own whose
    attribute stores are plain slot stores (frozen ``cls`` refuses them).

    Build a value as ``obj = object.__new__(twin)``, fill it with ``obj.name = value`` (the
    interpreter's fastest store) and finish with ``obj.__class__ = cls``: the result is an
    ordinary, frozen ``cls``. An unfinished twin must never escape. When ``cls`` has no
    ``__new__`` of its own, ``twin()`` makes the empty value too, a little cheaper (no
    argument tuple, no checks of ``object.__new__``'s own).
    """
    twin = _twins.get(cls)
    if twin is None:
        namespace = {
            "__slots__": (),
            # Both, or the interpreter keeps dispatching stores to a Python-level hook.
            "__setattr__": object.__setattr__,
            "__delattr__": object.__delattr__,
            "__module__": cls.__module__,
            "__qualname__": f"{cls.__qualname__}.<open>",
        }
        if cls.__new__ is object.__new__:
            namespace["__init__"] = object.__init__  # ``twin()``: an empty value, nothing run
        twin = _twins[cls] = type(cls.__name__, (cls,), namespace)
    return twin


def builder(cls: Callable[P, T]) -> Callable[P, T]:
    """A function that builds ``cls`` exactly as its constructor does, about 2.5 times as fast.

    Calling a class goes through the type's generic call (argument tuple, keyword dict,
    ``__init__`` lookup), which costs more than filling a frozen payload's slots; a builder is
    a plain function that fills an :func:`open_twin` and swaps in ``cls``. Same keyword-only
    parameters, defaults, factories and converters as the constructor. A class whose
    constructor cannot be reproduced exactly comes back unchanged (the class itself).
    Built once per class: every module that builds ``cls`` shares one function.
    """
    assert isinstance(cls, type)
    known: Callable[P, T] | None = _builders.get(cls)
    if known is None:
        known = _builders[cls] = _make_builder(cls)
    return known


def _make_builder(cls: Callable[P, T]) -> Callable[P, T]:
    assert isinstance(cls, type)
    plan = _plan(cls)
    if plan is None:
        return cls
    signature, steps, env = plan
    env["_new"] = object.__new__
    env["_open"] = open_twin(cls)
    env["_cls"] = cls
    body = ["_o = _new(_open)"]
    body += (step if isinstance(step, str) else f"_o.{step[1]} = {step[2]}" for step in steps)
    body += ["_o.__class__ = _cls", "return _o"]
    filename = f"<dsh builder {cls.__module__}.{cls.__qualname__}>"
    build: Callable[P, T] = _define(f"def build({signature}):", body, env, filename)
    build.__name__ = cls.__name__
    build.__qualname__ = cls.__qualname__
    annotations = dict(getattr(vars(cls).get("__init__"), "__annotations__", {}))
    annotations["return"] = cls.__qualname__
    build.__annotations__ = annotations
    build.__doc__ = f"Build a {cls.__qualname__} (see :func:`dsh_core._frozen.builder`)."
    return build


def _plan(cls: type) -> tuple[str, list[str | tuple[int, str, str]], dict[str, Any]] | None:
    """How attrs' ``__init__`` of frozen ``cls`` fills it: its parameter list, its steps (a
    statement, or a store ``(index, field, value expression)``) and their names; ``None`` if
    it cannot be reproduced exactly."""
    if getattr(getattr(cls, "__setattr__", None), "__name__", "") != "_frozen_setattrs":
        return None  # not frozen (attrs' plain stores are fast), or an attrs we do not know
    fields = filled_fields(cls)
    if fields is None:
        return None
    env: dict[str, Any] = {"NOTHING": attrs.NOTHING}
    params: list[str] = []
    steps: list[str | tuple[int, str, str]] = []
    for i, f in enumerate(fields):
        if slot_setter(cls, f.name) is None or f.validator is not None or f.alias != f.name:
            return None
        if f.init and not f.kw_only:
            return None
        converter = f.converter
        if converter is not None and (
            isinstance(converter, attrs.Converter) or not callable(converter)
        ):
            return None
        value = f.name
        default = f.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            if default.takes_self:
                return None
            env[f"factory_{i}"] = default.factory
            if f.init:
                params.append(f"{f.name}=NOTHING")
                steps.append(f"if {value} is NOTHING: {value} = factory_{i}()")
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
            return None  # attrs leaves such a slot empty
        if converter is not None:
            env[f"convert_{i}"] = converter
            value = f"convert_{i}({value})"
        steps.append((i, f.name, value))
    return (f"*, {', '.join(params)}" if params else ""), steps, env


def _define(head: str, body: list[str], env: dict[str, Any], filename: str) -> Any:
    """Compile one generated function (registered with ``linecache`` for tracebacks)."""
    source = head + "\n" + "".join(f"    {line}\n" for line in body or ["pass"])
    exec(compile(source, filename, "exec"), env)
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    return env[head[4 : head.index("(")]]


def _speed_up(cls: type) -> None:
    if cls in _originals:
        return
    plan = _plan(cls)
    if plan is None:
        return
    signature, steps, env = plan
    body: list[str] = []
    for step in steps:
        if isinstance(step, str):
            body.append(step)
        else:
            i, name, value = step
            env[f"set_{i}"] = slot_setter(cls, name)
            body.append(f"set_{i}(self, {value})")
    params = f"self, {signature}" if signature else "self"
    filename = f"{_PREFIX}{cls.__module__}.{cls.__qualname__}>"
    init = _define(f"def __init__({params}):", body, env, filename)
    original = cls.__dict__["__init__"]
    init.__qualname__ = original.__qualname__
    init.__module__ = original.__module__
    init.__annotations__ = dict(original.__annotations__)
    init.__doc__ = original.__doc__
    _originals[cls] = original
    cls.__init__ = init  # type: ignore[misc]
