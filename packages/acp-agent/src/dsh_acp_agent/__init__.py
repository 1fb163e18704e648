"""dsh-acp-agent: a dsh host served as an Agent Client Protocol agent over stdio.

The ``dsh-acp-agent [--config FILE]`` console script (``python -m dsh_acp_agent``) serves it;
:func:`open_agent` boots the same agent in code, for any ACP transport. See ``docs/acp.md``.
The SDK (``agent-client-protocol``) and the host are imported when serving starts, not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .__about__ import __version__
from ._config import AgentServerConfig, ConfigError, load_config

if TYPE_CHECKING:
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
    if name in ("DshAcpAgent", "open_agent"):
        from . import _server

        return getattr(_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
