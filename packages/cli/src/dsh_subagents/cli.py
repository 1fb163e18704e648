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

from . import _help, _sessions_args
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
    """The offline demo: one line about the discovered plugins; then the tour of the subagent
    seam (a coordinator on the scripted model through the real tools, one child an ACP
    process: ``dsh_subagents._demo``), or, when its distributions are not all installed, a
    note naming them and one plain offline turn. No network, no keys (unless ``--model
    openai:MODEL``). When the output closes, the tour (bounded) finishes unseen and the status
    is 141."""
    guarded = _Output(out)
    status = _demo_on(args, cast("TextIO", guarded))
    return EXIT_OUTPUT_CLOSED if guarded.gone else status


def _demo_on(args: argparse.Namespace, out: TextIO) -> int:
    import asyncio

    from dsh_core import DshError

    from . import _demo

    pm, fatal = _discover()
    dists = {d.distribution or d.name for d in pm.discovered}
    n = len(pm.discovered)
    print(
        f"{n} plugin{'s' * (n != 1)} from {len(dists)} distribution{'s' * (len(dists) != 1)} "
        "(`dsh-subagents plugins` lists them)",
        file=out,
    )
    _print_failures(pm, out)
    if fatal:
        print(f"\ndiscovery failed: {fatal}", file=out)
        return 1
    script, route = args.model or (None, None)
    missing = _demo.missing_tour_plugins(pm)
    if route is not None and "llm-openai" not in pm.collect_plugin_specs():
        missing.append("llm-openai (dsh-llm-openai)")
    prompt = args.prompt or _demo.DEFAULT_PROMPT
    if missing and route is not None:  # never an offline run in place of the model asked for
        wanted = sorted({m.split("(")[1].rstrip(")") for m in missing})
        print(
            f"dsh-subagents demo: error: --model {route} needs plugins that no installed "
            f"distribution mounts: {', '.join(missing)} (pip install {' '.join(wanted)})",
            file=sys.stderr,
        )
        return 2
    try:
        if missing:
            print(
                "\nthe tour of the subagent seam needs plugins that no installed distribution "
                "mounts: " + ", ".join(missing) + "; here is one plain offline turn instead",
                file=out,
            )
            status = asyncio.run(
                _demo.run_one_turn(out, script=script, prompt=args.prompt or _PROMPT)
            )
        else:
            store = _demo.demo_store(args.store)
            status = asyncio.run(
                _demo.run_tour(
                    out,
                    pm,
                    script=script,
                    prompt=prompt,
                    store=store,
                    model=route,
                    max_steps=args.max_steps,
                )
            )
    except DshError as exc:  # a script that cannot be read or is malformed, say
        print(f"dsh-subagents demo: error: {exc} [{exc.code}]", file=sys.stderr)
        return 2
    return 1 if pm.failures or status else 0


def _model(value: str) -> tuple[str | None, str | None]:
    """``--model``: ``scripted`` (the tour's embedded script), ``scripted:FILE`` (a script
    file) or ``openai:MODEL`` (a real model); ``(script, route)``."""
    kind, sep, rest = value.partition(":")
    if kind == "scripted" and not (sep and not rest):
        return (rest or None), None
    if kind == "openai" and rest:
        return None, value
    raise argparse.ArgumentTypeError(
        f"unknown model {value!r}: the demo runs on 'scripted' (its embedded script), "
        "'scripted:FILE' (a script file, see docs/scripted-model.md) or 'openai:MODEL' (a real "
        "model through an OpenAI-compatible endpoint: OPENAI_API_KEY, OPENAI_BASE_URL)"
    )


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    """One agent on the composed plugins until its tree settles: its answers streamed to
    ``out``, its tool calls and child runs shown as they happen (a live tree of the running
    children when ``out`` is a terminal). Exit status 0 when the root's last turn completed,
    1 when it did not, 2 when the run could not start (a bad file, flag or route), 124 at
    ``--timeout``, 130 on Ctrl-C, 141 when ``out`` closed."""
    import asyncio

    from dsh_core import DshError, make_plugin_manager

    from ._run import RunOptions, run_agent

    parser: argparse.ArgumentParser = args.run_parser
    prompt = _prompt_of(args, parser)
    if args.no_store and (args.resume is not None or args.latest):
        parser.error("--no-store keeps nothing to continue: drop it to use --resume or -c")
    if args.no_store and args.store is not None:
        parser.error("--store and --no-store contradict each other: give one")
    options = RunOptions(
        prompt=prompt,
        model=args.model,
        config=args.config,
        store=args.store,
        no_store=args.no_store,
        resume=args.resume,
        latest=args.latest,
        system=args.system,
        max_steps=args.max_steps,
        timeout=args.timeout,
        usage=args.usage,
        live=out is sys.stdout and _is_terminal(out),
        signals=out is sys.stdout,
    )
    pm = make_plugin_manager()
    try:
        status = asyncio.run(run_agent(options, pm, out))
    except DshError as exc:
        print(f"dsh-subagents run: error: {exc} [{exc.code}]", file=sys.stderr)
        return 2
    return status


#: The most a prompt read from standard input may hold (UTF-8 bytes).
_STDIN_LIMIT = 16 * 1024 * 1024


def _prompt_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """The prompt: the argument, or standard input for ``-`` or when no argument is given
    and standard input is not a terminal (a pipe). Empty is a usage error (CLI-21), and so
    is input that is not UTF-8."""
    prompt: str | None = args.prompt
    if prompt is None or prompt == "-":
        stdin = sys.stdin
        if prompt is None and (stdin is None or _is_terminal(stdin)):
            parser.error("the prompt is missing: give it as an argument, or '-' (or a pipe) to "
                         "read it from standard input")  # fmt: skip
        raw = stdin.buffer.read(_STDIN_LIMIT + 1) if stdin is not None else b""
        if len(raw) > _STDIN_LIMIT:
            parser.error(f"the prompt on standard input is longer than {_STDIN_LIMIT} bytes")
        try:
            prompt = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            parser.error(
                f"the prompt on standard input is not UTF-8 (byte 0x{raw[exc.start]:02x} at "
                f"offset {exc.start})"
            )
    if not prompt.strip():
        parser.error("the prompt is empty: say what the agent should do")
    return prompt


def _is_terminal(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except (OSError, ValueError):
        return False


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {value!r}")
    return n


def _seconds(value: str) -> float:
    try:
        n = float(value)
    except ValueError:
        n = 0.0
    if not 0 < n < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {value!r}")
    return n


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser(
        "run",
        help="run one agent on a prompt until its subagents settle",
        epilog=_help.RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "prompt",
        nargs="?",
        help="the user message; '-', or nothing with a pipe, reads it from standard input",
    )
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
    run.add_argument(
        "--system", metavar="TEXT", help="the system prompt's persona for this run's agents"
    )
    run.add_argument(
        "--max-steps",
        type=_positive_int,
        metavar="N",
        help="the most model requests one turn of an agent may take (default 100)",
    )
    run.add_argument(
        "--timeout",
        type=_seconds,
        metavar="SECONDS",
        help="stop the run after this long, as Ctrl-C does (exit status 124)",
    )
    run.add_argument(
        "-u", "--usage", action="store_true", help="print the tokens used, per turn and in all"
    )
    where = run.add_mutually_exclusive_group()
    where.add_argument(
        "-c",
        "--continue",
        dest="latest",
        action="store_true",
        help="continue the latest stored session",
    )
    where.add_argument(
        "--resume", metavar="ID", help="continue the stored session ID (a unique prefix will do)"
    )
    run.add_argument(
        "--store",
        metavar="DIR",
        help="keep the sessions as JSONL files under DIR "
        "(default: $DSH_SUBAGENTS_HOME/sessions, else ~/.dsh-subagents/sessions)",
    )
    run.add_argument("--no-store", action="store_true", help="keep the sessions in memory only")
    run.set_defaults(run=cmd_run, run_parser=run)


#: The subcommands as the command's usage lists them.
_COMMANDS = "{plugins,demo,run,sessions}"


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command's parser. With ``command="run"``, for arguments that begin with ``run``,
    only the ``run`` subcommand is added: what parses those arguments is that subparser
    alone (same name, same prog), so the outcome is the same, and making the other
    subcommands' parsers was a measurable part of a run's start (CLI-102)."""
    parser = argparse.ArgumentParser(
        prog="dsh-subagents",
        description="Run agents that delegate work to subagents, and tour the subagent seam.",
        epilog=_help.MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dsh-subagents {__version__}")
    if command == "run":  # the usage of an error in the arguments names every command
        sub = parser.add_subparsers(dest="command", required=True, metavar=_COMMANDS)
        _add_run(sub)
        return parser
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "plugins",
        help="list discovered plugins and load failures",
        description="List every discovered plugin: its entry point, distribution and version, "
        "and what it mounts; then every plugin that failed to load.",
        epilog=_help.PLUGINS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).set_defaults(run=cmd_plugins)
    demo = sub.add_parser(
        "demo",
        help="the offline tour of the subagent seam",
        description=_help.paragraphs(
            "A coordinator agent plans a weekend through the real model-facing tools: "
            "continuable children, reports, a cold resume, a fork child, a child in another "
            "process over ACP.",
            f"The default model is {_help.SCRIPTED}.",
        ),
        epilog=_help.DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument(
        "--model",
        type=_model,
        default=None,
        metavar="MODEL",
        help="'scripted' (the default): the tour's embedded script; 'scripted:FILE': a "
        "TOML or JSON script file (docs/scripted-model.md); 'openai:MODEL': a real model "
        "for the coordinator and its children, through an OpenAI-compatible endpoint "
        "(OPENAI_API_KEY, OPENAI_BASE_URL)",
    )
    demo.add_argument(
        "--prompt",
        default=None,
        help="the coordinator's user message",
    )
    demo.add_argument(
        "--max-steps",
        type=_positive_int,
        metavar="N",
        help="the coordinator's step limit per turn (default 100): a script that loops stops",
    )
    demo.add_argument(
        "--store",
        metavar="DIR",
        help="keep the tour's sessions as JSONL files under DIR "
        "(default: $DSH_SUBAGENTS_HOME/demo, else ~/.dsh-subagents/demo)",
    )
    demo.set_defaults(run=cmd_demo)
    _add_run(sub)
    _sessions_args.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of the ``dsh-subagents`` console script; returns the exit status.

    Arguments that are not UTF-8 exit 2 (argparse's usage error) before anything runs.
    With ``out`` unset the process's own streams are used, made safe for the terminal.
    """
    if out is None:
        _terminal_safe()
    checked, bad = _utf8_args(sys.argv[1:] if argv is None else argv, from_os=argv is None)
    parser = _parser("run" if bad is None and checked[:1] == ["run"] else None)
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
