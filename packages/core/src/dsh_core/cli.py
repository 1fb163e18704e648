"""The ``dsh`` command line.

``dsh plugins`` lists every discovered plugin with its distribution and version, and every one
that failed to load (exit status 1 then). ``dsh demo`` runs the offline demo.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from .__about__ import __version__
from ._plugins import DshPluginManager, PluginError, make_plugin_manager

__all__ = ["main"]


def _discover() -> tuple[DshPluginManager, str | None]:
    pm = make_plugin_manager()
    try:
        pm.collect_plugin_specs()
    except PluginError as exc:
        return pm, f"{exc} [{exc.code}]"
    return pm, None


def _print_failures(pm: DshPluginManager, out: TextIO) -> None:
    if not pm.failures:
        return
    print(f"\n{len(pm.failures)} plugin(s) failed to load:", file=out)
    for f in pm.failures:
        where = f" ({f.distribution} {f.version})" if f.distribution else ""
        print(f"  {f.name}{where}: {f.message}", file=out)


def cmd_plugins(args: argparse.Namespace, out: TextIO) -> int:
    """List discovered plugins: entry point, distribution, version, mountable plugin names."""
    pm, fatal = _discover()
    rows = [
        (
            d.name,
            d.distribution or "-",
            d.version or "-",
            ", ".join(s.name for s in d.plugins) or "-",
        )
        for d in sorted(pm.discovered, key=lambda d: d.name)
    ]
    header = ("PLUGIN", "DISTRIBUTION", "VERSION", "MOUNTS")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        print(
            "  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)) + "  " + row[3],
            file=out,
        )
    _print_failures(pm, out)
    if fatal:
        print(f"\ndiscovery failed: {fatal}", file=out)
    return 1 if pm.failures or fatal else 0


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    """The offline demo: for now, the tree of discovered distributions and their plugins."""
    pm, fatal = _discover()
    print("dsh plugin tree", file=out)
    by_dist = sorted(pm.discovered, key=lambda d: (d.distribution or "", d.name))
    for i, d in enumerate(by_dist):
        last = i == len(by_dist) - 1
        print(
            f"{'└── ' if last else '├── '}{d.distribution or d.name} {d.version or ''}".rstrip(),
            file=out,
        )
        pad = "    " if last else "│   "
        print(f"{pad}└── entry point {d.name!r} -> {d.value}", file=out)
        for spec in d.plugins:
            print(f"{pad}    └── mounts {spec.name!r}", file=out)
    _print_failures(pm, out)
    if fatal:
        print(f"\ndiscovery failed: {fatal}", file=out)
    return 1 if pm.failures or fatal else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsh", description="dsh agent host")
    parser.add_argument("--version", action="version", version=f"dsh {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("plugins", help="list discovered plugins and load failures").set_defaults(
        run=cmd_plugins
    )
    sub.add_parser("demo", help="run the offline demo").set_defaults(run=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of the ``dsh`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    status: int = args.run(args, out or sys.stdout)
    return status


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
