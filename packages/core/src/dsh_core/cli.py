"""The ``dsh`` command line.

``dsh plugins`` lists every discovered plugin with its distribution and version, and every one
that failed to load (exit status 1 then). ``dsh demo`` runs the offline demo, on the embedded
echo model or, with ``--model scripted:FILE``, on a script file (docs/scripted-model.md).
``dsh run "prompt"`` runs one agent on the composed plugins and streams its answer
(docs/configuration.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from .__about__ import __version__
from ._errors import DshError
from ._plugins import DshPluginManager, PluginError, make_plugin_manager

__all__ = ["main"]

_PROMPT = "hello from the demo"


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


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    """The offline demo: the tree of discovered plugins, then one real turn of an agent on the
    embedded scripted model (no network, no keys), with its durable log."""
    pm, fatal = _discover()
    print("dsh plugin tree", file=out)
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
    try:
        status = asyncio.run(_demo_turn(out, script=args.script, prompt=args.prompt))
    except DshError as exc:  # a script that cannot be read or is malformed, say
        print(f"dsh demo: error: {exc} [{exc.code}]", file=sys.stderr)
        return 2
    if not status and _acp_child_available(pm):
        status = asyncio.run(_demo_acp_child(out, pm, prompt=args.prompt))
    return 1 if pm.failures or status else 0


def _acp_child_available(pm: DshPluginManager) -> bool:
    """Whether the ACP child can run: the ``acp`` provider and ``dsh-acp-agent`` installed."""
    import importlib.util

    specs = pm.collect_plugin_specs()
    return (
        "subagent" in specs
        and "subagent-acp" in specs
        and importlib.util.find_spec("dsh_acp_agent") is not None
    )


async def _demo_acp_child(out: TextIO, pm: DshPluginManager, *, prompt: str) -> int:
    """Delegate ``prompt`` to an ACP child: a ``dsh-acp-agent`` process on the echo model,
    through the ``acp`` provider; 1 if it did not complete."""
    import importlib

    from ._agent import AgentOptions, CreateAgentOptions
    from ._content import blocks_text, text_blocks
    from ._events import SessionMeta
    from ._host import PluginRow, boot_host

    subagent = importlib.import_module("dsh_subagent")
    child = PluginRow(
        plugin="subagent-acp",
        config={"command": sys.executable, "args": ["-m", "dsh_acp_agent"]},
    )
    rows: list[PluginRow | str] = ["sessions", "session-persistence-memory", "llm",
            "llm-scripted", "tools", "system-prompt", "agents", "subagent", child]  # fmt: skip
    print("\none ACP child (a dsh-acp-agent process, over the Agent Client Protocol):", file=out)
    async with await boot_host(rows, pm=pm) as host:
        handle = await host.ctx.agents.create(
            CreateAgentOptions(
                meta=SessionMeta(cwd=os.getcwd()),
                agent_options=AgentOptions(provider="scripted", model="echo"),
            )
        )
        request = subagent.SubagentStartRequest(prompt=text_blocks(prompt), parent=handle.agent)
        run = await host.ctx.subagents.start("acp", request)
        try:
            result = await run.result
        finally:
            await run.dispose()
        print(f"  parent    > {prompt}", file=out)
        print(f"  acp child > {blocks_text(result.output)}  [pid {run.pid}]", file=out)
        print(f"  stop reason {result.stop_reason}; the process has exited", file=out)
        await handle.dispose()
    return 0 if result.stop_reason == "completed" else 1


def _model(value: str) -> str | None:
    """``--model``: ``scripted`` (the echo model) or ``scripted:FILE``; the script's path."""
    kind, sep, path = value.partition(":")
    if kind != "scripted" or (sep and not path):
        raise argparse.ArgumentTypeError(
            f"unknown model {value!r}: the demo runs on 'scripted' (echo) or 'scripted:FILE' "
            "(a script file, see docs/scripted-model.md)"
        )
    return path or None


async def _demo_turn(out: TextIO, *, script: str | None = None, prompt: str = _PROMPT) -> int:
    """Boot the core plugins on the scripted model (echo, or ``script``) and run one turn;
    1 if anything broke."""
    from . import plugin as core_plugin
    from ._agent import AgentOptions, CreateAgentOptions
    from ._content import user_message
    from ._events import SessionMeta
    from ._host import PluginRow, boot_host

    pm = make_plugin_manager(autoload=False, plugins={"core": core_plugin})
    model = PluginRow(plugin="llm-scripted", config={"script": script} if script else {})
    rows: list[PluginRow | str] = ["sessions", "session-persistence-memory", "llm", model, "tools",
            "system-prompt", "agents", "jobs", "invariants"]  # fmt: skip
    async with await boot_host(rows, pm=pm) as host:
        handle = await host.ctx.agents.create(
            CreateAgentOptions(
                meta=SessionMeta(cwd=os.getcwd()),
                agent_options=AgentOptions(provider="scripted", model="echo"),
            )
        )
        agent = handle.agent
        what = f"the script {script}" if script else "the embedded scripted model echoes"
        print(f"\none offline turn ({what}):", file=out)
        print(f"  user      > {prompt}", file=out)
        agent.followup(user_message(prompt))
        await agent.when_idle()
        print(f"  assistant > {agent.session.derive_messages()[-1].text}", file=out)
        print(f"  session {agent.id}: {agent.session.seq} durable events", file=out)
        print(f"    {', '.join(e.type for e in agent.session.events)}", file=out)
        await handle.dispose()
        broken = list(host.ctx.invariants.violations)
    for v in broken:
        print(f"  invariant broken: {v}", file=out)
    return 1 if broken else 0


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    """One agent on the composed plugins: its answer streamed to ``out``, its tool calls and
    child runs shown as they happen. Exit status 0 when the turn completed, 1 when it did
    not, 2 when the run could not start (a bad file, flag or route), 130 on Ctrl-C."""
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
        print(f"dsh run: error: {exc} [{exc.code}]", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ndsh run: interrupted", file=sys.stderr)
        return 130
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
    parser = argparse.ArgumentParser(prog="dsh", description="dsh agent host")
    parser.add_argument("--version", action="version", version=f"dsh {__version__}")
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
        help="the offline model: 'scripted' echoes (the default); 'scripted:FILE' answers "
        "from a TOML or JSON script (docs/scripted-model.md)",
    )
    demo.add_argument("--prompt", default=_PROMPT, help="the user message of the demo turn")
    demo.set_defaults(run=cmd_demo)
    _add_run(sub)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of the ``dsh`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    status: int = args.run(args, out or sys.stdout)
    return status


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
