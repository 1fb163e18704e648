"""The ``subagent-acp`` entry point: registers the ``acp`` provider when mounted.

Config (:class:`AcpConfig`): ``command`` (required), ``args``, ``cwd``, ``permission``
(``reject`` | ``allow``), ``env``, ``dispose_eof_grace_ms``, ``dispose_grace_ms``,
``start_timeout_ms``, ``idle_release_ms``, ``pool`` (a warm pool, off by default),
``provider_name`` (default ``"acp"``). A configured ``cwd`` is resolved
and checked once, here (ACP-4). Unmounting unregisters the provider; published runs go on.
"""

from __future__ import annotations

import os

from dsh_core import Context, PluginSpec, hookimpl

from ._config import AcpConfig, check_config

__all__ = ["dsh_plugins"]


def _apply(ctx: Context, config: AcpConfig) -> None:
    # The provider's machinery is imported when a row mounts it, not when the plugin loads:
    # a host that discovers plugins without mounting this one never needs it (PERF-17).
    from ._continuable import AcpSessions
    from ._pool import AcpPool
    from ._process import child_environment
    from ._provider import AcpProvider

    cwd = check_config(config)
    env = child_environment(config.env, passed=config.pass_env)
    pool = None
    if config.pool:
        # ACPC-31: started in the row's cwd, else the host's own working directory.
        pool = AcpPool(name=config.provider_name, config=config, cwd=cwd or os.getcwd())
        ctx.fiber.add(pool.close)
    sessions = AcpSessions(name=config.provider_name, config=config, ctx=ctx, env=env, pool=pool)
    # Registered before the adapter and the listener: unloading undoes them first, then ends
    # every process of a continuable child (and waits for each).
    ctx.fiber.add(sessions.close)
    ctx.llm.register_adapter(sessions.route, sessions)
    ctx.on("agent/disposed", sessions.on_agent_disposed, global_=True)
    ctx.subagents.register_continuable_setup(sessions.setup)
    ctx.subagents.register_provider(
        AcpProvider(config=config, cwd=cwd, sessions=sessions, pool=pool)
    )
    if pool is not None:
        pool.fill()


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """The ``subagent-acp`` plugin."""
    return [
        PluginSpec(
            name="subagent-acp",
            apply=_apply,
            requires=("subagents", "llm"),
            config_type=AcpConfig,
            description="subagent provider 'acp': an external agent over the Agent Client Protocol",
        )
    ]
