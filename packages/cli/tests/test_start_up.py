"""What the command imports and reads to start (CLI-17, CLI-70..CLI-75): the laziness its start-up
figures rely on (benchmarks/cli_start.py, benchmarks/sessions_list.py), proved here; the
figures themselves are measured there, never asserted.

Each import check runs the real console entry in a fresh interpreter that reports, at exit,
which of the watched modules it imported and from which thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_core import PluginError, PluginSpec, TokenUsage, make_plugin_manager, structure_config
from dsh_core._converter import config_converter
from dsh_core.testing import ScriptedReply, scripted_host
from dsh_llm_openai.testing import ChatCompletionsServer, text_reply
from dsh_subagents import _run, _sessions, cli

pytestmark = pytest.mark.slow

#: Runs ``dsh-subagents`` as its console entry does; at exit prints, after a marker, the
#: watched top-level packages it imported and the thread whose import found each first.
_WATCH = """
import atexit, json, runpy, sys, threading

WATCHED = ("openai", "dsh_core", "dsh_subagent", "fastjsonschema", "pluggy", "rich")
first = {}

class Spy:
    def find_spec(self, name, path=None, target=None):
        if name in WATCHED and name not in first:
            first[name] = threading.current_thread().name
        return None

sys.meta_path.insert(0, Spy())

def report():
    seen = {m: first.get(m) for m in WATCHED if m in sys.modules}
    print("\\n@imported " + json.dumps(seen), file=sys.stderr)

atexit.register(report)
sys.argv[0] = "dsh-subagents"
runpy.run_module("dsh_subagents.cli", run_name="__main__", alter_sys=True)
"""


def _imports(args: list[str], tmp: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The watched packages a ``dsh-subagents ARGS`` process imported, each with the name
    of the thread that first looked for it."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
    environ["DSH_SUBAGENTS_HOME"] = str(tmp / "home")
    environ.update(env or {})
    done = subprocess.run(
        [sys.executable, "-c", _WATCH, *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stderr.rpartition("@imported ")[2])
    return seen


async def _session(root: Path, sid: str, prompts: list[str]) -> None:
    replies = [
        ScriptedReply(text=f"answer {i}", usage=TokenUsage(input_tokens=10 * i, output_tokens=i))
        for i in range(1, len(prompts) + 1)
    ]
    async with scripted_host(model=replies, store="jsonl", store_root=root) as h:
        handle = await h.create_agent(session_id=sid)
        for prompt in prompts:
            await h.run(handle.agent, prompt)
        await handle.dispose()


# -- imports --------------------------------------------------------------------------------------


def test_sessions_list_imports_neither_the_runtime_nor_the_sdk(tmp_path: Path) -> None:
    """CLI-70: `sessions list` (newest and --all, text and --json) reads the folder itself:
    it imports neither dsh_core, the subagent seam, pluggy, fastjsonschema nor openai."""
    store = tmp_path / "s"
    asyncio.run(_session(store, "session-a", ["hello"]))
    for extra in ([], ["--all"], ["--all", "--json"]):
        seen = _imports(["sessions", "list", "--store", str(store), *extra], tmp_path)
        assert seen == {}, extra


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What one `run --model scripted hi` (its output a pipe) imported."""
    return _imports(["run", "--model", "scripted", "hi"], tmp_path_factory.mktemp("run"))


def test_a_run_without_an_openai_model_never_imports_the_sdk(scripted_run: dict[str, Any]) -> None:
    """CLI-71: `run` on the scripted model (the default composition, every installed plugin
    mounted, llm-openai among them) never imports openai; the runtime, of course, it does."""
    assert "openai" not in scripted_run
    assert "dsh_core" in scripted_run


def test_rich_is_not_imported_when_the_output_is_not_a_terminal(
    scripted_run: dict[str, Any],
) -> None:
    """CLI-17: a run whose output is a pipe never imports `rich` (start-up time)."""
    assert "rich" not in scripted_run


#: What a scripted run (its output a pipe) never imports (CLI-100): the `sessions` commands,
#: the schema validator (no tool is called), TOML (no file is read), importlib.metadata and
#: what it imports (discovery reads the entry points itself), the live tree, the SDK.
NOT_IMPORTED = (
    "dsh_subagents._sessions",
    "fastjsonschema",
    "tomllib",
    "importlib.metadata",
    "email",
    "zipfile",
    "csv",
    "rich",
    "openai",
)

_MODULES = """
import atexit, json, runpy, sys

atexit.register(lambda: print("\\n@modules " + json.dumps(sorted(sys.modules)), file=sys.stderr))
sys.argv[0] = "dsh-subagents"
runpy.run_module("dsh_subagents.cli", run_name="__main__", alter_sys=True)
"""


def test_a_scripted_run_imports_nothing_it_does_not_use(tmp_path: Path) -> None:
    """CLI-100: `run --model scripted` (output a pipe) imports none of NOT_IMPORTED: each
    is imported only by the command or the call that uses it; the answer is printed."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
    environ["DSH_SUBAGENTS_HOME"] = str(tmp_path / "home")
    done = subprocess.run(
        [sys.executable, "-c", _MODULES, "run", "--model", "scripted", "hello there"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=True,
    )
    assert done.stdout.startswith("hello there")
    modules = set(json.loads(done.stderr.rpartition("@modules ")[2]))
    assert "dsh_core" in modules
    assert sorted(m for m in modules if m in NOT_IMPORTED or m.split(".")[0] in NOT_IMPORTED) == []


def test_a_run_on_an_openai_model_never_imports_the_sdk(tmp_path: Path) -> None:
    """HTTP-1: `run --model openai:MODEL` on the builtin transport (the default) sends its
    request and gets its answer without ever importing the openai SDK."""
    with ChatCompletionsServer(default=text_reply("ok")) as server:
        env = {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "sk-test"}
        seen = _imports(["run", "--model", "openai:m", "hi"], tmp_path, env)
        assert len(server.requests) == 1
    assert "openai" not in seen
    assert seen["dsh_core"] == "MainThread"


# -- sessions list --all: one open per file -------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """Roots small and large (beyond the whole-read bound below), a child, a damaged entry."""
    root = tmp_path / "s"
    asyncio.run(_session(root, "session-small", ["plan a trip", "and the hotel?"]))
    asyncio.run(_session(root, "session-big", [f"prompt {i}" for i in range(40)]))
    asyncio.run(_session(root, "session-odd", ['say "hi"\\ then\nstop ☃ 𝄞', ""]))
    child = {"id": "session-kid", "created_at": 5, "parent_session": "session-small", "version": 1}
    (root / "session-kid.jsonl").write_text(json.dumps(child) + "\n")
    (root / "session-bad.jsonl").write_text("not json\n{}\n")
    return root


def test_listing_every_root_reads_each_file_through_one_open(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CLI-73: `sessions list --all` opens each entry once (the header's open reads on for a
    root's row), within the same bounds, and shows exactly what reading each root again
    would: the same rows, whole files exact and larger ones from their head and tail."""
    monkeypatch.setattr(_sessions, "FULL_READ", 8 << 10)
    monkeypatch.setattr(_sessions, "HEAD_READ", 2 << 10)
    monkeypatch.setattr(_sessions, "TAIL_READ", 2 << 10)
    assert (store / "session-big.jsonl").stat().st_size > 8 << 10
    opened: list[str] = []
    real_open = os.open

    def counted(path: str, flags: int, *args: Any) -> int:
        opened.append(os.path.basename(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(_sessions.os, "open", counted)
    folder, rows, total = _sessions.list_sessions(store, None)
    assert sorted(opened) == sorted(p.name for p in store.glob("*.jsonl"))
    assert total == 3 and [d.id for d in folder.damaged] == ["session-bad"]
    opened.clear()
    _, again, _ = _sessions.list_sessions(store, 1000)  # the newest N: a second open per row
    assert len(opened) == 5 + 3
    assert [r.as_json() for r in rows] == [r.as_json() for r in again]
    by_id = {r.id: r for r in rows}
    assert by_id["session-big"].exact is False and by_id["session-big"].turns == 40
    assert by_id["session-small"].exact is True and by_id["session-small"].children == 1


# -- the row's fields read without parsing the line -----------------------------------------------


def test_the_prompt_and_model_fast_paths_agree_with_parsing_the_line(store: Path) -> None:
    """CLI-74: a row's first prompt and model, read from the lines' layout, are what parsing
    those lines gives, for plain text and for text with quotes, backslashes, newlines and
    characters beyond ASCII (which take the parsing path)."""
    for path in (store / f"session-{n}.jsonl" for n in ("small", "big", "odd")):
        head = b"\n" + path.read_bytes()
        prompt = _sessions._first_line(head, _sessions._PROMPT_LINE)
        parsed = _sessions._text_of(prompt["data"]["content"]) if prompt else None
        assert _sessions._prompt_of(head) == parsed, path.name
        route = _sessions._model_of(_sessions._first_line(head, _sessions._ROUTE_LINE))
        assert _sessions._route_of(head) == route == "scripted:scripted-1", path.name
    odd = _sessions._prompt_of(b"\n" + (store / "session-odd.jsonl").read_bytes())
    assert odd == 'say "hi"\\ then\nstop ☃ 𝄞'


_LINE = (
    '{{"type":"user/message","seq":4,"time":1,"data":{{"id":"m1","role":"user","content":'
    '[{{"text":{text},"type":"text"}}]}},"source_event_seqs":[],"surface_op":"append"}}'
)


@settings(max_examples=200, deadline=None)
@given(st.text(), st.booleans())
def test_the_prompt_fast_path_reads_any_text_as_parsing_does(text: str, ascii_only: bool) -> None:
    """CLI-74: for any prompt text, escaped either way, the fast path and the parse agree."""
    line = _LINE.format(text=json.dumps(text, ensure_ascii=ascii_only))
    head = b'\n{"id":"s","created_at":1,"version":1}\n' + line.encode("utf-8", "surrogatepass")
    head += b"\n"
    assert _sessions._prompt_of(head) == text


# -- the default composition's probe of each plugin ----------------------------------------------


def _ignore(ctx: Any, config: Any) -> None:
    pass


def _accepts_empty(spec: PluginSpec) -> bool:
    try:
        structure_config(spec, {})
    except PluginError:
        return False
    return True


def test_the_probe_for_config_free_plugins_decides_as_the_converter() -> None:
    """CLI-101: whether the default composition mounts a plugin without config is what
    structuring its empty table decides, for every installed plugin and for config classes
    with and without required fields; a class with a required field is refused without a
    structure function being generated for it."""
    specs = dict(make_plugin_manager(autoload=True).collect_plugin_specs())

    @attrs.frozen(kw_only=True)
    class Needs:
        name: str
        size: int = 3

    @attrs.frozen(kw_only=True)
    class Defaulted:
        size: int = 3

    @attrs.frozen(kw_only=True)
    class Hidden:
        size: int = 3
        later: int = attrs.field(init=False, default=0)

    for cls in (Needs, Defaulted, Hidden):
        specs[cls.__name__] = PluginSpec(name=cls.__name__, apply=_ignore, config_type=cls)
    assert len(specs) > 6
    for name, spec in specs.items():
        assert _run._mounts_without_config(spec) is _accepts_empty(spec), name
    mounted = [n for n in ("Needs", "Defaulted", "Hidden") if _run._mounts_without_config(specs[n])]
    assert mounted == ["Defaulted", "Hidden"]

    @attrs.frozen(kw_only=True)
    class Fresh:
        name: str

    dispatch = config_converter._structure_func.dispatch
    before = dispatch.cache_info().currsize
    spec = PluginSpec(name="fresh", apply=_ignore, config_type=Fresh)
    assert _run._mounts_without_config(spec) is False
    assert dispatch.cache_info().currsize == before


# -- a run's parser -------------------------------------------------------------------------------

_RUN_ARGS = [
    ["run"],
    ["run", "-h"],
    ["run", "--help"],
    ["run", "hi"],
    ["run", "--model", "scripted", "hi"],
    ["run", "--model", "openai:m", "--store", "d", "a", "b"],
    ["run", "--no-store", "--resume", "x", "hi"],
    ["run", "-c", "--resume", "x", "hi"],
    ["run", "--bogus", "hi"],
    ["run", "--version"],
    ["run", "--model"],
    ["run", "--", "--model"],
    ["run", "plugins"],
]


def _parse(parser: Any, args: list[str]) -> tuple[Any, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            parsed = vars(parser.parse_args(args))
        except SystemExit as exc:
            return ("exit", exc.code), out.getvalue(), err.getvalue()
    parsed["run_parser"] = parsed["run_parser"].format_help()
    return parsed, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("args", _RUN_ARGS)
def test_a_run_is_parsed_as_by_the_whole_parser(args: list[str]) -> None:
    """CLI-102: arguments that begin with `run` give, through the parser that holds only the
    `run` subcommand, what the whole command's parser gives: the same values, the same help
    and the same usage errors (text and status)."""
    assert _parse(cli._parser("run"), args) == _parse(cli._parser(), args)


def test_only_a_run_gets_the_smaller_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """CLI-102: `main` builds the `run`-only parser exactly for arguments that begin with
    `run`; any other command (or none) gets the whole parser."""
    asked: list[str | None] = []
    real = cli._parser

    def spy(command: str | None = None) -> Any:
        asked.append(command)
        return real(command)

    monkeypatch.setattr(cli, "_parser", spy)
    for args in (["run", "--bogus"], ["plugins", "--bogus"], ["--bogus", "run"], []):
        with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit):
            cli.main(args, io.StringIO())
    assert asked == ["run", None, None, None]
