"""Model-facing subagent control tools: ``send_message``, ``interrupt_agent`` (plugin
``tool-subagent-control``) and ``list_agents`` (plugin ``tool-subagent-list-agents``)."""

from __future__ import annotations

from .__about__ import __version__
from ._control import INTERRUPT_AGENT_DESCRIPTION, SEND_MESSAGE_DESCRIPTION
from ._listing import LIST_AGENTS_DESCRIPTION, ListAgentsStatus, render_rows

__all__ = [
    "INTERRUPT_AGENT_DESCRIPTION",
    "LIST_AGENTS_DESCRIPTION",
    "ListAgentsStatus",
    "SEND_MESSAGE_DESCRIPTION",
    "__version__",
    "render_rows",
]
