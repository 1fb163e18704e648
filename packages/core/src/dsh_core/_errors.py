"""The error base every dsh distribution builds on.

Every error raised on purpose carries a stable ``code``; messages are for humans and may change.
Callers branch on ``code`` (or on a builtin base class where a subclass also derives from one).
"""

from __future__ import annotations

__all__ = ["DshError"]


class DshError(Exception):
    """Base of dsh's deliberate errors; ``code`` is stable, the message is not."""

    code: str = "DSH_ERROR"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.args[0]!r}, code={self.code!r})"
