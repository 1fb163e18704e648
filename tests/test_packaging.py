"""What every distribution declares for publishing: license, metadata, README, version.

These read the source tree only (cheap, every run); tests/test_index.py checks the built
artifacts and installs them from a package index.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
HOME = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["dsh-release"]["home"]


def _projects() -> dict[str, tuple[Path, dict[str, Any]]]:
    found = {}
    for pyproject in sorted(ROOT.glob("packages/**/pyproject.toml")):
        if "fixtures" not in pyproject.parts:
            data = tomllib.loads(pyproject.read_text())
            found[data["project"]["name"]] = (pyproject.parent, data)
    return found


PROJECTS = _projects()
_VERSION = re.compile(r'^__version__ = "([^"]+)"$', re.M)


def _version(folder: Path, data: dict[str, Any]) -> str:
    found = _VERSION.search((folder / data["tool"]["hatch"]["version"]["path"]).read_text())
    assert found
    return found.group(1)


def test_the_root_license_is_mit_and_every_copy_is_identical() -> None:
    """PKG-1: LICENSE at the root is the MIT text of the project's authors, and the copy each
    distribution ships (hatchling cannot reach above a project's folder) is byte-identical."""
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n\nCopyright (c) 2026 the dsh-subagents authors\n")
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text
    for name, (folder, _) in PROJECTS.items():
        assert (folder / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes(), name


@pytest.mark.parametrize("name", list(PROJECTS))
def test_license_and_classifiers(name: str) -> None:
    """PKG-2: the license is the PEP 639 expression `MIT` with the LICENSE file (hatchling
    >= 1.27), without the deprecated `License ::` classifiers; a development status and one
    operating-system classifier are given."""
    _, data = PROJECTS[name]
    project = data["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert "hatchling>=1.27" in data["build-system"]["requires"]
    classifiers = project["classifiers"]
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert len([c for c in classifiers if c.startswith("Development Status ::")]) == 1
    assert len([c for c in classifiers if c.startswith("Operating System ::")]) == 1
    assert "Programming Language :: Python :: 3 :: Only" in classifiers


@pytest.mark.parametrize("name", list(PROJECTS))
def test_project_urls_start_at_the_home(name: str) -> None:
    """PKG-3: Homepage, Documentation, Source and Changelog are set, each under the home named
    once in the root pyproject.toml; Source is the distribution's own folder."""
    folder, data = PROJECTS[name]
    urls = data["project"]["urls"]
    assert {"Homepage", "Documentation", "Source", "Changelog"} <= set(urls)
    assert all(url.startswith(HOME) for url in urls.values()), urls
    assert urls["Homepage"] == HOME
    assert urls["Source"] == f"{HOME}/tree/main/{folder.relative_to(ROOT).as_posix()}"
    assert urls["Changelog"] == f"{HOME}/blob/main/CHANGELOG.md"


_LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("name", list(PROJECTS))
def test_the_readme_works_on_its_own_page(name: str) -> None:
    """PKG-4: the README, which is the distribution's index page, links only absolutely or
    within itself (a link into the repository names a file that exists), says `pip install`
    with its name, has a runnable Python example and points to the docs."""
    folder, _ = PROJECTS[name]
    readme = (folder / "README.md").read_text()
    links = _LINK.findall(readme)
    assert all(link.startswith(("https://", "#")) for link in links), links
    prefix = f"{HOME}/blob/main/"
    for link in links:
        if link.startswith(HOME):
            assert link.startswith((prefix, f"{HOME}/tree/main/")), link
            if link.startswith(prefix):
                path = link[len(prefix) :].split("#", 1)[0]
                assert (ROOT / path).is_file(), link
        else:  # the home's address is written in one way only
            assert "dsh-subagents/dsh-subagents" not in link, link
    assert f"pip install {name}" in readme
    assert "```python\n" in readme
    assert f"]({HOME}/blob/main/docs/" in readme


@pytest.mark.parametrize("name", list(PROJECTS))
def test_one_place_says_the_version(name: str) -> None:
    """PKG-5: the version is dynamic, read by hatchling from the package's __about__.py, and
    written nowhere else in the pyproject."""
    folder, data = PROJECTS[name]
    assert data["project"]["dynamic"] == ["version"] and "version" not in data["project"]
    about = folder / data["tool"]["hatch"]["version"]["path"]
    assert about.is_file() and about.parent.parent.name == "src"
    Version(_version(folder, data))


@pytest.mark.parametrize("name", list(PROJECTS))
def test_sibling_requirements_are_ranges_holding_the_current_version(name: str) -> None:
    """PKG-6: a requirement on another dsh distribution is a range with a lower and an upper
    bound, never a pin, and the sibling's current version is inside it."""
    _, data = PROJECTS[name]
    for raw in data["project"].get("dependencies", []):
        requirement = Requirement(raw)
        if requirement.name not in PROJECTS:
            continue
        operators = {spec.operator for spec in requirement.specifier}
        assert operators == {">=", "<"}, raw
        sibling = _version(*PROJECTS[requirement.name])
        assert requirement.specifier.contains(sibling, prereleases=True), (raw, sibling)


def test_the_changelog_keeps_a_changelog() -> None:
    """PKG-7: CHANGELOG.md follows Keep a Changelog (an Unreleased section first, the
    format's categories) and names every distribution; docs/releasing.md says how a release
    is cut and where the home is set."""
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert changelog.startswith("# Changelog\n")
    assert "https://keepachangelog.com/en/1.1.0/" in changelog
    sections = re.findall(r"^## (.+)$", changelog, re.M)
    assert sections and sections[0] == "[Unreleased]", sections
    assert set(re.findall(r"^### (.+)$", changelog, re.M)) <= {
        "Added", "Changed", "Deprecated", "Removed", "Fixed", "Security",
    }  # fmt: skip
    assert all(f"`{name}`" in changelog for name in PROJECTS)
    releasing = (ROOT / "docs" / "releasing.md").read_text()
    assert "[tool.dsh-release]" in releasing
    assert all(step in releasing for step in ("nox -s build", "twine check", "twine upload"))
