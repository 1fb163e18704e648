"""Subagent provider `spawn`: a fresh in-process child."""

from __future__ import annotations

from .__about__ import __version__

__all__ = ["__version__"]
