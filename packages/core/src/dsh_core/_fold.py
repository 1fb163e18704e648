"""Folds over a session log that consumers of agents need (host-core §9).

``fold_consumed_work`` answers "how did the work this log accepted end?": the latest
``turn/end`` that accounts for consumed input, and whether accepted work was cancelled after it
without any turn opening over it.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from ._events import InboxSplicedData, SessionEvent, TurnEndData
from ._frozen import attrs_eq, attrs_hash, attrs_repr

__all__ = ["ConsumedWork", "fold_consumed_work"]

_FAILED_AFTER_CLAIM = frozenset({"blocked", "aborted", "interrupted", "error"})


@attrs.frozen(kw_only=True)
class ConsumedWork:
    """``end``: the accounting ``turn/end`` (``None`` if none); ``dropped_unrun``: accepted
    work was cancelled after it without a replacement and without a turn over it."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    end: TurnEndData | None
    end_seq: int | None
    dropped_unrun: bool


def fold_consumed_work(events: Iterable[SessionEvent]) -> ConsumedWork:
    """The last ``turn/end`` whose turn ran a step, or claimed input and then ended blocked,
    aborted, interrupted or in error; plus ``dropped_unrun``."""
    end: TurnEndData | None = None
    end_seq: int | None = None
    dropped = False
    in_turn = stepped = claimed = False
    for event in events:
        t = event.type
        if t == "turn/start":
            in_turn, stepped, claimed = True, False, False
        elif t == "step/start":
            stepped = True
        elif t == "agent/inbox/spliced":
            d: InboxSplicedData = event.data
            if d.removed_count and not d.inserted:
                if d.outcome is None:
                    claimed = claimed or in_turn
                elif d.outcome == "canceled":
                    dropped = True
        elif t == "turn/end":
            data: TurnEndData = event.data
            if stepped or (claimed and data.reason.kind in _FAILED_AFTER_CLAIM):
                end, end_seq, dropped = data, event.seq, False
            in_turn = False
    return ConsumedWork(end=end, end_seq=end_seq, dropped_unrun=dropped)
