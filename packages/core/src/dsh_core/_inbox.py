"""The durable inbox: an agent's only queue of pending input (host-core §9).

Two ordered lists, ``next_turn`` and ``next_step``. Every mutation first appends a normalised
``agent/inbox/spliced`` event to the agent's session and only then changes the projection, so
the projection always equals a replay of the splices (and a synchronous observer of the splice
still sees the old lists).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable
from typing import TYPE_CHECKING, Literal

from . import _content
from ._codec import Unfit, class_checker
from ._content import Message
from ._errors import DshError
from ._events import InboxSplicedData, SessionEvent
from ._frozen import builder
from ._json import MAX_NESTING

if TYPE_CHECKING:
    from ._sessions import Session

__all__ = ["Inbox", "InboxError", "InboxTarget", "replay_inbox"]

_spliced = builder(InboxSplicedData)  # one per inbox change: see dsh_core._frozen.builder
#: The check of a message where a splice holds it: inside the payload and its ``inserted``.
_check_message = class_checker(Message)
_MESSAGE_LEVELS = MAX_NESTING - 2

InboxTarget = Literal["next-turn", "next-step"]


class InboxError(DshError):
    """An inbox operation was refused (``DUPLICATE_PENDING``)."""

    code = "INBOX_ERROR"


def _apply(lists: dict[str, list[Message]], d: InboxSplicedData) -> None:
    target = lists[d.target]
    target[d.start : d.start + d.removed_count] = d.inserted


def replay_inbox(
    events: Iterable[SessionEvent],
    since: tuple[list[Message], list[Message]] | None = None,
) -> tuple[list[Message], list[Message]]:
    """The ``(next_turn, next_step)`` projection a sequence of events leaves behind (after
    ``since``, the projection of the events before them, taken over, if given)."""
    turn, step = since if since is not None else ([], [])
    lists: dict[str, list[Message]] = {"next-turn": turn, "next-step": step}
    for event in events:
        if event.type == "agent/inbox/spliced":
            _apply(lists, event.data)
    return lists["next-turn"], lists["next-step"]


Notify = Callable[[str, Message], None]


class Inbox:
    """The pending messages of one agent; a message id may be pending at most once."""

    __slots__ = (
        "_heard",
        "_notify",
        "_pending",
        "_session",
        "next_step",
        "next_turn",
    )

    def __init__(
        self, session: Session, notify: Notify, *, heard: Container[str] | None = None
    ) -> None:
        """``notify(name, message)`` reports each change; given ``heard`` (the names anyone
        listens to, a live view), only changes whose name is in it are reported."""
        self._session = session
        self._notify = notify
        self._heard = heard
        start = session.header.seed_length or 0
        fold = session._seed_fold
        if fold is not None and fold.start == start:  # a warm log: replay what follows it
            self.next_turn, self.next_step = replay_inbox(
                session.events_since(fold.length), (list(fold.next_turn), list(fold.next_step))
            )
        else:
            self.next_turn, self.next_step = replay_inbox(session.events_since(start))
        self._pending = {m.id for m in (*self.next_turn, *self.next_step)}

    def _list(self, target: str) -> list[Message]:
        """The list ``target`` names. Looked up here rather than in a dict kept per inbox:
        one object less for the cyclic collector to walk while the agent lives (PERF-6)."""
        if target == "next-turn":
            return self.next_turn
        if target == "next-step":
            return self.next_step
        raise KeyError(target)

    def __len__(self) -> int:
        return len(self.next_turn) + len(self.next_step)

    def contains(self, message_id: str) -> bool:
        """Whether ``message_id`` is pending."""
        return message_id in self._pending

    def _splice(self, data: InboxSplicedData, message: Message) -> None:
        """Log and apply a splice that inserts ``message``: where a message enters the inbox
        it is checked (hardening 11.1), once; the loop logs it later unchecked.

        The splice around it is built here from a target that named one of our lists and our
        own counts, so the message alone is checked (not even that if it is the message
        ``user_message`` just built from a plain string, which the log holds by construction);
        should that check not vouch for it, the append's full check gives the verdict (or the
        error)."""
        target: object = data.target  # as given to insert: any value that named a list
        try:
            if target.__class__ is not str or _check_message is None:
                raise Unfit
            if message is not _content.plain_user_message:
                _check_message(message, _MESSAGE_LEVELS)
        except Unfit:
            self._session.append("agent/inbox/spliced", data)
        else:
            self._session._append_vouched("agent/inbox/spliced", data)
        self._list(data.target)[data.start : data.start + data.removed_count] = data.inserted

    def _delete(self, data: InboxSplicedData) -> None:
        """Log and apply a pure deletion: built here from a literal target and our own
        counts, nothing to check."""
        self._session._append_vouched("agent/inbox/spliced", data)
        self._list(data.target)[data.start : data.start + data.removed_count] = data.inserted

    def insert(self, target: InboxTarget, message: Message) -> None:
        """Append ``message`` to ``target``; emits ``agent/inbox/inserted``.

        The acceptance is a checkpoint (DUR-1): with a store that writes through, the splice
        is handed to the operating system before this returns. Should that write fail
        (``SessionError`` ``SESSION_IO``), the message is taken out again (a ``canceled``
        splice) and the error raised: it was not accepted and never runs.
        """
        if message.id in self._pending:
            raise InboxError(f"message {message.id!r} is already pending", code="DUPLICATE_PENDING")
        lst = self._list(target)
        at = len(lst)
        self._splice(_spliced(target=target, start=at, inserted=(message,)), message)
        session = self._session
        if session._checkpointer is not None:
            try:
                session.checkpoint()
            except BaseException:
                self._delete(_spliced(target=target, start=at, removed_count=1, outcome="canceled"))
                raise
        self._pending.add(message.id)
        heard = self._heard
        if heard is None or "agent/inbox/inserted" in heard:
            self._notify("agent/inbox/inserted", message)

    def _find(self, message_id: str) -> tuple[InboxTarget, int, Message] | None:
        targets: tuple[InboxTarget, InboxTarget] = ("next-turn", "next-step")
        for target in targets:
            for i, m in enumerate(self._list(target)):
                if m.id == message_id:
                    return target, i, m
        return None

    def remove(self, message_id: str) -> Message | None:
        """Cancel one pending message; emits ``agent/inbox/discarded``."""
        found = self._find(message_id)
        if found is None:
            return None
        target, i, m = found
        self._delete(_spliced(target=target, start=i, removed_count=1, outcome="canceled"))
        self._pending.discard(message_id)
        self._notify("agent/inbox/discarded", m)
        return m

    def replace(self, message_id: str, new: Message) -> None:
        """Discard ``message_id`` and insert ``new`` at its place."""
        found = self._find(message_id)
        if found is None:
            raise InboxError(f"message {message_id!r} is not pending", code="NOT_PENDING")
        target, i, m = found
        self._splice(
            _spliced(target=target, start=i, removed_count=1, inserted=(new,), outcome="canceled"),
            new,
        )
        self._pending.discard(message_id)
        self._pending.add(new.id)
        self._notify("agent/inbox/discarded", m)
        self._notify("agent/inbox/inserted", new)

    def clear(self) -> list[Message]:
        """Cancel everything pending (next-step first, then next-turn); returns what went."""
        gone: list[Message] = []
        targets: tuple[InboxTarget, InboxTarget] = ("next-step", "next-turn")
        for target in targets:
            lst = self._list(target)
            if not lst:
                continue
            removed = list(lst)
            self._delete(
                _spliced(
                    target=target,
                    start=0,
                    removed_count=len(removed),
                    outcome="canceled",
                )
            )
            for m in removed:
                self._pending.discard(m.id)
                self._notify("agent/inbox/discarded", m)
            gone.extend(removed)
        return gone

    def claim(self, *, turn_boundary: bool) -> list[Message]:
        """Take the next batch: all of ``next_step``, plus the first ``next_turn`` item at a
        turn boundary. Pure deletions; the caller emits ``agent/inbox/claimed``."""
        batch: list[Message] = []
        if self.next_step:
            taken = list(self.next_step)
            self._delete(_spliced(target="next-step", start=0, removed_count=len(taken)))
            batch.extend(taken)
        if turn_boundary and self.next_turn:
            first = self.next_turn[0]
            self._delete(_spliced(target="next-turn", start=0, removed_count=1))
            batch.append(first)
        for m in batch:
            self._pending.discard(m.id)
        return batch
