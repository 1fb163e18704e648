"""The ``acp`` provider: a one-shot child that is an external agent process spoken to over the
Agent Client Protocol (contract §3, ACP-1..8)."""

from __future__ import annotations

import os

import attrs

from dsh_core import AbortedError, Agent, TextBlock, attrs_eq, attrs_hash, attrs_repr
from dsh_subagent import (
    NO_START_CAPABILITIES,
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ResolvedSubagentStartRequest,
    SubagentCapabilities,
    SubagentRun,
)

from ._config import AcpConfig
from ._continuable import AcpSessions
from ._errors import ABORTED_BEFORE_START, AcpError
from ._pool import AcpPool
from ._process import child_environment

__all__ = ["AcpProvider"]


def _enterable(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.X_OK)


@attrs.frozen(kw_only=True)
class AcpProvider:
    """Subagent provider ``acp``: no start-time capabilities; the child sees only its prompt.

    ``cwd`` is the configured working directory, already resolved and checked at load
    (ACP-4); ``None`` means the parent session's own.
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    config: AcpConfig
    cwd: str | None = None
    sessions: AcpSessions | None = attrs.field(default=None, eq=False)
    pool: AcpPool | None = attrs.field(default=None, eq=False)
    name: str = attrs.field(
        default=attrs.Factory(lambda self: self.config.provider_name, takes_self=True)
    )
    capabilities: SubagentCapabilities = NO_START_CAPABILITIES
    inherits_parent_context: bool = False

    def child_cwd(self, parent: Agent) -> str:
        """ACP-4: the configured directory, else the parent header's (absolute, enterable)."""
        if self.cwd is not None:
            return self.cwd
        cwd = parent.session.header.cwd
        if cwd is None:
            raise AcpError(
                f"subagent-acp {self.name!r}: no working directory for the child: configure "
                "`cwd`, or give the parent session one",
                code="ACP_NO_CWD",
            )
        if not os.path.isabs(cwd) or not _enterable(cwd):
            raise AcpError(
                f"subagent-acp {self.name!r}: the parent's working directory {cwd!r} is not an "
                "absolute, accessible directory",
                code="ACP_CWD_INVALID",
            )
        return cwd

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        """ACP-1/2: spawn, ``initialize``, ``session/new``, then publish (prompt running); a
        pooled process, when the row's pool has one for ``cwd``, skips the first two (ACPC-31)."""
        signal = request.signal
        if signal.aborted:
            raise AbortedError(signal.reason, ABORTED_BEFORE_START)
        cwd = self.child_cwd(request.parent)
        text = "".join(b.text for b in request.prompt if isinstance(b, TextBlock))
        from ._client import start_acp_run  # the SDK, imported on first use

        return await start_acp_run(
            name=self.name,
            config=self.config,
            cwd=cwd,
            env=child_environment(self.config.env, passed=self.config.pass_env),
            text=text,
            signal=signal,
            warm=None if self.pool is None else self.pool.take(cwd),
        )

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        """ACPC-10: start the agent process and its ACP session; the child's turns then take
        the route ``subagent-acp/<name>``, one ``session/prompt`` each (see ``_continuable``)."""
        if self.sessions is None:
            raise AcpError(
                f"subagent-acp {self.name!r} serves no continuable children here",
                code="ACP_START_FAILED",
            )
        cwd = self.child_cwd(request.parent)
        model = await self.sessions.prepare(request.session_id, request.parent, cwd, request.signal)
        return ContinuableCreateSpec(agent_provider=self.sessions.route, agent_model=model)
