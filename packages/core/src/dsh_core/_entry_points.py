"""The installed entry points of one group, read without ``importlib.metadata`` (PERF-12).

Importing ``importlib.metadata`` (``email``, ``zipfile``, ``csv``, ``importlib.resources``)
and its discovery cost a command's start about as much as a big module of its own, while what
discovery needs is a directory listing per path folder and one small text file per
distribution. :func:`entry_points` reads those the way ``importlib.metadata.entry_points``
does, in the same order and with the same de-duplication (the first distribution of a
normalized name on ``sys.path`` wins), and gives the work to ``importlib.metadata`` itself
whenever anything is not the plain case it reproduces: a finder on ``sys.meta_path`` that
finds distributions of its own, a path entry that is not a folder (a zip), an egg, a
metadata folder named other than in lower case, an entry-point line it would not parse.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from functools import reduce
from importlib import import_module
from importlib.machinery import PathFinder
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import importlib.metadata as md

__all__ = ["entry_points"]

#: ``importlib.metadata.EntryPoint.pattern``: ``module[:attr][ [extras]]``.
_VALUE = re.compile(r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$")
#: What ``PathDistribution.read_text`` treats as "no such file".
_ABSENT = (FileNotFoundError, IsADirectoryError, KeyError, NotADirectoryError, PermissionError)


class _Fallback(Exception):
    """Not the plain case: ``importlib.metadata`` decides."""


class PathDistribution:
    """A distribution's metadata folder: what discovery reads of it (``read_text``), and
    ``metadata`` through ``importlib.metadata`` when the plain head does not do."""

    __slots__ = ("_path",)

    def __init__(self, path: str) -> None:
        self._path = path

    def read_text(self, filename: str) -> str | None:
        """The file's text, ``None`` if absent (as ``importlib.metadata`` reads it)."""
        try:
            with open(os.path.join(self._path, filename), encoding="utf-8") as f:
                return f.read()
        except _ABSENT:
            return None

    @property
    def metadata(self) -> Any:
        """The parsed metadata, by ``importlib.metadata`` (rare: an unusual head)."""
        import importlib.metadata as md

        return md.PathDistribution(__import__("pathlib").Path(self._path)).metadata


class EntryPoint:
    """One entry point: ``name``, ``value``, ``group``, its distribution and ``load()`` as in
    ``importlib.metadata``."""

    __slots__ = ("dist", "group", "name", "value")

    def __init__(self, name: str, value: str, group: str, dist: PathDistribution) -> None:
        self.name = name
        self.value = value
        self.group = group
        self.dist = dist

    def load(self) -> Any:
        """Import the module and resolve the attribute path, as ``EntryPoint.load`` does."""
        match = _VALUE.match(self.value)
        assert match is not None  # checked when read
        module = import_module(match.group("module"))
        names = filter(None, (match.group("attr") or "").split("."))
        return reduce(getattr, names, module)

    def __repr__(self) -> str:
        return f"EntryPoint(name={self.name!r}, value={self.value!r}, group={self.group!r})"


def _normalize(name: str) -> str:
    """``importlib.metadata.Prepared.normalize``."""
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")


def _distributions() -> list[PathDistribution]:
    """The metadata folders on ``sys.path``, unique by normalized name, in discovery order."""
    for finder in sys.meta_path:
        if finder is not PathFinder and getattr(finder, "find_distributions", None) is not None:
            raise _Fallback
    seen: set[str] = set()
    found: list[PathDistribution] = []
    path: list[object] = list(sys.path)  # an entry may be other than str in practice
    for root in path:
        if not isinstance(root, str) or os.path.basename(root).lower().endswith(".egg"):
            raise _Fallback
        try:
            children = os.listdir(root or ".")
        except NotADirectoryError:
            raise _Fallback from None  # a zip
        except OSError:
            continue
        infos: dict[str, list[str]] = {}
        for child in children:
            low = child.lower()
            if low.endswith((".dist-info", ".egg-info")):
                if not child.endswith((".dist-info", ".egg-info")):
                    raise _Fallback  # its name would come from its metadata
                key = _normalize(low.rpartition(".")[0].partition("-")[0])
                infos.setdefault(key, []).append(os.path.join(root, child))
        for key, paths in infos.items():
            if key not in seen:
                seen.add(key)
                found.append(PathDistribution(paths[0]))
    return found


def _read(dist: PathDistribution, group: str) -> list[EntryPoint]:
    text = dist.read_text("entry_points.txt")
    section: str | None = None
    points: list[EntryPoint] = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[]")
            continue
        if section is None:
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise _Fallback  # importlib.metadata raises its own error for it
        if section == group:
            if _VALUE.match(value.strip()) is None:
                raise _Fallback
            points.append(EntryPoint(name.strip(), value.strip(), group, dist))
    return points


def entry_points(group: str) -> Iterable[EntryPoint | md.EntryPoint]:
    """The installed entry points of ``group``, as ``importlib.metadata.entry_points(group=)``
    lists them."""
    try:
        return [ep for dist in _distributions() for ep in _read(dist, group)]
    except _Fallback:
        import importlib.metadata as md

        return md.entry_points(group=group)
