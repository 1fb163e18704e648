"""Session ids as people type them: one rule for ``sessions show/tree`` and ``run --resume``
(kept apart from both so that neither pulls in the other's imports)."""

from __future__ import annotations

from collections.abc import Iterable

#: How many candidates an ambiguous prefix's message names.
_CANDIDATES = 10


class SessionsError(Exception):
    """A usage error of ``sessions``: an unknown or ambiguous id, a store that is no folder.
    ``code`` is stable: ``SESSION_NOT_FOUND``, ``SESSION_AMBIGUOUS``, ``SESSIONS_NO_STORE``."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


def match_id(names: Iterable[str], prefix: str, where: object) -> str:
    """The one id of ``names`` that ``prefix`` starts (``session-`` may be left out); an exact
    id always wins. Unknown: ``SESSION_NOT_FOUND``; several: ``SESSION_AMBIGUOUS``, naming
    them. ``sessions show/tree`` and ``run --resume`` resolve ids with this one rule
    (CLI-33, CLI-12, CLI-90); ``where`` (the store) is named in the messages."""
    names = list(names)
    if prefix in names:
        return prefix
    found = sorted(n for n in names if n.startswith(prefix))
    if not found and not prefix.startswith("session-"):
        found = sorted(n for n in names if n.startswith("session-" + prefix))
    if len(found) == 1:
        return found[0]
    if not found:
        raise SessionsError(
            f"no stored session id starts with {prefix!r} in {where}", code="SESSION_NOT_FOUND"
        )
    shown = ", ".join(found[:_CANDIDATES])
    more = f" and {len(found) - _CANDIDATES} more" if len(found) > _CANDIDATES else ""
    raise SessionsError(
        f"{prefix!r} is ambiguous: {len(found)} sessions start with it: {shown}{more}",
        code="SESSION_AMBIGUOUS",
    )
