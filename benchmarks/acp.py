"""ACP benchmark: what a child over the Agent Client Protocol costs.

Three figures, each against the bare SDK doing the same work:

1. **spawn-to-ready**: spawn ``dsh-acp-agent`` (echo model, memory store), ``initialize`` and
   ``session/new`` answered, driven by the SDK's client; against an agent written with the SDK
   alone (echo, ~30 lines). ``--spawns`` pairs, one spawn of each per pair, the order flipped
   every pair; the median of each and of the pairs' ratios. Beside it, the import times
   (``imports``): (a) the wall time of a fresh interpreter that imports nothing, the SDK,
   dsh-core, or all that the server needs (each a total, measured in alternation, median of
   ``--spawns``), and (b) inside one interpreter, what each import adds to the ones before it
   (the SDK, then dsh-core, then the server), so the increments add up.
2. **per-prompt round trip** on a warm child: dsh-acp-agent and the SDK-only agent both
   spawned and warm, then pairs of blocks of N sequential ``session/prompt`` calls, one block
   on each, in alternating order; ms per prompt (median block), each agent process's own CPU
   per prompt beside it (Linux), and the median of the pairs' ratios with their spread. Both
   children live throughout, so what slows the machine for a while slows both sides of a
   pair alike.
3. **concurrent children**: ``--children`` one-shot ``acp`` runs started at once through
   ``ctx.subagents.start()`` (spawn, prompt, answer, dispose), each a dsh-acp-agent process;
   the median wall time of ``--batches`` such batches, one after another.

    python benchmarks/acp.py                     # all three
    python benchmarks/acp.py --prompts 500 --children 20 --spawns 5
    python benchmarks/acp.py --only prompts --prompts 200 --rounds 30
        # the per-prompt figure alone: 30 pairs of 200-prompt blocks
    python benchmarks/acp.py --only prompts --warm 10000
        # per prompt on a long session: 10,000 prompts answered before the timed ones

The figures depend on the machine (most of spawn-to-ready is the SDK's import); compare runs
made on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# This file is named like the SDK's module: run as a script, its folder heads sys.path and
# `import acp` would import it. Take the folder out before anything imports the SDK.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

#: An ACP agent on the SDK alone, doing what dsh-acp-agent does on the echo model.
RAW_AGENT = """
import asyncio, uuid
import acp
from acp.schema import AgentCapabilities, InitializeResponse, NewSessionResponse, PromptResponse

class Echo:
    def on_connect(self, conn):
        self.conn = conn
    async def initialize(self, protocol_version, client_capabilities=None, client_info=None, **kw):
        return InitializeResponse(protocol_version=1, agent_capabilities=AgentCapabilities())
    async def new_session(self, cwd, mcp_servers=None, **kw):
        return NewSessionResponse(session_id=uuid.uuid4().hex)
    async def prompt(self, session_id, prompt, **kw):
        text = "".join(getattr(b, "text", "") for b in prompt)
        await self.conn.session_update(
            session_id=session_id, update=acp.update_agent_message_text(text)
        )
        return PromptResponse(stop_reason="end_turn")
    async def cancel(self, session_id, **kw):
        pass

asyncio.run(acp.run_agent(Echo()))
"""


class _Sink:
    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        pass

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


#: What a fresh interpreter imports, for the totals: a label and its statement.
IMPORTS = (
    ("nothing (the bare interpreter)", "pass"),
    ("acp (the SDK)", "import acp"),
    ("dsh_core", "import dsh_core"),
    (
        "acp, dsh_core and the server",
        "import acp, dsh_core, dsh_core.plugin, dsh_acp_agent._server",
    ),
)

#: Increments inside one interpreter: each import after the ones above it.
STEPS = """
import json, time
out = []
for name in ("acp", "dsh_core", "dsh_core.plugin", "dsh_acp_agent._server"):
    t = time.perf_counter()
    __import__(name)
    out.append(time.perf_counter() - t)
print(json.dumps(out))
"""


def _import_totals(runs: int) -> list[float]:
    """Median wall seconds of a fresh interpreter for each of :data:`IMPORTS`; the statements
    run in alternation (``runs`` rounds, the order rotated each round)."""
    times: list[list[float]] = [[] for _ in IMPORTS]
    for i in range(runs):
        first = i % len(IMPORTS)
        for k in (*range(first, len(IMPORTS)), *range(first)):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-P", "-c", IMPORTS[k][1]], check=True)
            times[k].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def _import_steps(runs: int) -> list[float]:
    """Median seconds each of the :data:`STEPS` imports adds, over ``runs`` interpreters."""
    found = [
        json.loads(
            subprocess.run(
                [sys.executable, "-P", "-c", STEPS], check=True, capture_output=True, text=True
            ).stdout
        )
        for _ in range(runs)
    ]
    return [statistics.median(run[i] for run in found) for i in range(len(found[0]))]


async def _ready(command: list[str]) -> tuple[float, Any]:
    import acp

    start = time.perf_counter()
    async with acp.spawn_agent_process(_Sink(), command[0], *command[1:], env=dict(os.environ)) as (
        conn,
        _,
    ):
        await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        await conn.new_session(cwd=os.getcwd(), mcp_servers=[])
        ready = time.perf_counter() - start
    return ready, None


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process has used (Linux ``/proc``; ``None`` elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Child:
    """A spawned agent with one warm session: ``block(n)`` times ``n`` sequential prompts."""

    def __init__(self, conn: Any, process: Any, sid: str) -> None:
        self.conn = conn
        self.pid = process.pid
        self.sid = sid
        self.prompt = [_text_block("ping")]
        self.walls: list[float] = []  # ms per prompt, one per block
        self.cpu = 0.0  # the process's CPU seconds over the timed blocks (Linux)
        self.timed = 0

    async def block(self, n: int) -> float:
        cpu_start = _cpu_seconds(self.pid)
        start = time.perf_counter()
        for _ in range(n):
            await self.conn.prompt(session_id=self.sid, prompt=self.prompt)
        wall = (time.perf_counter() - start) * 1000 / n
        cpu_end = _cpu_seconds(self.pid)
        if cpu_start is not None and cpu_end is not None:
            self.cpu += cpu_end - cpu_start
        self.timed += n
        self.walls.append(wall)
        return wall


def _text_block(text: str) -> Any:
    import acp

    return acp.text_block(text)


async def _both(
    ours: list[str], raw: list[str], prompts: int, warm: int, rounds: int
) -> tuple[_Child, _Child, list[float]]:
    """Both agents spawned and warmed (``warm`` prompts each), then ``rounds`` pairs of
    ``prompts``-prompt blocks, one on each, the order flipped every pair. Both stay alive
    throughout, so the machine's slow drifts (another job, a VM neighbour, frequency) fall on
    both sides of a pair alike; returns the children and every pair's ratio."""
    import acp

    async with contextlib.AsyncExitStack() as stack:
        children = []
        for command in (ours, raw):
            conn, process = await stack.enter_async_context(
                acp.spawn_agent_process(_Sink(), command[0], *command[1:], env=dict(os.environ))
            )
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            sid = (await conn.new_session(cwd=os.getcwd(), mcp_servers=[])).session_id
            child = _Child(conn, process, sid)
            for _ in range(warm):
                await conn.prompt(session_id=sid, prompt=child.prompt)
            children.append(child)
        dsh, sdk = children
        ratios = []
        for i in range(rounds):
            first, second = (dsh, sdk) if i % 2 == 0 else (sdk, dsh)
            a = await first.block(prompts)
            b = await second.block(prompts)
            ratios.append(a / b if first is dsh else b / a)
    return dsh, sdk, ratios


async def _children(n: int) -> tuple[float, int]:
    """Wall seconds for ``n`` concurrent one-shot acp runs, and how many completed."""
    import dsh_subagent.plugin
    import dsh_subagent_acp.plugin
    from dsh_core import SessionMeta, text_blocks
    from dsh_core.testing import scripted_host
    from dsh_subagent import SUBAGENTS, SubagentStartRequest

    config = {
        "command": sys.executable,
        "args": ["-P", "-m", "dsh_acp_agent"],
        # n children importing at once on a small or busy machine can take longer than the
        # default 30 s to answer; this measures their wall time, not the provider's timeout
        "start_timeout_ms": 600_000,
    }
    modules = {"subagent": dsh_subagent.plugin, "subagent-acp": dsh_subagent_acp.plugin}
    async with scripted_host(
        "subagent", "subagent-acp", modules=modules, config={"subagent-acp": config}
    ) as host:
        handle = await host.create_agent(meta=SessionMeta(cwd=os.getcwd()))
        service = handle.agent.ctx[SUBAGENTS]

        async def one(i: int) -> str:
            request = SubagentStartRequest(prompt=text_blocks(f"task {i}"), parent=handle.agent)
            run = await service.start("acp", request)
            try:
                return (await run.result).stop_reason
            finally:
                await run.dispose()

        import acp  # noqa: F401  (the provider's first start imports it: not billed below)

        start = time.perf_counter()
        reasons = await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - start
        await handle.dispose()
    return wall, sum(r == "completed" for r in reasons)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--spawns", type=int, default=5, help="spawn-to-ready pairs (and import samples)"
    )
    parser.add_argument(
        "--prompts", type=int, default=200, help="sequential prompts per timed block"
    )
    parser.add_argument("--children", type=int, default=20, help="concurrent acp children")
    parser.add_argument("--batches", type=int, default=3, help="batches of --children (median)")
    parser.add_argument(
        "--only",
        choices=("imports", "spawn", "prompts", "children"),
        action="append",
        help="run only these parts (repeatable; default: all)",
    )
    parser.add_argument("--warm", type=int, default=20, help="prompts before the timed ones")
    parser.add_argument(
        "--rounds", type=int, default=15, help="pairs of per-prompt blocks (alternating)"
    )
    args = parser.parse_args()
    parts = set(args.only or ("imports", "spawn", "prompts", "children"))

    with tempfile.TemporaryDirectory() as tmp:
        raw_script = Path(tmp) / "raw_agent.py"
        raw_script.write_text(RAW_AGENT, encoding="utf-8")
        # -P: no script or working folder on sys.path, where this file would shadow the SDK
        ours = [sys.executable, "-P", "-m", "dsh_acp_agent"]
        raw = [sys.executable, "-P", str(raw_script)]

        if "imports" in parts:
            _imports(args.spawns)
        if "spawn" in parts:
            _spawns(ours, raw, args.spawns)
        if "prompts" in parts:
            _per_prompt(ours, raw, args.prompts, args.warm, args.rounds)
        if "children" in parts:
            runs = [asyncio.run(_children(args.children)) for _ in range(args.batches)]
            walls = sorted(wall for wall, _ in runs)
            print(
                f"\n{args.children} concurrent acp children (spawn, prompt, answer, dispose; "
                f"median of {args.batches} batches):"
            )
            print(
                f"  wall                   {statistics.median(walls) * 1000:7.0f} ms "
                f"({walls[0] * 1000:.0f} to {walls[-1] * 1000:.0f}; "
                f"{sum(done for _, done in runs)} of {args.children * args.batches} completed)"
            )


def _imports(runs: int) -> None:
    totals = _import_totals(runs)
    print(f"imports, (a) a fresh interpreter's wall time, start to exit (median of {runs}):")
    for k, ((label, _), total) in enumerate(zip(IMPORTS, totals, strict=True)):
        more = f" ({(total - totals[0]) * 1000:+.0f} ms over nothing)" if k else ""
        print(f"  importing {label:<31} {total * 1000:7.0f} ms{more}")
    steps = _import_steps(runs)
    print(f"imports, (b) in one interpreter, each after the ones above it (median of {runs}):")
    for name, step in zip(
        ("acp (the SDK)", "dsh_core", "dsh_core.plugin", "the server"), steps, strict=True
    ):
        print(f"  + {name:<39} {step * 1000:7.0f} ms")
    print(f"  = {'all of them':<39} {sum(steps) * 1000:7.0f} ms")


def _spawns(ours: list[str], raw: list[str], spawns: int) -> None:
    """``spawns`` pairs, one spawn of each agent per pair, the order flipped every pair."""
    mine: list[float] = []
    theirs: list[float] = []
    for i in range(spawns):
        if i % 2 == 0:
            mine.append(asyncio.run(_ready(ours))[0])
            theirs.append(asyncio.run(_ready(raw))[0])
        else:
            theirs.append(asyncio.run(_ready(raw))[0])
            mine.append(asyncio.run(_ready(ours))[0])
    ratios = sorted(a / b for a, b in zip(mine, theirs, strict=True))
    print(f"\nspawn-to-ready (initialize + session/new; {spawns} alternating pairs, medians):")
    print(f"  dsh-acp-agent          {statistics.median(mine) * 1000:7.0f} ms")
    print(f"  SDK-only echo agent    {statistics.median(theirs) * 1000:7.0f} ms")
    print(
        f"  ratio                  {statistics.median(ratios):7.2f}x (pairs: {ratios[0]:.2f} to "
        f"{ratios[-1]:.2f})"
    )


def _per_prompt(ours: list[str], raw: list[str], prompts: int, warm: int, rounds: int) -> None:
    """Alternating blocks on two live children (see :func:`_both`): medians and ratios."""
    dsh, sdk, ratios = asyncio.run(_both(ours, raw, prompts, warm, rounds))
    ratios.sort()
    print(
        f"\nper-prompt round trip on a warm child ({rounds} pairs of {prompts}-prompt blocks, "
        f"after {warm}):"
    )
    for name, child in (("dsh-acp-agent      ", dsh), ("SDK-only echo agent", sdk)):
        # The agent process's own CPU per prompt (the client's is the same on both sides).
        cpu = f" (agent CPU {child.cpu * 1000 / child.timed:.3f} ms)" if child.cpu else ""
        print(f"  {name}    {statistics.median(child.walls):7.3f} ms{cpu}")
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    print(
        f"  ratio                  {statistics.median(ratios):7.2f}x (pairs: min {ratios[0]:.2f},"
        f" quartiles {quartiles[0]:.2f} / {quartiles[2]:.2f}, max {ratios[-1]:.2f})"
    )


if __name__ == "__main__":
    main()
