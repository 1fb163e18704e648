"""Subagent provider `fork`: a child seeded with the parent's completed turns."""

from __future__ import annotations

from .__about__ import __version__

__all__ = ["__version__"]
