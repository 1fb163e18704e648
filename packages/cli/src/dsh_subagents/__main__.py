"""``python -m dsh_subagents``: the ``dsh-subagents`` command, where the script is not on PATH."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
