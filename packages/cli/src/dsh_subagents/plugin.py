"""The ``subagents-cli`` entry point: announces the distribution, mounts nothing.

The command composes the plugins other distributions mount; this one only makes
``dsh-subagents plugins`` (and any host's discovery) show that the toolkit is installed.
"""

from __future__ import annotations

from dsh_core import PluginSpec, hookimpl

__all__ = ["dsh_plugins"]


@hookimpl
def dsh_plugins() -> list[PluginSpec]:
    """No mountable plugin: the distribution is the command."""
    return []
