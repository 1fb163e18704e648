"""dsh-tool-subagent: the model-facing ``subagent`` delegation tool (contract §4)."""

from __future__ import annotations

from .__about__ import __version__
from ._config import (
    BACKGROUND_MODES,
    PROVIDER_MANAGED,
    AgentOptionsConfig,
    SubagentToolConfig,
    ToolFilterConfig,
)
from ._tool import (
    DEPTH_CONTEXT_ORDER,
    HEADLINES,
    NO_AGENT,
    NO_JOBS,
    OUTPUT_SCHEMA,
    SECTION_ORDER,
    SubagentTool,
    depth_statement,
    description_for,
    guidance_for,
    install_subagent_tool,
    render_output,
)

__all__ = [
    "BACKGROUND_MODES",
    "DEPTH_CONTEXT_ORDER",
    "HEADLINES",
    "NO_AGENT",
    "NO_JOBS",
    "OUTPUT_SCHEMA",
    "PROVIDER_MANAGED",
    "SECTION_ORDER",
    "AgentOptionsConfig",
    "SubagentTool",
    "SubagentToolConfig",
    "ToolFilterConfig",
    "__version__",
    "depth_statement",
    "description_for",
    "guidance_for",
    "install_subagent_tool",
    "render_output",
]
