"""dsh-subagent-spawn: the ``spawn`` subagent provider.

A fresh child: it sees nothing of the parent's conversation.
"""

from __future__ import annotations

from .__about__ import __version__
from ._provider import SpawnProvider

__all__ = ["SpawnProvider", "__version__"]
