"""``python -m dsh_acp_agent``: the same as the ``dsh-acp-agent`` console script."""

from __future__ import annotations

from .cli import run

run()
