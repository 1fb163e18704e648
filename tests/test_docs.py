"""Every Python block in docs/ and the READMEs runs as written (dx 12.2).

How a document's fenced blocks are read:

- A block whose first line is a comment naming a path (``# host.toml``,
  ``# src/pkg/plugin.py``) is a **file**: it is written to that path in a fresh folder for the
  document, before anything runs (a block that is only that line is an empty file). Python
  files are then imported (``src/`` is a root too, when there is one), except tests: files
  named ``test_*.py`` are run with pytest in that folder.
- Every other ``python`` block is a **script**: it runs in its own process, in that folder,
  with a time limit, and must exit 0, as ``python SCRIPT`` would run it there. The process is
  forked from one that has only imported ``dsh_core`` (what ``import dsh_core`` loads, no
  more), so each script skips that import's half second, not its checks.
- A block preceded by ``<!-- not-run: reason -->`` is skipped. Such blocks must give a reason,
  and only a few may exist (``MAX_NOT_RUN``).
"""

from __future__ import annotations

import importlib.metadata as md
import io
import json
import os
import re
import select
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from dsh_subagent.testing import ProviderContract
from dsh_subagents.cli import main as dsh_main

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120  # seconds per process; a hung example fails instead of hanging the suite
MAX_NOT_RUN = 2
_SKIP_DIRS = frozenset({"dist", "build", "node_modules", "__pycache__", "venv", "site-packages"})
_FENCE = re.compile(r"^(`{3,})([\w+-]*)\s*$")
_PATH = re.compile(r"^#\s+([\w./-]+\.[\w]+)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not-run:(.*?)-->\s*$")


@attrs.frozen(kw_only=True)
class Block:
    """One fenced block of a document."""

    doc: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    before: str  # the last non-blank line before the block

    @property
    def not_run(self) -> str | None:
        """The reason given by a ``<!-- not-run: reason -->`` line right before the block."""
        marked = _NOT_RUN.match(self.before)
        return marked.group(1).strip() if marked else None

    @property
    def expected_output(self) -> bool:
        """A ``text`` block after a line ending "prints:" is the previous script's output."""
        return self.lang == "text" and self.before.endswith("prints:")

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT).as_posix()}:{self.line}"

    @property
    def path(self) -> str | None:
        """The file this block is, when its first line names one."""
        first = self.text.split("\n", 1)[0]
        found = _PATH.match(first)
        return found.group(1) if found else None


def documents() -> list[Path]:
    """docs/*.md and every README.md of the repository."""
    found = sorted((ROOT / "docs").glob("*.md"))
    readmes = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not (d.startswith(".") or d in _SKIP_DIRS)]
        if "README.md" in files:
            readmes.append(Path(folder) / "README.md")
    return found + sorted(readmes)


def blocks(doc: Path) -> Iterator[Block]:
    """The fenced blocks of ``doc``, in order."""
    lines = doc.read_text(encoding="utf-8").split("\n")
    previous = ""
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        fence, lang = opening.groups()
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != fence:
            end += 1
        yield Block(
            doc=doc,
            line=i + 1,
            lang=lang,
            text="\n".join(lines[i + 1 : end]) + "\n",
            before=previous,
        )
        previous = ""
        i = end + 1


def write_files(doc_blocks: list[Block], folder: Path) -> list[Path]:
    """Write every file block under ``folder``; returns the paths written."""
    written = []
    for block in doc_blocks:
        if block.path is None or block.not_run is not None:
            continue
        target = (folder / block.path).resolve()
        assert target.is_relative_to(folder.resolve()), f"{block.where}: path leaves the folder"
        target.parent.mkdir(parents=True, exist_ok=True)
        only_header = block.text.strip().count("\n") == 0
        target.write_text("" if only_header else block.text, encoding="utf-8")
        written.append(target)
    return written


def _env(folder: Path) -> dict[str, str]:
    """The caller's environment, without plugin selection, with a private DSH_SUBAGENTS_HOME."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DSH_DISABLE_PLUGIN_AUTOLOAD", "DSH_PLUGINS")
    }
    env["DSH_SUBAGENTS_HOME"] = str(folder / ".dsh-home")
    if (folder / "src").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(folder / "src"), env.get("PYTHONPATH")) if p
        )
    return env


def _run(args: list[str], folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=folder, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


#: Runs each job it reads (a JSON line: a script or code, its argv, folder, environment and
#: output files) in a process forked from itself, as ``python SCRIPT ARGS`` (or ``python -c
#: CODE ARGS``) would run it there, and answers its exit status (a JSON line). It imports
#: ``dsh_core`` first and nothing else, so a script sees what a fresh interpreter that imports
#: it would (dsh_core reseeds its ids in a forked child).
_FORKS = """
import json, os, runpy, select, signal, sys

import dsh_core

BASE = sys.path[1:]  # without -c's '' entry: the interpreter's own path

def child(job):
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, job["out"], os.O_WRONLY),
                            (2, job["err"], os.O_WRONLY)):
        opened = os.open(path, flags | (os.O_CREAT | os.O_TRUNC if fd else 0), 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    extra = [p for p in job["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    script = job.get("script")
    first = os.path.dirname(os.path.abspath(script)) if script else ""
    sys.path[:] = [first, *extra, *BASE]
    sys.argv = [script or "-c", *job["args"]]
    if script:
        runpy.run_path(script, run_name="__main__")
    else:
        exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})
    sys.exit(0)

for line in sys.stdin:
    job = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        child(job)  # exits as the script's interpreter would (status, atexit, flushes)
    watch = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    late = watch is not None and not select.select([watch], [], [], job["timeout"])[0]
    if late:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if watch is not None:
        os.close(watch)
    print(json.dumps({"status": os.waitstatus_to_exitcode(status), "late": late}), flush=True)
"""


class Forks:
    """The forking process of :data:`_FORKS`: one per module, a job at a time."""

    def __init__(self, folder: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.log = folder / "forks.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _FORKS],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=folder,
            )
        self.count = 0

    def run(
        self, folder: Path, env: dict[str, str], args: list[str], *, script: Path | None = None,
        code: str | None = None,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """``python SCRIPT ARGS`` (or ``python -c CODE ARGS``) in ``folder`` with ``env``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.count += 1
        out, err = folder / f".out-{self.count}", folder / f".err-{self.count}"
        job = {
            "script": str(script) if script else None, "code": code, "args": args,
            "cwd": str(folder), "env": env, "out": str(out), "err": str(err),
            "timeout": TIMEOUT,
        }  # fmt: skip
        self.proc.stdin.write(json.dumps(job).encode() + b"\n")
        self.proc.stdin.flush()
        fd = self.proc.stdout.fileno()
        answer = b""
        deadline = time.monotonic() + TIMEOUT + 30  # the job's own limit is TIMEOUT
        while not answer.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(left, 0))[0]
            more = os.read(fd, 4096) if ready else b""
            assert more, f"the forking process gave no answer: {self.log.read_text()}"
            answer += more
        result = json.loads(answer)
        assert not result["late"], f"{script or 'code'} ran longer than {TIMEOUT} s"
        stdout, stderr = (p.read_text(encoding="utf-8", errors="replace") for p in (out, err))
        return subprocess.CompletedProcess(args, result["status"], stdout, stderr)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=30)
            if self.proc.stdout is not None:
                self.proc.stdout.close()


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forks]:
    runner = Forks(tmp_path_factory.mktemp("forks"))
    try:
        yield runner
    finally:
        runner.close()


def _module_name(path: Path, folder: Path) -> str | None:
    """The import name of a written Python file (``src/`` is a root too); None for tests."""
    if path.name.startswith("test_") or path.name == "conftest.py":
        return None
    parts = list(path.relative_to(folder).with_suffix("").parts)
    if parts[0] == "src":
        parts = parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


RUNNABLE = [d for d in documents() if any(b.lang == "python" for b in blocks(d))]


def test_the_documents_are_found() -> None:
    """dx 12.2: the extractor sees the quickstart, the provider guide and the package READMEs."""
    names = {d.relative_to(ROOT).as_posix() for d in RUNNABLE}
    assert {
        "docs/quickstart.md",
        "docs/writing-a-provider.md",
        "docs/scripted-model.md",
        "packages/core/README.md",
    } <= names
    quickstart = [b for b in blocks(ROOT / "docs/quickstart.md") if b.lang == "python"]
    assert any("asyncio.run(main())" in b.text for b in quickstart)


def test_not_run_blocks_are_few_and_explained() -> None:
    """dx 12.2: a block may be skipped only with a reason, and only a few are."""
    skipped = [b for d in documents() for b in blocks(d) if b.not_run is not None]
    assert all(b.not_run for b in skipped), [b.where for b in skipped if not b.not_run]
    assert len(skipped) <= MAX_NOT_RUN, [f"{b.where}: {b.not_run}" for b in skipped]


@pytest.mark.slow
@pytest.mark.parametrize("doc", RUNNABLE, ids=lambda d: d.relative_to(ROOT).as_posix())
def test_python_blocks_run(doc: Path, tmp_path: Path, forks: Forks) -> None:
    """dx 12.2: each Python block of the document runs as written (scripts exit 0, the
    document's test files pass under pytest)."""
    doc_blocks = list(blocks(doc))
    written = write_files(doc_blocks, tmp_path)
    env = _env(tmp_path)
    ran = 0
    modules = [m for p in written if p.suffix == ".py" if (m := _module_name(p, tmp_path))]
    if modules:  # every Python file that is not a test imports cleanly
        load = "import importlib, sys\nfor name in sys.argv[1:]: importlib.import_module(name)"
        done = forks.run(tmp_path, env, modules, code=load)
        assert done.returncode == 0, f"{doc.name}: importing {modules} failed:\n{done.stderr}"
        ran += 1
    last_output: str | None = None
    for block in doc_blocks:
        if block.expected_output:
            assert last_output == block.text, f"{block.where}: the script printed {last_output!r}"
        if block.lang != "python" or block.path is not None or block.not_run is not None:
            continue
        script = tmp_path / f"_doc_block_{block.line}.py"
        script.write_text(block.text, encoding="utf-8")
        done = forks.run(tmp_path, env, [], script=script)
        assert done.returncode == 0, f"{block.where} failed:\n{done.stdout}\n{done.stderr}"
        last_output = done.stdout
        ran += 1
    tests = [p for p in written if p.suffix == ".py" and p.name.startswith("test_")]
    if tests:
        done = _run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", ".",
             *(str(p.relative_to(tmp_path)) for p in tests)],
            tmp_path,
            env,
        )  # fmt: skip
        assert done.returncode == 0, f"{doc.name}'s tests failed:\n{done.stdout}\n{done.stderr}"
        assert " passed" in done.stdout and " skipped" not in done.stdout, done.stdout
        ran += 1
    assert ran, f"{doc.name} has Python blocks but none of them runs"


# -- the README's distribution table is what `dsh-subagents plugins` lists ---------------------

_ROW = re.compile(
    r"^\|\s*\[?`(dsh-[\w-]+)`\]?(?:\([^)]*\))?\s*\|\s*`([\w-]+)`\s*\|([^|]*)\|([^|]*)\|"
)


def test_readme_table_matches_dsh_plugins() -> None:
    """dx 12.1, host-core §1: the README's table has one row per plugin `dsh-subagents plugins`
    lists,
    with the same distribution and mounts, and "placeholder" exactly where nothing is mounted."""
    out = io.StringIO()
    assert dsh_main(["plugins"], out=out) == 0, out.getvalue()
    listed = {}
    for line in out.getvalue().splitlines()[1:]:
        if line.strip():
            name, dist, _version, mounts = line.split(None, 3)
            listed[name] = (dist, mounts.strip())
    table = {}
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        row = _ROW.match(line)
        if row:
            dist, entry_point, mounts, status = (g.strip() for g in row.groups())
            table[entry_point] = (dist, mounts.replace("`", "").strip() or "-", status)
    assert set(table) == set(listed)
    for name, (dist, mounts) in listed.items():
        assert table[name][:2] == (dist, mounts), name
        placeholder = mounts == "-" and not _commands(dist)
        assert table[name][2].startswith("placeholder") == placeholder, name


def _commands(distribution: str) -> list[str]:
    """The console scripts ``distribution`` installs: one that mounts nothing but ships a
    command (dsh-subagents) is not a placeholder."""
    entry_points = md.distribution(distribution).entry_points
    return [ep.name for ep in entry_points if ep.group == "console_scripts"]


# -- the provider guide builds into a distribution that passes the contract suite ---------------


def _venv_bin(venv: Path, name: str) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / name


def _pip_sources_for_uv() -> list[str]:
    """pip's package sources given in the environment, as uv's options (uv reads no pip
    settings; its own ``UV_*`` variables it reads itself)."""
    args = [f"--find-links={link}" for link in os.environ.get("PIP_FIND_LINKS", "").split()]
    if os.environ.get("PIP_INDEX_URL"):
        args.append(f"--default-index={os.environ['PIP_INDEX_URL']}")
    args += [f"--index={url}" for url in os.environ.get("PIP_EXTRA_INDEX_URL", "").split()]
    return args


@pytest.mark.slow
def test_provider_guide_builds_installs_and_passes_the_contract(tmp_path: Path) -> None:
    """dx 12.2 (the provider contract, SVC-1 and DRV-1 on): the files of
    docs/writing-a-provider.md build a wheel (hatchling) that installs into a fresh venv next to
    dsh-core and dsh-subagent wheels built from this checkout; `dsh-subagents plugins` lists its
    entry
    point there, and its contract test passes."""
    guide = tmp_path / "guide"
    written = write_files(list(blocks(ROOT / "docs" / "writing-a-provider.md")), guide)
    assert {p.relative_to(guide).as_posix() for p in written} >= {
        "pyproject.toml",
        "src/dsh_subagent_terse/__init__.py",
        "src/dsh_subagent_terse/__about__.py",
        "src/dsh_subagent_terse/_provider.py",
        "src/dsh_subagent_terse/plugin.py",
        "src/dsh_subagent_terse/py.typed",
        "tests/conftest.py",
        "tests/test_contract.py",
    }
    # Nothing of this checkout may leak in: only what the venv installs is importable there.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DSH_DISABLE_PLUGIN_AUTOLOAD", "DSH_PLUGINS")
    }
    env["DSH_SUBAGENTS_HOME"] = str(tmp_path / "home")

    def run(*args: str | Path, cwd: Path = tmp_path) -> str:
        done = subprocess.run(
            [str(a) for a in args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    venv = tmp_path / "venv"
    given = os.environ.get("DSH_DIST")  # the run's dist/ (nox): dsh-core's and dsh-subagent's
    ours = [] if given else [ROOT / "packages/core", ROOT / "packages/subagent/subagent"]
    uv = os.environ.get("DSH_UV")  # the uv nox found: a venv and an install in ~2 s, not ~20
    if uv:
        run(uv, "venv", "--quiet", "--python", sys.executable, venv)
        python = _venv_bin(venv, "python")
        # uv builds the guide (and, without DSH_DIST, dsh-core and dsh-subagent) into wheels
        # through their build backend (hatchling), as pip does, and installs those wheels.
        run(uv, "pip", "install", "--quiet", "--python", python,
            *(f"--find-links={link}" for link in [given] if link), *_pip_sources_for_uv(),
            f"{guide}[test]", *ours)  # fmt: skip
    else:
        run(sys.executable, "-m", "venv", venv)
        python = _venv_bin(venv, "python")
        wheels = tmp_path / "wheels"
        run(python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, guide, *ours)
        links = [wheels, *([Path(given)] if given else [])]
        run(python, "-m", "pip", "install", "-q", *(f"--find-links={link}" for link in links),
            "dsh-subagent-terse[test]")  # fmt: skip
    where = run(python, "-c", "import dsh_subagent_terse; print(dsh_subagent_terse.__file__)")
    assert Path(where.strip()).is_relative_to(venv), where
    plugins = run(python, "-c", _LIST_PLUGINS)
    assert any(
        line.split()[:2] == ["subagent-terse", "dsh-subagent-terse"]
        for line in plugins.splitlines()
    ), plugins
    out = run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", cwd=guide)
    checks = [name for name in dir(ProviderContract) if name.startswith("test_")]
    assert f"{len(checks)} passed" in out and "skipped" not in out, out


#: The plugins a venv's dsh-core discovers, one ``ENTRY_POINT DISTRIBUTION`` per line (dsh-core
#: is a library: the command that lists them belongs to dsh-subagents).
_LIST_PLUGINS = """
from dsh_core import make_plugin_manager
pm = make_plugin_manager()
pm.collect_plugin_specs()
for d in pm.discovered:
    print(d.name, d.distribution)
"""


def test_placeholder_readmes_say_so() -> None:
    """dx 12.1, host-core §1: a distribution whose entry point mounts nothing says in its README
    that it is a placeholder; one that mounts something does not."""
    mounting = {}
    for entry_point in md.entry_points(group="dsh"):
        if entry_point.dist is not None and entry_point.dist.name.startswith("dsh-"):
            specs = entry_point.load().dsh_plugins()
            mounting[entry_point.dist.name] = bool(specs)
    folders = {}
    for pyproject in ROOT.glob("packages/**/pyproject.toml"):
        if "fixtures" not in pyproject.parts:
            name = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["name"]
            folders[name] = pyproject.parent
    assert set(folders) <= set(mounting)
    for name, folder in folders.items():
        readme = (folder / "README.md").read_text(encoding="utf-8")
        placeholder = not mounting[name] and not _commands(name)
        assert ("**Placeholder.**" in readme) == placeholder, name


#: A rule id as tests and code comments cite them (CONT-7, INT-1, REG-3): never in user docs.
#: UTF-8 and UTF-16 are encodings, not rule ids.
_RULE_ID = re.compile(
    r"\b(?:CONT|ROB|SVC|TOOL|ACP|ACPC|DRV|CTL|DSC|REG|DRN|RPT|DUR|BUG|DEP|SET|INT|OUT|LIST|STR"
    r"|FORK|ORDER|CLI|PKG|UTF)-\d+\b(?<!UTF-8)(?<!UTF-16)"
)


def test_user_docs_speak_plain_language() -> None:
    """CLI-66: the pages under docs/ and every README cite no rule id and never talk about
    "the reference" (the tests and code comments keep the rule ids)."""
    pages = [*ROOT.glob("docs/**/*.md"), ROOT / "README.md", *ROOT.glob("packages/**/README.md")]
    found = []
    for page in pages:
        if "fixtures" in page.parts:
            continue
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            hits = [*_RULE_ID.finditer(line), *re.finditer(r"(?i)\bthe reference\b", line)]
            found.extend(f"{page.relative_to(ROOT)}:{n}: {m.group(0)}" for m in hits)
    assert found == []
