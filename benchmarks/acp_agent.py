"""The ACP agent process's own cost per prompt, deterministic enough to compare two trees.

A plain blocking client (no SDK, no event loop: its own cost is small and the same on both
sides) spawns one agent, ``dsh-acp-agent`` (echo model, memory store, or ``--config``) or
the SDK-only echo agent of ``acp.py``, sends ``initialize``, ``session/new`` and ``--warm``
prompts, then ``--prompts`` sequential ``session/prompt`` calls, reading every frame (each
prompt's ``session/update`` and its answer), and closes the agent's stdin.

It prints the agent process's CPU per timed prompt (``/proc``, Linux). ``--wrap`` runs the
agent under a command (``valgrind --tool=callgrind ...``): ``instructions.sh TREE agent``
counts the agent's instructions per prompt as the difference of two runs of different
lengths, so start-up and imports cancel out.

    python benchmarks/acp_agent.py --agent dsh --prompts 5000
    python benchmarks/acp_agent.py --agent sdk --prompts 5000
    python benchmarks/acp_agent.py --agent dsh --rounds 5 --prompts 3000
        # both agents, alternating, 5 rounds each: medians of CPU per prompt and their ratio
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

_HERE = Path(__file__).resolve().parent


def _raw_agent_source() -> str:
    """The SDK-only echo agent of ``acp.py`` (read from its source: importing ``acp.py`` by
    its name would shadow the SDK)."""
    source = (_HERE / "acp.py").read_text(encoding="utf-8")
    start = source.index('RAW_AGENT = """') + len('RAW_AGENT = """')
    return source[start : source.index('"""', start)]


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


class _Client:
    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.process.stdin is not None and self.process.stdout is not None
        self._in: IO[bytes] = self.process.stdin
        self._out: IO[bytes] = self.process.stdout
        self._next = 0

    def call(self, method: str, params: dict[str, Any]) -> Any:
        self._next += 1
        frame = {"jsonrpc": "2.0", "id": self._next, "method": method, "params": params}
        self._in.write(json.dumps(frame).encode() + b"\n")
        self._in.flush()
        while True:
            line = self._out.readline()
            if not line:
                raise RuntimeError(f"the agent closed its stdout during {method}")
            message = json.loads(line)
            if message.get("id") == self._next and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message["result"]

    def close(self) -> None:
        self._in.close()
        self.process.wait(timeout=120)


def measure(
    command: list[str], prompts: int, warm: int, spy: str | None = None
) -> tuple[float, float]:
    """The agent's user and system CPU seconds per timed prompt (one session, sequential
    prompts)."""
    client = _Client(command)
    try:
        client.call("initialize", {"protocolVersion": 1})
        sid = client.call("session/new", {"cwd": os.getcwd(), "mcpServers": []})["sessionId"]
        params = {"sessionId": sid, "prompt": [{"type": "text", "text": "ping"}]}
        for _ in range(warm):
            client.call("session/prompt", params)
        sampler = None
        if spy:  # py-spy samples the agent process during the timed prompts
            sampler = subprocess.Popen(
                [os.environ.get("PY_SPY", "py-spy"), "record", "-r", "1000", "-f", "raw",
                 "--nonblocking", "-o", spy, "--pid", str(client.process.pid)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        user, system = _cpu_seconds(client.process.pid)
        for _ in range(prompts):
            client.call("session/prompt", params)
        user_end, system_end = _cpu_seconds(client.process.pid)
        if sampler is not None:
            sampler.send_signal(signal.SIGINT)  # py-spy writes its samples and exits
            sampler.wait(timeout=60)
        n = max(prompts, 1)
        return (user_end - user) / n, (system_end - system) / n
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", choices=("dsh", "sdk"), default="dsh")
    parser.add_argument("--prompts", type=int, default=2000, help="timed prompts")
    parser.add_argument("--warm", type=int, default=200, help="prompts before the timed ones")
    parser.add_argument("--config", help="dsh-acp-agent's --config FILE")
    parser.add_argument("--wrap", default="", help="a command to run the agent under")
    parser.add_argument(
        "--spy",
        metavar="FILE",
        help="sample the agent with py-spy (PY_SPY, or on PATH) during the timed prompts: "
        "collapsed stacks in FILE",
    )
    parser.add_argument(
        "--rounds", type=int, default=0, help="run both agents in turn, this many rounds each"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw_agent.py"
        raw.write_text(_raw_agent_source(), encoding="utf-8")
        commands = {
            "dsh": [sys.executable, "-P", "-m", "dsh_acp_agent"]
            + (["--config", args.config] if args.config else []),
            "sdk": [sys.executable, "-P", str(raw)],
        }
        wrap = shlex.split(args.wrap)
        if not args.rounds:
            user, system = measure(wrap + commands[args.agent], args.prompts, args.warm, args.spy)
            print(
                f"{args.agent}: agent CPU {(user + system) * 1e6:.1f} us per prompt (user "
                f"{user * 1e6:.1f}, system {system * 1e6:.1f}; {args.prompts} prompts)"
            )
            return
        found: dict[str, list[float]] = {"dsh": [], "sdk": []}
        users: dict[str, list[float]] = {"dsh": [], "sdk": []}
        for i in range(args.rounds):
            order = ("dsh", "sdk") if i % 2 == 0 else ("sdk", "dsh")
            for name in order:
                user, system = measure(wrap + commands[name], args.prompts, args.warm)
                found[name].append(user + system)
                users[name].append(user)
        ratios = sorted(a / b for a, b in zip(found["dsh"], found["sdk"], strict=True))
        for name, cpus in found.items():
            shown = ", ".join(f"{c * 1e6:.0f}" for c in cpus)
            print(
                f"{name}: agent CPU {statistics.median(cpus) * 1e6:.1f} us per prompt ({shown}); "
                f"user {statistics.median(users[name]) * 1e6:.1f}"
            )
        print(f"ratio {statistics.median(ratios):.3f} (rounds {ratios[0]:.3f} to {ratios[-1]:.3f})")


if __name__ == "__main__":
    main()
