"""dsh-subagent-acp: the ``acp`` subagent provider, an external agent process spoken to over
the Agent Client Protocol (``agent-client-protocol``, protocol version 1).

See ``docs/acp.md``. The SDK is imported on the first ``start()``, not with this package.
"""

from __future__ import annotations

from .__about__ import __version__
from ._config import MAX_POOL, MAX_TIMER_DELAY_MS, AcpConfig, check_config, resolve_config_cwd
from ._errors import ABORTED_BEFORE_START, AcpError
from ._process import child_environment, is_credential_name, is_credential_value
from ._provider import AcpProvider

__all__ = [
    "ABORTED_BEFORE_START",
    "MAX_POOL",
    "MAX_TIMER_DELAY_MS",
    "AcpConfig",
    "AcpError",
    "AcpProvider",
    "__version__",
    "check_config",
    "child_environment",
    "is_credential_name",
    "is_credential_value",
    "resolve_config_cwd",
]
