"""The model-facing `subagent` delegation tool."""

from __future__ import annotations

from .__about__ import __version__

__all__ = ["__version__"]
