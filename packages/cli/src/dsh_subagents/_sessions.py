"""``dsh-subagents sessions``: list, show and walk the sessions stored in a JSONL folder.

``list`` must stay fast over a large folder (10,000 sessions well under a second), so it does
not boot a host: it reads each ``*.jsonl`` entry's header line itself (one open, never through
a symlink, a 4 KiB read for an ordinary header; CLI-30), and then, for the rows it shows only,
a bounded part of each file (CLI-31): the whole file up to :data:`FULL_READ` bytes, else its
first :data:`HEAD_READ` and last :data:`TAIL_READ` bytes, with the tokens then marked as a
lower bound; with ``--all`` (every root shown) that part is read through the header's own
open (CLI-73), and it imports neither dsh-core nor a model SDK (CLI-70). ``show`` and ``tree``
read through dsh-core (the store's ``inspect``, which checks
and repairs in memory, and the subagent seam's ``list_descendants``).

What the folder holds that is not a session (a damaged or foreign ``*.jsonl`` entry, a
symlink, a folder) is reported as a diagnostic with the store's stable code, never a
traceback (CLI-32). Entries not named ``*.jsonl`` are not the store's and are ignored, as the
store ignores them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import json.scanner
import os
import re
import shutil
import stat
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO, cast

from ._home import home
from ._ids import SessionsError, match_id

__all__ = [
    "FULL_READ",
    "HEAD_READ",
    "TAIL_READ",
    "SessionsError",
    "list_sessions",
    "scan_folder",
]

#: A file up to this size is read whole for its turns and tokens (the rows ``list`` shows).
FULL_READ = 1 << 20
#: Of a larger file, ``list`` reads this much from the start (header, first prompt, model) ...
HEAD_READ = 64 << 10
#: ... and this much from the end (the turn count, the latest tokens).
TAIL_READ = 256 << 10
#: The store's limit of a header line; a longer one is damage (``SESSION_CORRUPT``).
HEADER_LIMIT = 1 << 20
#: The first read of every entry: enough for any ordinary header line.
_FIRST_READ = 4096
#: How deep ``show --children`` inlines; deeper children are folded.
INLINE_DEPTH = 32

_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_FLAGS = (
    os.O_RDONLY
    | _NOFOLLOW
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
_decode = json.JSONDecoder().decode
_scan = json.scanner.make_scanner(cast("Any", json.JSONDecoder()))  # what ``_decode`` calls


def _parse(text: str) -> Any:
    """``text`` as JSON, as :data:`_decode` reads it: a line the store wrote (one value, no
    white space around it) goes straight to the scanner, anything else (and every error,
    with its message) through the decoder."""
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        end = -1
    return value if end == len(text) else _decode(text)


_BAD_ID = re.compile(r"[/\\\x00]")
# An event line starts with its type (the store's encoder writes type, seq, time, data in this
# order) and a raw newline never occurs inside one (JSON escapes it), so these find lines.
_TURN_START = b'\n{"type":"turn/start",'
_TURN = re.compile(rb'"seq":\d+,"time":\d+,"data":\{"turn":(\d+)\}')
_ANSWER = b'\n{"type":"assistant/message",'
_USAGE_KEY = b'"usage":{"input_tokens":'
# What follows the usage key on an assistant/message line, to the line's end: the usage is
# the last field of the payload, so the key's last occurrence is the payload's own (text in
# the message before it cannot end the line this way).
_USAGE_TAIL = re.compile(
    rb'(\d+),"output_tokens":(\d+)(?:,"cache_read_tokens":\d+)?(?:,"cache_write_tokens":\d+)?\}'
    rb'(?:,"interrupted":(?:true|false))?\},"source_event_seqs":\[[\d,]*\],'
    rb'"surface_op":"append"\}'
)


def _usage(data: bytes) -> tuple[int, int]:
    """The input and output tokens of every complete ``assistant/message`` line of ``data``
    that reports its usage."""
    tokens_in = tokens_out = 0
    at = data.find(_ANSWER)
    while at >= 0:
        end = data.find(b"\n", at + 1)
        if end < 0:
            break  # a torn last line: not counted
        key = data.rfind(_USAGE_KEY, at, end)
        if key >= 0:
            m = _USAGE_TAIL.fullmatch(data, key + len(_USAGE_KEY), end)
            if m:
                tokens_in += int(m.group(1))
                tokens_out += int(m.group(2))
        at = data.find(_ANSWER, end)
    return tokens_in, tokens_out


class Entry:
    """One ``*.jsonl`` entry of the folder: a header, or a diagnostic (``code``)."""

    __slots__ = ("code", "created_at", "facts", "header", "id", "message", "parent", "path", "size")

    def __init__(self, id: str, path: str) -> None:
        self.id, self.path, self.size = id, path, 0
        self.header: dict[str, Any] | None = None
        #: The header's ``parent_session`` and ``created_at`` (checked: a string or
        #: ``None``, an int), set with it; ``None`` and 0 for a damaged entry.
        self.parent: str | None = None
        self.created_at = 0
        self.code: str | None = None
        self.message: str | None = None
        #: A root's row facts, when the scan read them through the same open (``--all``).
        self.facts: _Facts | None = None


class Folder:
    """What one pass over the folder found: headers by id, diagnostics, children by parent."""

    __slots__ = ("children", "damaged", "root", "sessions")

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sessions: dict[str, Entry] = {}
        self.damaged: list[Entry] = []
        self.children: dict[str, list[str]] = {}

    def descendants(self, id: str) -> int:
        """How many sessions are below ``id`` (each counted once, whatever the links)."""
        todo = list(self.children.get(id, ()))
        if not todo:
            return 0
        seen = {id}
        while todo:
            child = todo.pop()
            if child not in seen:
                seen.add(child)
                todo.extend(self.children.get(child, ()))
        return len(seen) - 1

    def resolve(self, prefix: str) -> str:
        """The one stored id ``prefix`` names (:func:`match_id`), damaged files included."""
        return match_id([*self.sessions, *(d.id for d in self.damaged)], prefix, self.root)


def _damage(entry: Entry, code: str, message: str) -> Entry:
    entry.code, entry.message = code, message
    return entry


def _read_header(entry: Entry, fd: int, summarise: bool = False) -> Entry | None:
    """The entry's header from the open file (``None``: cut inside its header, never
    created, as the store leaves it out), or the entry marked damaged with the store's code.
    With ``summarise``, a root's row facts are read on through the same open (``--all``
    shows every root: one open per file instead of two)."""
    data = os.read(fd, _FIRST_READ)
    end = data.find(b"\n")
    while end < 0 and len(data) <= HEADER_LIMIT:
        more = os.read(fd, HEADER_LIMIT + 1 - len(data) if len(data) < HEADER_LIMIT else 1)
        if not more:
            return None
        start = len(data)
        data += more
        end = data.find(b"\n", start)
    if end < 0 or end > HEADER_LIMIT:
        return _damage(
            entry, "SESSION_CORRUPT", f"session file {entry.path} line 1: header longer than 1 MiB"
        )
    try:
        header = _parse(data[:end].decode())
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        if end + 1 == entry.size:  # a torn last line, here the header: never created
            return None
        return _damage(
            entry, "SESSION_CORRUPT", f"session file {entry.path} line 1 is not JSON: {exc}"
        )
    if not isinstance(header, dict):
        return _damage(
            entry, "SESSION_CORRUPT", f"session file {entry.path} line 1 is not a JSON object"
        )
    if header.get("version") != 1:
        return _damage(
            entry,
            "SESSION_FORMAT_UNSUPPORTED",
            f"session file {entry.path}: unsupported format version {header.get('version')!r}",
        )
    if header.get("id") != entry.id:
        return _damage(
            entry,
            "SESSION_CORRUPT",
            f"session file {entry.path} line 1: header names session {header.get('id')!r}",
        )
    created, parent = header.get("created_at"), header.get("parent_session", None)
    if not isinstance(created, int) or isinstance(created, bool):
        return _damage(
            entry, "SESSION_CORRUPT", f"session file {entry.path} line 1: malformed header"
        )
    if parent is not None and not isinstance(parent, str):
        return _damage(
            entry, "SESSION_CORRUPT", f"session file {entry.path} line 1: malformed header"
        )
    entry.header, entry.parent, entry.created_at = header, parent, created
    if summarise and parent is None:
        try:
            entry.facts = _facts(*_read_on(fd, data, entry.size))
        except OSError:  # as when the row's own read fails: listed, with nothing read
            entry.facts = _facts(b"", b"", False)
    return entry


def _entry(name: str, path: str, is_reg: bool, summarise: bool = False) -> Entry | None:
    """One ``*.jsonl`` entry: opened without following a symlink, its header line read."""
    entry = Entry(id=name[:-6], path=path)
    if not entry.id or entry.id in (".", "..") or _BAD_ID.search(entry.id):
        return _damage(
            entry, "SESSION_INVALID_ID", f"session file {path}: its name is no session id"
        )
    unsafe = (
        f"session file {path} is a symlink or not a regular file; session files are never "
        "opened through one"
    )
    if not is_reg:
        return _damage(entry, "SESSION_FILE_UNSAFE", unsafe)
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        return None  # removed while listing
    except OSError as exc:
        if _NOFOLLOW and os.path.islink(path):  # ELOOP: it became a symlink
            return _damage(entry, "SESSION_FILE_UNSAFE", unsafe)
        return _damage(entry, "SESSION_IO", f"cannot read session file {path}: {exc}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return _damage(entry, "SESSION_FILE_UNSAFE", unsafe)
        entry.size = st.st_size
        return _read_header(entry, fd, summarise)
    except OSError as exc:
        return _damage(entry, "SESSION_IO", f"cannot read session file {path}: {exc}")
    finally:
        os.close(fd)


def scan_folder(root: Path, summarise: bool = False) -> Folder:
    """Every ``*.jsonl`` entry of ``root``: one open and one header read each (CLI-30). A
    folder that does not exist holds nothing; ``root`` naming anything else than a folder is
    ``SESSIONS_NO_STORE``. With ``summarise``, each root's row facts are read through the
    same open, within the same bounds as :func:`_read_span` (CLI-31)."""
    folder = Folder(root=root)
    try:
        it = os.scandir(root)
    except FileNotFoundError:
        return folder
    except NotADirectoryError:
        raise SessionsError(
            f"the store {root} is not a directory", code="SESSIONS_NO_STORE"
        ) from None
    except OSError as exc:
        raise SessionsError(
            f"cannot read the store {root}: {exc}", code="SESSIONS_NO_STORE"
        ) from exc
    with it:
        for d in it:
            name = d.name
            if not name.endswith(".jsonl"):
                continue
            try:
                is_reg = d.is_file(follow_symlinks=False)
            except OSError:
                is_reg = False
            entry = _entry(name, d.path, is_reg, summarise)
            if entry is None:
                continue
            if entry.code is not None:
                folder.damaged.append(entry)
            else:
                folder.sessions[entry.id] = entry
    folder.damaged.sort(key=lambda e: e.id)
    for entry in folder.sessions.values():
        parent = entry.parent
        if parent is not None:
            folder.children.setdefault(parent, []).append(entry.id)
    for kids in folder.children.values():
        kids.sort(key=lambda i: (folder.sessions[i].created_at, i))
    return folder


# -- list -----------------------------------------------------------------------------------------


class Summary:
    """What ``list`` shows of one root session."""

    __slots__ = (
        "children", "created_at", "descendants", "exact", "first_prompt", "id",
        "input_tokens", "model", "output_tokens", "size", "turns",
    )  # fmt: skip

    def __init__(
        self, *, id: str, created_at: int, model: str | None, first_prompt: str | None,
        turns: int, children: int, descendants: int, input_tokens: int, output_tokens: int,
        exact: bool, size: int,
    ) -> None:  # fmt: skip
        self.id, self.created_at, self.size = id, created_at, size
        self.model, self.first_prompt, self.exact = model, first_prompt, exact
        self.turns, self.children, self.descendants = turns, children, descendants
        self.input_tokens, self.output_tokens = input_tokens, output_tokens

    id: str
    created_at: int
    model: str | None
    first_prompt: str | None
    turns: int
    children: int
    descendants: int
    input_tokens: int
    output_tokens: int
    exact: bool
    size: int

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "created_at": self.created_at,
            "when": _iso(self.created_at),
            "model": self.model,
            "first_prompt": self.first_prompt,
            "turns": self.turns,
            "children": self.children,
            "descendants": self.descendants,
            "tokens": {
                "input": self.input_tokens,
                "output": self.output_tokens,
                "total": self.input_tokens + self.output_tokens,
                "exact": self.exact,
            },
            "bytes": self.size,
        }


def _iso(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


def _read_span(path: str, size: int) -> tuple[bytes, bytes, bool]:
    """The head and the tail (``b""`` when the head is the whole file) of a log, and whether
    the whole file was read; opened without following a symlink (CLI-31)."""
    fd = os.open(path, _FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b"", b"", False
        if size <= FULL_READ:
            chunks: list[bytes] = []
            got = 0
            while got <= FULL_READ:  # the size known, plus one byte to see it grew
                more = os.read(fd, min(FULL_READ + 1 - got, max(size - got, 0) + 1))
                if not more:
                    break
                chunks.append(more)
                got += len(more)
            data = b"".join(chunks)
            if len(data) <= FULL_READ:
                return data, b"", True
            return data[:HEAD_READ], data[-TAIL_READ:], False
        head = os.pread(fd, HEAD_READ, 0) if hasattr(os, "pread") else os.read(fd, HEAD_READ)
        start = max(size - TAIL_READ, HEAD_READ)
        if hasattr(os, "pread"):
            tail = os.pread(fd, TAIL_READ, start)
        else:  # pragma: no cover - Windows
            os.lseek(fd, start, os.SEEK_SET)
            tail = os.read(fd, TAIL_READ)
        return head, tail, False
    finally:
        os.close(fd)


def _read_on(fd: int, first: bytes, size: int) -> tuple[bytes, bytes, bool]:
    """:func:`_read_span`'s head, tail and whether the file was read whole, from a file
    whose first bytes (``first``, read from its start) are in hand: what is read on stays
    within the same bounds, and ends at the size the file had when it was opened (what was
    appended since is the next listing's)."""
    if size <= FULL_READ:
        chunks = [first]
        got = len(first)
        while got < size:  # the rest of the file as it was when opened
            more = os.read(fd, size - got)
            if not more:
                break
            chunks.append(more)
            got += len(more)
        data = b"".join(chunks) if len(chunks) > 1 else first
        if len(data) <= FULL_READ:
            return data, b"", True
        return data[:HEAD_READ], data[-TAIL_READ:], False
    if len(first) >= HEAD_READ:
        head = first[:HEAD_READ]
    else:
        head = first + _pread(fd, HEAD_READ - len(first), len(first))
    return head, _pread(fd, TAIL_READ, max(size - TAIL_READ, HEAD_READ)), False


def _pread(fd: int, n: int, at: int) -> bytes:
    if hasattr(os, "pread"):
        return os.pread(fd, n, at)
    os.lseek(fd, at, os.SEEK_SET)  # pragma: no cover - Windows
    return os.read(fd, n)  # pragma: no cover


def _first_line(data: bytes, prefix: bytes) -> Any:
    """The first complete line of ``data`` starting with ``prefix`` (after a newline), parsed;
    ``None`` when there is none or it is not JSON."""
    at = data.find(b"\n" + prefix)
    if at < 0:
        return None
    end = data.find(b"\n", at + 1)
    if end < 0:
        return None
    try:
        return _parse(data[at + 1 : end].decode())
    except (ValueError, RecursionError):
        return None


def _text_of(content: Any) -> str:
    if not isinstance(content, list):
        return ""
    return "\n".join(
        b["text"]
        for b in content
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    )


# The encoder's layout of the two lines a row reads a field of (fields in declaration order,
# no spaces): a line that fits is read by these without parsing the rest of it (in a real
# session the request header carries the system prompt and every tool's schema); one that
# does not (an escape in the string, a second block, another layout) is parsed whole.
_ROUTE = re.compile(
    rb'\{"type":"request/header","seq":\d+,"time":\d+,"data":\{"header":\{"config":\{'
    rb'"provider":"([^"\\\n]*)","model":"([^"\\\n]*)"[,}]'
)
_PROMPT = re.compile(
    rb'\{"type":"user/message","seq":\d+,"time":\d+,"data":\{"id":"[^"\\\n]*","role":"user",'
    rb'"content":\[\{"text":"([^"\\\n]*)","type":"text"\}\][,}]'
)
_PROMPT_LINE = b'{"type":"user/message",'
_ROUTE_LINE = b'{"type":"request/header",'


def _fast(data: bytes, prefix: bytes, pattern: re.Pattern[bytes]) -> re.Match[bytes] | None:
    """``pattern`` matched at the first complete line of ``data`` starting with ``prefix``
    (what :func:`_first_line` would parse), or ``None``."""
    at = data.find(b"\n" + prefix)
    if at < 0 or data.find(b"\n", at + 1) < 0:
        return None
    return pattern.match(data, at + 1)


def _prompt_of(head: bytes) -> str | None:
    """The text of the first ``user/message`` of ``head`` (``None``: none there)."""
    m = _fast(head, _PROMPT_LINE, _PROMPT)
    if m is not None:
        with contextlib.suppress(UnicodeDecodeError):
            return m.group(1).decode()
    event = _first_line(head, _PROMPT_LINE)
    if isinstance(event, dict) and isinstance(event.get("data"), dict):
        return _text_of(event["data"].get("content"))
    return None


def _route_of(head: bytes) -> str | None:
    """``provider:model`` of the first ``request/header`` of ``head`` (``None``: none)."""
    m = _fast(head, _ROUTE_LINE, _ROUTE)
    if m is not None:
        with contextlib.suppress(UnicodeDecodeError):
            provider, model = m.group(1).decode(), m.group(2).decode()
            return f"{provider}:{model}" if model else provider
    return _model_of(_first_line(head, _ROUTE_LINE))


def _model_of(event: Any) -> str | None:
    try:
        config = event["data"]["header"]["config"]
        provider, model = config["provider"], config.get("model")
    except (KeyError, TypeError):
        return None
    if not isinstance(provider, str):
        return None
    return f"{provider}:{model}" if isinstance(model, str) and model else provider


#: What a root's row shows of its log: first prompt, model, turns, input and output tokens,
#: and whether they are exact (the whole file was read).
_Facts = tuple[str | None, str | None, int, int, int, bool]


def _facts(head: bytes, tail: bytes, whole: bool) -> _Facts:
    """A row's facts from a bounded read (CLI-31): the first prompt and the model from the
    head; the turns from the last ``turn/start`` read; the tokens summed over the ``usage``
    of each ``assistant/message`` read (exact when the whole file was read)."""
    head = b"\n" + head  # the header line is not an event; every event line follows a newline
    prompt = _prompt_of(head)
    model = _route_of(head)
    turns = 0
    for part in (tail, head):
        at = part.rfind(_TURN_START)
        if at >= 0:
            m = _TURN.match(part, at + len(_TURN_START))
            if m:
                turns = int(m.group(1))
                break
    tokens_in, tokens_out = _usage(head)
    if tail:  # from its first complete line on
        more_in, more_out = _usage(tail[tail.find(b"\n") :] if b"\n" in tail else b"")
        tokens_in, tokens_out = tokens_in + more_in, tokens_out + more_out
    return prompt, model, turns, tokens_in, tokens_out, whole


def _summarise(entry: Entry, folder: Folder) -> Summary:
    """A root's row: its facts (read by the scan, else from a bounded read of its file now)
    and its children from the folder."""
    facts = entry.facts
    if facts is None:
        try:
            facts = _facts(*_read_span(entry.path, entry.size))
        except OSError:
            facts = _facts(b"", b"", False)
    prompt, model, turns, tokens_in, tokens_out, whole = facts
    return Summary(
        id=entry.id,
        created_at=entry.created_at,
        model=model,
        first_prompt=prompt,
        turns=turns,
        children=len(folder.children.get(entry.id, ())),
        descendants=folder.descendants(entry.id),
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        exact=whole,
        size=entry.size,
    )


def list_sessions(root: Path, limit: int | None) -> tuple[Folder, list[Summary], int]:
    """The folder, the newest ``limit`` root sessions (all with ``None``) summarised, and
    how many roots there are. A root is a session whose header names no parent. Listing
    every root reads each one's facts in the scan, through the header's open."""
    folder = scan_folder(root, summarise=limit is None)
    roots = [e for e in folder.sessions.values() if e.parent is None]
    roots.sort(key=lambda e: (e.created_at, e.id), reverse=True)
    shown = roots if limit is None else roots[:limit]
    return folder, [_summarise(e, folder) for e in shown], len(roots)


def _tokens(s: Summary) -> str:
    total = s.input_tokens + s.output_tokens
    text = f"{total / 1000:.1f}k" if total >= 10_000 else str(total)
    return text if s.exact else f"≥{text}"


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M")


def _one_line(text: str | None, width: int) -> str:
    flat = " ".join((text or "").split())
    width = max(width, 8)
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _list_json(folder: Folder, rows: list[Summary], total: int) -> dict[str, Any]:
    return {
        "store": str(folder.root),
        "roots": total,
        "sessions": [r.as_json() for r in rows],
        "diagnostics": [_diag_json(d) for d in folder.damaged],
    }


def _diag_json(d: Entry) -> dict[str, Any]:
    return {"id": d.id, "code": d.code, "message": d.message}


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    """``sessions list``: root sessions, newest first."""
    root = _store(args)
    limit = None if args.all or args.limit == 0 else args.limit
    folder, rows, total = list_sessions(root, limit)
    if args.json:
        _dump(_list_json(folder, rows, total), out)
        return 0
    width = _width(out)
    header = ("ID", "WHEN", "MODEL", "TURNS", "CHILDREN", "TOKENS")
    cells = [
        (r.id, _when(r.created_at), r.model or "-", str(r.turns), str(r.children), _tokens(r))
        for r in rows
    ]
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header))]
    used = sum(widths) + 2 * len(widths)
    prompt_width = max(width - used, 30)
    if _rich(out):
        _rich_list(out, header, cells, rows, prompt_width)
    else:
        print(_row([*header, "FIRST PROMPT"], [*widths, 0]), file=out)
        for c, r in zip(cells, rows, strict=True):
            print(_row([*c, _one_line(r.first_prompt, prompt_width)], [*widths, 0]), file=out)
    if not rows:
        print(f"no sessions in {root}", file=out)
    elif len(rows) < total:
        print(f"({len(rows)} of {total} sessions; --all shows every one)", file=out)
    _print_diagnostics(folder.damaged, out)
    return 0


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) if w else c for c, w in zip(cells, widths, strict=True)).rstrip()


def _print_diagnostics(damaged: Iterable[Entry], out: TextIO) -> None:
    damaged = list(damaged)
    if damaged:
        print(
            f"\n{len(damaged)} entr{'y' if len(damaged) == 1 else 'ies'} could not be read:",
            file=out,
        )
        for d in damaged:
            print(f"  {d.id}: {d.code}: {d.message}", file=out)


# -- show -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_store() -> Iterator[None]:
    """The store's warnings about damaged entries stay out of the output while it is read:
    the command reports them itself, as diagnostics."""
    import logging  # here: `list` never needs it

    logger = logging.getLogger("dsh.sessions")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.asynccontextmanager
async def _reader(root: Path) -> AsyncIterator[Callable[[str], Awaitable[tuple[Any, Any]]]]:
    """The store's ``inspect`` on a host that only reads ``root``: each log checked, any crash
    repair in memory only (nothing written, no lock taken)."""
    from dsh_core import PluginRow, boot_host

    rows: list[PluginRow | str] = [
        "sessions",
        PluginRow(plugin="session-persistence-jsonl", config={"root": str(root)}),
    ]
    with _quiet_store():
        async with await boot_host(rows) as runtime:
            yield runtime.ctx.session_persistence.inspect


def _entries(events: Sequence[Any]) -> list[dict[str, Any]]:
    """The readable transcript of one log: what the user and other agents sent, what the
    agent said, each tool call and its result, and how each turn ended."""
    from dsh_core import blocks_text

    out: list[dict[str, Any]] = []
    for event in events:
        kind, data = event.type, event.data
        if kind == "user/message":
            source = getattr(getattr(data, "source", None), "kind", "user")
            if source == "plugin":
                continue  # instructions a plugin adds (a persona, a delegation statement)
            out.append(
                {
                    "kind": "user" if source == "user" else "message",
                    "from": source,
                    "seq": event.seq,
                    "time": event.time,
                    "text": _blocks(data.content),
                }
            )
        elif kind == "assistant/message":
            text = blocks_text(data.message.content)
            if text:
                out.append(
                    {"kind": "assistant", "seq": event.seq, "time": event.time, "text": text}
                )
        elif kind == "tool/call":
            try:
                args: Any = json.loads(data.arguments)
            except ValueError:
                args = data.arguments
            out.append(
                {
                    "kind": "tool-call",
                    "seq": event.seq,
                    "time": event.time,
                    "call_id": data.call_id,
                    "name": data.name,
                    "arguments": args,
                }
            )
        elif kind == "tool/result":
            text = "\n".join(
                _blocks(getattr(block, "content", ())) for block in data.message.content
            )
            error = data.error.code if getattr(data, "error", None) is not None else None
            out.append(
                {
                    "kind": "tool-result",
                    "seq": event.seq,
                    "time": event.time,
                    "call_id": next(
                        (getattr(b, "tool_call_id", None) for b in data.message.content), None
                    ),
                    "text": text,
                    "error": error,
                }
            )
        elif kind == "turn/end":
            out.append(
                {
                    "kind": "turn-end",
                    "seq": event.seq,
                    "time": event.time,
                    "turn": data.turn,
                    "reason": data.reason.kind,
                }
            )
    return out


def _blocks(content: Any) -> str:
    return "\n".join(
        b.text for b in content if getattr(b, "type", None) == "text" and hasattr(b, "text")
    )


def _child_json(folder: Folder, id: str) -> dict[str, Any]:
    entry = folder.sessions.get(id)
    return {
        "id": id,
        "created_at": entry.created_at if entry else None,
        "children": len(folder.children.get(id, ())),
    }


async def _show_tree(root: Path, folder: Folder, id: str, inline: bool) -> dict[str, Any]:
    """``id``'s transcript; its children inline (``inline``, each session once, bounded by
    the folder) or named only. Each child sits after the first entry of its parent that
    names its id (the tool result that started it), else at the end."""
    seen: set[str] = set()

    async def one(sid: str, depth: int) -> dict[str, Any]:
        seen.add(sid)
        if depth:  # a child that cannot be read is shown as such; its siblings still are
            try:
                header, events = await inspect(sid)
            except Exception as exc:
                code = getattr(exc, "code", None)
                if not isinstance(code, str):
                    raise
                return dict(_child_json(folder, sid), error={"code": code, "message": str(exc)})
        else:
            header, events = await inspect(sid)
        seeded = header.seed_length or 0
        node: dict[str, Any] = {
            "id": sid,
            "created_at": header.created_at,
            "parent": header.parent_session,
            "seed_length": seeded,
            "entries": _entries(events[seeded:]),  # a fork's inherited turns are its parent's
        }
        kids = [k for k in folder.children.get(sid, ()) if k not in seen]
        placed: dict[int, list[str]] = {}
        for k in kids:
            placed.setdefault(_place(node["entries"], k, folder), []).append(k)
        node["children"] = []
        for at in sorted(placed):
            for k in placed[at]:
                deep = inline and depth < INLINE_DEPTH
                child = await one(k, depth + 1) if deep else _child_json(folder, k)
                child["after_seq"] = node["entries"][at]["seq"] if at >= 0 else None
                node["children"].append(child)
        return node

    async with _reader(root) as inspect:
        return await one(id, 0)


def _place(entries: Sequence[dict[str, Any]], child: str, folder: Folder) -> int:
    """Where a child goes in its parent's transcript: after the first entry that names it
    (the tool result that started it), else after the last entry logged before it was
    created (a fork's result does not name it), else at the start."""
    named = next((i for i, e in enumerate(entries) if child in json.dumps(e)), None)
    if named is not None:
        return named
    created = folder.sessions[child].created_at
    before = [i for i, e in enumerate(entries) if e["time"] <= created]
    return before[-1] if before else -1


_MARKS = {
    "user": "<",
    "message": "⇐",
    "assistant": ">",
    "tool-call": "→",
    "tool-result": "←",
    "turn-end": "·",
}


def _render_show(node: dict[str, Any], width: int, emit: Callable[[str, str], None]) -> None:
    """Lines of the transcript, each with its kind for styling; children indented."""

    def entry_text(e: dict[str, Any]) -> str:
        k = e["kind"]
        if k == "message":
            return f"(from the {e['from']}) {e['text']}"
        if k == "tool-call":
            args = e["arguments"]
            shown = json.dumps(args, ensure_ascii=False) if not isinstance(args, str) else args
            return f"{e['name']} {shown}"
        if k == "tool-result":
            return str(e["text"]) + (f"  (error {e['error']})" if e["error"] else "")
        if k == "turn-end":
            return f"turn {e['turn']} ended {e['reason']}"
        return str(e["text"])

    def walk(n: dict[str, Any], pad: str) -> None:
        by_seq: dict[Any, list[dict[str, Any]]] = {}
        for c in n.get("children", ()):
            by_seq.setdefault(c.get("after_seq"), []).append(c)
        text_width = max(width - len(pad) - 4, 20)
        for c in by_seq.pop(None, ()):
            child(c, pad)
        for e in n["entries"]:
            lines = [
                part
                for line in entry_text(e).splitlines()
                for part in (textwrap.wrap(line, text_width) or [""])
            ] or [""]
            emit(e["kind"], f"{pad}{_MARKS[e['kind']]} {lines[0]}")
            for line in lines[1:]:
                emit(e["kind"], f"{pad}  {line}")
            for c in by_seq.pop(e["seq"], ()):
                child(c, pad)
        for rest in by_seq.values():
            for c in rest:
                child(c, pad)

    def child(c: dict[str, Any], pad: str) -> None:
        if "entries" in c:
            seeded = c["seed_length"]
            note = f" (seeded with {seeded} events of its parent's)" if seeded else ""
            emit("child", f"{pad}┌ child {c['id']}{note}")
            walk(c, pad + "│ ")
            emit("child", f"{pad}└ end of child {c['id']}")
        elif "error" in c:
            error = c["error"]
            emit("diagnostic", f"{pad}⇢ child {c['id']} cannot be read: {error['message']}")
        else:
            more = f", {c['children']} below it" if c["children"] else ""
            emit("child", f"{pad}⇢ child {c['id']} (folded{more}; --children shows it)")

    emit(
        "title",
        f"session {node['id']}" + (f" (child of {node['parent']})" if node["parent"] else ""),
    )
    walk(node, "  ")


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    """``sessions show ID``: the transcript, children folded or (``--children``) inline."""
    root = _store(args)
    folder = scan_folder(root)
    id = folder.resolve(args.id)
    bad = next((d for d in folder.damaged if d.id == id), None)
    if bad is not None:
        raise SessionsError(
            f"session {id} cannot be read: {bad.message}",
            code=bad.code or "SESSION_CORRUPT",
        )
    import asyncio

    node = asyncio.run(_show_tree(root, folder, id, args.children))
    if args.json:
        _dump(node, out)
        return 0
    _emit_lines(out, lambda emit: _render_show(node, _width(out), emit))
    return 0


# -- tree -----------------------------------------------------------------------------------------


_STATUS_TYPES = (b'\n{"type":"turn/start",', b'\n{"type":"turn/end",')
_END_SEED = b'\n{"type":"session/end-seed","seq":'


def _child_facts(entry: Entry | None) -> dict[str, Any]:
    """Provider, status (how its last turn ended, ``open`` while one runs or was cut, ``new``
    before its first) and epochs (1 plus each resume after its own start) of a child, from a
    bounded read of its file (the provider from the descriptor at its head)."""
    facts: dict[str, Any] = {"provider": None, "status": None, "epochs": None, "turns": None}
    if entry is None:
        return facts
    try:
        head, tail, whole = _read_span(entry.path, entry.size)
    except OSError:
        return facts
    data = b"\n" + head
    seed = entry.header.get("seed_length") if entry.header else None
    at = data.find(b'\n{"type":"subagent/descriptor",')
    while at >= 0:
        end = data.find(b"\n", at + 1)
        try:
            event = json.loads(data[at + 1 : end]) if end > 0 else None
        except (ValueError, RecursionError):
            event = None
        if isinstance(event, dict) and (not isinstance(seed, int) or event.get("seq", -1) >= seed):
            d = event.get("data")
            if isinstance(d, dict) and isinstance(d.get("provider"), str):
                facts["provider"] = d["provider"]
            break
        at = data.find(b'\n{"type":"subagent/descriptor",', at + 1)
    last = tail or data
    starts, ends = (last.rfind(t) for t in _STATUS_TYPES)
    if starts < 0 and ends < 0:
        facts["status"] = "new"
    elif starts > ends:
        facts["status"] = "open"
    else:
        line_end = last.find(b"\n", ends + 1)
        m = re.search(rb'"reason":\{"kind":"([a-z-]+)"', last[ends:line_end])
        facts["status"] = m.group(1).decode() if m else "ended"
    at = last.rfind(_TURN_START)
    if at >= 0 and (m := _TURN.match(last, at + len(_TURN_START))):
        facts["turns"] = int(m.group(1))
    if whole:
        resumes = 0
        at = data.find(_END_SEED)
        while at >= 0:
            m = re.match(rb"\d+", data[at + len(_END_SEED) :])
            if m and (not isinstance(seed, int) or int(m.group()) > seed):
                resumes += 1
            at = data.find(_END_SEED, at + 1)
        facts["epochs"] = 1 + resumes
    return facts


async def _descendants(root: Path, id: str) -> list[Any]:
    """``list_descendants(id)`` of the subagent seam, on a host that only reads ``root``."""
    from dsh_core import PluginRow, boot_host
    from dsh_subagent import SUBAGENTS

    rows: list[PluginRow | str] = [
        "sessions",
        PluginRow(plugin="session-persistence-jsonl", config={"root": str(root)}),
        "session-query",
        "subagent",
    ]
    with _quiet_store():
        async with await boot_host(rows) as runtime:
            found: list[Any] = await runtime.ctx[SUBAGENTS].list_descendants(id)
    return found


def _tree_json(root: Path, folder: Folder, id: str) -> dict[str, Any]:
    import asyncio

    rows = asyncio.run(_descendants(root, id))
    out: list[dict[str, Any]] = []
    for row in rows:
        e = row.entry
        base = {"id": e.id, "parent": row.parent_id, "depth": row.depth}
        if e.kind == "child":
            base.update(kind="child", label=e.label, mode=e.mode)
            base.update(_child_facts(folder.sessions.get(e.id)))
        else:
            base.update(kind="diagnostic", reason=e.reason)
            bad = next((d for d in folder.damaged if d.id == e.id), None)
            base["message"] = bad.message if bad else None
        out.append(base)
    listed = {r["id"] for r in out} | {id}
    damaged = [_diag_json(d) for d in folder.damaged if d.id not in listed]
    return {"root": id, "descendants": out, "diagnostics": damaged}


def cmd_tree(args: argparse.Namespace, out: TextIO) -> int:
    """``sessions tree ID``: the descendants, from the subagent seam's listing."""
    root = _store(args)
    folder = scan_folder(root)
    id = folder.resolve(args.id)
    tree = _tree_json(root, folder, id)
    if args.json:
        _dump(tree, out)
        return 0

    def draw(emit: Callable[[str, str], None]) -> None:
        emit("title", f"session {id}")
        rows = tree["descendants"]
        if not rows:
            emit("dim", "└── (no subagents)")
        open_levels: list[bool] = []
        for i, row in enumerate(rows):
            later = rows[i + 1 :]
            last = next((r["depth"] for r in later if r["depth"] <= row["depth"]), 0) < row["depth"]
            del open_levels[row["depth"] - 1 :]
            pad = "".join("│   " if more else "    " for more in open_levels)
            open_levels.append(not last)
            branch = pad + ("└── " if last else "├── ")
            if row["kind"] == "child":
                label = f'"{_one_line(row["label"], 60)}" ' if row["label"] else ""
                epochs = row["epochs"]
                parts = [
                    row["provider"] or "?",
                    row["mode"],
                    row["status"] or "?",
                    f"{epochs if epochs is not None else '?'} epoch{'' if epochs == 1 else 's'}",
                ]
                emit("child", f"{branch}{label}{row['id']} ({', '.join(parts)})")
            else:
                why = f": {row['message']}" if row.get("message") else ""
                emit("diagnostic", f"{branch}{row['id']} [diagnostic: {row['reason']}]{why}")
        for d in tree["diagnostics"]:
            emit("diagnostic", f"in the folder, unreadable: {d['id']}: {d['code']}: {d['message']}")

    _emit_lines(out, draw)
    return 0


# -- output ---------------------------------------------------------------------------------------


def _store(args: argparse.Namespace) -> Path:
    root = Path(args.store) if args.store else home() / "sessions"
    if root.exists() and not root.is_dir():
        raise SessionsError(f"the store {root} is not a directory", code="SESSIONS_NO_STORE")
    return root


def _dump(value: Any, out: TextIO) -> None:
    out.write(json.dumps(value, ensure_ascii=False, indent=2) + "\n")


def _rich(out: TextIO) -> bool:
    isatty = getattr(out, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except (ValueError, OSError):
        return False


def _width(out: TextIO) -> int:
    if _rich(out):
        return shutil.get_terminal_size((100, 24)).columns
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 20 else 100


_STYLES = {
    "title": "bold",
    "user": "bold cyan",
    "message": "magenta",
    "assistant": "green",
    "tool-call": "yellow",
    "tool-result": "dim",
    "turn-end": "dim",
    "child": "blue",
    "diagnostic": "bold red",
    "dim": "dim",
}


def _emit_lines(out: TextIO, produce: Callable[[Callable[[str, str], None]], None]) -> None:
    """Print the lines ``produce`` emits: styled by rich on a terminal, plain otherwise."""
    if not _rich(out):
        produce(lambda _kind, line: print(line, file=out))
        return
    from rich.console import Console
    from rich.text import Text

    console = Console(file=out, highlight=False, soft_wrap=True)
    produce(lambda kind, line: console.print(Text(line, style=_STYLES.get(kind, ""))))


def _rich_list(
    out: TextIO,
    header: Sequence[str],
    cells: Sequence[Sequence[str]],
    rows: Sequence[Summary],
    prompt_width: int,
) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for i, name in enumerate(header):
        right = name in ("TURNS", "CHILDREN", "TOKENS")
        width = max(len(c[i]) for c in [header, *cells])
        table.add_column(name, justify="right" if right else "left", no_wrap=True, min_width=width)
    table.add_column("FIRST PROMPT", no_wrap=True, overflow="ellipsis")
    for c, r in zip(cells, rows, strict=True):
        table.add_row(*c, _one_line(r.first_prompt, prompt_width))
    Console(file=out, highlight=False).print(table)


def _run(command: Callable[[argparse.Namespace, TextIO], int]) -> Callable[..., int]:
    def run(args: argparse.Namespace, out: TextIO) -> int:
        try:
            return command(args, out)
        except SessionsError as exc:
            print(f"dsh-subagents sessions: error: {exc} [{exc.code}]", file=sys.stderr)
            return 2
        except Exception as exc:  # a store's own error (a log damaged since the scan, say)
            code = getattr(exc, "code", None)
            if not isinstance(code, str):
                raise
            print(f"dsh-subagents sessions: error: {exc} [{code}]", file=sys.stderr)
            return 1

    return run
