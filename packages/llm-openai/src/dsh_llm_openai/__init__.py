"""OpenAI-compatible chat-completions adapter for dsh: real models through the LLM seam."""

from __future__ import annotations

from .__about__ import __version__
from ._adapter import OpenAIAdapter, OpenAIConfig, request_body

__all__ = ["OpenAIAdapter", "OpenAIConfig", "__version__", "request_body"]
