"""Development sessions: per-distribution isolated tests, cross-package tests, lint, types, demo.

``nox`` runs the default set (everything CI runs), one session per CPU at a time after the
build (``nox -j 1``: one after another); ``nox -s demo`` runs the offline demo;
``nox -s thorough``, ``nox -s interop``, ``nox -s crash`` and ``nox -s continuable_machine`` are
the slow tiers, never part of the default set.
Every test venv installs wheels built from this checkout (``dist/``, made once per run by the
``build`` session), never the source tree, so a test proves what users get from ``pip install``.

Venvs are made and filled by uv when it is installed beside nox (``pip install nox uv``), and by
virtualenv and pip otherwise; the sessions and what they check are the same either way.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import nox

nox.needs_version = ">=2026.8.10"  # --parallel
nox.options.default_venv_backend = "uv|virtualenv"  # uv where it is installed, else virtualenv
nox.options.download_python = "never"  # the matrix is the Pythons installed here: never fetch one
nox.options.error_on_missing_interpreters = False  # a missing Python is skipped, not failed
nox.options.parallel = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "auto"

ROOT = Path(__file__).parent
DIST = ROOT / "dist"
PYTHONS = ["3.11", "3.12", "3.13"]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
TEST_REQUIREMENTS = nox.project.dependency_groups(PYPROJECT, "test")


def _load_packages() -> dict[str, dict[str, object]]:
    """Distribution name -> its folder, import name, entry points and sibling requirements."""
    found: dict[str, dict[str, object]] = {}
    for pyproject in sorted(ROOT.glob("packages/**/pyproject.toml")):
        if "fixtures" in pyproject.parts:
            continue
        project = tomllib.loads(pyproject.read_text())["project"]
        deps = [str(d) for d in project.get("dependencies", [])]
        found[project["name"]] = {
            "folder": pyproject.parent.relative_to(ROOT).as_posix(),
            "entry_points": sorted(project.get("entry-points", {}).get("dsh", {})),
            "siblings": sorted(
                d.split(">")[0].split("=")[0].split("<")[0].strip()
                for d in deps
                if d.startswith("dsh-")
            ),
        }
    return found


PACKAGES = _load_packages()


def _test_weight(name: str) -> int:
    """The size of a distribution's tests: the default set starts the biggest first."""
    folder = ROOT / str(PACKAGES[name]["folder"]) / "tests"
    return sum(path.stat().st_size for path in folder.rglob("*.py"))


_BY_WEIGHT = sorted(PACKAGES, key=_test_weight, reverse=True)
# The default set, in the order it starts: the sessions that allow it run one per CPU at a time
# (`-j 1` runs them one after another), each printing its output in one block when it ends.
# Longest first, so that no long session starts last while the other CPU has nothing left to
# do: `all` and `package`, then each distribution's tests on every Python, the biggest test
# folder first (mypy after the three biggest); the short ones fill the gaps at the end.
nox.options.sessions = [
    "all",
    "package",
    *(f"tests-{py}(dist='{name}')" for name in _BY_WEIGHT[:3] for py in PYTHONS),
    "typecheck",
    *(f"tests-{py}(dist='{name}')" for name in _BY_WEIGHT[3:] for py in PYTHONS),
    "lint",
]


def _closure(name: str) -> set[str]:
    todo, seen = [name], set()
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(PACKAGES[current]["siblings"])  # type: ignore[arg-type]
    return seen


# pip's settings that say where packages come from, and the uv variable that says the same
# (then older names of it). uv reads no pip.conf: without these, a machine whose pip uses a
# mirror, local wheels or a constraints file would install other things, or nothing, under uv.
_PIP_TO_UV = {
    "index-url": ("UV_DEFAULT_INDEX", "UV_INDEX_URL"),
    "extra-index-url": ("UV_INDEX", "UV_EXTRA_INDEX_URL"),
    "find-links": ("UV_FIND_LINKS",),
    "constraint": ("UV_CONSTRAINT",),
    "no-index": ("UV_NO_INDEX",),
    "cert": ("SSL_CERT_FILE",),
}


#: Where the nox process that loaded this file first hands pip's settings to the sessions it
#: starts (with ``--parallel`` each runs in a nox process of its own): pip is asked once per
#: ``nox`` call, not once per session.
_PIP_SOURCES_VAR = "_DSH_NOX_PIP_SOURCES"


@functools.cache
def _pip_sources() -> dict[str, list[str]]:
    """pip's effective source settings (environment over ``[install]`` over ``[global]``)."""
    handed = os.environ.get(_PIP_SOURCES_VAR)
    if handed is not None:
        try:
            given = json.loads(handed)
        except ValueError:
            given = None
        if isinstance(given, dict):
            return {str(k): [str(v) for v in vs] for k, vs in given.items()}
    found = _ask_pip()
    os.environ[_PIP_SOURCES_VAR] = json.dumps(found)
    return found


def _ask_pip() -> dict[str, list[str]]:
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):  # no pip beside nox: nothing to carry over
        return {}
    rank = {"global": 0, "install": 1, ":env:": 2}
    found: dict[str, tuple[int, list[str]]] = {}
    for line in listed.splitlines():
        key, _, raw = line.partition("=")
        section, _, name = key.rpartition(".")
        if name not in _PIP_TO_UV or section not in rank:
            continue
        try:
            value = str(ast.literal_eval(raw))
        except (ValueError, SyntaxError):
            continue
        if rank[section] >= found.get(name, (-1, []))[0]:
            found[name] = (rank[section], value.split())
    return {name: values for name, (_, values) in found.items()}


if _PIP_SOURCES_VAR not in os.environ:  # the first nox process: ask now, for every session
    _pip_sources()


#: Set by the nox process that loaded this file first, once the Pythons of the matrix are first
#: on ``PATH`` by their own folders (the sessions' nox processes inherit it).
_PYTHONS_VAR = "_DSH_NOX_PYTHONS"


def _pythons_first_on_path() -> None:
    """Put each Python of the matrix on ``PATH`` by its real folder, ahead of version shims.

    Where the Pythons come from pyenv, ``python3.12`` on ``PATH`` is a shell script that finds
    the interpreter each time it runs; nox and uv run it for every venv they make (about 0.5 s
    of CPU each time, for 30-odd venvs). Each shim is asked once here where its interpreter
    is; a Python that is not installed stays missing, and its sessions are skipped.
    """
    found: list[str] = []
    for version in PYTHONS:
        command = shutil.which(f"python{version}")
        if command is None:
            continue
        try:
            real = subprocess.run(
                [command, "-c", "import sys; print(sys.executable)"],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if real and os.path.dirname(real) not in found:
            found.append(os.path.dirname(real))
    os.environ["PATH"] = os.pathsep.join([*found, os.environ.get("PATH", "")])
    os.environ[_PYTHONS_VAR] = os.pathsep.join(found)


if _PYTHONS_VAR not in os.environ:
    _pythons_first_on_path()


def _install(session: nox.Session, *args: str, find_links: tuple[Path, ...] = ()) -> None:
    """``session.install`` with the same package sources under uv as pip would use here.

    A ``UV_*`` variable already set wins over pip's setting. With extra indexes, uv is told to
    pick the best version across all of them, as pip does (its default would stop at the first
    index that has the name).
    """
    links = [str(path) for path in find_links]
    if session.venv_backend != "uv":
        session.install(*(f"--find-links={link}" for link in links), *args)
        return
    env: dict[str, str] = {}
    for name, values in _pip_sources().items():
        variable, *older = _PIP_TO_UV[name]
        if any(known in os.environ for known in (variable, *older)):
            continue
        if name == "find-links":
            links += values
        elif name == "no-index":
            env[variable] = "1" if values[0].lower() in {"1", "true", "yes", "on"} else "0"
        else:
            env[variable] = values[0] if name == "cert" else " ".join(values)
    if links and "UV_FIND_LINKS" in os.environ:  # a --find-links given replaces the variable's
        links += os.environ["UV_FIND_LINKS"].replace(",", " ").split()
    if "UV_INDEX" in env and "UV_INDEX_STRATEGY" not in os.environ:
        env["UV_INDEX_STRATEGY"] = "unsafe-best-match"
    session.install(*(f"--find-links={link}" for link in links), *args, env=env)


#: The extras a test venv installs with a distribution: dsh-llm-openai's ``sdk`` (the
#: ``openai`` package), so that its tests run on both of its transports and mypy sees the SDK.
EXTRAS = {"dsh-llm-openai": "dsh-llm-openai[sdk]"}


def _install_wheels(
    session: nox.Session, *names: str, extra: tuple[str, ...] = tuple(TEST_REQUIREMENTS)
) -> None:
    """``names`` (and their dependencies) from this checkout's wheels, plus ``extra``.

    The installer resolves ``names`` as a user's ``pip install --find-links dist`` would. Then
    the dsh wheels are put in place again from ``dist/`` alone (no index, no dependencies): a
    reused venv (``nox -r``) already holds the same versions from an older checkout, which an
    installer would keep, and a same-named distribution on an index must never stand in for
    this checkout's.
    """
    ours = sorted(set().union(*(_closure(name) for name in names)))
    _install(session, *(EXTRAS.get(name, name) for name in names), *extra, find_links=(DIST,))
    again = "--reinstall" if session.venv_backend == "uv" else "--force-reinstall"
    session.install("--no-index", "--find-links", str(DIST), "--no-deps", again, *ours)
    _share_bytecode(session, harvest=False)


#: Bytecode compiled by this ``nox`` call's sessions, shared between their venvs (see
#: :func:`_share_bytecode`); emptied by ``build``, which runs once per call before the others.
BYTECODE = ROOT / ".nox" / "_bytecode"


def _share_bytecode(session: nox.Session, *, harvest: bool) -> None:
    """Lend a new venv the bytecode earlier sessions compiled, or give back what it compiled.

    Every session's venv holds the same pytest, hypothesis, attrs, dsh-core..., and with
    ``PYTHONPYCACHEPREFIX`` set CPython also compiles the standard library again into it:
    compiling all that again in each of the 30-odd sessions took about 5 s of CPU apiece.
    The files of an installed distribution are hard links to one file in uv's cache, and
    the standard library and the checkout are the same files for every venv: a module's
    bytecode compiled in one venv is valid in every other of its Python (CPython checks the
    source's modification time and size). So before its tests a session links into its own
    prefix the bytecode of every module an earlier session compiled whose source it has (the
    same inode, size and modification time: the same text for the whole call), and after
    them it gives back what it compiled (``harvest=True``). Installs that copy files (pip,
    another file system) have other inodes and share nothing: they only compile, as before.
    """
    venv = Path(session.virtualenv.location)
    sites = list(venv.glob("lib/python3.*/site-packages"))
    if len(sites) != 1:
        return  # another layout (Windows, PyPy): nothing is shared, every module compiles
    site, prefix = sites[0], venv / "pycache"
    tag = "cpython-3" + site.parent.name.removeprefix("python3.")
    suffix = f".{tag}.pyc"
    store = BYTECODE / tag
    store.mkdir(parents=True, exist_ok=True)

    def key(source: Path) -> str:
        found = source.stat()
        return f"{found.st_ino}-{found.st_size}-{found.st_mtime_ns}.pyc"

    def mirror(source: Path) -> Path:  # where CPython looks for the bytecode of `source`
        return prefix / source.parent.relative_to(source.anchor) / (source.stem + suffix)

    if not harvest:
        for listing in store.glob("*.list"):
            for line in listing.read_text().splitlines():
                known, _, where = line.partition("\t")
                source = site / where[5:] if where.startswith("site:") else Path(where)
                try:
                    if key(source) == known:
                        mirror(source).parent.mkdir(parents=True, exist_ok=True)
                        os.link(store / known, mirror(source))
                except OSError:  # gone, changed, already there: CPython compiles it
                    continue
        return
    lines = []
    for folder, _, names in os.walk(prefix):
        for name in names:
            if not name.endswith(suffix):
                continue  # pytest's rewritten test modules and other interpreters' bytecode
            compiled = Path(folder, name)
            parent = Path(compiled.anchor, compiled.parent.relative_to(prefix))
            source = parent / (name[: -len(suffix)] + ".py")
            try:
                known = key(source)
                os.link(compiled, store / known)
            except FileExistsError:
                continue  # shared already
            except OSError:
                continue
            where = f"site:{source.relative_to(site)}" if source.is_relative_to(site) else source
            lines.append(f"{known}\t{where}\n")
    if lines:  # whole or not at all: a session starting meanwhile reads every list
        name = f"{venv.name}-{os.getpid()}-{len(lines)}"
        (store / f"{name}.tmp").write_text("".join(lines))
        os.replace(store / f"{name}.tmp", store / f"{name}.list")


def _bytecode(session: nox.Session) -> dict[str, str | None]:
    """The environment that lets a session's processes keep the bytecode they compile.

    uv installs without compiling (pip compiles at install), and ``PYTHONDONTWRITEBYTECODE``
    (set on some machines) forbids writing it later: then every process the tests start
    compiles openai, pydantic and ours again from source, which costs about as much CPU as
    the tests themselves. Bytecode is written where the venv is (``PYTHONPYCACHEPREFIX``),
    never into the checkout; each module is compiled when first imported, once per ``nox``
    call and Python where the venvs share it (:func:`_share_bytecode`).
    """
    return {
        "PYTHONDONTWRITEBYTECODE": None,
        "PYTHONPYCACHEPREFIX": str(Path(session.virtualenv.location, "pycache")),
    }


def _pytest(
    session: nox.Session,
    *args: str,
    env: dict[str, str] | None = None,
    success_codes: list[int] | None = None,
) -> None:
    try:
        session.run(
            "pytest",
            "-c",
            "pyproject.toml",
            "--rootdir",
            ".",
            *args,
            *session.posargs,
            env={**_bytecode(session), "DSH_SUBAGENTS_HOME": session.create_tmp(), **(env or {})},
            success_codes=success_codes,
        )
    finally:
        _share_bytecode(session, harvest=True)


def _every_test_folder() -> list[str]:
    return ["tests", *(f"{info['folder']}/tests" for info in PACKAGES.values())]


# Runs inside a test venv: the dsh distributions installed there, and the plugins dsh-core
# discovers there (through its API: dsh-core is a library, the command is dsh-subagents').
_INSTALLED = """
import importlib.metadata as md, json
from dsh_core import PluginError, make_plugin_manager
names = {d.metadata["Name"] for d in md.distributions()}
dists = sorted(n for n in names if n.startswith("dsh-"))
pm = make_plugin_manager()
try:
    pm.collect_plugin_specs()
    fatal = ""
except PluginError as exc:
    fatal = str(exc)
listed = sorted(d.name for d in pm.discovered)
failures = [f.describe() for f in pm.failures]
status = 1 if failures or fatal else 0
out = "\\n".join([*listed, *failures, fatal])
print(json.dumps({"dists": dists, "plugins": listed, "status": status, "out": out}))
"""


# Runs in the build venv: each distribution's sdist and wheel from its folder through its
# build backend's PEP 517 hooks, all in this one process (a build frontend started per
# distribution costs far more than the builds themselves).
_BUILD = """
import importlib, os, sys, tomllib
out = sys.argv[1]
for folder in sys.argv[2:]:
    with open(os.path.join(folder, "pyproject.toml"), "rb") as file:
        backend = importlib.import_module(tomllib.load(file)["build-system"]["build-backend"])
    os.chdir(folder)
    backend.build_sdist(out)
    backend.build_wheel(out)
"""


@nox.session
def build(session: nox.Session) -> None:
    """Every distribution's wheel and sdist into dist/ (the local stand-in for an index).

    The other sessions require this one, and nox runs a required session once per invocation,
    however many sessions require it. The build runs without isolation, in this session's venv
    that holds the build backend (hatchling), one process for every distribution.
    """
    for made in (DIST, BYTECODE):  # this call's artifacts only
        if made.exists():
            shutil.rmtree(made)
    DIST.mkdir()
    _install(session, "hatchling")
    folders = [str(ROOT / str(info["folder"])) for info in PACKAGES.values()]
    session.run("python", "-c", _BUILD, str(DIST), *folders, silent=True)
    session.log(
        f"built {len(list(DIST.glob('*.whl')))} wheels and "
        f"{len(list(DIST.glob('*.tar.gz')))} sdists into dist/"
    )


@nox.session(python=PYTHONS, requires=["build"], allow_parallel=True)
@nox.parametrize("dist", _BY_WEIGHT)
def tests(session: nox.Session, dist: str) -> None:
    """One distribution alone in a fresh venv: only its declared dependencies, then its tests.

    A property test draws 60 examples here (Hypothesis profile ``ci``) unless it sets its own
    count: the three Pythons search with seeds of their own, and ``thorough`` draws 2000.
    """
    _install_wheels(session, dist)
    listed = session.run("python", "-c", _INSTALLED, env=_bytecode(session), silent=True)
    _share_bytecode(session, harvest=True)  # dsh-core and its dependencies, for the next ones
    report = json.loads(listed or "{}")
    expected = sorted(_closure(dist))
    if report["dists"] != expected:
        session.error(f"{dist} pulled in {report['dists']}, but declares only {expected}")
    eps = sorted(ep for name in expected for ep in PACKAGES[name]["entry_points"])  # type: ignore[attr-defined]
    if report["status"] != 0 or report["plugins"] != eps:
        session.error(
            f"dsh-core discovered {report['plugins']} (exit {report['status']}), "
            f"expected exactly {eps}:\n{report['out']}"
        )
    profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")  # 60 examples a property, per Python
    _pytest(session, f"{PACKAGES[dist]['folder']}/tests", env={"HYPOTHESIS_PROFILE": profile})


@nox.session(requires=["build"], allow_parallel=True)
def all(session: nox.Session) -> None:
    """Every distribution in one venv: the cross-package tests.

    Each package's own tests ran in the ``tests`` sessions (alone, on every Python); that
    installing everything changes none of their outcomes is what ``nox -s thorough`` proves
    (every test folder, everything installed), so the default run does not repeat them here.
    """
    _install_wheels(session, *PACKAGES)
    cross, *_ = _every_test_folder()
    uv = nox.virtualenv.UV if session.venv_backend == "uv" else ""
    # the wheels a test installs elsewhere, and the uv that installs them fastest
    _pytest(session, cross, env={"DSH_DIST": str(DIST), "DSH_UV": uv})


@nox.session(requires=["build"], allow_parallel=True)
def package(session: nox.Session) -> None:
    """What users get from an index: `twine check --strict` on every artifact, every sdist
    rebuilt into the same wheel, and every distribution installed by name from a local
    pypiserver into a fresh venv (tests/test_index.py); and the wheels installed beside the
    DeepSeek Harness runtime (packages/cli/tests/test_beside_deepseek_harness.py). Marker
    ``index``: these tests install from this run's dist/, once per run."""
    _install_wheels(
        session, "dsh-core", extra=(*TEST_REQUIREMENTS, "hatchling", "twine", "pypiserver")
    )
    uv = nox.virtualenv.UV if session.venv_backend == "uv" else ""
    _pytest(
        session,
        "-m",
        "index",
        "tests/test_index.py",
        "packages/cli/tests/test_beside_deepseek_harness.py",
        env={"DSH_DIST": str(DIST), "DSH_UV": uv},
    )


@nox.session(allow_parallel=True)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    _install(session, *nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(requires=["build"], allow_parallel=True)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over every distribution's src/ (configured in pyproject.toml)."""
    _install_wheels(session, *PACKAGES)
    _install(session, *nox.project.dependency_groups(PYPROJECT, "typecheck"))
    modules = [
        str(p.name)
        for info in PACKAGES.values()
        for p in (ROOT / str(info["folder"]) / "src").iterdir()
        if p.is_dir()
    ]
    session.run("mypy", *(arg for m in sorted(modules) for arg in ("-p", m)))


@nox.session(requires=["build"])
def thorough(session: nox.Session) -> None:
    """Slow tier, outside the default set: every test but those of the interop, crash and index
    tiers, Hypothesis at 2000 examples.

    The tests marked ``thorough`` (long state-machine and soak runs, which the default set
    deselects) run here, and every property test runs under the ``thorough`` profile.
    """
    _install_wheels(session, *PACKAGES)
    # The interop, crash and index tiers run in sessions of their own (``index`` needs the
    # build backend and the local package index that only ``nox -s package`` installs).
    _pytest(
        session,
        "-m",
        "not interop and not crash and not index",
        *_every_test_folder(),
        env={"HYPOTHESIS_PROFILE": "thorough"},
    )


@nox.session(requires=["build"])
def crash(session: nox.Session) -> None:
    """Slow tier, outside the default set: the crash tier at many kill points.

    A host process runs a tree of continuable children on the JSONL store and is killed with
    SIGKILL at ``DSH_CRASH_POINTS`` (default 200) seeded random points (``DSH_CRASH_SEED``,
    default 1); a fresh process checks that nothing acknowledged was lost and prints the
    tally. The default set runs a few kill points of the same test.
    """
    _install_wheels(session, *PACKAGES)
    env = {
        "DSH_CRASH_POINTS": os.environ.get("DSH_CRASH_POINTS", "200"),
        "DSH_CRASH_SEED": os.environ.get("DSH_CRASH_SEED", "1"),
    }
    _pytest(session, "-m", "crash", "-s", "tests/test_crash.py", env=env)


#: The third-party ACP agents `interop` drives: deepagents-acp (on a fake model) and the SDK's
#: own example agent, which only its sdist holds.
INTEROP = ["deepagents==0.7.32", "deepagents-acp==0.0.13"]
ACP_SDK = "agent-client-protocol==0.12.1"
#: The official TypeScript SDK (npm), which tests/fixtures/acp/ts_sdk_agent.mjs runs on.
ACP_TS_SDK = "@agentclientprotocol/sdk@~2.4.0"
#: The reference runtime, whose `dsh --profile acp` serves ACP (a ~95 MB wheel).
DSH_REFERENCE = "deepseek-harness-runtime-bin==0.2.1rc2"


def _optional(session: nox.Session, what: str, *args: str, **kwargs: object) -> bool:
    """Run a command that fetches an optional agent; a failure is a warning (its tests skip)."""
    try:
        session.run(*args, **kwargs)  # type: ignore[arg-type]
    except nox.command.CommandFailed:
        session.warn(f"{what} could not be installed: its interop tests are skipped")
        return False
    return True


def _interop_agents(session: nox.Session, tmp: Path) -> dict[str, str]:
    """The agents that need more than pip: the TypeScript SDK (npm, where node and npm are
    installed) and the reference runtime (its wheel from the index). The variables that name
    them for the tests; an agent that cannot be had is left out, and its tests skip."""
    env: dict[str, str] = {}
    node, npm = shutil.which("node"), shutil.which("npm")
    prefix = tmp / "ts-sdk"
    if node is None or npm is None:
        session.warn("no node or npm: the TypeScript SDK's interop tests are skipped")
    elif _optional(
        session, ACP_TS_SDK, npm, "install", "--prefix", str(prefix), "--no-save", "--no-audit",
        "--no-fund", "--no-package-lock", ACP_TS_SDK, external=True, silent=True,
    ):  # fmt: skip
        env["ACP_TS_SDK"] = str(prefix)
    try:  # into this session's venv only: its `dsh` command is the only thing it adds
        _install(session, DSH_REFERENCE)
    except nox.command.CommandFailed:
        session.warn(f"{DSH_REFERENCE} could not be installed: its interop tests are skipped")
    else:
        env["DSH_REFERENCE_RUNTIME"] = str(Path(session.bin) / "dsh")
    return env


@nox.session(requires=["build"])
def continuable_machine(session: nox.Session) -> None:
    """Slow tier, outside the default set: the continuation manager's state machine, longer.

    The default run (in ``tests`` and ``all``) explores 200 examples of up to 16 steps; this
    one explores ``DSH_CONTINUABLE_EXAMPLES`` (default 5000) of up to ``DSH_CONTINUABLE_STEPS``
    (default 30). Set either in the environment to change it.
    """
    _install_wheels(session, "dsh-subagent")
    env = {
        "DSH_CONTINUABLE_EXAMPLES": os.environ.get("DSH_CONTINUABLE_EXAMPLES", "5000"),
        "DSH_CONTINUABLE_STEPS": os.environ.get("DSH_CONTINUABLE_STEPS", "30"),
    }
    _pytest(session, "packages/subagent/subagent/tests/test_continuable_machine.py", env=env)


@nox.session(requires=["build"])
def interop(session: nox.Session) -> None:
    """Slow tier, outside the default set: the tests marked ``interop`` (real agent processes).

    Installs the third-party agents (:data:`INTEROP`) and unpacks the SDK's sdist for its
    ``examples/``; ``ACP_SDK_EXAMPLES`` tells the tests where they are. Where node and npm
    are installed, the TypeScript SDK (:data:`ACP_TS_SDK`) goes into a temporary folder
    (``ACP_TS_SDK``); the reference runtime (:data:`DSH_REFERENCE`) goes into this venv
    (``DSH_REFERENCE_RUNTIME`` names its ``dsh``). Either that cannot be installed is a
    warning, and its tests are skipped.
    """
    _install_wheels(session, *PACKAGES, extra=(*TEST_REQUIREMENTS, *INTEROP))
    tmp = Path(session.create_tmp()).resolve()
    session.run(  # nox's own pip: a uv venv has none
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", ACP_SDK,
        "--dest", str(tmp), silent=True, external=True,
    )  # fmt: skip
    (sdist,) = tmp.glob("agent_client_protocol-*.tar.gz")
    with tarfile.open(sdist) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(tmp, filter="data")
        else:  # pragma: no cover - a Python before 3.11.4
            archive.extractall(tmp)
    (examples,) = tmp.glob("agent_client_protocol-*/examples")
    _pytest(
        session,
        "-m",
        "interop",
        *_every_test_folder(),
        env={"ACP_SDK_EXAMPLES": str(examples), **_interop_agents(session, tmp)},
        success_codes=[0, 5],
    )


#: The peers' pinned requirements, all installed beside ours in the ``peers`` session's venv.
PEERS = {
    "openai-agents": ["openai-agents==0.24.0"],
    "pydantic-ai": ["pydantic-ai-slim==2.68.0"],
    "deepagents": ["deepagents==0.7.32"],
}
#: What ``benchmarks/delegation.py`` imports (the ``peers`` session installs only these of ours).
DELEGATION = ("dsh-tool-subagent", "dsh-subagent-spawn", "dsh-subagent-fork")


@nox.session(requires=["build"])
def bench(session: nox.Session) -> None:
    """Our benchmarks (never timed assertions): a turn, delegation, continuable children, the
    session log, cold resume, the OpenAI-compatible adapter against its loopback server,
    listing, and ACP children. Every script in benchmarks/README.md runs, with its defaults;
    ``nox -s bench -- ARGS`` passes ARGS to ``delegation.py``."""
    # pytest: acp_continuable.py drives its host through the continuable ACP tests' helpers
    _install_wheels(session, *PACKAGES, extra=("pytest",))
    # bytecode kept, as a user's install has it (the first import of a run compiles)
    env = {**_bytecode(session), "DSH_SUBAGENTS_HOME": session.create_tmp()}
    session.run("python", "benchmarks/turn.py", env=env)
    session.run("python", "benchmarks/delegation.py", *session.posargs, env=env)
    # its resume part is resume.py's measurement, which runs below: not twice
    session.run(
        "python", "benchmarks/continuable.py", "--only", "roundtrip", "--only", "fanout", env=env
    )
    session.run("python", "benchmarks/sessions.py", env=env)
    session.run("python", "benchmarks/resume.py", env=env)
    session.run("python", "benchmarks/llm_openai.py", env=env)
    session.run("python", "benchmarks/listing.py", env=env)
    session.run("python", "benchmarks/acp.py", env=env)
    session.run("python", "benchmarks/acp_agent.py", "--rounds", "3", env=env)
    session.run("python", "benchmarks/acp_continuable.py", env=env)
    session.run("python", "benchmarks/memory.py", env=env)
    session.run("python", "benchmarks/sessions_list.py", env=env)
    session.run("python", "benchmarks/cli_start.py", env=env)


@nox.session(requires=["build"])
def peers(session: nox.Session) -> None:
    """Our delegation through the ``subagent`` tool beside openai-agents, pydantic-ai and
    deepagents, in alternating rounds, printed as one table (not part of CI). The peers are
    installed from the package index into this session's venv only; ``nox -s peers -- ARGS``
    passes ARGS to ``benchmarks/peers/compare.py`` (e.g. ``--rounds 9``)."""
    _install_wheels(session, *DELEGATION, extra=tuple(r for reqs in PEERS.values() for r in reqs))
    session.run(
        "python",
        "benchmarks/peers/compare.py",
        *session.posargs,
        env={"LANGSMITH_TRACING": "false", "DSH_SUBAGENTS_HOME": session.create_tmp()},
    )


@nox.session(requires=["build"])
def demo(session: nox.Session) -> None:
    """The main job: the offline demo on embedded defaults (no network, no keys)."""
    _install_wheels(session, *PACKAGES, extra=())
    session.run(
        "dsh-subagents", "demo", *session.posargs, env={"DSH_SUBAGENTS_HOME": session.create_tmp()}
    )


if os.environ.get("NOX_LIST_PACKAGES"):  # pragma: no cover - a debugging aid
    print(json.dumps(PACKAGES, indent=2))
