"""Where the command keeps its state: ``$DSH_SUBAGENTS_HOME``, else ``~/.dsh-subagents``.

The name is the project's own, so the command never writes into another tool's folder (the
DeepSeek Harness runtime keeps its state under ``DSH_HOME`` / ``~/.dsh``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["HOME_ENV", "home"]

#: The environment variable naming the command's home folder.
HOME_ENV = "DSH_SUBAGENTS_HOME"


def home() -> Path:
    """The home folder: ``$DSH_SUBAGENTS_HOME`` when set and not empty, else
    ``~/.dsh-subagents``. Nothing is created here; a command creates what it writes."""
    value = os.environ.get(HOME_ENV)
    return Path(value) if value else Path.home() / ".dsh-subagents"
