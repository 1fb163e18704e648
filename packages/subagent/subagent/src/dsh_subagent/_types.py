"""The vocabulary of the subagent seam (the seed's types, in Python names).

Values are frozen attrs classes. A :class:`SubagentRun` is the one mutable handle: the consumer
awaits ``result`` and always calls ``dispose()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, runtime_checkable

import attrs

from dsh_core import (
    AbortSignal,
    ContentBlock,
    JsonValue,
    MessageSource,
    NotJsonError,
    SessionEvent,
    SharedDisposal,
    attrs_eq,
    attrs_hash,
    attrs_repr,
    freeze_json,
)

if TYPE_CHECKING:
    from dsh_core import Agent, AgentOptions, ToolRestriction

    from ._descriptor import SubagentDescriptorData

__all__ = [
    "NO_START_CAPABILITIES",
    "AncestorInterruptAuthority",
    "ContinuableCreateRequest",
    "ContinuableCreateSpec",
    "ContinuableStart",
    "ContinuableStartSpec",
    "CoordinatorMessageSource",
    "ResolvedSubagentStartRequest",
    "SubagentCapabilities",
    "SubagentChildEntry",
    "SubagentDescendantListEntry",
    "SubagentDiagnosticEntry",
    "SubagentFollowupOptions",
    "SubagentInterruptAuthority",
    "SubagentListEntry",
    "SubagentProvider",
    "SubagentReportDelivery",
    "SubagentReportMessageSource",
    "SubagentReportOptions",
    "SubagentResult",
    "SubagentRun",
    "SubagentRunEndInfo",
    "SubagentRunInfo",
    "SharedResult",
    "SubagentSettledMessageSource",
    "SubagentStartRequest",
    "SubagentStopReason",
    "UserInterruptAuthority",
    "KNOWN_STOP_REASONS",
]

#: Why a run ended. Open: providers may add reasons; consumers treat unknown ones as failures.
SubagentStopReason: TypeAlias = str
KNOWN_STOP_REASONS = frozenset(
    {"completed", "aborted", "error", "max-tokens", "max-steps", "refusal"}
)


@attrs.frozen(kw_only=True)
class SubagentCapabilities:
    """Start-time features of a provider's one-shot path, checked before ``start`` (SVC-5).

    Each flag matches one request field; ``depth_limit`` matches ``max_depth``.
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    output_schema: bool = False
    depth_limit: bool = False
    tool_filter: bool = False
    persona: bool = False


#: A provider supporting none of the optional start-time features.
NO_START_CAPABILITIES = SubagentCapabilities()


def _freeze_schema(value: object) -> Any:
    """Freeze an ``output_schema`` that is lossless JSON; keep any other value as given, for
    ``start`` to refuse in its documented order (SVC-5 capability first, then SVC-6)."""
    try:
        return freeze_json(value)
    except (NotJsonError, RecursionError):
        return value


@attrs.frozen(kw_only=True)
class SubagentStartRequest:
    """What a caller asks for when starting a ONE-SHOT subagent.

    ``parent`` gives the child its workspace, lineage and delegation depth; ``signal`` is the
    one cancellation channel before and after start-up (default: a fresh signal nothing
    aborts, so the child runs until it ends or the run is disposed). The optional fields each
    need the matching provider capability, or the start is refused (SVC-5).
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    prompt: tuple[ContentBlock, ...]
    parent: Agent = attrs.field(eq=False)
    signal: AbortSignal = attrs.field(eq=False, factory=AbortSignal)
    label: str | None = None
    agent_options: AgentOptions | None = None
    output_schema: JsonValue = attrs.field(default=None, converter=_freeze_schema)
    max_depth: int | None = None
    tool_filter: ToolRestriction | None = None
    persona: str | None = None


@attrs.frozen(kw_only=True)
class ResolvedSubagentStartRequest(SubagentStartRequest):
    """The provider-facing request: the caller's fields plus the resolved descriptor (SVC-7)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    descriptor: SubagentDescriptorData


@attrs.frozen(kw_only=True)
class SubagentResult:
    """The terminal outcome of a run.

    ``output`` is the child's final assistant content (OUT-1); ``structured`` is present only
    when an ``output_schema`` was satisfied; a non-``completed`` ``stop_reason`` means
    ``output`` may be partial. ``diagnostic`` is safe provider text (at most 4096 UTF-8 bytes),
    kept apart from ``output``.
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    output: tuple[ContentBlock, ...]
    stop_reason: SubagentStopReason
    structured: JsonValue = attrs.field(default=None, converter=freeze_json)
    diagnostic: str | None = None


class ResultFuture(asyncio.Future["SubagentResult"]):
    """A run's result future that settles every consumer's wait at once.

    A provider may hand a plain :class:`asyncio.Future` to :class:`SubagentRun`; each await of
    ``run.result`` then goes through :func:`asyncio.shield`, which costs the consumer one more
    turn of the event loop. A ``ResultFuture`` (the in-process driver's) gives each waiting
    consumer a future of its own and settles those directly when it settles itself.
    """

    def __init__(self, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(loop=loop)
        self._waiters: list[asyncio.Future[SubagentResult]] = []

    def set_result(self, result: SubagentResult) -> None:
        super().set_result(result)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:  # usually one, or none: _release inline
            if not waiter.done():
                waiter.set_result(result)

    def set_exception(self, exception: type | BaseException) -> None:
        super().set_exception(exception)
        fault = self.exception()
        for waiter in self._release():
            waiter.set_exception(fault)  # type: ignore[arg-type]

    def cancel(self, msg: Any | None = None) -> bool:
        cancelled = super().cancel(msg=msg)
        for waiter in self._release():
            waiter.cancel(msg=msg)
        return cancelled

    def _release(self) -> list[asyncio.Future[SubagentResult]]:
        waiters, self._waiters = self._waiters, []
        return [w for w in waiters if not w.done()]

    def _wait(self) -> Generator[Any, None, SubagentResult]:
        waiter: asyncio.Future[SubagentResult] = self.get_loop().create_future()
        self._waiters.append(waiter)
        try:
            return (yield from waiter.__await__())
        finally:
            if not self.done():  # this consumer stopped waiting: forget its future
                self._waiters.remove(waiter)


class SharedResult:
    """``run.result``: the one outcome of a run, awaited by any number of consumers.

    Each ``await`` waits on its own: a consumer that stops waiting (``asyncio.wait_for``
    timing out, its task cancelled) cancels only its wait, never the outcome the others and
    ``dispose()`` rely on. Read-only otherwise: ``done()``, ``result()``, ``exception()``,
    ``cancelled()`` and ``add_done_callback()`` behave like :class:`asyncio.Future`'s.
    """

    __slots__ = ("_future",)

    def __init__(self, future: asyncio.Future[SubagentResult]) -> None:
        self._future = future

    def __await__(self) -> Generator[Any, None, SubagentResult]:
        future = self._future
        if future.done():
            return future.__await__()  # settled: nothing left to cancel
        if isinstance(future, ResultFuture):
            return future._wait()
        # A plain future: shield gives this wait a fresh outer future.
        return asyncio.shield(future).__await__()

    def done(self) -> bool:
        """Whether the run's outcome is settled."""
        return self._future.done()

    def cancelled(self) -> bool:
        """Whether the provider settled the outcome by cancelling it."""
        return self._future.cancelled()

    def result(self) -> SubagentResult:
        """The settled result (raises like :meth:`asyncio.Future.result`)."""
        return self._future.result()

    def exception(self) -> BaseException | None:
        """The settled fault, if any (raises like :meth:`asyncio.Future.exception`)."""
        return self._future.exception()

    def add_done_callback(self, callback: Callable[[SharedResult], object]) -> None:
        """Call ``callback(self)`` once the outcome is settled."""
        self._future.add_done_callback(_Relay(self, callback))

    def __repr__(self) -> str:
        return f"SharedResult({self._future!r})"


class _Relay:
    """``callback(result)`` as a future's done callback: one slotted object rather than a
    lambda (a function, its cell tuple and two cells), each an object the cyclic collector
    walks while the run is in flight (PERF-6)."""

    __slots__ = ("_callback", "_result")

    def __init__(self, result: SharedResult, callback: Callable[[SharedResult], object]) -> None:
        self._result = result
        self._callback = callback

    def __call__(self, _: object) -> None:
        self._callback(self._result)


class SubagentRun:
    """A published ONE-SHOT child: await ``result``, and always ``dispose()`` (idempotent).

    ``id`` is the child session id for a local run (``local_agent`` is that agent), or a fresh
    parent-scoped id for a remote one (``local_agent`` is ``None``). ``result`` (a
    :class:`SharedResult` over the provider's future) resolves with a non-``completed`` stop
    reason on child failure and raises only on an infrastructure fault the seam cannot express
    as a stop reason; any number of consumers may await it and each may stop waiting alone.
    """

    __slots__ = ("_disposal", "_dispose", "id", "local_agent", "result")

    def __init__(
        self,
        *,
        id: str,
        local_agent: Agent | None,
        result: asyncio.Future[SubagentResult],
        dispose: Callable[[], Awaitable[None]],
    ) -> None:
        self.id = id
        self.local_agent = local_agent
        self.result = SharedResult(result)
        self._dispose = dispose
        self._disposal = SharedDisposal()

    def dispose(self) -> Coroutine[Any, Any, None]:
        """Cancel remaining work, reach quiescence, release resources (``await run.dispose()``;
        the shared disposal's coroutine itself, one coroutine less per delegation).

        Memoised: the first call runs the provider's disposal and every call (concurrent or
        later) waits for that same disposal and sees its outcome. A caller that stops waiting
        never stops the disposal: it goes on in a task of its own, calling the provider's
        (idempotent) dispose again (hardening 11.8).
        """
        return self._disposal.run(self._dispose)

    def __repr__(self) -> str:
        return f"SubagentRun({self.id!r}, local={self.local_agent is not None})"


@runtime_checkable
class SubagentProvider(Protocol):
    """One named transport for child agents (``spawn``, ``fork``, ``acp``, ...).

    ``start`` establishes a ONE-SHOT child and returns it once published; before that it owns
    set-up and cleans any unpublished resources before raising. ``inherits_parent_context``
    says whether the child sees the parent's completed turns (descriptive only). A provider that
    can create continuable children also defines ``prepare_continuable`` (see
    :class:`ContinuableCreateRequest`): its presence *is* the capability.
    """

    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> SubagentCapabilities: ...

    @property
    def inherits_parent_context(self) -> bool: ...

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun: ...


@attrs.frozen(kw_only=True)
class ContinuableCreateRequest:
    """What the continuation manager asks a provider while creating a continuable child's
    FIRST activation: only what distinguishes a fresh child from a seeded one."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    session_id: str
    parent: Agent = attrs.field(eq=False)
    signal: AbortSignal = attrs.field(eq=False, factory=AbortSignal)


@attrs.frozen(kw_only=True)
class ContinuableCreateSpec:
    """A provider's detached contribution to one continuable child: data, never a capability.

    ``seed`` is the parent's balanced completed-turn prefix (contiguous from seq 0, lossless),
    or ``None`` for a fresh child. ``agent_provider`` / ``agent_model``, when set, are the
    model route of the child's turns, in place of the requested one: a provider whose child
    is not a local model (``acp``: a bridge to an agent process) serves its turns itself. The
    route is kept in the child's durable descriptor, so a cold resume takes it too.
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    seed: tuple[SessionEvent, ...] | None = None
    agent_provider: str | None = None
    agent_model: str | None = None


@attrs.frozen(kw_only=True)
class ContinuableStartSpec:
    """``start_continuable``: a provider, the durable label, and the child's request."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    provider: str
    label: str
    prompt: tuple[ContentBlock, ...]
    parent: Agent = attrs.field(eq=False)
    signal: AbortSignal = attrs.field(eq=False, factory=AbortSignal)
    agent_options: AgentOptions | None = None
    max_depth: int | None = None
    tool_filter: ToolRestriction | None = None
    persona: str | None = None
    child_id: str | None = None


@attrs.frozen(kw_only=True)
class ContinuableStart:
    """Identities returned once a continuable child accepted its initial prompt."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    child_id: str
    message_id: str


# -- message sources the seam writes --------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CoordinatorMessageSource(MessageSource):
    """A model coordinator's follow-up to one of its children (attribution, not authority)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    kind: Literal["coordinator"] = attrs.field(default="coordinator", init=False)
    sender_session_id: str
    form: Literal["relay"] = "relay"


@attrs.frozen(kw_only=True)
class SubagentReportMessageSource(MessageSource):
    """A continuable child's explicit report to its direct parent."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    kind: Literal["subagent-report"] = attrs.field(default="subagent-report", init=False)
    sender_session_id: str
    form: Literal["relay"] = "relay"


@attrs.frozen(kw_only=True)
class SubagentSettledMessageSource(MessageSource):
    """The runtime's notice that a background child settled."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    kind: Literal["subagent-settled"] = attrs.field(default="subagent-settled", init=False)
    sender_session_id: str
    summary: str
    form: Literal["notice"] = "notice"


SubagentReportDelivery = Literal["quiet", "wakeup", "next-step"]


@attrs.frozen(kw_only=True)
class SubagentFollowupOptions:
    """Options for following up with one continuable child."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    source: MessageSource
    signal: AbortSignal = attrs.field(eq=False, factory=AbortSignal)


@attrs.frozen(kw_only=True)
class SubagentReportOptions:
    """Options for one continuable child's report to its direct parent: ``delivery`` is
    ``next-step`` (steer, the default), ``quiet`` (inject, no wake) or ``wakeup`` (a new
    parent turn)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    delivery: SubagentReportDelivery = "next-step"
    signal: AbortSignal = attrs.field(eq=False, factory=AbortSignal)


@attrs.frozen(kw_only=True)
class UserInterruptAuthority:
    """A person interrupting a child of ``parent_session_id``."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    parent_session_id: str
    kind: Literal["user"] = "user"


@attrs.frozen(kw_only=True)
class AncestorInterruptAuthority:
    """A live ancestor agent interrupting one of its descendants."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    agent: Agent = attrs.field(eq=False)
    kind: Literal["ancestor"] = "ancestor"


SubagentInterruptAuthority: TypeAlias = "UserInterruptAuthority | AncestorInterruptAuthority"


# -- lifecycle events and listing ---------------------------------------------------------------


@attrs.frozen(kw_only=True)
class SubagentRunInfo:
    """``subagent/start``: a run (or a continuable residency epoch) began."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    run_id: str
    provider: str
    id: str
    local: bool


@attrs.frozen(kw_only=True)
class SubagentRunEndInfo:
    """``subagent/end``: the run began as ``run_id`` ended (``last_assistant_message`` is
    omitted when there was no output)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    run_id: str
    provider: str
    id: str
    local: bool
    stop_reason: SubagentStopReason
    last_assistant_message: tuple[ContentBlock, ...] | None = None


@attrs.frozen(kw_only=True)
class SubagentChildEntry:
    """A listed child with a valid descriptor. ``label`` is always present when continuable;
    ``has_children``: some direct descendant's header says ``origin: subagent`` (LIST-3)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    id: str
    mode: Literal["one-shot", "continuable"]
    activity: Literal["running", "inactive"]
    label: str | None = None
    has_children: bool = False
    kind: Literal["child"] = "child"


@attrs.frozen(kw_only=True)
class SubagentDiagnosticEntry:
    """A child that could not be classified; one broken sibling never hides healthy ones.
    ``has_children`` as on a child entry (its own children may still be listed)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    id: str
    reason: Literal["corrupt", "unsupported", "unavailable"]
    has_children: bool = False
    kind: Literal["diagnostic"] = "diagnostic"


SubagentListEntry: TypeAlias = "SubagentChildEntry | SubagentDiagnosticEntry"


@attrs.frozen(kw_only=True)
class SubagentDescendantListEntry:
    """A listing entry with its durable direct parent and depth below the root (children: 1)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    entry: SubagentListEntry
    parent_id: str
    depth: int
