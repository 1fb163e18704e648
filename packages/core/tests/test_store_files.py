"""The JSONL store's files under hostile contents: damaged entries, symlinks, folder
permissions, refused ids, lock release (host-core §5, §6, §9; hardening 11.3-11.5, 11.10)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsh_core import (
    Context,
    EventTypeRegistry,
    Host,
    SessionError,
    SessionHeader,
    SessionStoreService,
    dumps,
    encode_header,
    user_message,
)
from dsh_core._persistence import install_jsonl_persistence, install_memory_persistence
from dsh_core._query import SessionQuery, SessionQueryError, install_session_query
from dsh_core.testing import scripted_host

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file semantics")


class Env:
    """A host with the sessions store, a JSONL backend under ``root`` and the session query."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.host = Host()
        self.ctx = Context(self.host, self.host.root)
        self.ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
        self.persistence = install_jsonl_persistence(self.ctx, root)
        self.query: SessionQuery = install_session_query(self.ctx)

    async def close(self) -> None:
        await self.ctx.dispose()
        await self.host.drain_tasks()

    def file(self, id: str) -> Path:
        return self.root / f"{id}.jsonl"


@pytest.fixture
def env(tmp_path: Path) -> Env:
    root = tmp_path / "sessions"
    root.mkdir(mode=0o700)
    return Env(root)


def header_line(id: str, **fields: Any) -> bytes:
    return (dumps(encode_header(SessionHeader(id=id, created_at=1, **fields))) + "\n").encode()


# -- hardening 11.3: one damaged file never hides the others ----------------------------------


def _bad_json(root: Path, tmp: Path) -> None:
    (root / "x.jsonl").write_bytes(b"{not json\n{}\n")


def _unsupported(root: Path, tmp: Path) -> None:
    (root / "x.jsonl").write_bytes(b'{"version":99,"id":"x","created_at":1}\n')


def _other_id(root: Path, tmp: Path) -> None:
    (root / "x.jsonl").write_bytes(header_line("y"))


def _not_utf8(root: Path, tmp: Path) -> None:
    (root / "x.jsonl").write_bytes(b'{"version":1,"id":"\xff\xfe","created_at":1}\n{}\n')


def _not_an_object(root: Path, tmp: Path) -> None:
    (root / "x.jsonl").write_bytes(b"[1,2,3]\n")


def _directory(root: Path, tmp: Path) -> None:
    (root / "x.jsonl").mkdir()


def _symlink(root: Path, tmp: Path) -> None:
    target = tmp / "elsewhere.jsonl"
    target.write_bytes(header_line("x"))
    (root / "x.jsonl").symlink_to(target)


def _dangling(root: Path, tmp: Path) -> None:
    (root / "x.jsonl").symlink_to(tmp / "nowhere.jsonl")


def _fifo(root: Path, tmp: Path) -> None:
    os.mkfifo(root / "x.jsonl")


def _huge_line(root: Path, tmp: Path) -> None:
    (root / "x.jsonl").write_bytes(b"a" * (3 << 20) + b"\n{}\n")


def _deep(root: Path, tmp: Path) -> None:
    (root / "x.jsonl").write_bytes(b"[" * 100_000 + b"]" * 100_000 + b"\n{}\n")


DAMAGE: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "bad json": (_bad_json, "SESSION_CORRUPT"),
    "unsupported version": (_unsupported, "SESSION_FORMAT_UNSUPPORTED"),
    "header names another id": (_other_id, "SESSION_CORRUPT"),
    "not utf-8": (_not_utf8, "SESSION_CORRUPT"),
    "not an object": (_not_an_object, "SESSION_CORRUPT"),
    "directory": (_directory, "SESSION_FILE_UNSAFE"),
    "symlink": (_symlink, "SESSION_FILE_UNSAFE"),
    "dangling symlink": (_dangling, "SESSION_FILE_UNSAFE"),
    "fifo": (_fifo, "SESSION_FILE_UNSAFE"),
    "huge header line": (_huge_line, "SESSION_CORRUPT"),
    "deeply nested header": (_deep, "SESSION_CORRUPT"),
}


@posix_only
@pytest.mark.parametrize("kind", sorted(DAMAGE))
async def test_a_damaged_file_is_a_listing_diagnostic(
    env: Env, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """hardening 11.3, host-core §5/§6: one damaged file is reported by id and code; list,
    list_sessions and trace_session still return the healthy sessions; its own load fails."""
    from dsh_core._persistence import SessionListing

    make, code = DAMAGE[kind]
    await env.persistence.create(SessionHeader(id="good", created_at=2))
    await env.persistence.create(SessionHeader(id="kid", created_at=3, parent_session="good"))
    make(env.root, tmp_path)
    async with asyncio.timeout(30):
        with caplog.at_level(logging.WARNING, logger="dsh.sessions"):
            assert [h.id for h in await env.persistence.list()] == ["good", "kid"]
        listing = await env.persistence.listing()
        assert isinstance(listing, SessionListing)
        assert [h.id for h in listing.headers] == ["good", "kid"]
        assert [(d.id, d.code) for d in listing.damaged] == [("x", code)]
        assert str(env.file("x")) in listing.damaged[0].message
        assert f"{env.file('x')}" in caplog.text  # the damage is logged, not silent
        records = await env.query.list_sessions()
        assert [r.id for r in records] == ["kid", "good"]
        query_listing = await env.query.listing()
        assert [r.id for r in query_listing.records] == ["kid", "good"]
        assert query_listing.damaged == listing.damaged
        trace = await env.query.trace_session("good")
        assert [n.session.id for n in trace.descendants] == ["kid"]
        assert trace.damaged == listing.damaged
        with pytest.raises(SessionQueryError) as failed:
            await env.query.trace_session("x")
        assert failed.value.code == "SESSION_QUERY_PERSISTENCE_FAILED"
        assert str(env.file("x")) in str(failed.value)
        for read in (env.persistence.load, env.persistence.inspect, env.persistence.prepare):
            with pytest.raises(Exception) as info:
                await read("x")
            if kind != "deeply nested header":  # its load error is hardening 11.2's
                assert isinstance(info.value, SessionError) and info.value.code == code
    await env.close()


async def test_an_unreadable_file_is_a_listing_diagnostic(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hardening 11.3, host-core §5: a file that cannot be opened is SESSION_IO for its id only."""
    await env.persistence.create(SessionHeader(id="good", created_at=2))
    env.file("x").write_bytes(header_line("x"))
    real_open = os.open
    denied = str(env.file("x"))

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path) == denied:
            raise PermissionError(errno.EACCES, "Permission denied", denied)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    listing = await env.persistence.listing()
    assert [h.id for h in listing.headers] == ["good"]
    assert [(d.id, d.code) for d in listing.damaged] == [("x", "SESSION_IO")]
    assert [r.id for r in await env.query.list_sessions()] == ["good"]
    monkeypatch.undo()
    await env.close()


async def test_a_file_name_that_is_no_id_is_a_listing_diagnostic(env: Env) -> None:
    """hardening 11.3, host-core §5: a stray ``.jsonl`` (empty id) is reported, not fatal."""
    await env.persistence.create(SessionHeader(id="good", created_at=2))
    (env.root / ".jsonl").write_bytes(header_line("good"))
    listing = await env.persistence.listing()
    assert [h.id for h in listing.headers] == ["good"]
    assert [(d.id, d.code) for d in listing.damaged] == [("", "SESSION_INVALID_ID")]
    await env.close()


async def test_damage_is_logged_once_per_file_version(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """hardening 11.3, host-core §6: repeated listings report a damaged file every time but
    warn about it once (the header cache remembers the damage until the file changes)."""
    env.file("x").write_bytes(b"{not json\n{}\n")
    with caplog.at_level(logging.WARNING, logger="dsh.sessions"):
        for _ in range(3):
            assert [d.id for d in (await env.persistence.listing()).damaged] == ["x"]
    assert len([r for r in caplog.records if "x.jsonl" in r.getMessage()]) == 1
    env.file("x").unlink()
    env.file("x").write_bytes(header_line("x"))
    listing = await env.persistence.listing()
    assert [h.id for h in listing.headers] == ["x"] and listing.damaged == ()
    await env.close()


async def test_memory_listing_has_no_damage(tmp_path: Path) -> None:
    """hardening 11.3, host-core §5: the memory backend answers listing() too (nothing damaged)."""
    from dsh_core._persistence import DamagedSession

    host = Host()
    ctx = Context(host, host.root)
    ctx.provide("sessions", SessionStoreService(EventTypeRegistry()))
    persistence = install_memory_persistence(ctx)
    await persistence.create(SessionHeader(id="a", created_at=1))
    listing = await persistence.listing()
    assert [h.id for h in listing.headers] == ["a"] and listing.damaged == ()
    assert DamagedSession(id="a", code="SESSION_CORRUPT", message="m").code == "SESSION_CORRUPT"
    await ctx.dispose()
    await host.drain_tasks()


# -- hardening 11.4 / 11.5: symlinks are never followed ----------------------------------------


@posix_only
async def test_create_over_a_dangling_symlink_fails_fast(tmp_path: Path) -> None:
    """hardening 11.4, host-core §5: a dangling symlink named <id>.jsonl refuses the creation
    at once (SESSION_FILE_UNSAFE naming the file) instead of retrying forever."""
    root = tmp_path / "sessions"
    root.mkdir(mode=0o700)
    (root / "s.jsonl").symlink_to(tmp_path / "nowhere")
    async with scripted_host(store="jsonl", store_root=root) as h:
        async with asyncio.timeout(10):
            with pytest.raises(SessionError) as info:
                await h.create_agent(session_id="s")
        assert info.value.code == "SESSION_FILE_UNSAFE"
        assert str(root / "s.jsonl") in str(info.value)
        assert h.ctx.agents.list() == [] and h.ctx.sessions.list() == []
    assert not (tmp_path / "nowhere").exists()


@posix_only
async def test_create_never_writes_through_a_symlink(tmp_path: Path) -> None:
    """hardening 11.5, host-core §5: with <id>.jsonl a symlink to a file outside the store,
    create_agent refuses (SESSION_FILE_UNSAFE) and the target keeps its bytes."""
    root = tmp_path / "sessions"
    root.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious\n")
    (root / "s.jsonl").symlink_to(victim)
    async with scripted_host(store="jsonl", store_root=root) as h:
        with pytest.raises(SessionError) as info:
            await h.create_agent(session_id="s")
        assert info.value.code == "SESSION_FILE_UNSAFE"
        assert str(root / "s.jsonl") in str(info.value)
    assert victim.read_bytes() == b"precious\n"


@posix_only
async def test_reads_and_locks_never_follow_a_symlink(env: Env, tmp_path: Path) -> None:
    """hardening 11.5, host-core §5: load, inspect, prepare, append and create refuse a
    symlinked session file, even one pointing at a valid session log."""
    other = tmp_path / "other"
    other.mkdir()
    outside = Env(other)
    await outside.persistence.create(SessionHeader(id="s", created_at=1))
    await outside.close()
    before = (other / "s.jsonl").read_bytes()
    env.file("s").symlink_to(other / "s.jsonl")
    calls = {
        "load": lambda: env.persistence.load("s"),
        "inspect": lambda: env.persistence.inspect("s"),
        "prepare": lambda: env.persistence.prepare("s"),
        "append": lambda: env.persistence.append("s", []),
        "create": lambda: env.persistence.create(SessionHeader(id="s", created_at=1)),
    }
    for name, call in calls.items():
        with pytest.raises(SessionError) as info:
            await call()
        assert info.value.code == "SESSION_FILE_UNSAFE", name
    assert (other / "s.jsonl").read_bytes() == before
    await env.close()


# -- hardening 11.5: folder permissions -------------------------------------------------------


@posix_only
async def test_a_loose_store_folder_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """hardening 11.5, host-core §5: a store folder group/other may write (mode & 0o022) is
    used but reported with one warning on dsh.sessions, however often it is touched."""
    root = tmp_path / "sessions"
    root.mkdir()
    root.chmod(0o777)
    env = Env(root)
    with caplog.at_level(logging.WARNING, logger="dsh.sessions"):
        await env.persistence.list()
        await env.persistence.create(SessionHeader(id="a", created_at=1))
        await env.persistence.load("a")
        await env.persistence.list()
    loose = [r for r in caplog.records if "writable" in r.getMessage()]
    assert len(loose) == 1 and str(root) in loose[0].getMessage()
    assert loose[0].name == "dsh.sessions" and loose[0].levelno == logging.WARNING
    await env.close()


@posix_only
async def test_a_private_store_folder_is_not_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """hardening 11.5, host-core §5: the folder the store creates is 0o700, and an existing
    0o755 folder is not loose: neither is reported."""
    created = tmp_path / "made" / "sessions"
    existing = tmp_path / "existing"
    existing.mkdir()
    existing.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="dsh.sessions"):
        for root in (created, existing):
            env = Env(root)
            await env.persistence.create(SessionHeader(id="a", created_at=1))
            await env.persistence.list()
            await env.close()
    assert stat.S_IMODE(created.stat().st_mode) == 0o700
    assert "writable" not in caplog.text


# -- hardening 11.5: the empty id ---------------------------------------------------------------


@pytest.mark.parametrize("store", ["memory", "jsonl"])
async def test_an_empty_session_id_is_refused(tmp_path: Path, store: Any) -> None:
    """hardening 11.5, host-core §3/§9: session_id="" is SESSION_INVALID_ID, never a new id."""
    async with scripted_host(store=store, store_root=tmp_path / "s") as h:
        with pytest.raises(SessionError) as info:
            await h.create_agent(session_id="")
        assert info.value.code == "SESSION_INVALID_ID"
        with pytest.raises(SessionError) as info:
            h.ctx.sessions.prepare("")
        assert info.value.code == "SESSION_INVALID_ID"
        assert h.ctx.sessions.list() == [] and h.ctx.agents.list() == []


# -- hardening 11.10: the lock is gone when dispose returns -------------------------------------


@posix_only
@pytest.mark.parametrize("pending", [True, False])
async def test_the_session_lock_is_released_when_dispose_returns(
    tmp_path: Path, pending: bool
) -> None:
    """hardening 11.10, host-core §9: once ``await handle.dispose()`` returns, the session's
    file lock is released (with or without events left to store): another open file
    description locks it at once."""
    import fcntl

    root = tmp_path / "sessions"
    async with scripted_host(model=["done", "again"], store="jsonl", store_root=root) as h:
        handle = await h.create_agent(session_id="s")
        assert await h.run(handle.agent, "go") == "done"
        if pending:
            handle.agent.followup(user_message("more"))
        else:
            await h.ctx.sessions.flush(handle.agent.session)
        await handle.dispose()
        fd = os.open(root / "s.jsonl", os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if still held
        finally:
            os.close(fd)
        again = await h.resume_agent("s")
        await again.dispose()


@posix_only
async def test_dispose_does_not_wait_for_the_last_fsync_but_close_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """host-core §9, hardening 11.10: a disposed session's last lines are written and its lock
    released before ``dispose`` returns, while that write's ``fsync`` runs afterwards (off the
    disposal's path); closing the backend waits for it."""
    import fcntl
    import threading

    import dsh_core._persistence._jsonl as persistence_module

    real_fsync = os.fsync
    gate = threading.Event()
    synced: list[int] = []

    def gated_fsync(fd: int) -> None:
        assert gate.wait(30), "the test never opened the gate"
        real_fsync(fd)
        synced.append(fd)

    root = tmp_path / "sessions"
    async with scripted_host(model=["done"], store="jsonl", store_root=root) as h:
        handle = await h.create_agent(session_id="s")
        assert await h.run(handle.agent, "go") == "done"
        monkeypatch.setattr(persistence_module.os, "fsync", gated_fsync)
        async with asyncio.timeout(10):
            await handle.dispose()  # would hang on the gate if it waited for the sync
        persistence = h.ctx.session_persistence
        assert persistence._syncs and not synced
        fd = os.open(root / "s.jsonl", os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if still held
        finally:
            os.close(fd)
        _, events = await persistence.inspect("s")
        assert events[-1].type == "turn/end"  # every line is there already
        gate.set()
    assert synced and not persistence._syncs


@posix_only
@pytest.mark.parametrize("big", [False, True])
async def test_a_disposed_sessions_last_write_is_done_when_the_detach_returns(
    tmp_path: Path, big: bool
) -> None:
    """host-core §9, hardening 11.10: a disposed session's last lines (up to the inline limit)
    are written and its lock let go by the time ``session/disposed`` is over, with no worker
    round trip (``released`` has nothing to wait for); a larger rest goes through a worker
    thread, and ``dispose`` waits for it. Either way every line is stored. (With ``sync =
    "detach"``: otherwise the turn end's checkpoint has written every line already.)"""

    root = tmp_path / "sessions"
    reply = "x" * (70 * 1024) if big else "done"
    seen: list[tuple[bool, int]] = []
    config = {"session-persistence-jsonl": {"root": str(root), "sync": "detach"}}
    async with scripted_host(model=[reply], store="jsonl", config=config) as h:
        persistence = h.ctx.session_persistence

        def after_persistence(session: Any) -> None:  # runs after the backend's own listener
            stored = (root / "s.jsonl").read_bytes().count(b"\n") - 1  # minus the header
            seen.append(("s" not in persistence._closing, stored))

        h.ctx.on("session/disposed", after_persistence, global_=True)
        handle = await h.create_agent(session_id="s")
        assert await h.run(handle.agent, "go") == reply
        total = handle.agent.session.seq
        await handle.dispose()
        assert "s" not in persistence._closing  # dispose waited for a threaded close
        _, events = await persistence.inspect("s")
        assert events[-1].type == "turn/end" and len(events) == total
    assert seen == ([(False, 0)] if big else [(True, total)])


# -- bounded retries and the header limit --------------------------------------------------------


async def test_an_open_that_keeps_racing_gives_up(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hardening 11.4, host-core §5: every retry of the open-and-lock loop is bounded: a name
    that keeps changing under it is SESSION_IO naming the file, not a spin."""
    import dsh_core._persistence._jsonl as persistence_module

    monkeypatch.setattr(persistence_module, "_same_file", lambda fd, path: False)
    async with asyncio.timeout(10):
        with pytest.raises(SessionError) as info:
            await env.persistence.create(SessionHeader(id="s", created_at=1))
    assert info.value.code == "SESSION_IO" and str(env.file("s")) in str(info.value)
    monkeypatch.undo()
    await env.close()


async def test_a_header_too_large_to_list_is_refused_at_creation(env: Env) -> None:
    """hardening 11.3, host-core §5: what listing reads, the writer wrote: a header line over
    the 1 MiB limit is refused at creation (SESSION_HEADER_TOO_LARGE) and nothing is stored."""
    header = SessionHeader(id="s", created_at=1, parent_session="p" * (1 << 20))
    with pytest.raises(SessionError) as info:
        await env.persistence.create(header)
    assert info.value.code == "SESSION_HEADER_TOO_LARGE"
    assert not env.file("s").exists()
    listing = await env.persistence.listing()
    assert listing.headers == () and listing.damaged == ()
    await env.close()


async def test_a_long_header_spanning_reads_is_listed(env: Env) -> None:
    """hardening 11.3, host-core §5: a valid header longer than one read chunk (but within the
    limit) is listed like any other."""
    cwd = "/" + "d" * 20_000
    await env.persistence.create(SessionHeader(id="s", created_at=1, cwd=cwd))
    listing = await env.persistence.listing()
    assert [(h.id, h.cwd) for h in listing.headers] == [("s", cwd)] and listing.damaged == ()
    await env.close()


async def test_a_torn_header_is_left_out_but_not_damage(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """hardening 11.3, host-core §5: the torn-header rule stands: a file cut inside its header
    was never created, so it is left out with a warning and is not a damaged entry."""
    await env.persistence.create(SessionHeader(id="good", created_at=1))
    env.file("torn").write_bytes(header_line("torn")[:20])
    with caplog.at_level(logging.WARNING, logger="dsh.sessions"):
        listing = await env.persistence.listing()
    assert [h.id for h in listing.headers] == ["good"] and listing.damaged == ()
    assert "never created" in caplog.text
    await env.close()


@pytest.mark.parametrize(
    ("said", "strict"),
    [
        ("x\ud800y", True),  # lone high
        ("\udc00!", True),  # lone low
        ("\ud800\ud800\udc00\udc00", False),  # a lone high, a raw pair, a lone low
        ("caf\u00e9 \\ud800", True),  # an escape's text is text
    ],
)
async def test_a_lone_surrogate_is_stored_as_its_escape(
    tmp_path: Path, said: str, strict: bool
) -> None:
    """ROB-17: the log keeps a lone surrogate as said, and its file stays UTF-8 (the surrogate
    is written as its JSON escape); only a high-low pair of separate characters stays raw,
    since its escape would read back as one character."""
    async with scripted_host(model=["ok"], store="jsonl", store_root=tmp_path) as h:
        handle = await h.create_agent(session_id="s")
        await h.run(handle.agent, said)
        live = handle.agent.session.events
        await handle.dispose()
        _, stored = await h.ctx.session_persistence.load("s")
    raw = (tmp_path / "s.jsonl").read_bytes()
    try:
        raw.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    assert valid is strict
    assert [e.data for e in stored[: len(live)]] == [e.data for e in live]
    assert [e.data.text for e in stored if e.type == "user/message"] == [said]
