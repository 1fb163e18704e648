"""The system prompt (``ctx.system_prompt``): ordered sections, variables, runtime contexts.

A section registered through an agent's context is scoped to that agent and *shadows* the
global section of the same name for that agent alone: this is how a child's persona replaces
the deployment's ``deployment:persona`` (order 0). Section text is a strict template:
``{{name}}`` must name a registered variable that has a value, or assembly fails with
``PROMPT_TEMPLATE`` (host-core §8). Order bands: -100 identity, 0 persona, 100-199 tool
guidance.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, cast

import attrs

from ._abort import AbortSignal
from ._context import ScopedCache, nearest_scope
from ._errors import DshError
from ._frozen import attrs_eq, attrs_hash, attrs_repr, builder, speed_up_inits

if TYPE_CHECKING:
    from ._agent import Agent
    from ._context import Context, Scope

__all__ = [
    "AssembleContext",
    "PromptAssembly",
    "PromptContext",
    "PromptError",
    "PromptSection",
    "SystemPromptRegistry",
    "SystemPromptService",
    "render_prompt",
]

PERSONA_SECTION = "deployment:persona"


class PromptError(DshError):
    """A prompt template is malformed or names an unknown/valueless variable."""

    code = "PROMPT_TEMPLATE"


@attrs.frozen(kw_only=True)
class AssembleContext:
    """For whom the prompt is being assembled."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    scope: Scope | None = None
    signal: AbortSignal | None = attrs.field(default=None, eq=False)
    agent: Agent | None = attrs.field(default=None, eq=False)


TextSource = str | Callable[[AssembleContext], str]


@attrs.frozen(kw_only=True)
class PromptSection:
    """A piece of the system text. ``text`` may be computed per assembly."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    name: str
    order: float
    text: TextSource = attrs.field(eq=False)


@attrs.frozen(kw_only=True)
class PromptContext:
    """A runtime-context statement; changed contexts reach the model as a user message."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    name: str
    order: float
    text: TextSource = attrs.field(eq=False)


@attrs.frozen(kw_only=True)
class PromptAssembly:
    """One assembly: the rendered system text, its sections, and the joined contexts."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    system: str
    sections: tuple[tuple[str, str], ...]
    context: str
    variables: Mapping[str, str]


_TOKEN = re.compile(r"\{\{(.*?)\}\}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]*$")


def render_prompt(template: str, variables: Mapping[str, str | None]) -> str:
    """Substitute ``{{name}}`` strictly: unknown, valueless or malformed -> ``PROMPT_TEMPLATE``."""
    if "{{" not in template and "}}" not in template:
        return template

    def sub(match: re.Match[str]) -> str:
        name = match.group(1).strip()
        if not _NAME.match(name):
            raise PromptError(f"malformed prompt variable {match.group(0)!r}")
        if name not in variables:
            raise PromptError(f"unknown prompt variable {{{{{name}}}}}")
        value = variables[name]
        if value is None:
            raise PromptError(f"prompt variable {{{{{name}}}}} has no value here")
        return value

    rendered = _TOKEN.sub(sub, template)
    if "{{" in _TOKEN.sub("", template) or "}}" in _TOKEN.sub("", template):
        raise PromptError(f"unbalanced braces in prompt template {template[:60]!r}")
    return rendered


@attrs.define(eq=False)
class _Item:
    __repr__ = attrs_repr
    value: PromptSection | PromptContext
    index: int


class SystemPromptService:
    """The sections, variables and contexts of one host (provided as ``system_prompt``)."""

    def __init__(self) -> None:
        self.sections: dict[Scope | None, dict[str, _Item]] = {None: {}}
        self.contexts: dict[Scope | None, dict[str, _Item]] = {None: {}}
        self.variables: dict[Scope | None, dict[str, Callable[[AssembleContext], str | None]]] = {
            None: {}
        }
        self._counter = 0
        #: Assemblies of static text, by effective scope; a change drops the entries it affects.
        self.cache: ScopedCache[PromptAssembly] = ScopedCache()
        #: Bumped by every change: a bound view's memo of its own scope is valid while equal.
        self.version = 0

    def __dsh_bind__(self, ctx: Context) -> SystemPromptRegistry:
        return SystemPromptRegistry(self, ctx)

    def next_index(self) -> int:
        self._counter += 1
        return self._counter

    def effective_scope(self, scope: Scope | None) -> Scope | None:
        """The cache key of ``scope``: the nearest scope with entries of its own."""
        return nearest_scope(scope, self.sections, self.contexts, self.variables)

    def changed(self, scope: Scope | None) -> None:
        """Drop the cached assemblies a change in ``scope`` can affect (an agent's scoped
        section never invalidates another agent's prompt)."""
        self.cache.drop(scope)
        self.version += 1


class _Variables(Mapping[str, "str | None"]):
    """Variables computed on first use, once per assembly."""

    __slots__ = ("_actx", "_providers", "cache")

    def __init__(
        self,
        providers: Mapping[str, Callable[[AssembleContext], str | None]],
        actx: AssembleContext,
    ) -> None:
        self._providers = providers
        self._actx = actx
        self.cache: dict[str, str | None] = {}

    def __getitem__(self, key: str) -> str | None:
        cache = self.cache
        if key not in cache:
            cache[key] = self._providers[key](self._actx)
        return cache[key]

    def __contains__(self, key: object) -> bool:
        return key in self._providers

    def __iter__(self) -> Iterator[str]:
        return iter(self._providers)

    def __len__(self) -> int:
        return len(self._providers)


def _layered(
    layers: Mapping[Scope | None, Mapping[str, _Item]], scope: Scope | None
) -> dict[str, _Item]:
    out: dict[str, _Item] = {}
    chain: list[Scope | None] = [*scope.chain(), None] if scope is not None else [None]
    for s in chain:  # nearest first
        for name, item in layers.get(s, {}).items():
            out.setdefault(name, item)
    return out


def _text(source: TextSource, ctx: AssembleContext) -> str:
    return source if isinstance(source, str) else source(ctx)


class SystemPromptRegistry:
    """``ctx.system_prompt``: the registry seen from one context (its scope and owner)."""

    __slots__ = ("_ctx", "_memo", "_scope", "_svc")

    def __init__(self, service: SystemPromptService, ctx: Context) -> None:
        self._svc = service
        self._ctx = ctx
        self._scope = ctx.scope
        # (service version, cached assembly) of this view's own scope: an agent assembles
        # every step, and an unchanged static prompt is the rule.
        self._memo: tuple[int, PromptAssembly] | None = None

    def cached(self) -> PromptAssembly | None:
        """This context's assembly if it is static and nothing changed since it was made
        (no rendering, no :class:`AssembleContext` needed); else ``None``: call
        :meth:`assemble`."""
        memo = self._memo
        if memo is not None and memo[0] == self._svc.version:
            return memo[1]
        return None

    def _register(
        self, layers: dict[Scope | None, dict[str, _Item]], value: PromptSection | PromptContext
    ) -> Callable[[], object]:
        self._ctx._require_active()
        scope = self._ctx.scope
        layer = layers.setdefault(scope, {})
        if value.name in layer:
            raise PromptError(
                f"prompt entry {value.name!r} is already registered in this scope",
                code="DUPLICATE_SECTION",
            )
        svc = self._svc
        item = _Item(value, svc.next_index())
        layer[value.name] = item
        ctx = self._ctx
        disposer = ctx.fiber.add(_Unregister(layers, scope, value.name, item, svc, ctx))
        svc.changed(scope)
        ctx.emit("system-prompt/change")
        return disposer

    def section(self, section: PromptSection) -> Callable[[], object]:
        """Register a section (scoped from an agent context, shadowing the global one)."""
        return self._register(self._svc.sections, section)

    def context(self, context: PromptContext) -> Callable[[], object]:
        """Register a runtime-context statement."""
        return self._register(self._svc.contexts, context)

    def variable(
        self, name: str, provider: Callable[[AssembleContext], str | None]
    ) -> Callable[[], object]:
        """Register a template variable; ``provider`` returns its value (``None``: no value)."""
        self._ctx._require_active()
        scope = self._ctx.scope
        layer = self._svc.variables.setdefault(scope, {})
        if name in layer:
            raise PromptError(
                f"prompt variable {name!r} is already registered", code="DUPLICATE_VARIABLE"
            )
        layer[name] = provider
        svc = self._svc
        variables = svc.variables
        ctx = self._ctx
        svc.changed(scope)

        def remove() -> None:
            current = variables.get(scope)
            if current is not None and current.get(name) is provider:
                del current[name]
                svc.changed(scope)
                ctx.emit("system-prompt/change")

        disposer = ctx.fiber.add(remove)
        ctx.emit("system-prompt/change")
        return disposer

    def assemble(self, actx: AssembleContext | None = None) -> PromptAssembly:
        """Render every visible section (ordered), and join the visible contexts."""
        if actx is None:
            actx = _assemble_context(scope=self._ctx.scope, agent=self._ctx.agent)
        scope = actx.scope
        svc = self._svc
        version = svc.version
        key = svc.effective_scope(scope)
        cached = svc.cache.get(key)
        if cached is None and key is not None and key is scope and scope.parent is None:
            base = svc.cache.get(None)
            if base is not None:
                cached = _static_assembly(svc, scope, base)
                if cached is not None:
                    svc.cache[key] = cached
        if cached is None:
            assembly = self._assemble(actx, key)
            if svc.cache.get(key) is not assembly:
                return assembly  # computed text: made afresh every time
            cached = assembly
        if scope is self._scope and svc.version == version:
            self._memo = (version, cached)
        return cached

    def _assemble(self, actx: AssembleContext, key: Scope | None) -> PromptAssembly:
        """The general assembly (templates, computed text, nested scopes); caches static
        results under ``key``."""
        scope = actx.scope
        svc = self._svc
        providers: dict[str, Callable[[AssembleContext], str | None]] = {}
        chain = list(scope.chain()) if scope is not None else []
        for s in [*chain, None]:
            for name, fn in svc.variables.get(s, {}).items():
                providers.setdefault(name, fn)
        variables = _Variables(providers, actx)
        sections = _layered(svc.sections, scope)
        context_items = _layered(svc.contexts, scope)
        static = all(
            isinstance(i.value.text, str) for i in (*sections.values(), *context_items.values())
        )

        def render(item: _Item) -> str:
            return render_prompt(_text(item.value.text, actx), variables)

        rendered = _rendered(sections, render)
        assembly = PromptAssembly(
            system="\n\n".join(t for _, t in rendered),
            sections=tuple(rendered),
            context="\n\n".join(t for _, t in _rendered(context_items, render)),
            variables={k: v for k, v in variables.cache.items() if v is not None},
        )
        if not variables.cache and static:
            svc.cache[key] = assembly
        return assembly


def _plain(layer: Mapping[str, _Item]) -> bool:
    """Whether every entry of ``layer`` is a fixed string with no template braces (it renders
    as its own stripped text and reads no variable)."""
    for item in layer.values():
        text = item.value.text
        if not isinstance(text, str) or "{{" in text or "}}" in text:
            return False
    return True


def _rendered(items: Mapping[str, _Item], render: Callable[[_Item], str]) -> list[tuple[str, str]]:
    """``(name, stripped rendering)`` of ``items`` in (order, registration) order, empties
    dropped: how both the general and the static assembly turn entries into text."""
    out: list[tuple[str, str]] = []
    for name, item in sorted(items.items(), key=lambda kv: (kv[1].value.order, kv[1].index)):
        text = render(item).strip()
        if text:
            out.append((name, text))
    return out


def _plain_text(item: _Item) -> str:
    return cast("str", item.value.text)


def _static_assembly(
    svc: SystemPromptService, scope: Scope, base: PromptAssembly
) -> PromptAssembly | None:
    """The assembly of a parentless ``scope`` whose own entries are plain strings, given the
    cached global assembly ``base`` (``None`` when the general path is needed).

    A cached global assembly means every global entry is a plain string that read no
    variable, so the result equals the general one: the global entries shadowed by name by
    the scope's own, rendered as stripped text, in (order, registration) order, with no
    variables. A layer the scope does not extend reuses ``base``'s rendering.
    """
    own_sections = svc.sections.get(scope)
    own_contexts = svc.contexts.get(scope)
    if own_sections:
        if not _plain(own_sections):
            return None
        sections = tuple(_rendered({**svc.sections[None], **own_sections}, _plain_text))
        system = "\n\n".join(t for _, t in sections)
    else:
        sections, system = base.sections, base.system
    if own_contexts:
        if not _plain(own_contexts):
            return None
        merged = {**svc.contexts[None], **own_contexts}
        context = "\n\n".join(t for _, t in _rendered(merged, _plain_text))
    else:
        context = base.context
    return PromptAssembly(system=system, sections=sections, context=context, variables={})


speed_up_inits(globals())

_assemble_context = builder(AssembleContext)  # once per step: see dsh_core._frozen.builder


class _Unregister:
    """Undoes one prompt registration. One slotted object instead of a closure (a function,
    its cell tuple and six cells): every agent with a scoped prompt entry holds one while it
    lives, each an object the cyclic collector walks (PERF-5)."""

    __slots__ = ("_ctx", "_item", "_layers", "_name", "_scope", "_svc")

    def __init__(
        self,
        layers: dict[Scope | None, dict[str, _Item]],
        scope: Scope | None,
        name: str,
        item: _Item,
        svc: SystemPromptService,
        ctx: Context,
    ) -> None:
        self._layers = layers
        self._scope = scope
        self._name = name
        self._item = item
        self._svc = svc
        self._ctx = ctx

    def __call__(self) -> None:
        layers, scope, name = self._layers, self._scope, self._name
        current = layers.get(scope)
        if current is not None and current.get(name) is self._item:
            del current[name]
            if not current and scope is not None:
                del layers[scope]
            self._svc.changed(scope)
            self._ctx.emit("system-prompt/change")
