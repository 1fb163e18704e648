"""Subagent provider `acp`: an external agent over the Agent Client Protocol."""

from __future__ import annotations

from .__about__ import __version__

__all__ = ["__version__"]
