"""The ``acp-agent`` entry point: plugin ``acp-agent`` lets a host serve itself over ACP.

Mounted, it provides ``ctx.acp_agent`` (:class:`AcpAgentService`): ``await
ctx.acp_agent.serve(writer, reader)`` serves this host as an ACP agent on those streams (or on
one SDK transport) until the client closes them. Config: ``provider``, ``model`` and
``max_tokens``, the route of every session it creates (default: the scripted model's echo).
``session/load`` is offered when the host's store is the JSONL one. The ``dsh-acp-agent``
command boots a host with this plugin from a config file. The SDK is imported on the first
``serve()``/``agent()``, never when the plugin loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from dsh_core import (
    AgentOptions,
    Context,
    JsonlSessionPersistence,
    PluginSpec,
    attrs_eq,
    attrs_hash,
    attrs_repr,
    hookimpl,
)

if TYPE_CHECKING:
    from ._server import DshAcpAgent

__all__ = ["AcpAgentConfig", "AcpAgentService", "dsh_plugins"]


def _non_empty(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not value:
        raise ValueError(f"key {attribute.name!r} must not be empty")


def _positive(instance: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"key {attribute.name!r} must be at least 1, got {value!r}")


@attrs.frozen(kw_only=True)
class AcpAgentConfig:
    """Config of ``acp-agent``: the model route of the sessions it serves (``provider`` and
    ``model`` non-empty, ``max_tokens`` at least 1, as the config file's ``[model]``)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    provider: str = attrs.field(default="scripted", validator=_non_empty)
    model: str = attrs.field(default="echo", validator=_non_empty)
    max_tokens: int | None = attrs.field(default=None, validator=_positive)


class AcpAgentService:
    """``ctx.acp_agent``: this host, served as an ACP agent."""

    def __init__(self, ctx: Context, config: AcpAgentConfig) -> None:
        self._ctx = ctx
        self.options = AgentOptions(
            provider=config.provider, model=config.model, max_tokens=config.max_tokens
        )

    @property
    def durable(self) -> bool:
        """Whether sessions outlive the process (the JSONL store): ``loadSession`` is offered."""
        return isinstance(self._ctx.get("session_persistence"), JsonlSessionPersistence)

    def agent(self) -> DshAcpAgent:
        """A fresh ACP agent over this host (for a transport of your own)."""
        from ._server import DshAcpAgent

        return DshAcpAgent(self._ctx, self.options, durable=self.durable)

    async def serve(self, input_stream: Any, output_stream: Any = None) -> None:
        """Serve until the client closes the connection; then dispose the sessions served.

        ``input_stream`` is what we write to (an ``asyncio.StreamWriter``) and
        ``output_stream`` what we read from (its ``StreamReader``): each line is checked before
        the SDK sees it, and a frame that is no JSON-RPC object is answered with an error and
        logged, never ending the connection (docs/acp.md); or one SDK ``Transport`` as
        ``input_stream`` alone.
        """
        from ._server import serve_connection

        agent = self.agent()
        try:
            await serve_connection(agent, input_stream, output_stream)
        finally:
            await agent.close()


def _apply(ctx: Context, config: AcpAgentConfig) -> None:
    ctx.provide("acp_agent", AcpAgentService(ctx, config))


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The ``acp-agent`` plugin."""
    return [
        PluginSpec(
            name="acp-agent",
            apply=_apply,
            provides=("acp_agent",),
            requires=("agents", "sessions"),
            after=("session_persistence",),
            config_type=AcpAgentConfig,
            description="ctx.acp_agent: serve this host as an Agent Client Protocol agent",
        )
    ]
