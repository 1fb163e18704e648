"""`dsh-subagents` installs beside the DeepSeek Harness runtime (CLI-39).

The runtime's wheel on PyPI (`deepseek-harness-runtime-bin`) installs a console script named
`dsh` and keeps its state under `DSH_HOME`. Both go into one fresh venv (made with uv), theirs
first, then every one of this checkout's distributions; both commands must still work. Skipped
when uv is missing or the wheel cannot be downloaded.

It runs once per `nox` call, in the ``package`` session (marker ``index``: a plain `pytest`
deselects it), which hands over the run's built wheels (``DSH_DIST``) and its uv (``DSH_UV``);
without ``DSH_DIST`` the distributions are built from their folders here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.index]

ROOT = Path(__file__).resolve().parents[3]
WHEEL = "deepseek-harness-runtime-bin"
OURS = [
    "packages/core",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "packages" / "subagent").iterdir()),
    "packages/llm-openai",
    "packages/acp-agent",
    "packages/cli",
]


def _find_uv() -> str | None:
    return os.environ.get("DSH_UV") or shutil.which("uv")


def _ours() -> list[str]:
    """This checkout's distributions: the run's wheels when it hands them over, else the
    folders (built here)."""
    given = os.environ.get("DSH_DIST")
    if not given:
        return OURS
    wheels = sorted(str(path) for path in Path(given).glob("dsh_*.whl"))
    assert len(wheels) == len(OURS), wheels
    return wheels


def _uv(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    uv = _find_uv()
    assert uv is not None
    return subprocess.run(
        [uv, *args], capture_output=True, text=True, timeout=timeout, check=False, cwd=ROOT
    )


def test_the_reference_runtime_and_ours_install_side_by_side_with_both_commands_intact(
    tmp_path: Path,
) -> None:
    """CLI-39: in one venv holding the DeepSeek Harness runtime wheel and dsh-subagents, the
    runtime's `dsh --version` still answers as itself and `dsh-subagents plugins` works:
    neither console script overwrote the other."""
    if _find_uv() is None:
        pytest.skip("uv is not installed")
    venv = tmp_path / "venv"
    made = _uv("venv", "-q", "--python", sys.executable, str(venv))
    assert made.returncode == 0, made.stderr
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    theirs = _uv("pip", "install", "-q", "--python", str(python), WHEEL)
    if theirs.returncode != 0:
        pytest.skip(f"{WHEEL} could not be installed here: {theirs.stderr.strip()[-300:]}")
    ours = _uv("pip", "install", "-q", "--python", str(python), *_ours())
    assert ours.returncode == 0, ours.stderr
    bin_dir = python.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSH_", "VIRTUAL_ENV"))}
    env["DSH_HOME"] = str(tmp_path / "dsh-home")
    env["DSH_SUBAGENTS_HOME"] = str(tmp_path / "our-home")
    dsh = subprocess.run(
        [str(bin_dir / "dsh"), "--version"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert dsh.returncode == 0, dsh.stderr
    assert "dsh-subagents" not in dsh.stdout + dsh.stderr
    version = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({WHEEL!r}))"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert version.returncode == 0
    expected = version.stdout.strip().replace("rc", "-rc.").split("-rc.")[0]
    assert dsh.stdout.strip().startswith(expected), (dsh.stdout, version.stdout)
    plugins = subprocess.run(
        [str(bin_dir / "dsh-subagents"), "plugins"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert plugins.returncode == 0, plugins.stdout + plugins.stderr
    assert "dsh-subagents" in plugins.stdout and "dsh-core" in plugins.stdout
    assert not (tmp_path / "dsh-home").exists() or not any(
        p.name.startswith("dsh-subagents") for p in (tmp_path / "dsh-home").iterdir()
    )
