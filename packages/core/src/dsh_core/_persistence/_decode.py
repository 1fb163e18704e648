"""Reading event lines: parsing a log a chunk at a time with the collector paused,
nesting limits, and the bounded read of a scan."""

from __future__ import annotations

import builtins
import gc
import json
import re
import threading
from collections.abc import Iterable
from itertools import compress
from json.encoder import encode_basestring
from typing import Any

from .._json import MAX_NESTING
from ._files import _pread

_HEADER_CHUNK = 4096
#: A stored file as ``stat`` sees it: (inode, ctime, size, mtime), in nanoseconds.
_Stamp = tuple[int, int, int, int]
#: The longest header line (bytes, without its newline) the store writes or lists: a header
#: holds a few short fields, so anything longer is not a header (and listing never reads more).
HEADER_LINE_LIMIT = 1 << 20

#: A line nests at most this deep: a payload's MAX_NESTING levels inside the event object.
_LINE_NESTING = MAX_NESTING + 1
#: How many lines of a sound log are parsed at once (see ``_parse_sound``). Small enough that
#: a chunk's parsed containers stay under the collector's first threshold (700 allocations):
#: 256 made a 100,000-event load run twice the collections and take 18 % longer than 32.
_PARSE_CHUNK = 32


class _CollectorPause:
    """``with _COLLECTOR_PAUSED:`` runs its block with the cyclic garbage collector off.

    A load builds some four collector-tracked objects per event that all survive it: with the
    collector on, a 10,000-event log sets off dozens of young-generation passes and several
    middle ones that walk those objects again and again (about a tenth of the load), and they
    find nothing, since a log holds no cycles. Paused, the objects are walked once, by the
    first pass after the load. The switch is process-wide, so it is held briefly (one log's
    parse and decode, in a worker thread; the event loop runs on meanwhile, its cyclic garbage
    waiting for the pass after), counted across overlapping loads, restored on every exit
    (an exception included), and left alone when the collector was already off. A program
    that turns the collector off itself while a load is under way sees it turned back on when
    the load ends.
    """

    __slots__ = ("_depth", "_lock", "_restore")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._restore = False

    def __enter__(self) -> None:
        with self._lock:
            if not self._depth:
                self._restore = gc.isenabled()
                gc.disable()
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if not self._depth and self._restore:
                gc.enable()


_COLLECTOR_PAUSED = _CollectorPause()


class _TooDeep(ValueError):
    """A complete line nests deeper than :data:`_LINE_NESTING` (corrupt, never torn)."""

    def __init__(self) -> None:
        super().__init__(f"it nests deeper than {_LINE_NESTING} levels")


def _loads(line: bytes) -> Any:
    try:
        return json.loads(line.decode("utf-8", "surrogatepass"))
    except RecursionError:
        raise _TooDeep from None


def _nests_deeper(value: Any, levels: int) -> bool:
    """Whether parsed JSON ``value`` opens more than ``levels`` levels (recursion bounded by
    ``levels``: the value may be as deep as the parser allows)."""
    if type(value) is dict:
        items: Iterable[Any] = value.values()
    elif type(value) is list:
        items = value
    else:
        return False
    if levels < 1:
        return True
    return any(_nests_deeper(v, levels - 1) for v in items)


def _first_too_deep(lines: builtins.list[bytes], values: builtins.list[Any]) -> int | None:
    """The index of the first line nesting deeper than :data:`_LINE_NESTING`, if any.

    A line that deep is longer than twice that and holds more brackets; most lines are
    shorter or hold far fewer (both counted at C speed), and only the others are walked.
    """
    limit = _LINE_NESTING
    longer = (2 * limit).__lt__
    # A torn last line has no value: the range stops before it.
    for i in compress(range(len(values)), map(longer, map(len, lines))):
        line = lines[i]
        if line.count(b"{") + line.count(b"[") > limit and _nests_deeper(values[i], limit):
            return i
    return None


#: The first read of a bounded scan (see ``_read_until``); each later one is twice the last.
_SCAN_CHUNK = 1 << 16


def _stop_pattern(until: frozenset[str]) -> re.Pattern[bytes]:
    """Matches the start of an event line of one of ``until``'s types as the store writes it
    (type first, then seq); group 1 is the seq."""
    names = b"|".join(
        re.escape(encode_basestring(t).encode("utf-8", "surrogatepass")) for t in sorted(until)
    )
    return re.compile(b'\n\\{"type":(?:' + names + b'),"seq":([0-9]+)[,}]')


def _header_seed(line: bytes) -> int | None:
    """The ``seed_length`` of a header line (0 without one); ``None``: not a header."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if type(value) is not dict:
        return None
    seed = value.get("seed_length", 0)
    return seed if type(seed) is int else 0


def _read_until(fd: int, stop: re.Pattern[bytes]) -> bytes:
    """The file up to the end of its first event line that ``stop`` matches at a seq of at
    least the header's ``seed_length`` (the whole file when there is none), read a growing
    chunk at a time, so a long tail after the stop costs nothing.

    The match is a fast path over the lines the store writes; whatever it misses only makes
    the read longer, and what was read is parsed as usual.
    """
    data = bytearray()
    offset = 0
    step = _SCAN_CHUNK
    seed: int | None = None
    searched = 0
    while True:
        chunk = _pread(fd, step, offset)
        if not chunk:
            return bytes(data)
        data += chunk
        offset += len(chunk)
        step = min(step * 2, 1 << 22)
        if seed is None:
            nl = data.find(b"\n")
            if nl < 0:
                if len(data) > HEADER_LINE_LIMIT:
                    data += _read_all_from(fd, offset)
                    return bytes(data)
                continue
            seed = _header_seed(bytes(data[:nl]))
            if seed is None:  # not a header: the usual parse says what is wrong
                data += _read_all_from(fd, offset)
                return bytes(data)
            searched = nl
        while True:
            found = stop.search(data, searched)
            if found is None:
                searched = max(searched, data.rfind(b"\n"))  # a match may begin there
                break
            end = data.find(b"\n", found.end())
            if end < 0:
                searched = found.start()  # its line is not complete yet
                break
            if int(found.group(1)) >= seed:
                return bytes(data[: end + 1])
            searched = end


def _read_all_from(fd: int, offset: int) -> bytes:
    parts: list[bytes] = []
    while True:
        chunk = _pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        offset += len(chunk)
