"""dsh-core: the host runtime that dsh agents, tools and subagent providers plug into."""

from __future__ import annotations

from .__about__ import __version__
from ._errors import DshError
from ._plugins import (
    ENTRY_POINT_GROUP,
    DiscoveredPlugin,
    DshPluginManager,
    PluginError,
    PluginLoadFailure,
    PluginSpec,
    hookimpl,
    make_plugin_manager,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "DiscoveredPlugin",
    "DshError",
    "DshPluginManager",
    "PluginError",
    "PluginLoadFailure",
    "PluginSpec",
    "__version__",
    "hookimpl",
    "make_plugin_manager",
]
