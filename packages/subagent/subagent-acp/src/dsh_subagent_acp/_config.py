"""The ``subagent-acp`` plugin's configuration (contract §3, ACP-4).

Structuring checks every key's type strictly (as for every plugin); :func:`check_config` then
checks the values, once, when the plugin loads: a bad value fails the boot with
``PLUGIN_CONFIG``.
"""

from __future__ import annotations

import math
import os

import attrs

from dsh_core import PluginError, attrs_eq, attrs_hash, attrs_repr

__all__ = ["MAX_POOL", "MAX_TIMER_DELAY_MS", "AcpConfig", "check_config", "resolve_config_cwd"]

#: The longest grace a timer may be given (the reference's ``MAX_TIMER_DELAY_MS``, 2**31 - 1).
MAX_TIMER_DELAY_MS = 2_147_483_647
#: ACPC-30: the most agent processes a row's warm pool keeps started ahead of need. Each is a
#: whole agent process (about a second of CPU and tens of MB for one on the Python SDK).
MAX_POOL = 8
_PERMISSIONS = ("reject", "allow")


@attrs.frozen(kw_only=True)
class AcpConfig:
    """Config of ``subagent-acp``. Times are milliseconds.

    ``command`` is required. ``start_timeout_ms`` is ours: a child that does not answer
    ``initialize`` and ``session/new`` within it fails ``start()`` and is reaped, instead of
    hanging the caller. ``idle_release_ms``: how long the process of a continuable child may
    stay idle before it is released (ACPC-15). ``pool``: how many agent processes are kept
    started and initialized ahead of need (ACPC-30; 0, the default, keeps none).
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    command: str  # no default: a composition without it cannot mount the plugin
    provider_name: str = "acp"
    args: list[str] = attrs.field(factory=list)
    cwd: str | None = None
    permission: str = "reject"
    env: dict[str, str] = attrs.field(factory=dict)
    pass_env: list[str] = attrs.field(factory=list)
    dispose_eof_grace_ms: float = 6000
    dispose_grace_ms: float = 3000
    start_timeout_ms: float = 30_000
    idle_release_ms: float = 60_000
    pool: int = 0


def resolve_config_cwd(value: str | None, *, launch_dir: str | None = None) -> str | None:
    """ACP-4: a configured ``cwd``, resolved against the launch directory and checked to be an
    enterable directory; ``None`` when not configured (``ValueError`` when unusable)."""
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


def _check(config: AcpConfig) -> str | None:
    if not config.command:
        raise ValueError("subagent-acp: command must name the ACP agent to run")
    if "\0" in config.command:
        raise ValueError("subagent-acp: command must not contain NUL")
    for i, arg in enumerate(config.args):
        if "\0" in arg:
            raise ValueError(f"subagent-acp: args[{i}] must not contain NUL, got {arg!r}")
    for name, value in config.env.items():
        if not name or "=" in name or "\0" in name:
            raise ValueError(
                f"subagent-acp: env names must be non-empty, without '=' or NUL, got {name!r}"
            )
        if "\0" in value:
            raise ValueError(f"subagent-acp: env.{name} must not contain NUL")
    for i, name in enumerate(config.pass_env):
        if not name or "=" in name or "\0" in name:
            raise ValueError(f"subagent-acp: pass_env[{i}] must be a variable name, got {name!r}")
    if config.permission not in _PERMISSIONS:
        raise ValueError(
            f"subagent-acp: permission must be 'reject' or 'allow', got {config.permission!r}"
        )
    for key in ("dispose_eof_grace_ms", "dispose_grace_ms", "start_timeout_ms", "idle_release_ms"):
        value = getattr(config, key)
        if not (math.isfinite(value) and 0 < value <= MAX_TIMER_DELAY_MS):
            raise ValueError(
                f"subagent-acp: {key} must be a positive finite number no greater than "
                f"{MAX_TIMER_DELAY_MS}"
            )
    if not (type(config.pool) is int and 0 <= config.pool <= MAX_POOL):
        raise ValueError(
            f"subagent-acp: pool must be a whole number from 0 to {MAX_POOL}, got {config.pool!r}"
        )
    return resolve_config_cwd(config.cwd)


def check_config(config: AcpConfig) -> str | None:
    """Check the values of ``config`` (ACP surface, ACP-4); returns the resolved ``cwd``.

    What the child's ``execve`` would refuse is refused here, naming the key: NUL in
    ``command``, an ``args`` item or an ``env`` value; an ``env`` name that is empty or holds
    ``=`` or NUL.

    Raises ``PluginError`` (``PLUGIN_CONFIG``) naming what is wrong.
    """
    try:
        return _check(config)
    except ValueError as exc:
        raise PluginError(str(exc), code="PLUGIN_CONFIG") from None
