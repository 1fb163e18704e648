"""dsh-subagents: the whole toolkit in one install, and the ``dsh-subagents`` command.

The command's modules are private; what a program uses lives in the distributions this one
depends on (``dsh_core``, ``dsh_subagent`` and the providers and tools).
"""

from __future__ import annotations

from .__about__ import __version__
from ._home import home

__all__ = ["__version__", "home"]
