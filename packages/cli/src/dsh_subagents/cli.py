"""The ``dsh-subagents`` command line.

``dsh-subagents plugins`` lists every discovered plugin with its distribution and version, and
every one that failed to load (exit status 1 then). ``dsh-subagents demo`` runs the offline
demo: the tour of the subagent seam on the embedded script or, with ``--model scripted:FILE``,
on a script file (docs/scripted-model.md); its sessions go to ``--store DIR`` (default
``$DSH_SUBAGENTS_HOME/demo``).
``dsh-subagents run "prompt"`` runs one agent on the composed plugins and streams its answer
(docs/configuration.md).

At the process boundary (ROB-40..ROB-44): command-line arguments that are not UTF-8 are a
usage error (exit 2) before anything runs; standard output and error replace what the
terminal's encoding cannot carry instead of raising; an output that closes
(``dsh-subagents run | head``) ends the command quietly with status 141, as a shell reports a
process that SIGPIPE ended.
"""

from __future__ import annotations

import argparse
import codecs
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO, cast

from . import _sessions
from .__about__ import __version__

if TYPE_CHECKING:  # dsh-core is imported by the commands that run it: `sessions` does not
    from dsh_core import DshPluginManager

__all__ = ["main"]

_PROMPT = "hello from the demo"
#: The exit status when the output closed under us: 128 + SIGPIPE, what a shell reports.
EXIT_OUTPUT_CLOSED = 141
#: The error handler the terminal streams use: U+FFFD on a UTF-8 stream (a lone surrogate),
#: ``?`` elsewhere (an ASCII terminal, say).
_REPLACE = "dsh-replace"
_FFFD = "\ufffd".encode()


def _replace(exc: UnicodeError) -> tuple[str | bytes, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    n = exc.end - exc.start
    # The UTF-8 encoder takes a replacement as bytes (as text it must be ASCII).
    return (_FFFD * n if codecs.lookup(exc.encoding).name == "utf-8" else "?" * n), exc.end


codecs.register_error(_REPLACE, _replace)
#: Error handlers that never fail to encode.
_LENIENT = frozenset(
    {_REPLACE, "replace", "backslashreplace", "xmlcharrefreplace", "namereplace", "ignore"}
)


def _terminal_safe() -> None:
    """Standard output and error replace what their encoding cannot carry (their reader is
    a terminal or a pipe: text only goes out, so a replacement loses nothing the log keeps).
    A stream whose handler never fails (stderr's ``backslashreplace``) keeps it; ``strict``
    and UTF-8 mode's ``surrogateescape`` (which fails on a surrogate it did not make) are
    replaced."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) not in _LENIENT:
            try:
                reconfigure(errors=_REPLACE)
            except (ValueError, OSError):  # a closed or exotic stream: leave it
                pass


def _utf8_args(argv: Sequence[str], from_os: bool) -> tuple[list[str], str | None]:
    """The arguments as text, or why one is not UTF-8. Arguments from the OS are checked as
    the bytes they were (``os.fsencode`` undoes the interpreter's decoding, whatever the
    locale); arguments given in-process must encode as UTF-8 (no lone surrogate)."""
    args: list[str] = []
    for i, arg in enumerate(argv, 1):
        try:
            raw = os.fsencode(arg) if from_os else arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            return args, (
                f"argument {i} is not text that can be encoded as UTF-8 (character "
                f"{arg[exc.start]!a} at offset {exc.start} of {arg!a})"
            )
        try:
            args.append(raw.decode("utf-8") if from_os else arg)
        except UnicodeDecodeError as exc:
            return args, (
                f"argument {i} is not UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
                f"{exc.start} of {raw!a})"
            )
    return args, None


def _discover() -> tuple[DshPluginManager, str | None]:
    from dsh_core import PluginError, make_plugin_manager

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
        print(f"  {f.describe()}", file=out)


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


class _Output:
    """A command's output that a closed reader cannot break: the first write that finds it
    closed marks it (:attr:`gone`) and every later write is a no-op, so the listeners that
    print the demo's transcript never raise into the host (ROB-44)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._out.write(text)
            except BrokenPipeError:
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._out.flush()
            except BrokenPipeError:
                self.gone = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._out, name)


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    """The offline demo: the tree of discovered plugins; then the tour of the subagent seam (a
    coordinator on the scripted model through the real tools, ``dsh_subagents._demo``), or, when
    its distributions are not all installed, a note naming them and one plain offline turn;
    then the ACP child when it can run. No network, no keys. When the output closes, the
    tour (a bounded script) finishes unseen, the ACP child is skipped, and the status is 141."""
    guarded = _Output(out)
    status = _demo_on(args, cast("TextIO", guarded))
    return EXIT_OUTPUT_CLOSED if guarded.gone else status


def _demo_on(args: argparse.Namespace, out: TextIO) -> int:
    import asyncio

    from dsh_core import DshError

    from . import _demo

    pm, fatal = _discover()
    print("dsh-subagents plugin tree", file=out)
    by_dist = sorted(pm.discovered, key=lambda d: (d.distribution or "", d.name))
    for i, d in enumerate(by_dist):
        last = i == len(by_dist) - 1
        label = f"{d.distribution or d.name} {d.version or ''}".rstrip()
        print(f"{'└── ' if last else '├── '}{label}", file=out)
        pad = "    " if last else "│   "
        print(f"{pad}└── entry point {d.name!r} -> {d.value}", file=out)
        for j, spec in enumerate(d.plugins):
            branch = "└── " if j == len(d.plugins) - 1 else "├── "
            print(f"{pad}    {branch}mounts {spec.name!r}", file=out)
    _print_failures(pm, out)
    if fatal:
        print(f"\ndiscovery failed: {fatal}", file=out)
        return 1
    missing = _demo.missing_tour_plugins(pm)
    prompt = args.prompt or _demo.DEFAULT_PROMPT
    try:
        if missing:
            print(
                "\nthe tour of the subagent seam needs plugins that no installed distribution "
                "mounts: " + ", ".join(missing) + "; here is one plain offline turn instead",
                file=out,
            )
            status = asyncio.run(
                _demo.run_one_turn(out, script=args.script, prompt=args.prompt or _PROMPT)
            )
        else:
            store = _demo.demo_store(args.store)
            status = asyncio.run(
                _demo.run_tour(out, pm, script=args.script, prompt=prompt, store=store)
            )
    except DshError as exc:  # a script that cannot be read or is malformed, say
        print(f"dsh-subagents demo: error: {exc} [{exc.code}]", file=sys.stderr)
        return 2
    if not status and not getattr(out, "gone", False) and _demo.acp_child_available(pm):
        acp_prompt = args.prompt or _PROMPT
        status = asyncio.run(_demo.run_acp_child(out, pm, prompt=acp_prompt))
    return 1 if pm.failures or status else 0


def _model(value: str) -> str | None:
    """``--model``: ``scripted`` (the echo model) or ``scripted:FILE``; the script's path."""
    kind, sep, path = value.partition(":")
    if kind != "scripted" or (sep and not path):
        raise argparse.ArgumentTypeError(
            f"unknown model {value!r}: the demo runs on 'scripted' (echo) or 'scripted:FILE' "
            "(a script file, see docs/scripted-model.md)"
        )
    return path or None


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    """One agent on the composed plugins: its answer streamed to ``out``, its tool calls and
    child runs shown as they happen. Exit status 0 when the turn completed, 1 when it did
    not, 2 when the run could not start (a bad file, flag or route), 130 on Ctrl-C, 141 when
    ``out`` closed (the run was cancelled on the first write that found it closed)."""
    import asyncio

    from dsh_core import DshError, make_plugin_manager

    from ._run import RunOptions, run_agent

    options = RunOptions(
        prompt=args.prompt,
        model=args.model,
        config=args.config,
        store=args.store,
        resume=args.resume,
    )
    pm = make_plugin_manager()
    try:
        status = asyncio.run(run_agent(options, pm, out))
    except DshError as exc:
        print(f"dsh-subagents run: error: {exc} [{exc.code}]", file=sys.stderr)
        return 2
    return status


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run one agent on a prompt and stream its answer")
    run.add_argument("prompt", help="the user message")
    run.add_argument(
        "--model",
        metavar="PROVIDER[:MODEL]",
        help="the model route, e.g. openai:deepseek-chat; 'scripted' echoes and "
        "'scripted:FILE' answers from a script (default: the first row of the composition "
        "that sets `model`, else 'scripted')",
    )
    run.add_argument(
        "--config", metavar="FILE", help="the composition, a TOML file (docs/configuration.md)"
    )
    run.add_argument("--store", metavar="DIR", help="keep the session as JSONL files under DIR")
    run.add_argument("--resume", metavar="ID", help="continue the stored session ID")
    run.set_defaults(run=cmd_run)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsh-subagents", description="run agents that delegate to subagents"
    )
    parser.add_argument("--version", action="version", version=f"dsh-subagents {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("plugins", help="list discovered plugins and load failures").set_defaults(
        run=cmd_plugins
    )
    demo = sub.add_parser("demo", help="run the offline demo")
    demo.add_argument(
        "--model",
        dest="script",
        type=_model,
        default=None,
        metavar="scripted[:FILE]",
        help="the offline model: 'scripted' (the default) is the demo's embedded script; "
        "'scripted:FILE' answers from a TOML or JSON script (docs/scripted-model.md)",
    )
    demo.add_argument(
        "--prompt",
        default=None,
        help="the coordinator's user message (and the ACP child's prompt)",
    )
    demo.add_argument(
        "--store",
        metavar="DIR",
        help="keep the tour's sessions as JSONL files under DIR "
        "(default: $DSH_SUBAGENTS_HOME/demo, else ~/.dsh-subagents/demo)",
    )
    demo.set_defaults(run=cmd_demo)
    _add_run(sub)
    _sessions.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of the ``dsh-subagents`` console script; returns the exit status.

    Arguments that are not UTF-8 exit 2 (argparse's usage error) before anything runs.
    With ``out`` unset the process's own streams are used, made safe for the terminal.
    """
    if out is None:
        _terminal_safe()
    parser = _parser()
    checked, bad = _utf8_args(sys.argv[1:] if argv is None else argv, from_os=argv is None)
    if bad is not None:
        parser.error(bad)
    args = parser.parse_args(checked)
    stream = out or sys.stdout
    try:
        status: int = args.run(args, stream)
    except KeyboardInterrupt:  # Ctrl-C: whatever ran was cancelled and closed on the way out
        print(f"\ndsh-subagents {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`dsh-subagents plugins | head -1`): quietly
        status = EXIT_OUTPUT_CLOSED
    if status == EXIT_OUTPUT_CLOSED and out is None:
        _drop_stdout()
    return status


def _drop_stdout() -> None:
    """Point file descriptor 1 at the null device, so the interpreter's last flush of what
    is still buffered for the closed pipe cannot print an ignored ``BrokenPipeError``."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
