"""Reports, interrupts and scoped drains of continuable children (RPT-S1..3, INT-1/2, DRN-2/3).

The continuation manager (``_continuation``) owns Activations, residency and disposal; this
module adds the operations that act on them from outside a child's own follow-up path:

- :func:`report_from`: a child's report, exactly one edge up, in the parent's inbox;
- :func:`interrupt`: stop a child's current turn, keeping its queued input parked;
- :func:`drain_descendants` / :func:`drain_children`: release a subtree (closing admission
  under exact live roots) or selected direct children.

A report accepted before a child settles reaches the parent's model before that child's
settlement notice, whatever the delivery (BUG-2): the notice is queued behind any report of
the same child still waiting in the parent's next-turn queue (:func:`queued_report`, read by
the manager when it sends the notice).

This module imports nothing of ``_continuation`` at run time (the manager imports
:func:`queued_report` from here).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Generator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from dsh_core import (
    AbortedError,
    Agent,
    AgentCancelCause,
    AgentRegistry,
    ContentBlock,
    ContextError,
    ServiceKey,
    SessionError,
    TextBlock,
    shown_id,
    user_message,
)

from ._errors import SubagentError
from ._types import (
    AncestorInterruptAuthority,
    SubagentInterruptAuthority,
    SubagentReportMessageSource,
    SubagentReportOptions,
)

if TYPE_CHECKING:
    from ._continuation import Activation, ContinuationManager

__all__ = [
    "Release",
    "drain_children",
    "drain_descendants",
    "interrupt",
    "queued_report",
    "report_from",
]

_AGENTS: ServiceKey[AgentRegistry] = ServiceKey("agents")
_DEFAULT_REPORT = SubagentReportOptions()
_PARENT_CANCEL = AgentCancelCause(kind="parent")
_USER_CANCEL = AgentCancelCause(kind="user")
_PARENT_UNAVAILABLE = "direct parent is not live; report was not delivered"


def _error(message: str, code: str) -> SubagentError:
    return SubagentError(message, code=code)


# -- reports (RPT-S1..3, BUG-2) -------------------------------------------------------------------


def report_from(
    manager: ContinuationManager,
    child: Agent,
    content: Sequence[ContentBlock],
    options: SubagentReportOptions | None,
) -> str:
    """Deliver ``child``'s report to its durable direct parent; return the message id.

    Checks in RPT-S1's order, nothing awaited in between: the signal (its own reason), the
    child's lineage admitting work (``DRAINING``), ``child`` being the exact agent of a resident
    Activation (``UNAUTHORIZED``) that is not closing (``ACTIVATION_CLOSING``), the parent
    named by the child's header being live (``PARENT_UNAVAILABLE``). ``quiet`` injects (no
    wake), ``next-step`` steers and ``wakeup`` follows up (a new parent turn); both waking
    sends go through the manager's waking accounting, so a resident continuable parent stays
    running until it claims the report. The parent's inbox writes the report through to its
    log before the send returns, so the id returned is on disk; a write that fails raises its
    ``SessionError`` (``SESSION_IO``): the report was not accepted. Any other send that raises
    is ``PARENT_UNAVAILABLE`` with the error as its cause.
    """
    registry = manager.agents()
    if options is None:
        options = _DEFAULT_REPORT
    delivery = options.delivery
    if delivery not in ("quiet", "next-step", "wakeup"):
        raise ValueError(
            f"unknown report delivery {delivery!r}: expected 'quiet', 'next-step' or 'wakeup'"
        )
    signal = options.signal
    if signal.aborted:
        raise AbortedError(signal.reason)
    manager.check_admission(_report_lineage(manager, registry, child))
    act = manager.activation_of(child)
    if act is None:
        raise _error(
            f"agent {child.id} is not a live continuable subagent and cannot report",
            "UNAUTHORIZED",
        )
    if act.closing:
        raise _error(
            f"subagent {child.id} activation is being disposed; the report was not delivered",
            "ACTIVATION_CLOSING",
        )
    parent_id = child.session.header.parent_session
    parent = registry.get(parent_id) if parent_id is not None else None
    if parent is None:
        raise _error(_PARENT_UNAVAILABLE, "PARENT_UNAVAILABLE")
    message = user_message(
        (TextBlock(text=f"Background subagent {act.child_id} reported:"), *content),
        source=SubagentReportMessageSource(sender_session_id=act.child_id),
    )
    try:
        if delivery == "quiet":
            parent.inject(message)
        else:
            manager.send_waking(parent, message, "turn" if delivery == "wakeup" else "step")
    except SessionError:
        raise  # DUR-32: the parent's log could not take it (SESSION_IO): not accepted
    except Exception as exc:
        raise _error(_PARENT_UNAVAILABLE, "PARENT_UNAVAILABLE") from exc
    return message.id


def _report_lineage(
    manager: ContinuationManager, registry: AgentRegistry, child: Agent
) -> list[Agent]:
    """The agents whose drain closes ``child``'s admission: its captured (or owned) lineage,
    and the live chain of durable parents its header names (which still reaches a drained
    root from a child the drain already released)."""
    lineage = list(manager.lineage_of(child))
    parent_id = child.session.header.parent_session
    seen = {a.id for a in lineage}
    while parent_id is not None and parent_id not in seen:
        parent = registry.get(parent_id)
        if parent is None:
            break
        lineage.append(parent)
        seen.add(parent_id)
        parent_id = parent.session.header.parent_session
    return lineage


def queued_report(parent: Agent, child_id: str) -> bool:
    """Whether a report of ``child_id`` still waits in ``parent``'s next-turn queue (BUG-2).

    A next step claims the whole next-step queue before the next turn's first item, so a
    settlement notice steered (or injected) there would reach the model before a ``wakeup``
    report queued earlier; the manager then queues the notice behind it instead.
    """
    for message in parent.inbox.next_turn:
        source = message.source
        if isinstance(source, SubagentReportMessageSource) and source.sender_session_id == child_id:
            return True
    return False


# -- interrupt (INT-1, INT-2) ---------------------------------------------------------------------


def interrupt(
    manager: ContinuationManager, target_id: str, authority: SubagentInterruptAuthority
) -> None:
    """Stop the current turn of resident child ``target_id``; synchronous (INT-1).

    An ``ancestor`` authority must be the exact live registered agent and not the target,
    checked even when no such target exists. An absent target (unknown, one-shot, settled) is
    an accepted no-op. ``user`` authority must name the target's durable parent session;
    ``ancestor`` authority must be in the ancestry captured when the target materialized. A
    target whose Activation is already closing is left alone. Otherwise the target is
    cancelled (cause ``user`` or ``parent``) keeping its inbox: queued follow-ups stay parked
    until the next waking send, which runs them first (INT-2); one sent while the aborted turn
    still unwinds runs as soon as it ended (BUG-6). Descendants are never signalled.
    """
    registry = manager.state.ctx.get(_AGENTS)
    if registry is None:
        return  # SVC-14: no manager, nothing to interrupt
    if isinstance(authority, AncestorInterruptAuthority):
        caller: Agent | None = authority.agent
        parent_session = None
        if registry.get(authority.agent.id) is not authority.agent:
            raise _error(
                f"interrupting {shown_id(target_id)} requires the exact live ancestor agent",
                "UNAUTHORIZED",
            )
        if authority.agent.id == target_id:
            raise _error(f"agent {shown_id(target_id)} cannot interrupt itself", "UNAUTHORIZED")
    else:
        caller = None
        parent_session = authority.parent_session_id
    act = manager.activations.get(target_id)
    if act is None:
        return
    if caller is None:
        if act.handle.agent.session.header.parent_session != parent_session:
            raise _error(f"subagent {target_id} belongs to another parent session", "UNAUTHORIZED")
    elif not act.in_ancestry(caller):
        raise _error(
            f"subagent {target_id} is not a live descendant of agent {caller.id}", "UNAUTHORIZED"
        )
    if act.closing:
        return
    act.handle.agent.cancel(_USER_CANCEL if caller is None else _PARENT_CANCEL, keep_inbox=True)


# -- drains (DRN-2, DRN-3) ------------------------------------------------------------------------


class Release:
    """What a drain returns: the release already runs (in a host-owned task, so nobody's
    cancellation stops it); awaiting gives its outcome, ``ACTIVATION_TEARDOWN_FAILED`` when a
    branch failed. Any number of callers may await it, each stopping alone."""

    __slots__ = ("_task",)

    def __init__(self, task: asyncio.Future[SubagentError | None] | None) -> None:
        self._task = task

    def __await__(self) -> Generator[Any, None, None]:
        task = self._task
        if task is None:
            return
        failure = yield from asyncio.shield(task).__await__()
        if failure is not None:
            raise failure


_DONE = Release(None)


def drain_descendants(manager: ContinuationManager, parents: Iterable[Agent]) -> Release:
    """Release the continuable descendants of the exact live agents ``parents`` (DRN-2).

    On the call, before anything is awaited: admission closes under each root until that
    agent is disposed (a start under it, a follow-up from it or a report from below it fail
    ``DRAINING``), and every strict continuable descendant is closed and cancelled, found by
    the ancestry captured at its materialization (so also below an intermediate agent that
    already left the registry). The release then waits for the admitted materializations
    under the roots (each publishes or rolls back) and disposes the descendants child-first;
    a continuable root itself is kept. Stale copies of a root are ignored; unrelated forests
    keep running. Concurrent calls converge on the same disposals.
    """
    registry = manager.state.ctx.get(_AGENTS)
    if registry is None:
        return _DONE  # SVC-14
    roots = [p for p in dict.fromkeys(parents) if registry.get(p.id) is p]
    if not roots:
        return _DONE
    for root in roots:
        _close_under(manager, root)
    for act in _descendants(manager, roots):
        if not act.closing:
            manager.cancel_tree(act, drain=True)
    return _spawn(manager, _release_descendants(manager, roots), "drain continuable descendants")


def drain_children(
    manager: ContinuationManager, parent: Agent, child_ids: Iterable[str]
) -> Release:
    """Release the selected resident direct children of ``parent`` and their descendants
    (DRN-3); admission stays open and siblings stay resident.

    ``parent`` must be the exact live agent (``UNAUTHORIZED``); ids are deduplicated and
    absent ones skipped; a resident target that is not ``parent``'s direct child fails the
    whole call ``UNAUTHORIZED`` before anything is released. The selected subtrees are closed
    and cancelled on the call; failures come as one ``ACTIVATION_TEARDOWN_FAILED`` once every
    selected child was released.
    """
    registry = manager.state.ctx.get(_AGENTS)
    if registry is None:
        return _DONE  # SVC-14
    if registry.get(parent.id) is not parent:
        raise _error("selected child teardown requires the exact live parent agent", "UNAUTHORIZED")
    targets: list[Activation] = []
    for child_id in dict.fromkeys(child_ids):
        act = manager.activations.get(child_id)
        if act is None:
            continue
        if act.parent_session != parent.id or not act.in_ancestry(parent):
            raise _error(
                f"subagent {child_id} is not a direct child of agent {parent.id}", "UNAUTHORIZED"
            )
        targets.append(act)
    if not targets:
        return _DONE
    for act in targets:
        manager.cancel_tree(act, drain=True)
    return _spawn(manager, _dispose_all(targets, "selected"), "drain continuable children")


def _spawn(
    manager: ContinuationManager, release: Awaitable[SubagentError | None], name: str
) -> Release:
    return Release(manager.state.ctx.host.spawn(release, name=name))


def _close_under(manager: ContinuationManager, root: Agent) -> None:
    """Close admission under ``root`` until that agent is disposed (its registry entry goes)."""
    roots = manager.drain_roots
    if root in roots:
        return
    roots.add(root)
    ctx = manager.state.ctx

    def forget(agent: Agent) -> None:
        if agent is root:
            roots.discard(root)
            remove()

    try:
        remove = ctx.on("agent/disposed", forget, global_=True)
    except ContextError:
        pass  # the service is unloading: its own drain closes admission for everyone


def _descendants(manager: ContinuationManager, roots: Sequence[Agent]) -> list[Activation]:
    """Every resident (or retiring) Activation strictly below one of ``roots`` (a root below
    another root is released with that one)."""
    found: list[Activation] = []
    for act in (*manager.activations.values(), *manager.retiring.values()):
        agent = act.handle.agent
        for root in roots:
            if root is not agent and act.in_ancestry(root):
                found.append(act)
                break
    return found


async def _release_descendants(
    manager: ContinuationManager, roots: Sequence[Agent]
) -> SubagentError | None:
    pending = [m.done for m in manager.materializations if any(a in roots for a in m.lineage)]
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    targets = _descendants(manager, roots)
    for act in targets:
        if not act.closing:  # published meanwhile, before admission closed
            manager.cancel_tree(act, drain=True)
    inside = set(targets)
    tops = [a for a in targets if a.owner is None or a.owner not in inside]
    return await _dispose_all(tops, "scoped")


async def _dispose_all(targets: Sequence[Activation], kind: str) -> SubagentError | None:
    """Dispose ``targets`` together; one ``ACTIVATION_TEARDOWN_FAILED`` for every failed one,
    after all of them settled."""
    outcomes = await asyncio.gather(*(a.dispose() for a in targets), return_exceptions=True)
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    if not failures:
        return None
    causes = "; ".join(f"{type(f).__name__}: {f}" for f in failures)
    error = _error(
        f"continuable subagent teardown failed for {len(failures)} {kind} activation(s): " + causes,
        "ACTIVATION_TEARDOWN_FAILED",
    )
    error.__cause__ = failures[0]
    return error
