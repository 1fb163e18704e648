"""The ``subagent-acp`` plugin's configuration, checked once at load (ACP-4, ACP surface)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any, Literal

import attrs

__all__ = ["MAX_TIMER_DELAY_MS", "AcpConfig", "resolve_config_cwd"]

#: The longest grace a timer may be given (the reference's ``MAX_TIMER_DELAY_MS``, 2**31 - 1).
MAX_TIMER_DELAY_MS = 2_147_483_647


def _grace(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    """ACP surface: a grace is positive, finite and at most ``MAX_TIMER_DELAY_MS``."""
    if not (math.isfinite(value) and 0 < value <= MAX_TIMER_DELAY_MS):
        raise ValueError(
            f"subagent-acp: {attribute.name} must be a positive finite number no greater than "
            f"{MAX_TIMER_DELAY_MS}"
        )


def _command(instance: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if not value:
        raise ValueError("subagent-acp: command must name the ACP agent to run")


def resolve_config_cwd(value: str | None, *, launch_dir: str | None = None) -> str | None:
    """ACP-4: a configured ``cwd``, resolved against the launch directory and checked to be an
    enterable directory; ``None`` when not configured."""
    if value is None:
        return None
    if value == "":
        raise ValueError(
            "subagent-acp: cwd must not be empty — omit the key to use the parent's working "
            "directory"
        )
    path = os.path.abspath(os.path.join(launch_dir or os.getcwd(), value))
    if not (os.path.isdir(path) and os.access(path, os.X_OK)):
        raise ValueError(f"subagent-acp: cwd {path!r} is not an accessible directory")
    return path


def _cwd(instance: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    resolve_config_cwd(value)


@attrs.frozen(kw_only=True)
class AcpConfig:
    """Config of ``subagent-acp`` (contract §3). Times are milliseconds.

    ``start_timeout_ms`` is ours: a child that does not answer ``initialize`` and
    ``session/new`` within it fails ``start()`` and is reaped, instead of hanging the caller.
    """

    provider_name: str = "acp"
    command: str = attrs.field(validator=_command)
    args: tuple[str, ...] = ()
    cwd: str | None = attrs.field(default=None, validator=_cwd)
    permission: Literal["reject", "allow"] = "reject"
    env: Mapping[str, str] = attrs.field(factory=dict)
    dispose_eof_grace_ms: float = attrs.field(default=6000, validator=_grace)
    dispose_grace_ms: float = attrs.field(default=3000, validator=_grace)
    start_timeout_ms: float = attrs.field(default=30_000, validator=_grace)
