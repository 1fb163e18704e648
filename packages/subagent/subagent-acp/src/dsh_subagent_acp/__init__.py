"""dsh-subagent-acp: the ``acp`` subagent provider, an external agent process spoken to over
the Agent Client Protocol (``agent-client-protocol``, protocol version 1).

See ``docs/acp.md``. The SDK is imported on the first ``start()``, not with this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .__about__ import __version__

if TYPE_CHECKING:
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

#: Where each public name lives: imported on first use, so loading the plugin (every host that
#: discovers plugins does) imports none of the provider's machinery (PERF-17).
_HOMES = {
    "MAX_POOL": "_config",
    "MAX_TIMER_DELAY_MS": "_config",
    "AcpConfig": "_config",
    "check_config": "_config",
    "resolve_config_cwd": "_config",
    "ABORTED_BEFORE_START": "_errors",
    "AcpError": "_errors",
    "child_environment": "_process",
    "is_credential_name": "_process",
    "is_credential_value": "_process",
    "AcpProvider": "_provider",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
