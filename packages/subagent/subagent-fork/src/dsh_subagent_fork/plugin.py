"""The ``subagent-fork`` entry point: registers the ``fork`` provider when mounted.

Config: ``provider_name`` (default ``"fork"``) renames the provider. Unmounting the plugin
unregisters the provider; runs it already started keep going (SVC-12, DRV-9).
"""

from __future__ import annotations

import attrs

from dsh_core import Context, PluginSpec, attrs_eq, attrs_hash, attrs_repr, hookimpl

from ._provider import ForkProvider

__all__ = ["ForkConfig", "dsh_plugins"]


@attrs.frozen(kw_only=True)
class ForkConfig:
    """Config of ``subagent-fork``."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    provider_name: str = "fork"


def _apply(ctx: Context, config: ForkConfig) -> None:
    ctx.subagents.register_provider(ForkProvider(name=config.provider_name))


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The ``subagent-fork`` plugin."""
    return [
        PluginSpec(
            name="subagent-fork",
            apply=_apply,
            requires=("subagents",),
            config_type=ForkConfig,
            description="subagent provider 'fork'",
        )
    ]
