"""dsh-subagent-fork: the ``fork`` subagent provider.

A child seeded with the parent's completed turns (FORK-1); the in-flight turn is not included.
"""

from __future__ import annotations

from .__about__ import __version__
from ._provider import ForkProvider

__all__ = ["ForkProvider", "__version__"]
