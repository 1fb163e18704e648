"""The append-only session log (:class:`Session`) and the live store (``ctx.sessions``).

A session validates every event *before* it commits (a payload the log can write and read
back, surface metadata, pre-commit validators such as the invariant checker), so a refused
append writes nothing.
Publication (``session/event``) happens after the commit, to listeners captured before it;
appending to a session from inside its own publication is refused (host-core §3).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any, NoReturn, overload

import attrs

from ._codec import Unfit
from ._codec import checkers as _checkers
from ._content import Message, PluginSource, new_id
from ._events import (
    SESSION_FORMAT_VERSION,
    EndSeedData,
    EpochHeader,
    EventTypeRegistry,
    EventTypeSpec,
    SessionError,
    SessionEvent,
    SessionHeader,
    SessionMeta,
)
from ._frozen import attrs_eq, attrs_hash, attrs_repr, open_twin
from ._json import MAX_NESTING
from ._log_checker import LogInvariantError, check_balanced

if TYPE_CHECKING:
    from ._context import Context

__all__ = ["MessageHistory", "Session", "SessionStore", "SessionStoreService", "now_ms"]

Validator = Callable[["Session", SessionEvent], None]
Watcher = Callable[[SessionEvent], object]

_log = logging.getLogger("dsh.sessions")


_time_ns = time.time_ns
_new_object = object.__new__
_OpenEvent = open_twin(SessionEvent)


def now_ms() -> int:
    """Epoch milliseconds."""
    return _time_ns() // 1_000_000


class MessageHistory(Sequence[Message]):
    """An immutable prefix of a session's model-visible history (what ``derive_messages``
    returns): the first ``len`` messages of the session's derived list.

    Taking one costs O(1), not a copy of the history: the derived list only ever grows (a fold
    appends to it; nothing rewrites it), so a prefix of it never changes. It reads like a
    tuple (``+`` with a tuple gives a tuple), and equals the tuple of the same messages (and
    hashes like it).
    """

    __slots__ = ("_items", "_n")

    def __init__(self, items: list[Message], n: int) -> None:
        self._items = items  # shared, append-only: read only below n
        self._n = n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...
    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        n = self._n
        if isinstance(index, slice):
            items = self._items
            return tuple([items[i] for i in range(*index.indices(n))])
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("message history index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[Message]:
        return islice(self._items, self._n)

    def __reversed__(self) -> Iterator[Message]:
        items = self._items
        n = self._n
        if n == len(items):  # the latest view (the usual one): the list's own iterator, which
            return reversed(items)  # starts at its current end and never sees later appends
        return (items[i] for i in range(n - 1, -1, -1))

    def __add__(self, other: tuple[Message, ...]) -> tuple[Message, ...]:
        if not isinstance(other, tuple | MessageHistory):
            return NotImplemented
        return (*self, *other)

    def __radd__(self, other: tuple[Message, ...]) -> tuple[Message, ...]:
        if not isinstance(other, tuple):
            return NotImplemented
        return (*other, *self)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is MessageHistory:
            theirs: MessageHistory = other
            if theirs._items is self._items:  # two prefixes of one history
                return theirs._n == self._n
            return theirs._n == self._n and self._items[: self._n] == theirs._items[: theirs._n]
        if isinstance(other, tuple):
            return len(other) == self._n and tuple(self) == other
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"MessageHistory({tuple(self)!r})"


_NO_MESSAGES: list[Message] = []

#: Histories up to this many messages are handed out as tuples, longer ones as views.
_TUPLE_UP_TO = 64

#: Marks a publishing session (its ``_specs`` while ``session/event`` listeners run).
_PUBLISHING: dict[str, EventTypeSpec] = {}


class Session:
    """One durable conversation log.

    Construct through ``ctx.sessions.prepare``/``create`` (or persistence, for a restored one).
    ``seed`` events must be contiguous from seq 0, lossless and balanced; the constructor then
    writes ``session/end-seed`` unless the seed already ends with one. A ``stored`` seed is a
    log a persistence backend read back: the reader checked it (payloads, surface metadata,
    the log invariant, and repair closed any open turn), and it is not checked again.
    """

    __slots__ = (
        "_announced",
        "_bus",
        "_checkpointer",
        "_ctx",
        "_events",
        "_messages",
        "_messages_tuple",
        "_messages_view",
        "_request_header",
        "_seed_fold",
        "_specs",
        "_types",
        "_validators",
        "_view",
        "_vouching",
        "_watching",
        "first_live_seq",
        "header",
    )

    def __init__(
        self,
        header: SessionHeader,
        *,
        types: EventTypeRegistry,
        seed: Sequence[SessionEvent] | None = None,
        stored: bool = False,
        fold: LogFold | None = None,
    ) -> None:
        self.header = header
        self._types = types
        # The registry's own table, not its read-only view: a lookup per append, same process.
        self._specs = types._specs
        # That table when it holds the core types as core declares them (see _append_vouched).
        self._vouching = types._specs if types._core else None
        self._events: list[SessionEvent] | _ClosedLog = []
        self._messages: list[Message] = []
        self._messages_view = MessageHistory(_NO_MESSAGES, 0)
        self._messages_tuple: tuple[Message, ...] = ()
        self._view: tuple[SessionEvent, ...] = ()
        self._validators: list[Validator] = []
        self._request_header: EpochHeader | None = None
        self._ctx: Context | None = None
        # The host's listener table while published (read per append without going through
        # the context's attribute lookup; a host keeps one table for its lifetime).
        self._bus: Mapping[str, object] | None = None
        self._announced = False
        # Session.watch's watchers by event type (empty: an append pays one test).
        self._watching: dict[str, tuple[Watcher, ...]] = {}
        # Set by a persistence backend that writes through (see checkpoint); None: nothing to do.
        self._checkpointer: Callable[[Session], None] | None = None
        self.first_live_seq = 0
        #: What a backend derived of the seed already (``fold``, see :class:`LogFold`), else None.
        self._seed_fold: LogFold | None = None
        if seed is not None:
            self._load_seed(seed, from_store=stored, fold=fold)

    def _load_seed(
        self, given: Sequence[SessionEvent], *, from_store: bool, fold: LogFold | None = None
    ) -> None:
        # A stored log's list was made for this session alone: it becomes the session's log
        # as it is (PERF-22: a warm resume takes over the closed session's list, no copy).
        seed = given if from_store and isinstance(given, list) else list(given)
        if from_store:
            # A stored log as a backend read it: the reader decoded every event strictly
            # (types, payloads, surface metadata), replayed it through the log invariant and
            # closed any open turn, so it is contiguous and balanced; checking it all again
            # would double the cost of a resume for nothing.
            if fold is not None and fold.length == len(seed):
                self._take_fold(seed, fold)
            else:
                self._fold_seed(seed)
            return
        for i, event in enumerate(seed):
            if event.seq != i:
                raise SessionError(
                    f"seed event {i} has seq {event.seq}; a seed is contiguous from 0",
                    code="SESSION_SEED_INVALID",
                )
            spec = self._types.get(event.type)
            if spec is None and not event.ignorable:
                raise SessionError(
                    f"seed event {i} has unknown required type {event.type!r}",
                    code="SESSION_FORMAT_UNSUPPORTED",
                )
            data = event.data
            if spec is not None and data.__class__ is spec.payload:
                if not from_store:  # a stored log's payloads passed this check, or the reader's
                    try:  # the append fast path's check
                        _checkers[data.__class__](data, MAX_NESTING)
                    except (KeyError, Unfit):
                        self._types.snapshot(spec, event.type, data)  # the verdict, or the error
            else:
                stored = self._types.snapshot(spec, event.type, data)
                if stored is not data:  # free-form data is kept as a frozen copy
                    seed[i] = event = attrs.evolve(event, data=stored)
            surface = spec.surface if spec is not None else event.source_event_seqs is not None
            if surface != (event.surface_op == "append" and event.source_event_seqs is not None):
                raise SessionError(
                    f"seed event {i} ({event.type}) has wrong surface metadata",
                    code="SESSION_SEED_INVALID",
                )
        try:
            check_balanced(seed)
        except LogInvariantError as exc:
            raise SessionError(
                f"the seed is not balanced: {exc}", code="SESSION_SEED_INVALID"
            ) from exc
        self._fold_seed(seed)

    def _fold_seed(self, seed: list[SessionEvent]) -> None:
        """Take ``seed`` (checked) as the log so far, then write ``session/end-seed``."""
        folds = _FOLDS
        for event in seed:
            fold = folds.get(event.type)
            if fold is not None:
                fold(self, event.data)
        self._end_seed(seed)

    def _take_fold(self, seed: list[SessionEvent], fold: LogFold) -> None:
        """:meth:`_fold_seed` with the folds of ``seed`` done already (``fold`` is of these
        very events): nothing is folded again, whatever the log's length."""
        self._messages.extend(fold.messages)
        self._request_header = fold.request_header
        self._seed_fold = fold
        self._end_seed(seed)

    def _end_seed(self, seed: list[SessionEvent]) -> None:
        self._events = seed  # the session's own list by now (a copy, or the store's)
        self.first_live_seq = len(seed)
        if not seed or seed[-1].type != "session/end-seed":
            self.append("session/end-seed", EndSeedData())

    # -- reading ---------------------------------------------------------------------------------

    @property
    def id(self) -> str:
        """The session id (from the header)."""
        return self.header.id

    @property
    def events(self) -> tuple[SessionEvent, ...]:
        """An immutable snapshot of the whole log."""
        view = self._view
        if len(view) != len(self._events):  # the log only grows: a shorter view is stale
            view = self._view = tuple(self._events)
        return view

    @property
    def seq(self) -> int:
        """The seq the next event will get (the log's length)."""
        return len(self._events)

    def event(self, seq: int) -> SessionEvent:
        """The event at ``seq``."""
        return self._events[seq]

    def events_since(self, seq: int) -> Sequence[SessionEvent]:
        """The events from ``seq`` on (a copy)."""
        return self._events[seq:]

    def _hand_over(self, length: int) -> list[SessionEvent] | None:
        """The list holding this closed session's first ``length`` events, for a store to
        keep warm and a later activation of the log to take over as its own (PERF-22): from
        now on this session reads those events through a :class:`_ClosedLog`. A copy when the
        session holds more events than that (appended after its log was stored: they stay
        its own); ``None`` if it was handed over already."""
        events = self._events
        if isinstance(events, _ClosedLog):
            return None
        if len(events) != length:
            return events[:length]
        self._events = _ClosedLog(events, length)
        return events

    def derive_messages(self) -> Sequence[Message]:
        """The model-visible history: user messages, non-empty assistant messages, results.

        Never re-derived: the log's folds keep it up to date as events are appended. Up to
        ``_TUPLE_UP_TO`` messages it is a tuple (cached until the history grows; copying a few
        dozen references in C is cheaper than a view's Python-level reads, and most agents,
        children above all, stay that short); beyond, an O(1) :class:`MessageHistory` view, so
        a turn costs the same on the ten-thousandth message as on the hundredth.
        """
        messages = self._messages
        n = len(messages)
        if n <= _TUPLE_UP_TO:
            copy = self._messages_tuple
            if len(copy) != n:  # the history only grows: a shorter copy is stale
                copy = self._messages_tuple = tuple(messages)
            return copy
        view = self._messages_view
        if view._n != n:
            view = self._messages_view = MessageHistory(messages, n)
        return view

    def request_header(self) -> EpochHeader | None:
        """The envelope of the latest ``request/header``, if any."""
        return self._request_header

    @property
    def published(self) -> bool:
        """Whether the session is entered into a store."""
        return self._ctx is not None

    # -- writing ---------------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Hand every event not yet stored to the operating system now, before returning.

        Called where something is about to be acknowledged or to happen outside the process
        (an inbox acceptance, a model request, a tool body, a turn end, a child id handed out),
        so a crash of the process right after loses none of it. A write, not a sync: the
        backend's policy decides when ``fsync`` follows. Without a backend that writes
        through (memory, or none) it costs one attribute test. A failed write raises
        ``SessionError`` ``SESSION_IO``: the caller must not acknowledge what it was about to.
        """
        checkpointer = self._checkpointer
        if checkpointer is not None:
            checkpointer(self)

    def watch(self, types: Iterable[str], watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher(event)`` for each event of one of ``types`` this session commits,
        from now on; returns the remover.

        A ``session/event`` listener for one session and chosen types: called the same way
        (synchronously, after the commit and the folds, after the ``session/event``
        listeners, the session refusing appends meanwhile; a failure is logged and
        contained), but an event of another type costs one look-up instead of a call, and it
        works whether or not the session is published. What a consumer following one
        session's stream wants: dsh-acp-agent streams a prompt's turn this way.
        """
        wanted = tuple(dict.fromkeys(types))
        for kind in wanted:
            self._watching[kind] = (*self._watching.get(kind, ()), watcher)

        def remove() -> None:
            for kind in wanted:
                rest = tuple(w for w in self._watching.get(kind, ()) if w is not watcher)
                if rest:
                    self._watching[kind] = rest
                else:
                    self._watching.pop(kind, None)

        return remove

    def _publish(self, event: SessionEvent) -> None:
        """Publish one committed event: the ``session/event`` listeners (while the session is
        published), then the watchers of its type (see :meth:`watch`). The session refuses
        appends meanwhile (its specs are swapped for ``_PUBLISHING``)."""
        specs, self._specs = self._specs, _PUBLISHING
        try:
            bus = self._bus
            if bus is not None and "session/event" in bus:
                ctx = self._ctx
                assert ctx is not None
                ctx.emit("session/event", self, event)
            for watcher in self._watching.get(event.type, ()):
                try:
                    watcher(event)
                except Exception:
                    _log.exception("watcher of session %r failed", self.header.id)
        finally:
            self._specs = specs

    def add_validator(self, validator: Validator) -> Callable[[], None]:
        """Run ``validator(session, event)`` before every commit; a raise vetoes the append."""
        self._validators.append(validator)

        def remove() -> None:
            if validator in self._validators:
                self._validators.remove(validator)

        return remove

    def append(
        self,
        type: str,
        data: object,
        *,
        source_event_seqs: Iterable[int] | None = None,
        ignorable: bool = False,
    ) -> SessionEvent:
        """Validate, commit and publish one event; on any failure nothing is written.

        Surface types need ``source_event_seqs`` (possibly empty); others must omit it.
        An unregistered type may be appended only as ``ignorable`` free-form JSON.

        The agent loop logs what it built from values already checked through
        :meth:`_append_vouched` instead.
        """
        # While the session publishes, ``_specs`` is empty: every append takes the checked
        # path, which refuses it (one check less on the hot path).
        spec = self._specs.get(type)
        events = self._events
        seq = len(events)
        # The trusted fast path (a core payload of the declared class, seqs iff surface) only
        # runs the class's compiled check (what the log can write and read back, see
        # EventTypeRegistry.snapshot); anything else, and a payload that check does not pass,
        # is checked and snapshotted by the registry. Cited seqs are checked below, on both.
        seqs: tuple[int, ...] | None = None
        if (
            spec is None
            or not spec.trusted
            or data.__class__ is not spec.payload
            or (source_event_seqs is None) is not (not spec.surface)  # seqs iff surface
        ):
            data, seqs = self._checked(spec, type, data, source_event_seqs, ignorable)
        else:
            try:
                _checkers[data.__class__](data, MAX_NESTING)
            except (KeyError, Unfit):  # no checker (yet), or one that cannot vouch for data
                data = self._types.snapshot(spec, type, data)  # the verdict, or the error
            if source_event_seqs is not None:
                seqs = tuple(source_event_seqs)
        if seqs and (min(seqs) < 0 or max(seqs) >= seq):
            raise SessionError(f"{type} cites events that do not exist", code="SESSION_SURFACE")
        # The event is built inline (as make_event does): this is the hottest path of a turn.
        event: Any = _new_object(_OpenEvent)
        event.type = type
        event.seq = seq
        event.time = _time_ns() // 1_000_000
        event.data = data
        event.source_event_seqs = seqs
        event.surface_op = None if seqs is None else "append"
        event.ignorable = ignorable
        event.__class__ = SessionEvent
        if self._validators:
            for validator in self._validators:
                validator(self, event)
        events.append(event)
        if type in _FOLDS:  # a test, not a call, for the types that fold nothing
            _FOLDS[type](self, event.data)
        bus = self._bus
        watching = self._watching
        if (bus is not None and "session/event" in bus) or (watching and type in watching):
            self._publish(event)  # a call only when something listens
        return event  # type: ignore[no-any-return]  # an alias would cost a store and a load

    def _append_vouched(
        self, type: str, data: object, seqs: tuple[int, ...] | None = None
    ) -> SessionEvent:
        """The agent loop's own append (private), one per event it logs.

        The loop built ``data``, of ``type``'s core payload class, from values already checked
        where they entered (its counters and constants, an inbox message, adapter chunks
        checked as it read them), and ``seqs`` (given iff ``type`` is surface) are seqs this
        session just returned. So no payload or range check runs, and no spec is looked up:
        the core specs of a registry that holds them never change. The validators, the fold
        and the publication run as in :meth:`append`, which takes the append instead when the
        session publishes (its specs are swapped then, and :meth:`append` refuses) or its
        registry does not hold the core types as core declares them.

        Positional, without :meth:`append`'s keywords: the hottest call of a turn.
        """
        if self._specs is not self._vouching:
            return self.append(type, data, source_event_seqs=seqs)
        events = self._events
        event: Any = _new_object(_OpenEvent)
        event.type = type
        event.seq = len(events)
        event.time = _time_ns() // 1_000_000
        event.data = data
        event.source_event_seqs = seqs
        event.surface_op = None if seqs is None else "append"
        event.ignorable = False
        event.__class__ = SessionEvent
        if self._validators:
            for validator in self._validators:
                validator(self, event)
        events.append(event)
        if type in _FOLDS:  # a test, not a call, for the types that fold nothing
            _FOLDS[type](self, data)
        bus = self._bus
        watching = self._watching
        if (bus is not None and "session/event" in bus) or (watching and type in watching):
            self._publish(event)  # a call only when something listens
        return event  # type: ignore[no-any-return]  # an alias would cost a store and a load

    def _checked(
        self,
        spec: EventTypeSpec | None,
        type: str,
        data: object,
        source_event_seqs: Iterable[int] | None,
        ignorable: bool,
    ) -> tuple[object, tuple[int, ...] | None]:
        """The stored payload and cited seqs (not yet range-checked) of an append off the fast
        path, or the error."""
        if self._specs is _PUBLISHING:
            raise SessionError(
                f"cannot append {type!r} to session {self.header.id!r} from inside its own "
                "session/event publication",
                code="SESSION_REENTRANT_APPEND",
            )
        if spec is None and not ignorable:
            raise SessionError(
                f"session event type {type!r} is not registered (register it through the "
                "dsh_session_event_types hook, or append it as ignorable)",
                code="SESSION_EVENT_UNKNOWN_TYPE",
            )
        stored = self._types.snapshot(spec, type, data)
        if spec is not None and spec.surface:
            if source_event_seqs is None:
                raise SessionError(f"{type} needs source_event_seqs", code="SESSION_SURFACE")
            return stored, tuple(source_event_seqs)
        if source_event_seqs is not None:
            raise SessionError(f"{type} is not a surface type", code="SESSION_SURFACE")
        return stored, None

    def _attach(self, owner: Context | None) -> None:
        """Enter the session into (or, with ``None``, detach it from) its owner's host."""
        self._ctx = owner
        self._bus = owner.host.listeners if owner is not None else None

    def __repr__(self) -> str:
        return f"Session({self.header.id!r}, events={len(self._events)})"


# -- the store ------------------------------------------------------------------------------------


@attrs.frozen
class _Entry:
    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash
    session: Session
    owner: Context


class _Detach:
    """``detach`` of an entered session. One slotted object instead of a closure (a function,
    its cell tuple and one cell per captured name): every live session holds one, and each is
    an object the cyclic collector walks at every collection while the session lives (PERF-5).
    """

    __slots__ = ("_entry", "_live")

    def __init__(self, live: dict[str, _Entry], entry: _Entry) -> None:
        self._live = live
        self._entry = entry

    def __call__(self) -> None:
        entry = self._entry
        session, live = entry.session, self._live
        if live.get(session.header.id) is not entry:
            return
        del live[session.header.id]
        if session._announced:
            session._announced = False
            entry.owner.emit("session/disposed", session)
        session._attach(None)


class SessionStoreService:
    """The live sessions of one host (provided as ``sessions``; use the bound view)."""

    def __init__(self, types: EventTypeRegistry) -> None:
        self.types = types
        self._live: dict[str, _Entry] = {}

    def __dsh_bind__(self, ctx: Context) -> SessionStore:
        return SessionStore(self, ctx)

    def live(self) -> dict[str, _Entry]:
        """The live entries, by id, in creation order (read-only use)."""
        return self._live


class SessionStore:
    """``ctx.sessions``: the store seen from one context (its owner for ``create``/``enter``)."""

    __slots__ = ("_ctx", "_svc")

    def __init__(self, service: SessionStoreService, ctx: Context) -> None:
        self._svc = service
        self._ctx = ctx

    @property
    def types(self) -> EventTypeRegistry:
        """The event types this host knows."""
        return self._svc.types

    def prepare(
        self,
        id: str | None = None,
        *,
        seed: Sequence[SessionEvent] | None = None,
        meta: SessionMeta | None = None,
        restored: SessionHeader | None = None,
        fold: LogFold | None = None,
    ) -> Session:
        """Build an unpublished session (nothing is announced or stored yet).

        ``restored`` rebuilds a persisted session under its stored header (``seed`` is then the
        stored log as a backend read, replay-checked and repaired it: it is not checked again;
        a list is taken over as the session's log, not copied, so the backend must not use it
        afterwards; ``fold``, if given, is what the backend derived of it already). A live
        duplicate id, an empty id (``SESSION_INVALID_ID``) or a relative ``cwd`` fails;
        ``id=None`` mints a new id.
        """
        if restored is not None:
            header = restored
        else:
            if id is not None:
                # An empty id names nothing (hardening 11.5): refused, never replaced by a new
                # one. Every store takes the same ids, so a host that works in memory works on
                # files too.
                check_session_id(id)
            meta = meta or _NO_META
            if meta is not _NO_META:
                _check_meta(meta)
            if meta.cwd is not None and not os.path.isabs(meta.cwd):
                raise SessionError(
                    f"session cwd must be absolute, got {meta.cwd!r}", code="SESSION_INVALID_CWD"
                )
            header = SessionHeader(
                version=SESSION_FORMAT_VERSION,
                id=f"session-{new_id()}" if id is None else id,
                created_at=_now(),
                cwd=meta.cwd,
                parent_session=meta.parent_session,
                seed_length=meta.seed_length,
                origin=meta.origin,
                delegation_depth=meta.delegation_depth,
            )
        if header.id in self._svc._live:
            raise SessionError(f"session {header.id!r} is already live", code="DUPLICATE_SESSION")
        return Session(
            header, types=self._svc.types, seed=seed, stored=restored is not None, fold=fold
        )

    def enter(self, session: Session) -> Callable[[], None]:
        """Publish ``session`` into the store, owned by this context; returns ``detach``.

        ``detach`` removes it and, if it was announced, emits ``session/disposed``.
        """
        live = self._svc._live
        if session.header.id in live:
            raise SessionError(
                f"session {session.header.id!r} is already live", code="DUPLICATE_SESSION"
            )
        owner = self._ctx
        entry = _Entry(session, owner)
        live[session.header.id] = entry
        session._attach(owner)
        return _Detach(live, entry)

    def announce(self, session: Session) -> None:
        """Emit ``session/created`` once; a listener that raises vetoes the session.

        On a veto the session is detached with a paired ``session/disposed`` and the error
        propagates.
        """
        if session._announced:
            return
        entry = self._svc._live.get(session.header.id)
        if entry is None or entry.session is not session:
            raise SessionError("announce needs an entered session", code="SESSION_NOT_LIVE")
        session._announced = True
        try:
            entry.owner.emit_veto("session/created", session)
        except BaseException:
            entry.owner.emit("session/disposed", session)
            session._announced = False
            del self._svc._live[session.header.id]
            session._attach(None)
            raise

    def create(
        self,
        id: str | None = None,
        *,
        seed: Sequence[SessionEvent] | None = None,
        meta: SessionMeta | None = None,
    ) -> Session:
        """``prepare`` + ``enter`` + ``announce``; the session lives as long as this context."""
        session = self.prepare(id, seed=seed, meta=meta)
        detach = self.enter(session)
        try:  # owned before it is announced: a disposed owner must not leave it live
            owned = self._ctx.fiber.add(detach)
        except BaseException:
            detach()
            raise
        try:
            self.announce(session)
        except BaseException:
            owned()
            raise
        return session

    def get(self, id: str) -> Session | None:
        """The live session ``id``, if any."""
        entry = self._svc._live.get(id)
        return entry.session if entry is not None else None

    def list(self) -> list[Session]:
        """Live sessions in creation order."""
        return [e.session for e in self._svc._live.values()]

    async def flush(self, session: Session) -> bool:
        """Run the ``session/flush`` event; return whether any listener took part.

        Raises the first listener failure after all have settled.
        """
        owner = session._ctx or self._ctx
        taken: int = await owner.parallel("session/flush", session, scope=owner.scope)
        return taken > 0


def check_session_id(id: object) -> None:
    """Refuse an id that cannot name a session in every store (``SESSION_INVALID_ID``): not a
    string, empty, ``.``, ``..``, or holding ``/``, ``\\`` or NUL (it names a file)."""
    if type(id) is not str or not id or id in (".", "..") or "/" in id or "\\" in id or "\0" in id:
        raise SessionError(
            f"session id {id!r} cannot name a session (a non-empty string without '/', "
            "'\\\\', NUL, and not '.' or '..')",
            code="SESSION_INVALID_ID",
        )


_NO_META = SessionMeta()
_MAX_SAFE = 2**53 - 1


def _check_meta(meta: SessionMeta) -> None:
    """Refuse header fields the log could not write and read back (``SESSION_META_INVALID``,
    hardening 11.1): the header is the first line of the file, and a wrong type there made the
    whole session unreadable. (Unrolled: it runs for every child a delegation creates.)"""
    cwd, parent = meta.cwd, meta.parent_session
    seed, depth = meta.seed_length, meta.delegation_depth
    if cwd is not None and type(cwd) is not str:
        _bad_meta("cwd", "a string", cwd)
    if parent is not None and type(parent) is not str:
        _bad_meta("parent_session", "a string", parent)
    if seed is not None and (type(seed) is not int or not 0 <= seed <= _MAX_SAFE):
        _bad_meta("seed_length", "a non-negative safe integer", seed)
    if depth is not None and (type(depth) is not int or not 0 <= depth <= _MAX_SAFE):
        _bad_meta("delegation_depth", "a non-negative safe integer", depth)
    if meta.origin is not None and meta.origin != "subagent":
        _bad_meta("origin", "'subagent'", meta.origin)
    if parent is not None:
        try:
            check_session_id(parent)
        except SessionError:
            _bad_meta("parent_session", "a session id", parent)


def _bad_meta(name: str, expected: str, value: object) -> NoReturn:
    raise SessionError(
        f"SessionMeta.{name} must be {expected} or None, got {value!r}",
        code="SESSION_META_INVALID",
    )


def _now() -> int:
    return now_ms()


# -- what a session derives from its log as it grows ---------------------------------------------


def _fold_user(session: Session, data: Any) -> None:
    session._messages.append(data)


def _fold_answer(session: Session, data: Any) -> None:
    if data.message.content:  # an empty answer is logged but never sent back to the model
        session._messages.append(data.message)


def _fold_result(session: Session, data: Any) -> None:
    session._messages.append(data.message)


def _fold_header(session: Session, data: Any) -> None:
    session._request_header = data.header


_FOLDS: dict[str, Callable[[Session, Any], None]] = {
    "user/message": _fold_user,
    "assistant/message": _fold_answer,
    "tool/result": _fold_result,
    "request/header": _fold_header,
}


def is_snapshot(message: Message) -> bool:
    """Whether ``message`` is a system-prompt context snapshot (the agent loop's)."""
    source = message.source
    return isinstance(source, PluginSource) and source.form == "snapshot"


class LogFold:
    """What a session and its agent derive from the first ``length`` events of a log: the
    session's folds (its messages, its request header), the agent's inbox (a replay of the
    splices from the header's ``seed_length`` on) and its last context snapshot.

    A restored session given its seed with its ``fold`` takes these over instead of
    deriving them again (a warm log: the store carries the fold from one activation of the
    log to the next, folding only the events in between, see :func:`fold_log`). Immutable.
    """

    __slots__ = (
        "length",
        "messages",
        "next_step",
        "next_turn",
        "request_header",
        "snapshot",
        "start",
    )

    def __init__(
        self,
        *,
        length: int,
        start: int,
        messages: tuple[Message, ...],
        request_header: EpochHeader | None,
        next_turn: tuple[Message, ...],
        next_step: tuple[Message, ...],
        snapshot: str | None,
    ) -> None:
        self.length = length
        self.start = start  # the seq the inbox replay starts at
        self.messages = messages
        self.request_header = request_header
        self.next_turn = next_turn
        self.next_step = next_step
        self.snapshot = snapshot


class _Folding:
    """A stand-in for a session while :func:`fold_log` runs its folds (the same functions)."""

    __slots__ = ("_messages", "_request_header")

    def __init__(self, messages: list[Message], header: EpochHeader | None) -> None:
        self._messages = messages
        self._request_header = header


def fold_log(
    events: Sequence[SessionEvent], seed_length: int | None, since: LogFold | None = None
) -> LogFold:
    """The :class:`LogFold` of ``events``; given ``since`` (a fold of ``events[:since.length]``
    with the same ``seed_length``), only the events after it are folded."""
    from ._inbox import replay_inbox

    start = seed_length or 0
    if since is None or since.start != start or since.length > len(events):
        since = LogFold(
            length=0,
            start=start,
            messages=(),
            request_header=None,
            next_turn=(),
            next_step=(),
            snapshot=None,
        )
    new = events[since.length :]
    folding = _Folding([], since.request_header)
    stand_in: Any = folding
    folds = _FOLDS
    for event in new:
        fold = folds.get(event.type)
        if fold is not None:
            fold(stand_in, event.data)
    added = folding._messages
    snapshot = since.snapshot
    for message in reversed(added):
        if is_snapshot(message):
            snapshot = message.text
            break
    skip = max(0, start - since.length)  # the inbox replays the log's own part only
    next_turn, next_step = replay_inbox(
        islice(new, skip, None), (list(since.next_turn), list(since.next_step))
    )
    return LogFold(
        length=len(events),
        start=start,
        messages=since.messages + tuple(added),
        request_header=folding._request_header,
        next_turn=tuple(next_turn),
        next_step=tuple(next_step),
        snapshot=snapshot,
    )


class _ClosedLog(Sequence[SessionEvent]):
    """The log of a closed session whose list may go on to a later activation of the same
    log (see :meth:`Session._hand_over`): the first ``length`` events of that list. An append
    (what a ``session/disposed`` listener may still do, in memory only) first copies them
    into a list of this session's own, so the shared list never sees it."""

    __slots__ = ("_events", "_length", "_shared")

    def __init__(self, events: list[SessionEvent], length: int) -> None:
        self._events = events
        self._length = length
        self._shared = True

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> SessionEvent: ...

    @overload
    def __getitem__(self, index: slice) -> list[SessionEvent]: ...

    def __getitem__(self, index: int | slice) -> SessionEvent | list[SessionEvent]:
        if isinstance(index, slice):
            return self._events[: self._length][index]
        if not -self._length <= index < self._length:
            raise IndexError("session event index out of range")
        return self._events[index % self._length]

    def __iter__(self) -> Iterator[SessionEvent]:
        return islice(self._events, self._length)

    def __reversed__(self) -> Iterator[SessionEvent]:
        events = self._events
        for seq in range(self._length - 1, -1, -1):
            yield events[seq]

    def append(self, event: SessionEvent) -> None:
        if self._shared:
            self._events = self._events[: self._length]
            self._shared = False
        self._events.append(event)
        self._length += 1
