"""The lifecycle invariant checker, driven directly with crafted events (SVC-15)."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

from dsh_core import Context, Host, InvariantError, InvariantRegistry
from dsh_subagent import NO_START_CAPABILITIES, SubagentRunEndInfo, SubagentRunInfo
from dsh_subagent._lifecycle import COMPANION, install_lifecycle_checker


@attrs.frozen
class Named:
    """Just enough of a provider for provider-added."""

    name: str
    capabilities: object = NO_START_CAPABILITIES
    inherits_parent_context: bool = False


def checker() -> tuple[Callable[..., None], InvariantRegistry]:
    """A bare host with the checker; returns a vetoing emitter and the registry."""
    host = Host()
    ctx = Context(host, host.root)
    registry = InvariantRegistry(ctx)
    registry.register(COMPANION, install_lifecycle_checker)

    def emit(name: str, *args: object) -> None:
        ctx.emit_veto(name, *args)

    return emit, registry


def start(
    run_id: str = "r1", provider: str = "p", id: str = "c1", local: bool = True
) -> SubagentRunInfo:
    return SubagentRunInfo(run_id=run_id, provider=provider, id=id, local=local)


def end(
    run_id: str = "r1", provider: str = "p", id: str = "c1", local: bool = True
) -> SubagentRunEndInfo:
    return SubagentRunEndInfo(
        run_id=run_id, provider=provider, id=id, local=local, stop_reason="completed"
    )


VIOLATIONS: list[tuple[str, list[tuple[str, object]]]] = [
    ("empty provider name", [("subagent/provider-added", Named(""))]),
    (
        "provider added twice while live",
        [("subagent/provider-added", Named("p")), ("subagent/provider-added", Named("p"))],
    ),
    ("removal of an unknown name", [("subagent/provider-removed", "ghost")]),
    (
        "removal twice",
        [
            ("subagent/provider-added", Named("p")),
            ("subagent/provider-removed", "p"),
            ("subagent/provider-removed", "p"),
        ],
    ),
    ("start with an empty provider", [("subagent/start", start(provider=""))]),
    ("start with an empty run id", [("subagent/start", start(run_id=""))]),
    ("start with an empty id", [("subagent/start", start(id=""))]),
    ("repeated run id", [("subagent/start", start()), ("subagent/start", start(id="c2"))]),
    ("end without start", [("subagent/end", end())]),
    ("end twice", [("subagent/start", start()), ("subagent/end", end()), ("subagent/end", end())]),
    (
        "end with another provider",
        [("subagent/start", start()), ("subagent/end", end(provider="q"))],
    ),
    ("end with another id", [("subagent/start", start()), ("subagent/end", end(id="c9"))]),
    (
        "end with another locality",
        [("subagent/start", start()), ("subagent/end", end(local=False))],
    ),
]


@pytest.mark.parametrize(
    "events", [events for _, events in VIOLATIONS], ids=[why for why, _ in VIOLATIONS]
)
def test_checker_raises_on_violation(events: list[tuple[str, object]]) -> None:
    """SVC-15: the checker raises (and records) on each listed lifecycle violation."""
    emit, registry = checker()
    *prefix, (name, last) = events
    for event_name, payload in prefix:
        emit(event_name, payload)
    assert registry.violations == []
    with pytest.raises(InvariantError) as caught:
        emit(name, last)
    assert caught.value.package_name == COMPANION
    assert registry.violations == [caught.value]


def test_checker_accepts_a_valid_history() -> None:
    """SVC-15: add, start, end, remove, re-add, and runs whose provider has since been removed
    (provenance) are accepted."""
    emit, registry = checker()
    emit("subagent/provider-added", Named("p"))
    emit("subagent/start", start("r1"))
    emit("subagent/start", start("r2", id="c1"))  # the same child id under a fresh run id
    emit("subagent/provider-removed", "p")
    emit("subagent/end", end("r1"))
    emit("subagent/start", start("r3", provider="p", id="c3", local=False))
    emit("subagent/end", end("r3", id="c3", local=False))
    emit("subagent/provider-added", Named("p"))
    emit("subagent/end", end("r2"))
    assert registry.violations == []
