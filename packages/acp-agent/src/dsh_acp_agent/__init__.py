"""dsh-acp-agent: a dsh host served as an Agent Client Protocol agent over stdio.

The ``dsh-acp-agent [--config FILE]`` console script (``python -m dsh_acp_agent``) serves it;
:func:`open_agent` boots the same agent in code, for any ACP transport. See ``docs/acp.md``.
The SDK (``agent-client-protocol``) and the host are imported when serving starts, not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .__about__ import __version__

if TYPE_CHECKING:
    from ._config import AgentServerConfig, ConfigError, load_config
    from ._server import DshAcpAgent, open_agent

__all__ = [
    "AgentServerConfig",
    "ConfigError",
    "DshAcpAgent",
    "__version__",
    "load_config",
    "open_agent",
]


def __getattr__(name: str) -> Any:
    # Each imported on first use: the plugin (``dsh_acp_agent.plugin``, loaded by every host
    # that discovers plugins) needs neither the command's config nor the server (PERF-17).
    if name in ("DshAcpAgent", "open_agent"):
        from . import _server

        return getattr(_server, name)
    if name in ("AgentServerConfig", "ConfigError", "load_config"):
        from . import _config

        return getattr(_config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
