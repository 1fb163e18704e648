"""What every part of the session store shares: the logger, waiting on storage work
that outlives a cancelled caller, and the errors of a write."""

from __future__ import annotations

import asyncio
import builtins
import logging
from pathlib import Path
from typing import Any, TypeVar

from .._abort import AbortedError, AbortSignal
from .._events import SessionError

T = TypeVar("T")
_log = logging.getLogger("dsh.sessions")


def _check(signal: AbortSignal | None) -> None:
    if signal is not None and signal.aborted:
        raise AbortedError(signal.reason)


async def _settle(fut: asyncio.Future[T]) -> T:
    """Wait for ``fut`` even if the caller is cancelled meanwhile, then re-raise the cancel.

    Storage work that has started (a write in a worker thread) cannot be recalled, and what
    follows it (bookkeeping, releasing a lock) must see its true outcome.
    """
    cancelled = False
    while not fut.done():
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:
            break
    if cancelled:
        if not fut.cancelled():
            fut.exception()  # retrieved: the caller sees the cancel, the state reflects the rest
        raise asyncio.CancelledError
    return fut.result()


def _deliver(fut: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    """In the loop: settle ``fut`` with a worker thread's outcome (unless it was cancelled)."""
    if fut.cancelled():
        return
    ok, value = outcome
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


def _succeeded(fut: asyncio.Future[Any]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None


def _stored_anyway(fut: asyncio.Future[Any]) -> bool:
    """A write that failed only to encode some events: it stored stand-ins for them."""
    return fut.done() and not fut.cancelled() and isinstance(fut.exception(), _Unwritten)


class _Unwritten(SessionError):
    """A write that stored every event, some as ``session/unwritable`` stand-ins: the batch
    counts as stored (never retried), and the flush reports the loss (``SESSION_IO``)."""


def _unwritten(path: Path, failed: builtins.list[str]) -> _Unwritten:
    return _Unwritten(
        f"session file {path}: could not encode {'; '.join(failed)}; stored an ignorable "
        "session/unwritable event in its place",
        code="SESSION_IO",
    )


def _not_found(id: str, where: str = "") -> SessionError:
    return SessionError(f"no stored session {id!r}{where}", code="SESSION_NOT_FOUND")
