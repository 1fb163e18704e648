"""The ``sessions`` command's arguments (``list``, ``show``, ``tree``), apart from the commands.

Every command's parser is built at each start, ``run`` included; the commands themselves
(:mod:`dsh_subagents._sessions`: reading and printing stored logs) are imported only by the
one that runs them (CLI-100).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TextIO

__all__ = ["add_parser"]


def _command(name: str) -> Callable[[argparse.Namespace, TextIO], int]:
    """The ``sessions`` command ``name`` of :mod:`dsh_subagents._sessions`, imported when run."""

    def run(args: argparse.Namespace, out: TextIO) -> int:
        from . import _sessions

        command: Callable[[argparse.Namespace, TextIO], int] = _sessions._run(
            getattr(_sessions, name)
        )
        return command(args, out)

    return run


def _count(value: str) -> int:
    """``-n``: a whole number, 0 or more."""
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of sessions (0: all)")
    return int(value)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``sessions`` (``list``, ``show``, ``tree``) to the command's subparsers."""
    sessions = sub.add_parser(
        "sessions",
        help="list, show and walk stored sessions",
        description="Browse the sessions stored as JSONL files (default: "
        "$DSH_SUBAGENTS_HOME/sessions, else ~/.dsh-subagents/sessions).",
        epilog="examples:\n  dsh-subagents sessions list\n  dsh-subagents sessions show 3fa9\n"
        "  dsh-subagents sessions show 3fa9 --children\n  dsh-subagents sessions tree 3fa9 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = sessions.add_subparsers(dest="sessions_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--store",
            metavar="DIR",
            help="the sessions folder (default: $DSH_SUBAGENTS_HOME/sessions, else "
            "~/.dsh-subagents/sessions)",
        )
        p.add_argument("--json", action="store_true", help="print JSON (docs/sessions.md)")

    listing = which.add_parser(
        "list", help="root sessions, newest first: id, when, model, turns, children, tokens"
    )
    common(listing)
    listing.add_argument(
        "-n",
        "--limit",
        type=_count,
        default=20,
        metavar="N",
        help="show the newest N root sessions (default 20; 0 for all)",
    )
    listing.add_argument("--all", action="store_true", help="show every root session")
    listing.set_defaults(run=_command("cmd_list"))
    show = which.add_parser("show", help="a session's transcript (ID or a unique prefix)")
    common(show)
    show.add_argument("id", metavar="ID", help="a session id or a unique prefix of one")
    show.add_argument(
        "--children", action="store_true", help="show the children's transcripts inline"
    )
    show.set_defaults(run=_command("cmd_show"))
    tree = which.add_parser(
        "tree", help="a session's subagents: label, provider, mode, status, epochs"
    )
    common(tree)
    tree.add_argument("id", metavar="ID", help="a session id or a unique prefix of one")
    tree.set_defaults(run=_command("cmd_tree"))
