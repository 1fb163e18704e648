"""The ``subagent-spawn`` entry point: registers the ``spawn`` provider when mounted.

Config: ``provider_name`` (default ``"spawn"``) renames the provider. Unmounting the plugin
unregisters the provider; runs it already started keep going (SVC-12, DRV-9).
"""

from __future__ import annotations

import attrs

from dsh_core import Context, PluginSpec, attrs_eq, attrs_hash, attrs_repr, hookimpl

from ._provider import SpawnProvider

__all__ = ["SpawnConfig", "dsh_plugins"]


@attrs.frozen(kw_only=True)
class SpawnConfig:
    """Config of ``subagent-spawn``."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    provider_name: str = "spawn"


def _apply(ctx: Context, config: SpawnConfig) -> None:
    ctx.subagents.register_provider(SpawnProvider(name=config.provider_name))


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The ``subagent-spawn`` plugin."""
    return [
        PluginSpec(
            name="subagent-spawn",
            apply=_apply,
            requires=("subagents",),
            config_type=SpawnConfig,
            description="subagent provider 'spawn'",
        )
    ]
