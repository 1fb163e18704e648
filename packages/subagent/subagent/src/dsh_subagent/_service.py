"""The subagent service, ``ctx.subagents``: the provider registry and one-shot starts.

Providers are named; several coexist (the seam differs from single-executor seams there).
``start`` checks the request against the named provider *before* anything exists, in the order
SVC-5/6 give, so an unsupported request fails loud instead of being accepted and ignored.
Lifecycle events are observation only: a listener failure is logged and contained (SVC-11).
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Awaitable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from dsh_core import (
    AbortSignal,
    Agent,
    AgentOptions,
    ContentBlock,
    Context,
    ServiceKey,
    ToolRestriction,
    quote_name,
)

from . import _control
from ._continuation import ContinuationManager
from ._depth import assert_subagent_max_depth
from ._descriptor import OneShotDescriptor, snapshot_one_shot_descriptor
from ._errors import InvalidStartRequestError, SubagentError, no_provider
from ._limits import SubagentConfig, TreeLimits
from ._listing import ListingMemo, list_children, list_descendants
from ._schema import assert_object_json_schema
from ._setup import ActivationSetupRegistry, ContinuableSetup
from ._types import (
    ContinuableStart,
    ContinuableStartSpec,
    ResolvedSubagentStartRequest,
    SharedResult,
    SubagentDescendantListEntry,
    SubagentFollowupOptions,
    SubagentInterruptAuthority,
    SubagentListEntry,
    SubagentProvider,
    SubagentReportOptions,
    SubagentRun,
    SubagentRunEndInfo,
    SubagentRunInfo,
    SubagentStartRequest,
)

if TYPE_CHECKING:
    from dsh_core import Registration

__all__ = ["SUBAGENTS", "SubagentService", "SubagentState"]


class SubagentState:
    """What every view of ``ctx.subagents`` shares (the provided service object)."""

    def __init__(self, ctx: Context, config: SubagentConfig | None = None) -> None:
        self.ctx = ctx
        #: The running subagents of every run tree, against the row's cap (ROB-60).
        self.limits = TreeLimits((config or SubagentConfig()).max_running_children_per_tree)
        self.providers: dict[str, SubagentProvider] = {}
        #: Label-less one-shot descriptors by registry name (immutable values, built once).
        self.descriptors: dict[str, OneShotDescriptor] = {}
        #: Contributions applied to every continuable child before publication (REG-1..5).
        self.setups = ActivationSetupRegistry()
        #: The continuation manager; unloading the service drains it first (DRN-1).
        self.continuation = ContinuationManager(self)
        ctx.fiber.add(self.continuation.drain)
        #: Listing entries by child id, reused while the child's scan is unchanged.
        self.listing_memo = ListingMemo()

    def __dsh_bind__(self, ctx: Context) -> SubagentService:
        return SubagentService(self, ctx)

    def tree_root(self, agent: Agent) -> str:
        """The id of the root of ``agent``'s run tree (the end of its live lineage)."""
        return self.continuation.lineage_of(agent)[-1].id


#: Typed access to the service: ``ctx[SUBAGENTS]`` (``ctx.subagents`` is untyped).
SUBAGENTS: ServiceKey[SubagentService] = ServiceKey("subagents")

#: The caller fields a resolved request copies (SVC-7).
_REQUEST_FIELDS = tuple(a.name for a in attrs.fields(SubagentStartRequest))
_CAPABILITY_ORDER = (
    ("output_schema", "output_schema"),
    ("max_depth", "depth_limit"),
    ("tool_filter", "tool_filter"),
    ("persona", "persona"),
)


class SubagentService:
    """``ctx.subagents``, seen from one context (registrations are owned by that context)."""

    __slots__ = ("_ctx", "_state")

    def __init__(self, state: SubagentState, ctx: Context) -> None:
        self._state = state
        self._ctx = ctx

    # -- the registry (SVC-1..3) -----------------------------------------------------------------

    def register_provider(self, provider: SubagentProvider) -> Registration:
        """Register ``provider`` under its name for as long as this context lives.

        Emits ``subagent/provider-added``; if a listener raises, the registration is rolled
        back (announced as ``subagent/provider-removed``) and the error propagates (SVC-1). A
        duplicate name fails synchronously with ``DUPLICATE_PROVIDER`` and leaves the first
        registration intact (SVC-2). Disposing deletes the name, then emits
        ``subagent/provider-removed`` (contained, SVC-3).
        """
        name = provider.name
        providers = self._state.providers
        if not name:
            raise SubagentError("a provider needs a non-empty name", code="INVALID_PROVIDER")
        if name in providers:
            raise SubagentError(
                f"subagent provider {name!r} is already registered", code="DUPLICATE_PROVIDER"
            )
        self._ctx._require_active()
        providers[name] = provider
        emitter = self._state.ctx
        try:
            emitter.emit_veto("subagent/provider-added", provider)
        except BaseException:
            if providers.get(name) is provider:
                del providers[name]
                # Observers that saw the add (the lifecycle checker) see it undone, so the
                # same name can be registered again.
                emitter.emit("subagent/provider-removed", name)
            raise

        def unregister() -> None:
            if providers.get(name) is provider:
                del providers[name]
                emitter.emit("subagent/provider-removed", name)

        return self._ctx.fiber.add(unregister)

    def get_provider(self, name: str) -> SubagentProvider | None:
        """The provider registered as ``name``, if any."""
        return self._state.providers.get(name)

    def list(self) -> list[str]:
        """Registered provider names, in registration order."""
        return list(self._state.providers)

    # -- one-shot starts (SVC-4..11) ---------------------------------------------------------

    async def start(self, name: str, request: SubagentStartRequest) -> SubagentRun:
        """Validate ``request`` against provider ``name``, start it, announce the run.

        Order: provider exists (``NO_PROVIDER``); capabilities in the order output_schema,
        max_depth, tool_filter, persona (``UNSUPPORTED_CAPABILITY``); then ``max_depth`` is a
        non-negative safe integer (``TypeError``), ``output_schema`` is in the supported
        subset, and the other fields have their declared types (``InvalidStartRequestError``).
        Then the run takes a slot of its run tree (``SUBAGENT_LIMIT`` when the tree already
        runs ``max_running_children_per_tree`` subagents), held until ``run.result`` settles.
        Only then is the provider called, with a fresh resolved request carrying the one-shot
        descriptor. A provider failure passes through unchanged, gives the slot back and emits
        nothing.
        """
        provider = self._state.providers.get(name)
        if provider is None:
            raise SubagentError(no_provider(name, self._state.providers), code="NO_PROVIDER")
        caps = provider.capabilities
        for field, flag in _CAPABILITY_ORDER:
            if getattr(request, field) is not None and not getattr(caps, flag):
                raise SubagentError(
                    f"subagent provider {quote_name(name)} does not support {field}",
                    code="UNSUPPORTED_CAPABILITY",
                )
        if request.max_depth is not None:
            assert_subagent_max_depth(request.max_depth)
        if request.output_schema is not None:
            assert_object_json_schema(request.output_schema)
        _check_fields(request)
        resolved = ResolvedSubagentStartRequest(
            **{field: getattr(request, field) for field in _REQUEST_FIELDS},
            descriptor=self._descriptor(name, request.label),
        )
        state = self._state
        # ROB-60/61: the run holds a slot of its tree until its result settles.
        slot = state.limits.acquire(state.tree_root(request.parent))
        try:
            run = await provider.start(resolved)
        except BaseException:
            slot.release()
            raise
        run.result.add_done_callback(slot.release)
        emitter = request.parent.ctx
        lifecycle = _RunLifecycle(emitter, name, run.id, run.local_agent is not None)
        run.result.add_done_callback(lifecycle.observe_end)
        if emitter.has_listeners("subagent/start"):
            emitter.emit("subagent/start", lifecycle.info())
        return run

    # -- the run tree's cap (ROB-60..68; in _limits) ---------------------------------------------

    @property
    def max_running_children_per_tree(self) -> int:
        """The cap on subagents running at once in one run tree (the row's config)."""
        return self._state.limits.limit

    def running_in_tree(self, agent: Agent) -> int:
        """How many subagents hold a slot of ``agent``'s run tree now."""
        state = self._state
        return state.limits.running.get(state.tree_root(agent), 0)

    def check_tree_capacity(self, agent: Agent) -> None:
        """``SUBAGENT_LIMIT`` if ``agent``'s run tree has no free slot now (holds nothing).

        For a caller that hands the start to later work (a background job) and wants the
        refusal now; the start itself still takes the slot, or is refused then.
        """
        state = self._state
        state.limits.check(state.tree_root(agent))

    # -- continuable children (CONT-1..17, SET-1..4; the manager is in _continuation) --------

    async def start_continuable(self, spec: ContinuableStartSpec) -> ContinuableStart:
        """Start a continuable background child; resolve once its prompt is accepted.

        Checks in CONT-1's order: admission (``DRAINING``), persistence
        (``PERSISTENCE_UNAVAILABLE``), ``max_depth`` (``TypeError``), the child id (a reserved
        ``child_id`` or a fresh one; ``DUPLICATE_CHILD`` for a live agent or session, the
        parent's own id, or a stored session), depth (``SubagentDepthError``), the descriptor,
        then the provider's ``prepare_continuable`` (``NO_PROVIDER``,
        ``UNSUPPORTED_CAPABILITY``). The child is created through the manager's private
        owner scope with the descriptor after any provider seed (DSC-5), the persona, tool
        filter and delegation statement applied by the manager itself, and the setup
        registry's contributions. Resolves with ``{child_id, message_id}`` at inbox
        acceptance (CONT-2); any earlier failure, including ``spec.signal`` aborting (raised
        as its own reason), leaves no session, agent, Activation or ownership edge (CONT-3).
        After acceptance the signal cancels nothing (CONT-9). On a store that writes through
        (JSONL), the child's header, descriptor and accepted prompt are written to the
        operating system before this resolves, so a crash right after loses no child whose id
        was returned; a failed write is the store's ``SessionError`` (``SESSION_IO``) and
        rolls the child back like any failure before acceptance.
        """
        return await self._state.continuation.start(spec)

    async def followup(
        self,
        parent: Agent,
        child_id: str,
        content: Sequence[ContentBlock],
        options: SubagentFollowupOptions,
    ) -> str:
        """Send ``content`` to continuable child ``child_id`` of ``parent``; return the
        accepted message id.

        ``parent`` must be the exact live agent registered under its id and the child's
        durable direct parent (``UNAUTHORIZED``), checked at lookup and again at the final
        admission step (CONT-8). Routing depends only on residency (CONT-7): a running child
        queues a next turn on its inbox, a waiting one is woken, a child with no Activation is
        cold-resumed from its durable descriptor without its provider (CONT-10,
        ``NOT_RESUMABLE``). A delivery racing the child's disposal waits for it, then
        resumes. ``options.signal`` owns only the span before acceptance (CONT-9);
        ``options.source`` is attribution, never authority. The returned id is in the child's
        stored log (written to the operating system) on a store that writes through; a
        failed write raises the store's ``SessionError`` (``SESSION_IO``): nothing was queued.
        """
        return await self._state.continuation.followup(parent, child_id, content, options)

    def _descriptor(self, name: str, label: str | None) -> OneShotDescriptor:
        """SVC-7's descriptor; the label-less one is an immutable value kept per name."""
        if label is not None:
            return snapshot_one_shot_descriptor(name, label)
        cache = self._state.descriptors
        descriptor = cache.get(name)
        if descriptor is None:
            descriptor = cache[name] = snapshot_one_shot_descriptor(name)
        return descriptor

    # -- continuable setup contributions (REG-1..5) ----------------------------------------------

    def register_continuable_setup(self, setup: ContinuableSetup) -> Registration:
        """Install ``setup(child_ctx)`` into every later fresh or resumed continuable child.

        The registration belongs to this context: unmounting the registering plugin (or
        calling the returned registration) revokes the setup from resident children at once
        (REG-4); a failing disposer surfaces as ``ACTIVATION_SETUP_RELEASE_FAILED`` (REG-5).
        """
        return self._state.setups.register(setup, self._ctx)

    # -- durable listing (LIST-S, LIST-3, LIST-5, LIST-6) ------------------------------------

    async def list_children(
        self, parent_session_id: str, signal: AbortSignal | None = None
    ) -> builtins.list[SubagentListEntry]:
        """The session-backed subagents directly under ``parent_session_id``, from one
        ``ctx.session_query`` trace; no agent is loaded or resumed (LIST-S).

        Candidates are the traced direct descendants, ordered by ``created_at``, then id. One
        supported ``subagent/descriptor`` in a child's own suffix (after its seed) makes it a
        ``SubagentChildEntry`` (``running`` if its session is live, else ``inactive``); none
        leaves it out; more than one or a malformed one is a ``corrupt`` diagnostic, an
        unknown version ``unsupported``, a failed read ``unavailable`` (or ``corrupt`` /
        ``unsupported`` as the store judged the log). A trace failure fails the call; one
        child's never does. No session query: ``SUBAGENT_CONTROL_SESSION_QUERY_UNAVAILABLE``;
        an abort: ``CANCELLED``, never a partial result.
        """
        return await list_children(self._ctx, self._state.listing_memo, parent_session_id, signal)

    async def list_descendants(
        self, root_session_id: str, signal: AbortSignal | None = None
    ) -> builtins.list[SubagentDescendantListEntry]:
        """Every subagent below ``root_session_id``, in stable pre-order (siblings as
        ``list_children`` orders them), each with its durable direct ``parent_id`` and its
        ``depth`` (children: 1) (LIST-6).

        Ordinary sessions and children without a descriptor give no row but are walked
        through; the walk is iterative and meets each session once, so a parent cycle ends
        there. Entries, errors and cancellation are those of :meth:`list_children`.
        """
        return await list_descendants(self._ctx, self._state.listing_memo, root_session_id, signal)

    # -- reports, interrupts and scoped drains (RPT-S1..3, INT-1/2, DRN-2/3; in _control) ---

    async def report_from(
        self,
        child: Agent,
        content: Sequence[ContentBlock],
        options: SubagentReportOptions | None = None,
    ) -> str:
        """Report ``content`` from continuable child ``child`` to its durable direct parent;
        return the accepted message id (there is no recipient to choose: one edge up).

        Checks in RPT-S1's order: ``options.signal`` (raised as its own reason), admission
        for the child's lineage (``DRAINING``), ``child`` being the exact agent of a resident
        Activation (``UNAUTHORIZED``) that is not being disposed (``ACTIVATION_CLOSING``), a
        live direct parent (``PARENT_UNAVAILABLE``). The parent receives ``[text "Background
        subagent <id> reported:", *content]`` from a ``subagent-report`` source, delivered by
        ``options.delivery``: ``next-step`` (default; steers, waking an idle parent),
        ``quiet`` (injects, no wake) or ``wakeup`` (a new parent turn). The returned id is in
        the parent's stored log on a store that writes through; a failed write raises the
        store's ``SessionError`` (``SESSION_IO``): the report was not accepted. Any other
        send that raises is ``PARENT_UNAVAILABLE`` with the error as its cause; a parent whose
        disposal has started but which is still registered accepts the report (kept in its
        log, unwoken, RPT-4). Reporting never ends the child's turn, and a report accepted
        before the child settles reaches the parent's model before its settlement notice,
        whatever the delivery (RPT-S3, BUG-2). Without an ``agents`` service:
        ``CONTINUATION_UNAVAILABLE`` (SVC-14).
        """
        return _control.report_from(self._state.continuation, child, content, options)

    def interrupt(self, target_id: str, authority: SubagentInterruptAuthority) -> None:
        """Stop resident continuable child ``target_id``'s current turn; returns once the
        cancel was issued (INT-1).

        ``UserInterruptAuthority(parent_session_id)`` must name the child's durable parent;
        ``AncestorInterruptAuthority(agent)`` must be the exact live agent, not the target,
        and in the target's ancestry (``UNAUTHORIZED``; the first two are checked even for an
        absent target). An absent target and one already being disposed are no-ops. Queued
        follow-ups stay parked until the next waking send runs them first, in order; the
        child's own children are not signalled (INT-2, BUG-6). Without an ``agents`` service
        this does nothing (SVC-14).
        """
        _control.interrupt(self._state.continuation, target_id, authority)

    def drain_continuable_descendants(self, parents: Iterable[Agent]) -> Awaitable[None]:
        """Release every continuable descendant of the exact live agents ``parents``; await
        the result for the outcome (DRN-2).

        On the call, admission closes under each root until that agent is disposed
        (``DRAINING`` for a start under it, a follow-up from it or a report from below), and
        every strict descendant is cancelled; the release then waits for admitted
        materializations under the roots and disposes the descendants child-first, keeping
        the roots. Failed branches come as one ``ACTIVATION_TEARDOWN_FAILED`` after every
        branch settled. A no-op without an ``agents`` service (SVC-14).
        """
        return _control.drain_descendants(self._state.continuation, parents)

    def drain_continuable_children(
        self, parent: Agent, child_ids: Iterable[str]
    ) -> Awaitable[None]:
        """Release the selected resident direct children of the exact live ``parent`` and
        their descendants; await the result for the outcome (DRN-3).

        ``UNAUTHORIZED`` (on the call) for a stale parent or a resident id that is not its
        direct child; absent ids are skipped. Admission stays open, siblings stay resident;
        failures come as one ``ACTIVATION_TEARDOWN_FAILED`` after the release. A no-op
        without an ``agents`` service (SVC-14).
        """
        return _control.drain_children(self._state.continuation, parent, child_ids)

    def drained(self, agent: Agent) -> bool:
        """Whether continuable child ``agent``'s Activation is being released by a drain
        (the manager's, a scoped or a selected one), not by settling. A provider that keeps
        something alive for a child between epochs (the ``acp`` provider's agent process)
        asks this while the child's scope is disposed, and ends it at once when true."""
        act = self._state.continuation.activation_of(agent)
        return act is not None and act.drained


def _check_fields(request: SubagentStartRequest) -> None:
    """Refuse mistyped request fields before anything exists (DRV-3, hardening 11.6).

    ``label`` is left to the descriptor snapshot (DSC-1), ``max_depth`` and ``output_schema``
    to SVC-6; the rest is checked here, so a provider never publishes a child it then cannot
    prompt.
    """
    prompt = request.prompt
    if not isinstance(prompt, (tuple, list)):  # a tuple: no union object built per call
        raise _mistyped("prompt", "a sequence of content blocks (see text_blocks)", prompt)
    for i, block in enumerate(prompt):
        if not isinstance(block, ContentBlock):
            raise _mistyped("prompt", f"a sequence of content blocks; item {i}", block)
    if not isinstance(request.parent, Agent):
        raise _mistyped("parent", "an Agent", request.parent)
    if not isinstance(request.signal, AbortSignal):
        raise _mistyped("signal", "an AbortSignal", request.signal)
    if request.persona is not None and not isinstance(request.persona, str):
        raise _mistyped("persona", "a str or None", request.persona)
    options = request.agent_options
    if options is not None and not isinstance(options, AgentOptions):
        raise _mistyped("agent_options", "an AgentOptions or None", options)
    tool_filter = request.tool_filter
    if tool_filter is not None and not isinstance(tool_filter, ToolRestriction):
        raise _mistyped("tool_filter", "a ToolRestriction or None", tool_filter)


def _mistyped(field: str, what: str, value: object) -> InvalidStartRequestError:
    return InvalidStartRequestError(
        f"SubagentStartRequest.{field} must be {what}, got {type(value).__name__}"
    )


class _RunLifecycle:
    """The ``subagent/start`` and ``subagent/end`` identity of one run (SVC-9, SVC-10).

    The run id is minted the first time a payload needs it: a run nobody observes never
    builds one, and a run that is observed carries the same id in its start and end.
    """

    __slots__ = ("_emitter", "_id", "_info", "_local", "_provider")

    def __init__(self, emitter: Context, provider: str, id: str, local: bool) -> None:
        self._emitter = emitter
        self._provider = provider
        self._id = id
        self._local = local
        self._info: SubagentRunInfo | None = None

    def info(self) -> SubagentRunInfo:
        """The start payload (the run id is minted on first use)."""
        info = self._info
        if info is None:
            info = self._info = SubagentRunInfo(
                run_id=str(uuid.uuid4()), provider=self._provider, id=self._id, local=self._local
            )
        return info

    def observe_end(self, future: SharedResult) -> None:
        """``run.result`` settled: emit ``subagent/end`` (its payload only when observed)."""
        last: Any = None
        if future.cancelled() or future.exception() is not None:
            stop = "error"
        else:
            result = future.result()
            stop = result.stop_reason
            last = result.output or None
        emitter = self._emitter
        if not emitter.has_listeners("subagent/end"):
            return
        info = self.info()
        emitter.emit(
            "subagent/end",
            SubagentRunEndInfo(
                run_id=info.run_id,
                provider=info.provider,
                id=info.id,
                local=info.local,
                stop_reason=stop,
                last_assistant_message=last,
            ),
        )
