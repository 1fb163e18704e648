"""Model-facing subagent control tools."""

from __future__ import annotations

from .__about__ import __version__

__all__ = ["__version__"]
