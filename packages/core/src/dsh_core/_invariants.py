"""Invariant replay (``ctx.invariants``): checkers that watch a running host and fail loud.

Enabled in every test run (the ``dsh_core.testing`` host builder mounts them and fails the test
on any recorded violation). Companions shipped here (host-core §10): the session log (nesting,
numbering, call pairing; replayed from seq 0 on ``session/created``, then checked before every
append), agent status (never the same value twice in a row), and loop request reconstruction
(a loop-built request equals what its log says it must be).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._errors import DshError
from ._log_checker import LogInvariantError, SessionLogChecker, unanswered_calls

if TYPE_CHECKING:
    from ._agent import Agent
    from ._context import Context
    from ._events import SessionEvent
    from ._llm import GenerateOptions
    from ._sessions import Session

__all__ = ["InvariantError", "InvariantRegistry", "install_core_invariants"]


class InvariantError(DshError, AssertionError):
    """An invariant was broken; ``package_name`` names the companion that noticed."""

    code = "INVARIANT"

    def __init__(self, message: str, *, package_name: str) -> None:
        super().__init__(f"[{package_name}] {message}")
        self.package_name = package_name


class InvariantRegistry:
    """Named invariant companions; every violation is raised *and* recorded."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._names: set[str] = set()
        self.violations: list[InvariantError] = []

    def register(
        self, package_name: str, installer: Callable[[Context, InvariantRegistry], Any]
    ) -> Callable[[], object]:
        """Reserve ``package_name`` and run ``installer(child_ctx, self)`` in its own fiber."""
        if package_name in self._names:
            raise DshError(
                f"invariant companion {package_name!r} is already registered",
                code="DUPLICATE_INVARIANT",
            )
        self._names.add(package_name)
        child = self._ctx.plugin(f"invariants:{package_name}")
        installer(child, self)
        names = self._names

        async def remove() -> None:
            names.discard(package_name)
            await child.dispose()

        return self._ctx.fiber.add(remove)

    def violation(self, package_name: str, message: str) -> InvariantError:
        """Record a violation and return the error to raise."""
        error = InvariantError(message, package_name=package_name)
        self.violations.append(error)
        return error


def _session_log(ctx: Context, registry: InvariantRegistry) -> None:
    def on_created(session: Session) -> None:
        checker = SessionLogChecker()
        try:
            checker.replay(session.events)
        except LogInvariantError as exc:
            raise registry.violation("session-log", f"{session.id}: {exc}") from exc

        def validate(s: Session, event: SessionEvent) -> None:
            try:
                checker.check(event)
            except LogInvariantError as exc:
                raise registry.violation("session-log", f"{s.id}: {exc}") from exc
            if event.type in _REQUESTS:  # a model request follows: no call may lack its result
                problem = checker.request_problem()
                if problem is not None:
                    raise registry.violation("session-log", f"{s.id}: {problem}")
            checker.apply(event)

        session.add_validator(validate)

    ctx.on("session/created", on_created, global_=True)


#: The events a model request follows (the loop opens a step, then logs a changed header).
_REQUESTS = frozenset({"step/start", "request/header"})


def _agent_status(ctx: Context, registry: InvariantRegistry) -> None:
    last: dict[int, str] = {}

    def on_status(agent: Agent, status: str) -> None:
        key = id(agent)
        if last.get(key) == status:
            raise registry.violation("agent-status", f"{agent.id} reported {status!r} twice")
        last[key] = status

    def on_disposed(agent: Agent) -> None:
        last.pop(id(agent), None)

    ctx.on("agent/status", on_status, global_=True)
    ctx.on("agent/disposed", on_disposed, global_=True)


def _request_reconstruction(ctx: Context, registry: InvariantRegistry) -> None:
    async def check(options: GenerateOptions, next_: Callable[..., Any]) -> Any:
        if options.loop_request:
            problem = _reconstruction_problem(ctx, options)
            if problem:
                raise registry.violation("request-reconstruction", problem)
        return await next_()

    ctx.on("llm/stream", check, prepend=True, global_=True)


def _reconstruction_problem(ctx: Context, options: GenerateOptions) -> str | None:
    sid = options.session_id
    session = ctx.sessions.get(sid) if sid is not None else None
    if session is None:
        return f"loop request for session {sid!r}, which is not live"
    types = {e.type for e in session.events_since(session.first_live_seq)}
    if "step/start" not in types or "request/header" not in types:
        return f"{sid}: a loop request needs step/start and request/header in the log"
    if options.messages != session.derive_messages():
        return f"{sid}: request messages differ from the log's derived messages"
    unanswered = unanswered_calls(options.messages)
    if unanswered:
        return f"{sid}: the request carries tool calls without a result: {unanswered}"
    header = session.request_header()
    assert header is not None
    c = header.config
    if (options.provider, options.model, options.max_tokens, options.temperature, options.stop) != (
        c.provider,
        c.model,
        c.max_tokens,
        c.temperature,
        c.stop,
    ):
        return f"{sid}: request route/sampling differs from the folded request/header"
    if options.system != header.system or options.tools != header.tools:
        return f"{sid}: request system text or tools differ from the folded request/header"
    return None


def install_core_invariants(ctx: Context) -> InvariantRegistry:
    """Provide ``invariants`` and register the host's own companions."""
    registry = InvariantRegistry(ctx)
    ctx.provide("invariants", registry)
    registry.register("session-log", _session_log)
    registry.register("agent-status", _agent_status)
    registry.register("request-reconstruction", _request_reconstruction)
    return registry
