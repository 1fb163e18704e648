"""Our delegation beside the peers', in alternating rounds, and one table of the results.

Each round runs, each in a fresh process and in an order rotated by one each round: ours
(``benchmarks/delegation.py``'s ``spawn:tool``: the real ``subagent`` tool, spawn provider,
memory store) and every peer script of this folder whose peer is installed (openai-agents in
its two patterns, pydantic-ai, deepagents). Every process times the same two phases for at
least ``--seconds`` each (see ``_phases.py``). What slows the machine for a while then falls
on every side of a round, and the ratio of a peer to ours is taken within each round.

The table gives, per measure, ours and each peer: the median over the rounds, each round's
ratio peer / ours, and the median of those ratios. ``--json FILE`` writes every round's
figures and the medians.

    python benchmarks/peers/compare.py                 # 5 rounds
    python benchmarks/peers/compare.py --rounds 3 --seconds 0.5
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OURS = "ours: dsh (the subagent tool)"

#: name -> (module that must be importable, script, its extra arguments)
PEERS = {
    "openai-agents (one Agent pair shared)": ("agents", "bench_oai.py", ["--pattern", "shared"]),
    "openai-agents (an Agent pair per run)": ("agents", "bench_oai.py", ["--pattern", "per-run"]),
    "pydantic-ai": ("pydantic_ai", "bench_pydai.py", []),
    "deepagents": ("deepagents", "bench_deep.py", []),
}

#: measure key -> its label in the table
MEASURES = {
    "seq_ms": "ms per delegation, sequential",
    "conc_ms_each": "ms per delegation, concurrent",
    "peak_rss_mb": "peak RSS of the process, MB",
}


def _command(name: str, args: argparse.Namespace) -> list[str]:
    phases = ["--seq", str(args.seq), "--conc", str(args.conc), "--seconds", str(args.seconds)]
    if name == OURS:
        script = HERE.parent / "delegation.py"
        return [sys.executable, str(script), "--child", "spawn:tool", "--live", "0", *phases]
    _, script, extra = PEERS[name]
    return [sys.executable, str(HERE / script), *extra, *phases, "--json"]


def _run(name: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "DSH_DISABLE_PLUGIN_AUTOLOAD": "1", "LANGSMITH_TRACING": "false"}
    out = subprocess.run(_command(name, args), capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise SystemExit(f"{name} failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seq", type=int, default=200, help="sequential delegations, at least")
    parser.add_argument("--conc", type=int, default=50, help="concurrent delegations per batch")
    parser.add_argument("--seconds", type=float, default=1.0, help="each phase's length, at least")
    parser.add_argument("--json", help="write every round's figures and the medians here")
    args = parser.parse_args()
    missing = [
        name for name, (module, _, _) in PEERS.items() if not importlib.util.find_spec(module)
    ]
    names = [OURS, *(name for name in PEERS if name not in missing)]
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for i in range(args.rounds):
        first = i % len(names)
        for name in names[first:] + names[:first]:
            rounds[name].append(_run(name, args))
        print(f"round {i + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    medians = {
        name: {key: statistics.median(r[key] for r in runs) for key in MEASURES}
        for name, runs in rounds.items()
    }
    ratios = {
        name: {
            key: [p[key] / o[key] for p, o in zip(rounds[name], rounds[OURS], strict=True)]
            for key in MEASURES
        }
        for name in names[1:]
    }
    _table(args, names, medians, ratios, missing)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rounds": rounds, "medians": medians, "ratios": ratios}, indent=1)
        )


def _table(
    args: argparse.Namespace,
    names: list[str],
    medians: dict[str, dict[str, float]],
    ratios: dict[str, dict[str, list[float]]],
    missing: list[str],
) -> None:
    width = max(len(name) for name in names)
    print(
        f"\nDelegation, ours and the peers: {args.rounds} alternating rounds, a fresh process "
        f"each; each phase >= {args.seconds:g} s (sequential: at least {args.seq}; concurrent: "
        f"batches of {args.conc}). python {sys.version.split()[0]}"
    )
    head = f"{'':<{width}}  {'median':>9}  {'ratio to ours, per round':<40}  {'median ratio':>12}"
    for key, label in MEASURES.items():
        print(f"\n{label}")
        print(head)
        for name in names:
            value = (
                f"{medians[name][key]:>9.3f}"
                if key != "peak_rss_mb"
                else f"{medians[name][key]:>9.1f}"
            )
            if name == OURS:
                print(f"{name:<{width}}  {value}")
                continue
            per_round = " ".join(f"{r:.2f}" for r in ratios[name][key])
            ratio = statistics.median(ratios[name][key])
            print(f"{name:<{width}}  {value}  {per_round:<40}  {ratio:>11.2f}x")
    for name in missing:
        print(f"(not installed here, left out: {name})")


if __name__ == "__main__":
    main()
