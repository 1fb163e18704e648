"""The index tier: the built distributions as users get them, from a package index.

Runs in ``nox -s package`` (marker ``index``; a plain ``pytest`` deselects it). That session
hands over the ``dist/`` of the run (``DSH_DIST``) and the uv it found (``DSH_UV``); without
them the distributions are built here with hatchling, and pip fills the venvs.

pypiserver serves ``dist/`` on a free loopback port, in a process the tests start and stop,
and logs every request before answering it, so a test knows which files an install fetched.
It holds only the dsh distributions: for any other name it redirects the installer to the
index pip is configured with (``PIP_INDEX_URL``, else PyPI; ``DSH_INDEX_UPSTREAM`` overrides
both), so third-party dependencies come from where they always do and a dsh name can come from
nowhere but ``dist/``.

Every distribution found under ``packages/`` is covered, so a new one needs no change here.
"""

from __future__ import annotations

import email
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.index

ROOT = Path(__file__).resolve().parents[1]
HOME = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["dsh-release"]["home"]
TIMEOUT = 300  # seconds per command: a hung install fails instead of hanging the suite


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _load_packages() -> dict[str, dict[str, Any]]:
    """Distribution name -> folder, version, dsh entry points and dsh requirements."""
    found: dict[str, dict[str, Any]] = {}
    for pyproject in sorted(ROOT.glob("packages/**/pyproject.toml")):
        if "fixtures" in pyproject.parts:
            continue
        data = tomllib.loads(pyproject.read_text())
        project = data["project"]
        about = pyproject.parent / data["tool"]["hatch"]["version"]["path"]
        version = re.search(r'__version__ = "([^"]+)"', about.read_text())
        assert version, about
        found[project["name"]] = {
            "folder": pyproject.parent,
            "version": version.group(1),
            "entry_points": sorted(project.get("entry-points", {}).get("dsh", {})),
            "siblings": sorted(
                re.split(r"[<>=!~; \[]", d, maxsplit=1)[0]
                for d in project.get("dependencies", [])
                if d.startswith("dsh-")
            ),
        }
    return found


PACKAGES = _load_packages()


def _closure(*names: str) -> set[str]:
    todo, seen = list(names), set()
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(PACKAGES[current]["siblings"])
    return seen


def _wheel_name(name: str) -> str:
    return f"{name.replace('-', '_')}-{PACKAGES[name]['version']}-py3-none-any.whl"


def _sdist_name(name: str) -> str:
    return f"{name.replace('-', '_')}-{PACKAGES[name]['version']}.tar.gz"


def _run(args: list[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        **kwargs,
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


# -- the artifacts ---------------------------------------------------------------------------


# Runs in this test's Python: each folder's wheel (and its sdist, with `sdist` first) through
# its build backend's PEP 517 hooks, as an installer builds a wheel from an sdist. All folders
# in this one process (a build frontend started per distribution costs far more than the
# builds themselves); a folder's failure is reported by folder, the others still build.
_BUILD = """
import importlib, json, os, sys, tomllib, traceback
sdist, out, failed = sys.argv[1] == "sdist", sys.argv[2], {}
for folder in sys.argv[3:]:
    try:
        with open(os.path.join(folder, "pyproject.toml"), "rb") as file:
            name = tomllib.load(file)["build-system"]["build-backend"]
        backend = importlib.import_module(name)
        os.chdir(folder)
        where = os.path.join(out, os.path.basename(folder)) if not sdist else out
        os.makedirs(where, exist_ok=True)
        if sdist:
            backend.build_sdist(where)
        backend.build_wheel(where)
    except Exception:
        failed[folder] = traceback.format_exc()
print(json.dumps(failed))
"""


def _build(kind: str, out: Path, folders: list[Path]) -> dict[str, str]:
    """Build ``folders`` in one process; the traceback of each folder that failed."""
    done = _run([sys.executable, "-c", _BUILD, kind, out, *folders])
    failed: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
    return failed


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of built wheels and sdists: the run's dist/, else built here."""
    given = os.environ.get("DSH_DIST")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("dist")
    failed = _build("sdist", out, [info["folder"] for info in PACKAGES.values()])
    assert not failed, failed
    return out


def test_every_distribution_is_built(dist: Path) -> None:
    """PKG-10: dist/ holds one wheel and one sdist of every distribution at its version."""
    expected = {_wheel_name(n) for n in PACKAGES} | {_sdist_name(n) for n in PACKAGES}
    assert expected <= {p.name for p in dist.iterdir()}


def test_twine_check_strict_passes_for_every_artifact(dist: Path) -> None:
    """PKG-11: `twine check --strict` passes for every wheel and sdist (the metadata and the
    README render as a PyPI page)."""
    artifacts = [dist / _wheel_name(n) for n in PACKAGES] + [
        dist / _sdist_name(n) for n in PACKAGES
    ]
    done = _run([sys.executable, "-m", "twine", "check", "--strict", *artifacts])
    assert done.stdout.count("PASSED") == len(artifacts), done.stdout


@pytest.mark.parametrize("name", list(PACKAGES))
def test_every_artifact_ships_the_license_and_the_urls(dist: Path, name: str) -> None:
    """PKG-12: the wheel and the sdist carry the root LICENSE text, `License-Expression: MIT`
    and the project URLs under the project's home."""
    license_text = (ROOT / "LICENSE").read_bytes()
    stem = f"{name.replace('-', '_')}-{PACKAGES[name]['version']}"
    wheel = _members(dist / _wheel_name(name))
    assert wheel[f"{stem}.dist-info/licenses/LICENSE"] == license_text
    with tarfile.open(dist / _sdist_name(name)) as sdist:
        member = sdist.extractfile(f"{stem}/LICENSE")
        assert member is not None and member.read() == license_text
        pkg_info = sdist.extractfile(f"{stem}/PKG-INFO")
        assert pkg_info is not None
        sdist_metadata = pkg_info.read()
    for raw in (wheel[f"{stem}.dist-info/METADATA"], sdist_metadata):
        metadata = email.message_from_bytes(raw)
        assert metadata["License-Expression"] == "MIT"
        assert metadata.get_all("License-File") == ["LICENSE"]
        urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL") or [])
        assert {"Homepage", "Documentation", "Source", "Changelog"} <= set(urls)
        assert all(url.startswith(HOME) for url in urls.values()), urls


@pytest.fixture(scope="module")
def rebuilt(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    """Every sdist unpacked and built into a wheel (all in one process): by distribution,
    the folder its wheel went to, or the traceback of its failed build."""
    tmp = tmp_path_factory.mktemp("rebuilt")
    unpacked: dict[str, Path] = {}
    for name in PACKAGES:
        with tarfile.open(dist / _sdist_name(name)) as sdist:
            sdist.extractall(tmp / "src" / name, filter="data")
        (unpacked[name],) = (p for p in (tmp / "src" / name).iterdir() if p.is_dir())
    failed = _build("wheel", tmp / "out", list(unpacked.values()))
    return {n: failed.get(str(f)) or tmp / "out" / f.name for n, f in unpacked.items()}


@pytest.mark.parametrize("name", list(PACKAGES))
def test_the_sdist_builds_the_same_wheel(
    dist: Path, rebuilt: dict[str, Path | str], name: str
) -> None:
    """PKG-13: a wheel built from the sdist holds exactly the files, with exactly the bytes,
    of the wheel built from the source folder."""
    out = rebuilt[name]
    assert isinstance(out, Path), f"{name}'s sdist did not build a wheel:\n{out}"
    assert _members(out / _wheel_name(name)) == _members(dist / _wheel_name(name))


# -- the index -------------------------------------------------------------------------------


# The index process: pypiserver's app behind a threading WSGI server on a free loopback port.
# Each client gets its own URL prefix, which the app sees as its mount point: an installer's
# cache, keyed by URL, then never stands in for a download. Every request's path is appended to
# a log file before it is answered, so once an install returned, the log holds all it asked.
_SERVER = """
import socketserver, sys, warnings
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
warnings.simplefilter("ignore")  # its web framework's deprecated imports are not ours
import pypiserver

root, log, upstream = sys.argv[1:4]
app = pypiserver.app(roots=[root], fallback_url=upstream or "https://pypi.org/simple/",
                     disable_fallback=not upstream)

class Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True

class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass

def mounted(environ, start_response):
    _, prefix, rest = environ["PATH_INFO"].split("/", 2)
    environ["SCRIPT_NAME"], environ["PATH_INFO"] = "/" + prefix, "/" + rest
    with open(log, "a") as f:
        f.write(environ["PATH_INFO"] + "\\n")
    return app(environ, start_response)

server = make_server("127.0.0.1", 0, mounted, server_class=Server, handler_class=Quiet)
print(server.server_port, flush=True)  # the socket listens already
server.serve_forever()
"""


class Index:
    """pypiserver serving ``root`` from a process of its own, started and stopped here."""

    def __init__(self, root: Path, upstream: str | None, log: Path) -> None:
        self._log = log
        log.write_text("")
        self._read = 0
        self._clients = 0
        self.port = 0
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(root.resolve()), str(log), upstream or ""],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        ready = threading.Thread(target=self._ready, daemon=True)
        ready.start()
        ready.join(timeout=60)
        assert self.port, "the index did not start within 60 s"

    def _ready(self) -> None:
        assert self._process.stdout is not None
        self.port = int(self._process.stdout.readline() or 0)

    def new_url(self) -> str:
        """The index's URL for one more client."""
        self._clients += 1
        return f"http://127.0.0.1:{self.port}/c{self._clients}/simple/"

    def served_files(self) -> set[str]:
        """The names of the distribution files downloaded since the last call."""
        lines = self._log.read_text().splitlines()
        fresh, self._read = lines[self._read :], len(lines)
        return {p.rsplit("/", 1)[-1] for p in fresh if p.startswith("/packages/")}

    def close(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=30)
        if self._process.stdout is not None:
            self._process.stdout.close()


def _upstream() -> str:
    """The index third-party names come from: the one pip is configured with."""
    return (
        os.environ.get("DSH_INDEX_UPSTREAM")
        or os.environ.get("PIP_INDEX_URL")
        or "https://pypi.org/simple/"
    )


@pytest.fixture(scope="module")
def index(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    upstream = _upstream()
    log = tmp_path_factory.mktemp("index") / "requests.log"
    # An index pip reads from disk cannot be redirected to: it is then an extra index.
    served = Index(dist, upstream if upstream.startswith(("http://", "https://")) else None, log)
    try:
        yield served
    finally:
        served.close()


class Bytecode:
    """Bytecode one venv's processes compiled, lent to the venvs made after it.

    Each venv keeps the bytecode its processes compile (a user's installer compiles at install
    time) under its own ``PYTHONPYCACHEPREFIX``. Every venv here installs the same wheels, but
    each unpacks its own copy of them (each client has its own index URL, so no installer
    cache stands in for a download): without sharing, each of the dozen venvs compiled
    dsh-core, pydantic, openai... again. What one venv compiled is kept as hash-checked
    bytecode (PEP 552), which CPython uses only while the source's hash matches, and lent to a
    later venv for each source there with the same text.
    """

    def __init__(self, store: Path) -> None:
        self.store = store
        self.suffix = f".{sys.implementation.cache_tag}.pyc"
        self.known: dict[str, str] = {}  # where a source is (site: relative) -> its key
        self.seen: dict[str, set[str]] = {}  # by prefix: the sources already looked at

    @staticmethod
    def _key(text: bytes) -> str:
        return f"{importlib.util.source_hash(text).hex()}-{len(text)}"

    # Paths as strings: these run over a thousand files per venv.
    def lend(self, site: Path, prefix: Path) -> None:
        """Link into ``prefix`` the bytecode of every known module whose source is the same."""
        seen = self.seen.setdefault(str(prefix), set())
        for where, known in self.known.items():
            if where in seen:
                continue
            source = f"{site}/{where[5:]}" if where.startswith("site:") else where
            try:
                with open(source, "rb") as file:
                    text = file.read()
            except OSError:  # not installed here (yet): nothing to lend
                continue
            seen.add(where)
            if self._key(text) == known:
                mirror = f"{prefix}{source[:-3]}{self.suffix}"
                os.makedirs(os.path.dirname(mirror), exist_ok=True)
                try:
                    os.link(self.store / known, mirror)
                except FileExistsError:
                    continue

    def harvest(self, site: Path, prefix: Path) -> None:
        """Keep what the processes of a venv compiled under ``prefix``."""
        seen = self.seen.setdefault(str(prefix), set())
        inside, cut = f"{site}/", len(str(prefix))
        for folder, _, names in os.walk(prefix):
            for name in names:
                if not name.endswith(self.suffix):
                    continue
                source = f"{folder[cut:]}/{name[: -len(self.suffix)]}.py"
                where = f"site:{source[len(inside) :]}" if source.startswith(inside) else source
                if where in seen:
                    continue  # lent here, or kept already
                seen.add(where)
                try:
                    with open(source, "rb") as file:
                        text = file.read()
                    with open(os.path.join(folder, name), "rb") as file:
                        code = file.read()
                except OSError:
                    continue
                if int.from_bytes(code[4:8], "little") != 0:
                    continue  # hash-based already: lent
                known = self._key(text)
                kept = self.store / known
                if not kept.exists():  # magic, "checked hash" flags, hash, the code itself
                    head = code[:4] + (3).to_bytes(4, "little")
                    temporary = kept.with_suffix(".tmp")
                    temporary.write_bytes(head + importlib.util.source_hash(text) + code[16:])
                    os.replace(temporary, kept)
                self.known[where] = known


@pytest.fixture(scope="module")
def bytecode(tmp_path_factory: pytest.TempPathFactory) -> Bytecode:
    return Bytecode(tmp_path_factory.mktemp("bytecode"))


# The environment of a user's install: none of this checkout's sources or settings. Bytecode
# is written (a user's installer compiles it), under the venv (see Bytecode).
_DROPPED = (
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "DSH_PLUGINS",
    "DSH_DISABLE_PLUGIN_AUTOLOAD",
    "PYTHONDONTWRITEBYTECODE",
)
_SOURCES = re.compile(r"^(UV_(DEFAULT_)?INDEX.*|UV_EXTRA_INDEX_URL|UV_FIND_LINKS|UV_NO_INDEX|"
                      r"PIP_(INDEX_URL|EXTRA_INDEX_URL|FIND_LINKS|NO_INDEX))$")  # fmt: skip


class Venv:
    """A fresh venv filled by name from the index, as a user's ``pip install`` would."""

    def __init__(self, where: Path, index: Index, bytecode: Bytecode) -> None:
        self.where = where
        self.index = index
        self.bytecode = bytecode
        self.url = index.new_url()
        self.uv = os.environ.get("DSH_UV") or None
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED}
        env["DSH_SUBAGENTS_HOME"] = str(where / "home")
        env["PYTHONPYCACHEPREFIX"] = str(where / "pycache")
        self.env = env
        self.install_env = {k: v for k, v in env.items() if not _SOURCES.match(k)}
        if self.uv:
            _run([self.uv, "venv", "--quiet", "--python", sys.executable, where / "venv"])
        else:
            _run([sys.executable, "-m", "venv", where / "venv"])
        bin_dir = "Scripts" if os.name == "nt" else "bin"
        self.python = where / "venv" / bin_dir / "python"
        sites = list((where / "venv").glob("lib/python3.*/site-packages"))
        self.site = sites[0] if len(sites) == 1 else None  # else another layout: no sharing
        self.lend = True

    def install(self, *names: str) -> set[str]:
        """Install ``names`` from the index; returns the dsh files the index served."""
        upstream = _upstream()
        extra = [] if upstream.startswith(("http://", "https://")) else [upstream]
        if self.uv:
            args: list[str | Path] = [self.uv, "pip", "install", "--quiet", "--python"]
            args += [self.python, "--default-index", self.url]
            args += [f"--index={u}" for u in extra]
        else:
            args = [self.python, "-m", "pip", "install", "--quiet", "--index-url", self.url]
            args += [f"--extra-index-url={u}" for u in extra]
        _run([*args, *names], env=self.install_env, cwd=self.where)
        self.lend = True
        return self.index.served_files()

    def python_run(self, code: str, cwd: Path | None = None) -> str:
        prefix = Path(self.env["PYTHONPYCACHEPREFIX"])
        if self.site and self.lend:  # what was installed since the last run
            self.bytecode.lend(self.site, prefix)
            self.lend = False
        try:
            return _run([self.python, "-c", code], env=self.env, cwd=cwd or self.where).stdout
        finally:
            if self.site:
                self.bytecode.harvest(self.site, prefix)


# Runs in the user's venv: the installed dsh distributions and what dsh-core discovers.
_REPORT = """
import importlib.metadata as md, json
import dsh_core
pm = dsh_core.make_plugin_manager()
pm.collect_plugin_specs()
dists = {d.metadata["Name"]: d.version for d in md.distributions()}
print(json.dumps({
    "dists": {n: v for n, v in dists.items() if n.startswith("dsh-")},
    "plugins": sorted(d.name for d in pm.discovered),
    "failures": [f.describe() for f in pm.failures],
    "where": dsh_core.__file__,
}))
"""


def _report(venv: Venv) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(venv.python_run(_REPORT))
    return report


def _check_installed(venv: Venv, names: set[str]) -> None:
    """Exactly ``names`` (at this checkout's versions) installed in the venv, and dsh-core
    discovers exactly their entry points, without a failure."""
    report = _report(venv)
    assert report["dists"] == {n: PACKAGES[n]["version"] for n in names}
    assert Path(report["where"]).is_relative_to(venv.where), report["where"]
    eps = sorted(ep for n in names for ep in PACKAGES[n]["entry_points"])
    assert report["plugins"] == eps and report["failures"] == [], report


_PIP_INSTALL = re.compile(r'pip install ((?:"?[\w.-]+(?:\[[\w,]+\])?"? ?)+)')


@pytest.fixture(scope="module")
def venvs() -> dict[str, Venv]:
    """The venvs made by the install test, by the distribution installed first: the
    tests after it run there too rather than installing the same things again."""
    return {}


def _installed(
    venvs: dict[str, Venv], index: Index, bytecode: Bytecode, tmp_path: Path, *names: str
) -> Venv:
    """The install test's venv of ``names[0]``; else a fresh venv with ``names`` installed
    one after the other (when that test did not run)."""
    if names[0] not in venvs:
        venvs[names[0]] = Venv(tmp_path, index, bytecode)
        for name in names:
            venvs[names[0]].install(name)
    return venvs[names[0]]


def _readme_install(name: str) -> list[str]:
    """Every requirement the README's `pip install` lines and phrases name, the first first."""
    text = (PACKAGES[name]["folder"] / "README.md").read_text()
    wanted: list[str] = []
    for found in _PIP_INSTALL.finditer(text):
        wanted += [w.strip('"') for w in found.group(1).split() if w.strip('"') not in wanted]
    assert wanted, f"{name}'s README has no `pip install {name}` line"
    return wanted


def _bare(requirement: str) -> str:
    return requirement.split("[", 1)[0]


_FENCE = re.compile(r"^(`{3,})([\w+-]*)\s*$")
_FILE = re.compile(r"^#\s+([\w./-]+\.[\w]+)\s*$")


def _readme_blocks(name: str) -> list[tuple[str, str, str]]:
    """The README's fenced blocks as (language, text, the last text line before it)."""
    lines = (PACKAGES[name]["folder"] / "README.md").read_text().split("\n")
    found, i, before = [], 0, ""
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            before = lines[i].strip() or before
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != opening.group(1):
            end += 1
        found.append((opening.group(2), "\n".join(lines[i + 1 : end]) + "\n", before))
        before, i = "", end + 1
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PACKAGES))
def test_install_by_name_from_the_index(
    index: Index, venvs: dict[str, Venv], bytecode: Bytecode, name: str, tmp_path: Path
) -> None:
    """PKG-14: in a fresh venv, `pip install NAME` from the index brings exactly NAME's dsh
    closure, each from the index's wheel of this checkout, and dsh-core discovers exactly
    their entry points; then the README's install line and its Python example work there."""
    venv = venvs[name] = Venv(tmp_path, index, bytecode)
    closure = _closure(name)
    served = venv.install(name)
    assert served == {_wheel_name(n) for n in closure}
    _check_installed(venv, closure)

    wanted = _readme_install(name)
    assert wanted[0] == name, wanted
    more = _closure(*map(_bare, wanted))
    served = venv.install(*wanted)
    assert served == {_wheel_name(n) for n in more - closure}
    if wanted != [name]:  # else the venv is the one just checked
        _check_installed(venv, more)
    blocks = _readme_blocks(name)
    for lang, text, _ in blocks:  # the files the example reads, as the README names them
        path = _FILE.match(text.split("\n", 1)[0])
        if path and lang != "python":
            (tmp_path / path.group(1)).write_text(text)
    ran, printed = 0, None
    for lang, text, before in blocks:
        if lang == "text" and before.endswith("prints:"):
            assert printed == text, f"{name}'s README example printed {printed!r}"
        elif lang == "python" and not _FILE.match(text.split("\n", 1)[0]):
            printed = venv.python_run(text)
            ran += 1
    assert ran, f"{name}'s README has no runnable Python example"


# The spawn provider as a user meets it: a host on the scripted echo model starts a child.
_SPAWN_CHILD = """
import asyncio, os
from dsh_core import AgentOptions, CreateAgentOptions, SessionMeta, blocks_text, boot_host
from dsh_core import text_blocks
from dsh_subagent import SubagentStartRequest

ROWS = ["sessions", "session-persistence-memory", "llm", "llm-scripted", "tools",
        "system-prompt", "agents", "subagent", "subagent-spawn"]

async def main():
    async with await boot_host(ROWS) as host:
        created = await host.ctx.agents.create(CreateAgentOptions(
            meta=SessionMeta(cwd=os.getcwd()),
            agent_options=AgentOptions(provider="scripted", model="echo")))
        run = await host.ctx.subagents.start(
            "spawn", SubagentStartRequest(prompt=text_blocks("ping"), parent=created.agent))
        try:
            result = await run.result
        finally:
            await run.dispose()
        print(result.stop_reason, blocks_text(result.output))
        await created.dispose()

asyncio.run(main())
"""


@pytest.mark.slow
def test_a_spawn_child_runs_after_install_by_name(
    index: Index, venvs: dict[str, Venv], bytecode: Bytecode, tmp_path: Path
) -> None:
    """PKG-15: after `pip install dsh-subagent-spawn` from the index, a host started on the
    installed entry points runs a spawn child to completion."""
    venv = _installed(venvs, index, bytecode, tmp_path, "dsh-subagent-spawn")
    assert venv.python_run(_SPAWN_CHILD) == "completed ping\n"


# The delegation tool as a user meets it: a scripted model calls `subagent`, whose spawn
# child echoes the prompt, and the model answers with the tool's result.
_TOOL_CHILD = """
import asyncio, json, os
from dsh_core import AgentOptions, CreateAgentOptions, SessionMeta, boot_host, user_message

CALL = {"description": "echo a word", "prompt": "ping"}
SCRIPT = {
    "default": "{{last_user}}",
    "rules": [
        {"when": {"last_role": "tool"}, "reply": "child said: {{last_tool_result}}"},
        {"when": {"last_user": "^delegate", "tool": "subagent"},
         "reply": {"tool_calls": [{"name": "subagent", "arguments": CALL}]}},
    ],
}

async def main():
    with open("script.json", "w") as f:
        json.dump(SCRIPT, f)
    rows = ["sessions", "session-persistence-memory", "llm",
            {"plugin": "llm-scripted", "config": {"script": "script.json"}}, "tools",
            "system-prompt", "agents", "subagent", "subagent-spawn",
            {"plugin": "tool-subagent", "config": {"provider": "spawn"}}]
    async with await boot_host(rows) as host:
        created = await host.ctx.agents.create(CreateAgentOptions(
            meta=SessionMeta(cwd=os.getcwd()),
            agent_options=AgentOptions(provider="scripted", model="m")))
        created.agent.followup(user_message("delegate please"))
        await created.agent.when_idle()
        print(created.agent.session.derive_messages()[-1].text)
        await created.dispose()

asyncio.run(main())
"""


@pytest.mark.slow
def test_the_subagent_tool_runs_a_child_after_install_by_name(
    index: Index, venvs: dict[str, Venv], bytecode: Bytecode, tmp_path: Path
) -> None:
    """PKG-16: after `pip install dsh-tool-subagent` and then `pip install dsh-subagent-spawn`
    from the index (the install test checks that the second brings only itself), a scripted
    model's `subagent` call runs a spawn child and gets its answer."""
    venv = _installed(venvs, index, bytecode, tmp_path, "dsh-tool-subagent", "dsh-subagent-spawn")
    out = venv.python_run(_TOOL_CHILD)
    assert out.startswith("child said: ") and "ping" in out, out
