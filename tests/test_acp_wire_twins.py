"""The two ACP distributions guard their streams with the same module (ROB-36)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVED = ROOT / "packages/acp-agent/src/dsh_acp_agent/_wire.py"
PROVIDER = ROOT / "packages/subagent/subagent-acp/src/dsh_subagent_acp/_wire.py"


def test_both_distributions_carry_the_same_wire_guard() -> None:
    """ROB-36: dsh-acp-agent and dsh-subagent-acp are published apart, so each carries the
    guard between the pipe and the SDK; the two files are one text, so a fix to one side
    cannot miss the other."""
    assert SERVED.read_bytes() == PROVIDER.read_bytes()
