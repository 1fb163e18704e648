"""Development sessions: per-distribution isolated tests, cross-package tests, lint, types, demo.

``nox`` runs the default set (everything CI runs); ``nox -s demo`` runs the offline demo.
Every test venv installs wheels built from this checkout (``dist/``, made by the ``build``
session), never the source tree, so a test proves what users get from ``pip install``.
"""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from pathlib import Path

import nox

nox.needs_version = ">=2024.4.15"
nox.options.error_on_missing_interpreters = False  # a missing Python is skipped, not failed
nox.options.sessions = ["tests", "all", "lint", "typecheck"]

ROOT = Path(__file__).parent
DIST = ROOT / "dist"
PYTHONS = ["3.11", "3.12", "3.13"]
TEST_REQUIREMENTS = ["pytest>=8", "hypothesis>=6.100"]


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


def _closure(name: str) -> set[str]:
    todo, seen = [name], set()
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(PACKAGES[current]["siblings"])  # type: ignore[arg-type]
    return seen


def _install_wheels(
    session: nox.Session, *names: str, extra: tuple[str, ...] = tuple(TEST_REQUIREMENTS)
) -> None:
    """``names`` (and their dependencies) from this checkout's wheels, plus ``extra``.

    A reused venv (``nox -r``) already holds the same versions from an older checkout, which
    pip would keep; so the dsh wheels are then put in place again, from ``dist/`` only.
    """
    session.install("--find-links", str(DIST), *names, *extra)
    ours = sorted(set().union(*(_closure(name) for name in names)))
    session.install(
        "--no-index", "--find-links", str(DIST), "--no-deps", "--force-reinstall", *ours
    )


def _pytest(session: nox.Session, *paths: str) -> None:
    session.run(
        "pytest",
        "-c",
        "pyproject.toml",
        "--rootdir",
        ".",
        *paths,
        *session.posargs,
        env={"DSH_HOME": session.create_tmp()},
    )


# Runs inside a test venv: the dsh distributions installed there, and the plugins `dsh` lists.
_INSTALLED = """
import importlib.metadata as md, json, subprocess
names = {d.metadata["Name"] for d in md.distributions()}
dists = sorted(n for n in names if n.startswith("dsh-"))
out = subprocess.run(["dsh", "plugins"], capture_output=True, text=True)
listed = sorted(line.split()[0] for line in out.stdout.splitlines()[1:] if line.strip())
print(json.dumps({"dists": dists, "plugins": listed, "status": out.returncode, "out": out.stdout}))
"""


@nox.session(python=False)
def build(session: nox.Session) -> None:
    """Build every distribution's wheel and sdist into dist/ (the local stand-in for an index)."""
    if DIST.exists():
        shutil.rmtree(DIST)
    venv = ROOT / ".nox" / "_build"
    if not (venv / "bin" / "python").exists():
        session.run("python3", "-m", "venv", str(venv), external=True)
        session.run(
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "build",
            "hatchling",
            external=True,
        )
    for info in PACKAGES.values():
        session.run(
            str(venv / "bin" / "python"),
            "-m",
            "build",
            "--no-isolation",
            "--sdist",
            "--wheel",
            "--outdir",
            str(DIST),
            str(info["folder"]),
            external=True,
            silent=True,
        )
    session.log(
        f"built {len(list(DIST.glob('*.whl')))} wheels and "
        f"{len(list(DIST.glob('*.tar.gz')))} sdists into dist/"
    )


@nox.session(python=PYTHONS, requires=["build"])
@nox.parametrize("dist", list(PACKAGES))
def tests(session: nox.Session, dist: str) -> None:
    """One distribution alone in a fresh venv: only its declared dependencies, then its tests."""
    _install_wheels(session, dist)
    report = json.loads(session.run("python", "-c", _INSTALLED, silent=True) or "{}")
    expected = sorted(_closure(dist))
    if report["dists"] != expected:
        session.error(f"{dist} pulled in {report['dists']}, but declares only {expected}")
    eps = sorted(ep for name in expected for ep in PACKAGES[name]["entry_points"])  # type: ignore[attr-defined]
    if report["status"] != 0 or report["plugins"] != eps:
        session.error(
            f"`dsh plugins` listed {report['plugins']} (exit {report['status']}), "
            f"expected exactly {eps}:\n{report['out']}"
        )
    _pytest(session, f"{PACKAGES[dist]['folder']}/tests")


@nox.session(requires=["build"])
def all(session: nox.Session) -> None:
    """Every distribution in one venv: the cross-package tests, then every package's tests."""
    _install_wheels(session, *PACKAGES)
    _pytest(session, "tests", *(f"{info['folder']}/tests" for info in PACKAGES.values()))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(requires=["build"])
def typecheck(session: nox.Session) -> None:
    """mypy --strict over every distribution's src/ (configured in pyproject.toml)."""
    _install_wheels(session, *PACKAGES)
    session.install("mypy>=1.11")
    modules = [
        str(p.name)
        for info in PACKAGES.values()
        for p in (ROOT / str(info["folder"]) / "src").iterdir()
        if p.is_dir()
    ]
    session.run("mypy", *(arg for m in sorted(modules) for arg in ("-p", m)))


PEERS = {
    "openai-agents": (["openai-agents==0.24.0"], "bench_oai.py"),
    "pydantic-ai": (["pydantic-ai-slim==2.68.0"], "bench_pydai.py"),
    "deepagents": (["deepagents==0.7.32"], "bench_deep.py"),
}


@nox.session(requires=["build"])
def bench(session: nox.Session) -> None:
    """Our benchmarks (never timed assertions): delegation and the session log."""
    _install_wheels(session, *PACKAGES, extra=())
    session.run("python", "benchmarks/turn.py")
    session.run("python", "benchmarks/delegation.py", *session.posargs)
    session.run("python", "benchmarks/sessions.py")


@nox.session
@nox.parametrize("peer", list(PEERS))
def peers(session: nox.Session, peer: str) -> None:
    """One peer's delegation benchmark in its own venv (not part of CI)."""
    requirements, script = PEERS[peer]
    session.install(*requirements)
    session.run("python", f"benchmarks/peers/{script}", env={"LANGSMITH_TRACING": "false"})


@nox.session(requires=["build"])
def demo(session: nox.Session) -> None:
    """The main job: the offline demo on embedded defaults (no network, no keys)."""
    _install_wheels(session, *PACKAGES, extra=())
    session.run("dsh", "demo", *session.posargs, env={"DSH_HOME": session.create_tmp()})


if os.environ.get("NOX_LIST_PACKAGES"):  # pragma: no cover - a debugging aid
    print(json.dumps(PACKAGES, indent=2))
