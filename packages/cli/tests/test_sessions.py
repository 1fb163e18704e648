"""`dsh-subagents sessions`: list, show and tree over a JSONL folder (CLI-30..CLI-38).

The stored tree is the demo's (a coordinator, three continuable children, one of them resumed,
and a fork child), made once per module. Each command runs as a subprocess (the real console
entry, real pipes) and, where the behaviour is the same, in-process for speed.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import select
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dsh_core import TokenUsage
from dsh_core.testing import ScriptedReply, scripted_host
from dsh_subagents import _sessions
from dsh_subagents.cli import main

pytestmark = pytest.mark.slow


def _env(tmp: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DSH_PLUGINS", "PYTHONIOENCODING")}
    env["DSH_SUBAGENTS_HOME"] = str(tmp / "home")
    env.update(extra or {})
    return env


def cli(
    *args: str, tmp: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dsh_subagents.cli", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        env=_env(tmp, env),
        timeout=120,
        check=False,
    )


def inproc(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    status = main(list(args), out=out)
    return status, out.getvalue()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the demo tour's sessions."""
    store = tmp_path_factory.mktemp("demo") / "sessions"
    status, _ = inproc("demo", "--store", str(store))
    assert status == 0
    return store


def _headers(store: Path) -> dict[str, dict[str, Any]]:
    return {
        p.stem: json.loads(p.read_text().split("\n", 1)[0]) for p in sorted(store.glob("*.jsonl"))
    }


def _root(store: Path) -> str:
    (root,) = [i for i, h in _headers(store).items() if "parent_session" not in h]
    return root


def _copy(demo: Path, tmp: Path) -> Path:
    store = tmp / "sessions"
    shutil.copytree(demo, store)
    return store


# -- list ----------------------------------------------------------------------------------------


def test_list_shows_root_sessions_only_newest_first_with_their_facts(
    demo: Path, tmp_path: Path
) -> None:
    """CLI-30: `sessions list` lists the sessions that are nobody's child, newest first, each
    with its id, time, model, first prompt, turns, children and tokens; --json has that shape."""
    store = _copy(demo, tmp_path)
    root = _root(store)
    older = dict(_headers(store)[root], id="session-older", created_at=1)
    (store / "session-older.jsonl").write_text(json.dumps(older) + "\n")
    done = cli("sessions", "list", "--store", str(store), "--json", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert [s["id"] for s in listing["sessions"]] == [root, "session-older"]
    first = listing["sessions"][0]
    children = [i for i, h in _headers(store).items() if h.get("parent_session") == root]
    assert first["children"] == len(children) == 5
    assert first["model"] == "scripted:tour"
    assert first["first_prompt"].startswith("Plan a weekend in Lisbon")
    logged = [json.loads(line) for line in (store / f"{root}.jsonl").read_text().splitlines()[1:]]
    turns = [e["data"]["turn"] for e in logged if e["type"] == "turn/start"]
    assert first["turns"] == len(turns) == max(turns)  # the demo's turn count varies by timing
    assert set(first) == {
        "id", "created_at", "when", "model", "first_prompt", "turns", "children",
        "descendants", "tokens", "bytes",
    }  # fmt: skip
    assert set(first["tokens"]) == {"input", "output", "total", "exact"}
    assert listing["diagnostics"] == [] and listing["roots"] == 2
    text = cli("sessions", "list", "--store", str(store), tmp=tmp_path)
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert lines[0].split()[:6] == ["ID", "WHEN", "MODEL", "TURNS", "CHILDREN", "TOKENS"]
    assert lines[1].startswith(root) and "Plan a weekend" in lines[1]
    assert all(c not in text.stdout for c in children)
    assert "\x1b[" not in text.stdout  # plain text when stdout is not a terminal


async def _session_with_usage(root: Path, sid: str, turns: int) -> None:
    replies = [
        ScriptedReply(text=f"answer {i}", usage=TokenUsage(input_tokens=100, output_tokens=i))
        for i in range(1, turns + 1)
    ]
    async with scripted_host(model=replies, store="jsonl", store_root=root) as h:
        handle = await h.create_agent(session_id=sid)
        for i in range(turns):
            await h.run(handle.agent, f"prompt {i}")
        await handle.dispose()


def test_turns_and_tokens_come_from_a_bounded_read_and_say_when_they_are_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CLI-31: a root's turns and tokens are exact when its file is read whole; a file larger
    than the bound is read at its head and tail only (tokens marked partial, the turn count
    still from the tail), and listing never reads more than header reads plus that bound."""
    store = tmp_path / "s"
    asyncio.run(_session_with_usage(store, "session-small", 3))
    asyncio.run(_session_with_usage(store, "session-big", 40))
    monkeypatch.setattr(_sessions, "FULL_READ", 8 << 10)
    monkeypatch.setattr(_sessions, "HEAD_READ", 2 << 10)
    monkeypatch.setattr(_sessions, "TAIL_READ", 2 << 10)
    big = (store / "session-big.jsonl").stat().st_size
    assert big > 8 << 10
    read: list[int] = []
    real_read, real_pread = os.read, os.pread

    def counted(data: bytes) -> bytes:
        read.append(len(data))
        return data

    monkeypatch.setattr(_sessions.os, "read", lambda fd, n: counted(real_read(fd, n)))
    monkeypatch.setattr(_sessions.os, "pread", lambda fd, n, at: counted(real_pread(fd, n, at)))
    status, out = inproc("sessions", "list", "--store", str(store), "--json")
    assert status == 0
    rows = {s["id"]: s for s in json.loads(out)["sessions"]}
    assert rows["session-small"]["tokens"] == {
        "input": 300, "output": 6, "total": 306, "exact": True
    }  # fmt: skip
    assert rows["session-small"]["turns"] == 3
    assert rows["session-big"]["turns"] == 40
    tokens = rows["session-big"]["tokens"]
    assert tokens["exact"] is False and 0 < tokens["input"] < 4000
    small = (store / "session-small.jsonl").stat().st_size
    assert sum(read) <= 2 * 4096 + small + (2 << 10) * 2


def test_list_reads_only_the_header_of_a_session_it_does_not_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CLI-30: beyond the newest N roots (-n), a session's file is read no further than the
    first read of its header line, however long it is."""
    store = tmp_path / "s"
    asyncio.run(_session_with_usage(store, "session-a", 1))
    body = json.dumps({"type": "plugin/note", "data": "x" * 1000}) + "\n"
    for i in range(5):
        header = {"id": f"session-x{i}", "created_at": i, "version": 1}
        (store / f"session-x{i}.jsonl").write_text(json.dumps(header) + "\n" + body * 100)
    read: list[int] = []
    real_read = os.read

    def counted(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        read.append(len(data))
        return data

    monkeypatch.setattr(_sessions.os, "read", counted)
    status, out = inproc("sessions", "list", "--store", str(store), "-n", "1", "--json")
    assert status == 0
    listing = json.loads(out)
    assert [s["id"] for s in listing["sessions"]] == ["session-a"]
    assert listing["roots"] == 6 and listing["diagnostics"] == []
    assert sum(read) <= 6 * 4096 + (store / "session-a.jsonl").stat().st_size
    status, out = inproc("sessions", "list", "--store", str(store), "-n", "1")
    assert "(1 of 6 sessions; --all shows every one)" in out


def test_damaged_and_foreign_entries_are_diagnostics_and_symlinks_are_not_followed(
    demo: Path, tmp_path: Path
) -> None:
    """CLI-32: a symlink (even to a valid session), a folder, a header that is not JSON, names
    another id or an unknown version, a name that is no id: each is a diagnostic with the
    store's code, never a traceback; other files are ignored and a torn header is left out."""
    store = _copy(demo, tmp_path)
    root = _root(store)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "session-linked.jsonl").write_text(
        json.dumps({"id": "session-linked", "created_at": 5, "version": 1}) + "\n"
    )
    (store / "session-linked.jsonl").symlink_to(elsewhere / "session-linked.jsonl")
    (store / "folder.jsonl").mkdir()
    (store / "garbage.jsonl").write_text("not json\nmore\n")
    (store / "other.jsonl").write_text('{"id":"someone","created_at":1,"version":1}\n')
    (store / "future.jsonl").write_text('{"id":"future","created_at":1,"version":9}\n')
    (store / ".jsonl").write_text("{}\n")
    (store / "torn.jsonl").write_text('{"id":"torn","crea')
    (store / "notes.txt").write_text("not the store's\n")
    expected = {
        "session-linked": "SESSION_FILE_UNSAFE",
        "folder": "SESSION_FILE_UNSAFE",
        "garbage": "SESSION_CORRUPT",
        "other": "SESSION_CORRUPT",
        "future": "SESSION_FORMAT_UNSUPPORTED",
        "": "SESSION_INVALID_ID",
    }
    done = cli("sessions", "list", "--store", str(store), "--json", tmp=tmp_path)
    assert done.returncode == 0 and done.stderr == ""
    listing = json.loads(done.stdout)
    assert {d["id"]: d["code"] for d in listing["diagnostics"]} == expected
    assert [s["id"] for s in listing["sessions"]] == [root]
    text = cli("sessions", "list", "--store", str(store), tmp=tmp_path)
    assert text.returncode == 0 and "Traceback" not in text.stderr
    assert "6 entries could not be read:" in text.stdout
    assert "session-linked: SESSION_FILE_UNSAFE" in text.stdout
    shown = cli("sessions", "show", "session-linked", "--store", str(store), tmp=tmp_path)
    assert shown.returncode == 2 and "SESSION_FILE_UNSAFE" in shown.stderr
    assert "Traceback" not in shown.stderr


# -- ids -----------------------------------------------------------------------------------------


def test_an_id_may_be_a_unique_prefix_and_an_ambiguous_or_unknown_one_is_a_usage_error(
    demo: Path, tmp_path: Path
) -> None:
    """CLI-33: a unique prefix (with or without `session-`) names its session; an ambiguous
    prefix exits 2 naming the candidates; an unknown one exits 2 naming the folder."""
    root = _root(demo)
    ids = sorted(_headers(demo))
    for prefix in (root, root[:-1], root.removeprefix("session-")):
        if prefix != root and sum(i.startswith(prefix) for i in ids) > 1:
            continue
        status, out = inproc("sessions", "tree", prefix, "--store", str(demo), "--json")
        assert status == 0 and json.loads(out)["root"] == root
    common = next(
        ids[0][:n] for n in range(len(ids[0]), -1, -1) if all(i[:n] == ids[0][:n] for i in ids)
    )
    done = cli("sessions", "show", common, "--store", str(demo), tmp=tmp_path)
    assert done.returncode == 2
    assert "ambiguous" in done.stderr and "[SESSION_AMBIGUOUS]" in done.stderr
    assert all(i in done.stderr for i in ids)
    done = cli("sessions", "tree", "session-nobody", "--store", str(demo), tmp=tmp_path)
    assert done.returncode == 2 and "[SESSION_NOT_FOUND]" in done.stderr
    assert str(demo) in done.stderr and "Traceback" not in done.stderr


# -- show ----------------------------------------------------------------------------------------


def test_show_renders_the_transcript_with_children_folded_or_inline(
    demo: Path, tmp_path: Path
) -> None:
    """CLI-34: `sessions show` prints the user's prompt, the tool calls and results, the
    answers and the messages that reached the agent; each child is one folded line where it
    started, and with --children its own transcript (a fork's inherited turns left out)."""
    root = _root(demo)
    children = [i for i, h in _headers(demo).items() if h.get("parent_session") == root]
    done = cli("sessions", "show", root, "--store", str(demo), tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "< Plan a weekend in Lisbon" in out
    assert "→ subagent {" in out and "← started subagent" in out
    assert "⇐ (from the subagent-settled) Background subagent" in out
    assert re.search(r"^  > .*Your weekend in Lisbon", out, re.M)
    assert re.search(r"· turn \d+ ended completed", out)
    for child in children:
        assert f"⇢ child {child} (folded" in out
    started = out.index("← started subagent " + children[0])
    assert out.index(f"⇢ child {children[0]}") > started
    status, inline = inproc("sessions", "show", root, "--store", str(demo), "--children")
    assert status == 0
    assert "│ < Find a Friday morning flight to Lisbon for two." in inline
    assert "│ ⇐ (from the coordinator) Please also find the return flight" in inline
    assert inline.count("┌ child ") == len(children)
    assert "seeded with" in inline and inline.count("< Plan a weekend in Lisbon") == 1
    status, raw = inproc("sessions", "show", root, "--store", str(demo), "--json")
    node = json.loads(raw)
    assert set(node) == {"id", "created_at", "parent", "seed_length", "entries", "children"}
    assert {e["kind"] for e in node["entries"]} == {
        "user", "message", "assistant", "tool-call", "tool-result", "turn-end"
    }  # fmt: skip
    assert sorted(c["id"] for c in node["children"]) == sorted(children)
    assert all("entries" not in c for c in node["children"])


def test_show_children_names_a_child_it_cannot_read_and_shows_its_siblings(
    demo: Path, tmp_path: Path
) -> None:
    """CLI-34: with --children, a child whose log is damaged is one line naming the damage
    (its code in JSON); the parent and the other children are still shown."""
    store = _copy(demo, tmp_path)
    root = _root(store)
    children = [i for i, h in _headers(store).items() if h.get("parent_session") == root]
    path = store / f"{children[0]}.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[4] = '{"type":"bogus"}\n'
    path.write_text("".join(lines))
    status, out = inproc("sessions", "show", root, "--store", str(store), "--children")
    assert status == 0
    assert f"⇢ child {children[0]} cannot be read: session file" in out
    assert out.count("┌ child ") == len(children) - 1
    status, raw = inproc("sessions", "show", root, "--store", str(store), "--children", "--json")
    broken = next(c for c in json.loads(raw)["children"] if c["id"] == children[0])
    assert broken["error"]["code"] == "SESSION_CORRUPT"


# -- tree ----------------------------------------------------------------------------------------


def test_tree_lists_descendants_with_label_provider_mode_status_and_epochs(
    demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CLI-35: `sessions tree` gives each descendant the subagent listing finds, with its label,
    provider, mode, how its last turn ended and its epochs (a resumed child has two); a
    damaged child is a diagnostic row, its siblings still listed. The text runs as a process;
    the JSON and the damaged store in-process."""
    root = _root(demo)
    status, raw = inproc("sessions", "tree", root, "--store", str(demo), "--json")
    assert status == 0
    tree = json.loads(raw)
    rows = {r["label"]: r for r in tree["descendants"]}
    flights = rows["Find Lisbon flights"]
    assert (flights["provider"], flights["mode"], flights["status"], flights["epochs"]) == (
        "spawn", "continuable", "completed", 2
    )  # fmt: skip
    assert rows["Find an Alfama hotel"]["epochs"] == 1
    budget = rows["Review the plan's budget"]
    assert (budget["provider"], budget["mode"]) == ("fork", "one-shot")
    assert set(flights) == {
        "id", "parent", "depth", "kind", "label", "mode", "provider", "status", "epochs", "turns"
    }  # fmt: skip
    text = cli("sessions", "tree", root, "--store", str(demo), tmp=tmp_path)
    assert text.returncode == 0 and text.stderr == "", text.stderr
    assert f'"Find Lisbon flights" {flights["id"]} (spawn, continuable, completed, 2 epochs)' in (
        text.stdout
    )
    store = _copy(demo, tmp_path)
    path = store / f"{flights['id']}.jsonl"
    path.write_text(path.read_text().replace('"mode":"continuable"', '"mode":"bogus"', 1))
    status, broken = inproc("sessions", "tree", root, "--store", str(store))
    assert status == 0
    assert f"{flights['id']} [diagnostic: corrupt]" in broken
    assert '"Find an Alfama hotel"' in broken and capsys.readouterr().err == ""


# -- the process boundary ------------------------------------------------------------------------


def test_a_store_that_is_a_file_is_a_usage_error_and_a_missing_one_holds_nothing(
    tmp_path: Path,
) -> None:
    """CLI-36: --store naming a file exits 2 saying it is not a directory; a folder that does
    not exist lists no session (exit 0) and is not created; the default is the home's."""
    file = tmp_path / "file"
    file.write_text("x")
    for command in (("list",), ("show", "x"), ("tree", "x")):
        done = cli("sessions", *command, "--store", str(file), tmp=tmp_path)
        assert done.returncode == 2 and "is not a directory" in done.stderr
    done = cli("sessions", "list", tmp=tmp_path)
    assert done.returncode == 0
    assert f"no sessions in {tmp_path / 'home' / 'sessions'}" in done.stdout
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("command", ["list", "show", "tree"])
def test_every_sessions_command_stops_quietly_when_its_output_is_closed(
    demo: Path, tmp_path: Path, command: str
) -> None:
    """CLI-37: with a stdout whose reader is gone, each `sessions` command exits 141 with
    nothing on stderr."""
    args = [command] if command == "list" else [command, _root(demo)]
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dsh_subagents.cli", "sessions", *args, "--store", str(demo)],
            stdout=write,
            stderr=subprocess.PIPE,
            env=_env(tmp_path),
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, b"")


def test_text_the_terminal_cannot_encode_is_replaced(demo: Path, tmp_path: Path) -> None:
    """CLI-38: on an ASCII terminal the transcript's arrows and tree branches print as `?`,
    never an error."""
    root = _root(demo)
    for command in ("show", "tree"):
        done = subprocess.run(
            [sys.executable, "-m", "dsh_subagents.cli", "sessions", command, root,
             "--store", str(demo)],
            capture_output=True,
            env=_env(tmp_path, {"PYTHONIOENCODING": "ascii"}),
            timeout=120,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert b"?" in done.stdout and b"Traceback" not in done.stderr


def test_a_terminal_gets_rich_rendering(demo: Path, tmp_path: Path) -> None:
    """CLI-38: on a terminal (a pseudo-terminal here) the output is styled by rich (escape
    sequences), and it says the same things as the plain text."""
    pty = pytest.importorskip("pty")
    root = _root(demo)
    for command in (["list"], ["tree", root], ["show", root]):
        leader, follower = pty.openpty()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dsh_subagents.cli", "sessions", *command,
                 "--store", str(demo)],
                stdout=follower,
                stderr=subprocess.DEVNULL,
                env=_env(tmp_path, {"TERM": "xterm-256color", "COLUMNS": "120"}),
            )  # fmt: skip
            os.close(follower)
            follower = -1
            chunks = []
            while True:
                ready, _, _ = select.select([leader], [], [], 120)
                assert ready, "the command drew nothing for 120 s"
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            assert proc.wait(timeout=120) == 0
        finally:
            os.close(leader)
            if follower >= 0:
                os.close(follower)
        shown = b"".join(chunks).decode("utf-8", "replace")
        assert "\x1b[" in shown
        assert root in shown
