"""Tools (``ctx.tools``): scoped registration, one visibility rule, guarded execution.

A tool registered through an agent's context is *scoped* to that agent and shadows a global
tool of the same name. ``restrict`` hides inherited tools from one scope; ``guard`` can only
deny. One resolver feeds the prompt, lookup and execution, so a hidden tool is absent from the
prompt *and* fails as ``UNKNOWN_TOOL`` (host-core §7). Tool failures are results, never turn
failures.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ._abort import AbortSignal
from ._codec import Unfit, class_checker
from ._content import ContentBlock, Message, TextBlock, ToolResultBlock, ToolSource
from ._context import ScopedCache, nearest_scope
from ._errors import DshError
from ._events import ToolSchema
from ._frozen import attrs_eq, attrs_hash, attrs_repr, builder, speed_up_inits
from ._json import MAX_NESTING, JsonValue, NotJsonError, dumps, freeze_json, thaw_json
from ._words import (
    NAME_LIMIT,
    invalid_arguments_text,
    json_syntax_text,
    not_json_text,
    quote_name,
    quote_names,
)

if TYPE_CHECKING:
    from ._agent import Agent
    from ._context import Context, Scope

__all__ = [
    "ToolDefinition",
    "ToolError",
    "ToolExecutionInput",
    "ToolExecutionResult",
    "ToolFailure",
    "ToolOutput",
    "ToolRegistry",
    "ToolRegistryService",
    "ToolRestriction",
    "ToolRunContext",
    "MAX_ARGUMENT_CHARS",
    "MAX_ARGUMENT_NESTING",
    "VALIDATOR_CACHE_SIZE",
    "compile_schema",
    "schema_error_text",
]


class ToolError(DshError):
    """Raised by a tool body to fail with a chosen ``code``; any other exception is TOOL_ERROR."""

    code = "TOOL_ERROR"


@attrs.frozen(kw_only=True)
class ToolFailure:
    """Why a call failed: a message for the model and a stable code."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    message: str
    code: str


@attrs.frozen(kw_only=True)
class ToolOutput:
    """How a tool's value is checked (JSON Schema) and shown to the model (``render``)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    schema: Mapping[str, JsonValue] | None = None
    render: Callable[[Any, ToolRunContext], tuple[ContentBlock, ...]] | None = attrs.field(
        default=None, eq=False
    )


@attrs.frozen(kw_only=True)
class ToolDefinition:
    """A tool: its model-facing schema, its body, and how its value is rendered.

    ``execute(arguments, run)`` receives validated, frozen JSON arguments. Calls marked
    ``concurrency_safe`` in one model response may run together (results keep model order).
    ``starts_jobs`` says a call can start a background job (``ctx.jobs``) for its agent.
    ``visible_if`` makes an inherited tool visible in a scope only where the predicate holds of
    the other tools visible there (e.g. ``job_output`` only beside a tool that starts jobs); it
    is evaluated once per change, with the scope's cached visibility, never per call.
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    name: str
    description: str
    parameters: Mapping[str, JsonValue] = attrs.field(
        factory=lambda: {"type": "object"}, converter=freeze_json
    )
    execute: Callable[[Any, ToolRunContext], Awaitable[Any]] = attrs.field(eq=False)
    output: ToolOutput = ToolOutput()
    concurrency_safe: bool = False
    starts_jobs: bool = False
    visible_if: Callable[[Iterable[ToolDefinition]], bool] | None = attrs.field(
        default=None, eq=False
    )

    @property
    def schema(self) -> ToolSchema:
        """What the model sees."""
        return ToolSchema(name=self.name, description=self.description, parameters=self.parameters)


@attrs.frozen(kw_only=True)
class ToolRestriction:
    """Hide inherited tools from one scope: keep only ``allow``, and/or drop ``deny``."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] | None = None


@attrs.frozen(kw_only=True)
class ToolExecutionInput:
    """One call to execute. ``arguments`` is the model's raw JSON text or a parsed value."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    call_id: str
    name: str
    arguments: Any
    signal: AbortSignal = attrs.field(eq=False)
    agent: Agent | None = attrs.field(default=None, eq=False)
    root_call_id: str | None = None


@attrs.frozen(kw_only=True)
class ToolExecutionResult:
    """A call's outcome: ``error`` is ``None`` on success. ``content`` is what the model sees."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    value: Any = None
    content: tuple[ContentBlock, ...] = ()
    error: ToolFailure | None = None
    meta: JsonValue = None
    additional_contexts: tuple[Message, ...] = ()
    concludes_turn: bool = False

    @property
    def ok(self) -> bool:
        """Whether the call succeeded."""
        return self.error is None

    def message(self, call_id: str) -> Message:
        """The ``tool``-role message carrying this result."""
        return _message(
            id=f"result-{call_id}",
            role="tool",
            content=(
                _result_block(
                    tool_call_id=call_id, content=self.content, is_error=self.error is not None
                ),
            ),
            source=_tool_source(call_id=call_id),
        )


def failure(message: str, code: str, **fields: Any) -> ToolExecutionResult:
    """A failed result, rendered ``Error: <message>``."""
    return _execution_result(
        error=ToolFailure(message=message, code=code),
        content=(_text_block(text=f"Error: {message}"),),
        **fields,
    )


class ToolRunContext:
    """What a tool body sees of its call, and the two things it may ask of the loop."""

    __slots__ = (
        "_concludes",
        "_deferred",
        "agent",
        "arguments",
        "call",
        "call_id",
        "ctx",
        "name",
        "signal",
    )

    def __init__(
        self,
        *,
        call_id: str,
        name: str,
        arguments: Any,
        signal: AbortSignal,
        agent: Agent | None,
        ctx: Context,
        call: ToolExecutionInput | None = None,
    ) -> None:
        #: The execution this run belongs to (the object ``tools/result`` reports), so state
        #: can be keyed by execution rather than by a model-chosen call id.
        self.call = call
        self.call_id = call_id
        self.name = name
        self.arguments = arguments
        self.signal = signal
        self.agent = agent
        self.ctx = ctx
        self._deferred: list[Message] = []
        self._concludes = False

    def defer_context(self, message: Message) -> None:
        """Add ``message`` to the agent's next step, after this call's result."""
        self._deferred.append(message)

    def conclude_turn(self) -> None:
        """On success, end the turn after this step (no further model request)."""
        self._concludes = True


#: The longest raw argument text a call may have (1 MiB of characters), parsed or not: a longer
#: one fails ``INVALID_ARGS`` naming the limit, before any parsing (hardening: hostile model).
MAX_ARGUMENT_CHARS = 1 << 20
#: How deep parsed arguments may nest: the session log's payload limit (every array or object
#: one level). Deeper arguments fail ``INVALID_ARGS`` naming the limit, however deep (a parse
#: that would exhaust the interpreter's stack included), and the turn goes on.
MAX_ARGUMENT_NESTING = MAX_NESTING

#: The exceptions a tool call never turns into its result: they end the process or the task,
#: and the agent loop answers the call (and the rest of its response) before they propagate.
_FATAL = (KeyboardInterrupt, SystemExit, GeneratorExit)


#: How many compiled validators :func:`compile_schema` keeps (least recently used dropped).
VALIDATOR_CACHE_SIZE = 256


@functools.lru_cache(maxsize=VALIDATOR_CACHE_SIZE)
def _compiled(key: str) -> Callable[[Any], Any]:
    import fastjsonschema  # on first use: a run's start needs no validator (PERF-11)

    return fastjsonschema.compile(json.loads(key))


def _schema_exception() -> type[Exception]:
    """fastjsonschema's base exception (every validator raises it: imported by then)."""
    import fastjsonschema

    return fastjsonschema.JsonSchemaException


def compile_schema(schema: Mapping[str, JsonValue]) -> Callable[[Any], Any]:
    """A fastjsonschema validator for ``schema``, compiled once per distinct schema.

    Keyed by the schema's JSON text and bounded (an LRU of ``VALIDATOR_CACHE_SIZE``), so a
    long-running host that sees a new schema per call stays flat (hardening 11.9); a schema
    that fell out is simply compiled again.
    """
    return _compiled(dumps(schema))


@attrs.define(eq=False)
class _Entry:
    __repr__ = attrs_repr
    definition: ToolDefinition
    validate: Callable[[Any], Any]
    validate_output: Callable[[Any], Any] | None
    schema: ToolSchema


def _no_validator(value: Any) -> Any:  # pragma: no cover - replaced at once
    raise AssertionError("the validator is set right after the entry is made")


class _SchemaUncompilable(Exception):
    """A tool's schema that fastjsonschema cannot compile, met at its first validation."""


def _on_first_use(entry: _Entry, field: str, schema: Mapping[str, JsonValue]) -> None:
    """Set ``entry.<field>`` to a validator that compiles ``schema`` when first called and
    then puts the compiled one in its place (PERF-11): registering a tool compiles nothing,
    so a host's start pays for no schema its run never validates against (compiling is
    most of what registering a tool costs). Still compiled once per distinct schema."""
    key = dumps(schema)

    def validate(value: Any) -> Any:
        try:
            compiled = _compiled(key)
        except Exception as exc:  # definition errors, SyntaxError, RecursionError
            raise _SchemaUncompilable(f"{type(exc).__name__}: {str(exc)[:200]}") from exc
        setattr(entry, field, compiled)
        return compiled(value)

    setattr(entry, field, validate)


#: How deep a tool's ``parameters`` may nest: the schema is logged inside every
#: ``request/header`` (payload, header, tools, schema: four levels of the payload limit).
SCHEMA_NESTING = MAX_NESTING - 4


def _check_loggable(schema: ToolSchema) -> None:
    """Refuse, at registration, a tool the log could not hold in a ``request/header``
    (``TOOL_SCHEMA_INVALID``, hardening 11.1): a name or description that is not a ``str``,
    ``parameters`` nesting deeper than :data:`SCHEMA_NESTING`. Every registered schema is
    therefore loggable, and the agent loop writes its headers without checking them again."""
    try:
        class_checker(ToolSchema)(schema, SCHEMA_NESTING + 1)  # type: ignore[misc]
    except Unfit:
        raise ToolError(
            f"tool {schema.name!r} cannot be logged: its name and description must be str and "
            f"its parameters nest at most {SCHEMA_NESTING} levels",
            code="TOOL_SCHEMA_INVALID",
        ) from None


class ToolRegistryService:
    """The tools of one host (provided as ``tools``; use the bound view)."""

    def __init__(self) -> None:
        self.layers: dict[Scope | None, dict[str, _Entry]] = {None: {}}
        self.restrictions: dict[Scope, list[ToolRestriction]] = {}
        self.guards: dict[Scope | None, list[Callable[[ToolExecutionInput], str | None]]] = {}
        self._visible: ScopedCache[dict[str, _Entry]] = ScopedCache()
        self._schemas: ScopedCache[tuple[ToolSchema, ...]] = ScopedCache()
        #: Bumped by every change: a bound view's memo of its own scope is valid while equal.
        self.version = 0

    def __dsh_bind__(self, ctx: Context) -> ToolRegistry:
        return ToolRegistry(self, ctx)

    def changed(self, ctx: Context, scope: Scope | None) -> None:
        """Drop the cached visibility a change in ``scope`` can affect, then emit
        ``tools/change``."""
        self._visible.drop(scope)
        self._schemas.drop(scope)
        self.version += 1
        ctx.emit("tools/change")

    def schemas(self, scope: Scope | None) -> tuple[ToolSchema, ...]:
        """The visible schemas of ``scope`` (the same tuple object until something changes)."""
        key = self._effective(scope)
        cached = self._schemas.get(key)
        if cached is not None:
            return cached
        schemas = self._schemas[key] = tuple(e.schema for e in self.visible(key).values())
        return schemas

    def _effective(self, scope: Scope | None) -> Scope | None:
        """The cache key of ``scope``: the nearest scope with tools or restrictions."""
        return nearest_scope(scope, self.layers, self.restrictions)

    def inherited(self, scope: Scope | None) -> dict[str, _Entry]:
        """What ``scope`` inherits: ancestor layers nearest-first, then the global layer."""
        out: dict[str, _Entry] = {}
        if scope is not None:
            parent = scope.parent
            while parent is not None:
                for name, entry in self.layers.get(parent, {}).items():
                    out.setdefault(name, entry)
                parent = parent.parent
        for name, entry in self.layers[None].items():
            out.setdefault(name, entry)
        return out

    def visible(self, scope: Scope | None) -> dict[str, _Entry]:
        """The one visibility rule: own layer, plus inherited tools minus restrictions."""
        scope = self._effective(scope)
        cached = self._visible.get(scope)
        if cached is not None:
            return cached
        inherited = self.inherited(scope)
        if scope is not None:
            for restriction in self.restrictions.get(scope, ()):
                if restriction.allow is not None:
                    keep = set(restriction.allow)
                    inherited = {n: e for n, e in inherited.items() if n in keep}
                if restriction.deny is not None:
                    drop = set(restriction.deny)
                    inherited = {n: e for n, e in inherited.items() if n not in drop}
            own = self.layers.get(scope, {})
            result = {**inherited, **own}
        else:
            result = inherited
        if any(e.definition.visible_if is not None for e in result.values()):
            result = _conditional(result, self.layers.get(scope, {}) if scope else {})
        self._visible[scope] = result
        return result


def _conditional(visible: dict[str, _Entry], own: Mapping[str, _Entry]) -> dict[str, _Entry]:
    """``visible`` without the inherited tools whose ``visible_if`` does not hold of the
    others (a scope's own tools are never hidden, like restrictions)."""
    unconditional = [e.definition for e in visible.values() if e.definition.visible_if is None]
    return {
        name: entry
        for name, entry in visible.items()
        if entry.definition.visible_if is None
        or own.get(name) is entry
        or entry.definition.visible_if(unconditional)
    }


class ToolRegistry:
    """``ctx.tools``: the registry seen from one context (its scope and owner)."""

    __slots__ = ("_ctx", "_listeners", "_memo", "_scope", "_svc")

    def __init__(self, service: ToolRegistryService, ctx: Context) -> None:
        self._svc = service
        self._ctx = ctx
        # Read per call (the host keeps one table): not looked up through a context each time.
        self._listeners = ctx.host.listeners
        self._scope = ctx.scope
        # (service version, visible tools, schemas) of this view's own scope: an agent asks
        # for its tools every step, and nothing changed since the last time is the rule.
        self._memo: tuple[int, dict[str, _Entry], tuple[ToolSchema, ...]] | None = None

    def _own(self) -> tuple[int, dict[str, _Entry], tuple[ToolSchema, ...]]:
        svc = self._svc
        memo = self._memo
        if memo is None or memo[0] != svc.version:
            scope = self._scope
            memo = self._memo = (svc.version, svc.visible(scope), svc.schemas(scope))
        return memo

    def register(self, definition: ToolDefinition) -> Callable[[], object]:
        """Register a tool in this context's layer (scoped from an agent context).

        A duplicate name in the same layer fails; a scoped tool shadows a global one.
        """
        self._ctx._require_active()
        svc = self._svc
        scope = self._ctx.scope
        layer = svc.layers.setdefault(scope, {})
        if definition.name in layer:
            raise ToolError(
                f"tool {definition.name!r} is already registered in this scope",
                code="DUPLICATE_TOOL",
            )
        schema = definition.schema
        _check_loggable(schema)
        entry = _Entry(definition, _no_validator, None, schema)
        _on_first_use(entry, "validate", definition.parameters)
        if definition.output.schema:
            _on_first_use(entry, "validate_output", definition.output.schema)
        layer[definition.name] = entry
        ctx = self._ctx

        def remove() -> None:
            current = svc.layers.get(scope)
            if current is not None and current.get(definition.name) is entry:
                del current[definition.name]
                if not current and scope is not None:
                    del svc.layers[scope]
                svc.changed(ctx, scope)

        disposer = ctx.fiber.add(remove)
        svc.changed(ctx, scope)
        return disposer

    def restrict(self, restriction: ToolRestriction) -> Callable[[], object]:
        """Hide inherited tools from this scope (prompt and execution alike).

        Only through a scoped context. An empty filter, an unknown name, or a name registered
        in this scope itself fails loud. Restrictions intersect; own tools stay visible.
        """
        self._ctx._require_active()
        scope = self._ctx.scope
        if scope is None:
            raise ToolError("restrict() needs a scoped (agent) context", code="TOOL_RESTRICTION")
        if restriction.allow is None and restriction.deny is None:
            raise ToolError("a tool restriction needs allow and/or deny", code="TOOL_RESTRICTION")
        inherited = self._svc.inherited(scope)
        own = self._svc.layers.get(scope, {})
        for name in (*(restriction.allow or ()), *(restriction.deny or ())):
            if name in own:
                raise ToolError(
                    f"tool {name!r} is registered in this scope; a restriction only filters "
                    "inherited tools",
                    code="TOOL_RESTRICTION",
                )
            if name not in inherited:
                raise ToolError(f'unknown global tool "{name}"', code="UNKNOWN_TOOL")
        svc = self._svc
        svc.restrictions.setdefault(scope, []).append(restriction)
        ctx = self._ctx

        def remove() -> None:
            items = svc.restrictions.get(scope)
            if items and restriction in items:
                items.remove(restriction)
                if not items:
                    del svc.restrictions[scope]
                svc.changed(ctx, scope)

        disposer = ctx.fiber.add(remove)
        svc.changed(ctx, scope)
        return disposer

    def guard(self, fn: Callable[[ToolExecutionInput], str | None]) -> Callable[[], object]:
        """Add a guard: it returns a denial reason, or ``None`` to let the call through."""
        self._ctx._require_active()
        scope = self._ctx.scope
        self._svc.guards.setdefault(scope, []).append(fn)
        svc = self._svc

        def remove() -> None:
            items = svc.guards.get(scope)
            if items and fn in items:
                items.remove(fn)

        return self._ctx.fiber.add(remove)

    def get(self, name: str, scope: Scope | object | None = ...) -> ToolDefinition | None:
        """The tool ``name`` as visible from ``scope`` (default: this context's)."""
        visible = self._own()[1] if scope is ... else self._svc.visible(scope)  # type: ignore[arg-type]
        entry = visible.get(name)
        return entry.definition if entry is not None else None

    def schemas(self, scope: Scope | object | None = ...) -> tuple[ToolSchema, ...]:
        """The tools visible from ``scope``, as the model sees them (registration order)."""
        if scope is ...:
            return self._own()[2]
        return self._svc.schemas(scope)  # type: ignore[arg-type]

    def definitions(self, scope: Scope | object | None = ...) -> tuple[ToolDefinition, ...]:
        """The visible definitions from ``scope``."""
        sc = self._ctx.scope if scope is ... else scope
        return tuple(e.definition for e in self._svc.visible(sc).values())  # type: ignore[arg-type]

    async def execute(self, call: ToolExecutionInput) -> ToolExecutionResult:
        """Run one call through validation, ``tools/pre-execute``, guards, ``tools/execute``,
        output checks and ``tools/post-execute``; then emit ``tools/result``.

        Never raises for a failure of the call: not the tool's, not a listener's, guard's or
        renderer's (``TOOL_ERROR``, or the exception's own ``code``), whatever it raised
        (``RecursionError``, ``MemoryError``, a ``BaseException`` subclass); only the
        cancellation of the running task and ``KeyboardInterrupt`` / ``SystemExit``
        propagate, so every call of a response can be answered."""
        ctx = call.agent.ctx if call.agent is not None else self._ctx
        try:
            result = await self._execute(call, ctx)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            result = failure(str(exc) or "the tool's work was cancelled", "TOOL_ERROR")
        except _FATAL:
            raise
        except BaseException as exc:
            result = _failed(exc)
        if "tools/result" in self._listeners:
            ctx.emit("tools/result", call, result)
        return result

    async def _execute(self, call: ToolExecutionInput, ctx: Context) -> ToolExecutionResult:
        svc = self._svc
        listeners = self._listeners
        scope = ctx.scope
        visible = self._own()[1] if scope is self._scope else svc.visible(scope)
        entry = visible.get(call.name)
        if entry is None:
            return failure(_unknown_tool(call.name), "UNKNOWN_TOOL")
        raw = call.arguments
        if isinstance(raw, str) and len(raw) > MAX_ARGUMENT_CHARS:
            return failure(
                invalid_arguments_text(
                    call.name,
                    f"the arguments are {len(raw)} characters long; the limit is "
                    f"{MAX_ARGUMENT_CHARS} characters",
                    f"Call {call.name} again with shorter arguments.",
                ),
                "INVALID_ARGS",
            )
        try:
            parsed = json.loads(raw) if isinstance(raw, str) else raw
            arguments = freeze_json(parsed)
        except RecursionError:  # the parser ran out of stack: far deeper than the limit
            return failure(
                invalid_arguments_text(
                    call.name,
                    f"the arguments are nested deeper than {MAX_ARGUMENT_NESTING} levels",
                ),
                "INVALID_ARGS",
            )
        except NotJsonError as exc:
            return failure(
                invalid_arguments_text(call.name, not_json_text(exc, "the arguments")),
                "INVALID_ARGS",
            )
        except ValueError as exc:  # the text is not JSON (ROB-90: never the parser's words)
            return failure(_not_json_arguments(call.name, raw, exc), "INVALID_ARGS")
        try:
            entry.validate(parsed if isinstance(raw, str) else thaw_json(arguments))
        except _SchemaUncompilable:
            return failure(_uncompilable(call.name, "parameters"), "TOOL_SCHEMA_INVALID")
        except _schema_exception() as exc:
            return failure(_invalid_arguments(call.name, exc), "INVALID_ARGS")
        if call.signal.aborted:
            return failure("tool call aborted before dispatch", "ABORTED_BEFORE_DISPATCH")
        if "tools/pre-execute" in listeners:
            decision: str = await ctx.waterfall("tools/pre-execute", call, default=_allow)
            if decision != "allow":
                return failure(f"tool call denied: {decision}", "TOOL_DENIED")
        for layer in (scope, None) if scope is not None else (None,):
            for guard in svc.guards.get(layer, ()):
                denial = guard(call)
                if denial is not None:
                    return failure(f"tool call denied: {denial}", "TOOL_DENIED")
        definition = entry.definition
        run = ToolRunContext(
            call_id=call.call_id,
            name=call.name,
            arguments=arguments,
            signal=call.signal,
            agent=call.agent,
            ctx=ctx,
            call=call,
        )

        if "tools/execute" in listeners:
            body = _execute_body(call, definition, arguments, run)
            outcome = await ctx.waterfall("tools/execute", call, default=body)
        else:
            outcome = await _invoke(definition, arguments, run)
        if outcome.error is None:
            if run.signal.aborted:
                outcome = failure("tool call aborted", "ABORTED")
            else:
                outcome = self._finish(entry, outcome, run)
        if run._deferred:
            outcome = attrs.evolve(outcome, additional_contexts=tuple(run._deferred))
        if "tools/post-execute" in listeners:
            outcome = await ctx.waterfall("tools/post-execute", call, outcome, default=_accept)
        return outcome

    def _finish(
        self, entry: _Entry, outcome: ToolExecutionResult, run: ToolRunContext
    ) -> ToolExecutionResult:
        value = outcome.value
        try:
            frozen = freeze_json(value)
        except NotJsonError as exc:
            return failure(
                f"tool returned a non-JSON value: {not_json_text(exc, 'the value')}",
                "INVALID_TOOL_OUTPUT",
            )
        if entry.validate_output is not None:
            try:
                entry.validate_output(thaw_json(frozen))
            except _SchemaUncompilable:
                return failure(
                    _uncompilable(entry.definition.name, "output"), "TOOL_SCHEMA_INVALID"
                )
            except _schema_exception() as exc:
                return failure(
                    f"tool output is invalid: {schema_error_text(exc, 'the value')}",
                    "INVALID_TOOL_OUTPUT",
                )
        render = entry.definition.output.render
        plain = False  # one text block of a plain string (see plain_result)
        if render is not None:
            content = render(frozen, run)
        else:
            text = frozen if isinstance(frozen, str) else dumps(frozen)
            content = (_text_block(text=text),)
            plain = text.__class__ is str and outcome.meta is None
        result = _execution_result(
            value=frozen, content=content, concludes_turn=run._concludes, meta=outcome.meta
        )
        if plain:
            global plain_result
            plain_result = result
        return result


#: The result :meth:`ToolRegistry._finish` built last whose content is one text block of a
#: plain ``str`` (the tool's string, or its value as JSON text) and which has no ``meta``: the
#: log holds it by construction, so the agent loop need not check it again (hardening 11.1).
#: One slot: only the latest such result is known; a listener's replacement is checked.
plain_result: ToolExecutionResult | None = None


def _uncompilable(tool: str, which: str) -> str:
    """The model's text for a tool whose ``which`` schema the validator cannot compile (found
    at its first use, PERF-11): the tool cannot be used as registered."""
    return (
        f"tool {quote_name(tool)} cannot be used: the validator cannot compile its {which} "
        "schema. Do not call it again; report the problem."
    )


def _invalid_arguments(tool: str, exc: Exception) -> str:
    """The model's text for arguments that break ``tool``'s schema: what is wrong, where, and
    what to do (ROB-80)."""
    return invalid_arguments_text(tool, schema_error_text(exc, "the arguments"))


def _not_json_arguments(tool: str, raw: Any, exc: ValueError) -> str:
    """The model's text for argument text that is not JSON: what the parser expected, at which
    line and column, and what to send instead (ROB-90)."""
    todo = f"Call {tool} again with its arguments as one JSON object."
    if isinstance(raw, str) and not raw.strip():
        return invalid_arguments_text(
            tool, "the arguments are empty", todo[:-1] + " ({} for none)."
        )
    return invalid_arguments_text(tool, json_syntax_text(exc, "the arguments"), todo)


def _unknown_tool(name: object) -> str:
    """UNKNOWN_TOOL's text: the name as the model sent it (quoted, bounded) and what to do."""
    return f"unknown tool {quote_name(name)}; call only the tools you have been given"


_JSON_TYPES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean (true or false)",
    "object": "an object",
    "array": "an array",
    "null": "null",
}


def _json_type(value: Any) -> str:
    """The JSON type of a parsed value, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return "an object"


_quoted = quote_names


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def schema_error_text(exc: Exception, root: str = "the arguments") -> str:
    """A JSON Schema failure in plain words, naming the field (``"a.b[0]"``) and what is wrong
    with it, never the validator's own wording (ROB-80/81): a model reads it and retries.

    ``exc`` is fastjsonschema's ``JsonSchemaValueException`` (``path``, ``rule``,
    ``rule_definition``, ``value``, ``definition``); ``root`` names the whole value."""
    path = getattr(exc, "path", None) or ["data"]
    rule = getattr(exc, "rule", None)
    limit = getattr(exc, "rule_definition", None)
    value = getattr(exc, "value", None)
    field = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in map(str, path[1:])).lstrip(".")
    where = quote_name(field, 2 * NAME_LIMIT) if field else root
    if rule == "required" and isinstance(value, Mapping) and isinstance(limit, list | tuple):
        missing = [k for k in limit if k not in value]
        noun = "property" if len(missing) == 1 else "properties"
        head = f"missing required {noun} {_quoted(missing)}"
        return head if not field else f"{where} is {head}"
    if rule == "type":
        types = limit if isinstance(limit, list | tuple) else [limit]
        wanted = " or ".join(_JSON_TYPES.get(str(t), str(t)) for t in types)
        return f"{where} must be {wanted}, not {_json_type(value)}"
    if rule == "additionalProperties" and isinstance(value, Mapping):
        known = getattr(exc, "definition", None) or {}
        allowed = known.get("properties", {}) if isinstance(known, Mapping) else {}
        extra = [k for k in value if k not in allowed]
        noun = "property" if len(extra) == 1 else "properties"
        text = f"unknown {noun} {_quoted(extra)}" if extra else "unknown properties"
        if field:
            text = f"{where} has {text}"
        if allowed:
            text += f"; the allowed properties are {_quoted(allowed)}"
        return text
    if rule == "enum" and isinstance(limit, list | tuple):
        return f"{where} must be one of {_quoted(limit, 'or')}"
    if rule == "const":
        return f"{where} must be {json.dumps(limit, ensure_ascii=False)}"
    words = {
        "minLength": lambda n: f"at least {_plural(n, 'character')} long",
        "maxLength": lambda n: f"at most {_plural(n, 'character')} long",
        "minimum": lambda n: f"at least {n}",
        "maximum": lambda n: f"at most {n}",
        "exclusiveMinimum": lambda n: f"greater than {n}",
        "exclusiveMaximum": lambda n: f"less than {n}",
        "multipleOf": lambda n: f"a multiple of {n}",
        "pattern": lambda n: f"text matching the pattern {n}",
        "format": lambda n: f"a valid {n}",
        "minItems": lambda n: f"an array of at least {_plural(n, 'item')}",
        "maxItems": lambda n: f"an array of at most {_plural(n, 'item')}",
        "minProperties": lambda n: f"an object with at least {_plural(n, 'property')}",
        "maxProperties": lambda n: f"an object with at most {_plural(n, 'property')}",
    }
    if rule in words:
        return f"{where} must be {words[rule](limit)}"
    if rule == "uniqueItems":
        return f"{where} must not repeat an item"
    if rule == "not":
        return f"{where} has a value it must not have"
    if rule in ("anyOf", "oneOf", "allOf"):
        return f"{where} matches none of the forms its schema allows"
    if rule == "dependencies" or rule == "dependentRequired":
        return f"{where} is missing a property that another property requires"
    return f"{where} does not satisfy the {json.dumps(str(rule))} rule of its schema"


def _execute_body(
    call: ToolExecutionInput, definition: ToolDefinition, arguments: JsonValue, run: ToolRunContext
) -> Callable[[ToolExecutionInput], Awaitable[ToolExecutionResult]]:
    """The default of ``tools/execute``. A closure made here, not in ``_execute``: there its
    four variables would be cells of every call's frame, kept while the tool runs (PERF-6)."""

    async def body(c: ToolExecutionInput) -> ToolExecutionResult:
        if c.signal is not call.signal:
            run.signal = AbortSignal.any((call.signal, c.signal))
        return await _invoke(definition, arguments, run)

    return body


async def _invoke(
    definition: ToolDefinition, arguments: JsonValue, run: ToolRunContext
) -> ToolExecutionResult:
    """Run the tool body; its own failure becomes an error result (code from ``exc.code``).

    A ``CancelledError`` propagates only while the running task is being cancelled (the
    turn's, or the loop shutting down). One the body raises by itself (it awaited work that
    someone else cancelled) is the tool's failure like any other exception: it must not end
    the caller's turn with its call left unanswered.
    """
    try:
        value = await definition.execute(arguments, run)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise
        return failure(str(exc) or "the tool's work was cancelled", "TOOL_ERROR")
    except _FATAL:
        raise
    except BaseException as exc:  # Exception, and the odd BaseException subclass of a tool
        return _failed(exc)
    return _execution_result(value=value)


def _failed(exc: BaseException) -> ToolExecutionResult:
    """The error result of a call that raised ``exc``: its message (or its type's name) and
    its ``code`` if it has a string one, else ``TOOL_ERROR``."""
    try:
        code = getattr(exc, "code", None)
        text = str(exc) or type(exc).__name__
    except Exception:  # an exception whose __str__ (or code) fails is still a result
        code, text = None, type(exc).__name__
    return failure(text, code if isinstance(code, str) else "TOOL_ERROR")


async def _allow(call: ToolExecutionInput) -> str:
    return "allow"


async def _accept(call: ToolExecutionInput, outcome: ToolExecutionResult) -> ToolExecutionResult:
    return outcome


speed_up_inits(globals())

# Built for every tool call: plain-function builders (see dsh_core._frozen.builder).
_message = builder(Message)
_result_block = builder(ToolResultBlock)
_tool_source = builder(ToolSource)
_text_block = builder(TextBlock)
_execution_result = builder(ToolExecutionResult)
