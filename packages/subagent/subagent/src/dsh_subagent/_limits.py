"""The cap on subagents running at once in one run tree (ROB-60..68).

A *run tree* is a root agent (one no other live agent owns) and every agent created under it,
at any depth. A subagent holds one of its tree's slots while it runs:

- a one-shot run (foreground, or a background job) from ``ctx.subagents.start`` until its
  ``run.result`` settles;
- a continuable child for as long as it has an Activation: from its admitted creation or cold
  resume until its disposal drops the Activation. An Activation is disposed as soon as it is
  settled, so a resident one is either running a turn or waiting for children of its own
  (which hold slots themselves): counting resident Activations counts the live work.

A start beyond the cap is refused at once with ``SUBAGENT_LIMIT`` (a ``SubagentLimitError``),
before any child exists; nothing ever waits for a slot. That is what makes the cap
deadlock-free: a parent blocked in a foreground call, or a continuable child waiting for its
own children, holds its slot while the work below it needs slots of the same tree; with a
queue that work could wait for a slot only its own ancestor can give back. A refusal ends
nothing: the model reads the tool error and tries again after a child finished.

The counts are plain integers keyed by the root's id; a tree with nothing running has no entry.
"""

from __future__ import annotations

from typing import Any

import attrs

from dsh_core import attrs_eq, attrs_hash, attrs_repr, check_positive_int

from ._depth import MAX_SAFE_INTEGER
from ._errors import SubagentError

__all__ = [
    "DEFAULT_MAX_RUNNING_CHILDREN_PER_TREE",
    "NO_SLOT",
    "SubagentConfig",
    "SubagentLimitError",
    "TreeLimits",
    "TreeSlot",
]

#: The default cap: four times the reference's pool of 8, so a real fan-out (a handful of
#: parallel children, each with a few of its own) is served, while a model that starts
#: hundreds of children in one response gets 32 model streams, not hundreds.
DEFAULT_MAX_RUNNING_CHILDREN_PER_TREE = 32

#: What a refused start says it did not do (one-shot and continuable starts).
NOT_STARTED = "no subagent was started"


class SubagentLimitError(SubagentError):
    """A start beyond the run tree's cap (``SUBAGENT_LIMIT``); ``limit`` is the cap."""

    code = "SUBAGENT_LIMIT"

    def __init__(self, limit: int, refused: str = NOT_STARTED) -> None:
        super().__init__(
            "subagent limit reached: this run tree already has the maximum number of running "
            f"subagents (max_running_children_per_tree = {limit}); {refused}. Wait for one of "
            "them to finish, then try again."
        )
        self.limit = limit


def _check_cap(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    check_positive_int(f"key {attribute.name!r}", value, limit=MAX_SAFE_INTEGER)


@attrs.frozen(kw_only=True)
class SubagentConfig:
    """Config of the ``subagent`` plugin row."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    #: Subagents allowed to run at once in one run tree (ROB-60).
    max_running_children_per_tree: int = attrs.field(
        default=DEFAULT_MAX_RUNNING_CHILDREN_PER_TREE, validator=_check_cap
    )


class TreeSlot:
    """One held slot of one tree; :meth:`release` gives it back, once (idempotent)."""

    __slots__ = ("_counts", "_root")

    def __init__(self, counts: dict[str, int] | None, root: str | None) -> None:
        self._counts = counts
        self._root = root

    def release(self, _: object = None) -> None:
        """Give the slot back (a no-op after the first call); usable as a done callback."""
        root = self._root
        counts = self._counts
        if root is None or counts is None:
            return
        self._root = None
        left = counts[root] - 1
        if left:
            counts[root] = left
        else:
            del counts[root]

    def transfer(self) -> TreeSlot:
        """A slot holding what this one held; this one is then empty (a handover)."""
        slot = TreeSlot(self._counts, self._root)
        self._root = None
        return slot


#: An empty slot: holds nothing, releases nothing.
NO_SLOT = TreeSlot(None, None)


class TreeLimits:
    """The running counts of every tree of one subagent service."""

    __slots__ = ("limit", "running")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: Subagents holding a slot, by the id of their tree's root (no entry: none).
        self.running: dict[str, int] = {}

    def acquire(self, root: str, refused: str = NOT_STARTED) -> TreeSlot:
        """A slot of tree ``root``, or ``SubagentLimitError`` when the tree is full."""
        running = self.running
        held = running.get(root, 0)
        if held >= self.limit:
            raise SubagentLimitError(self.limit, refused)
        running[root] = held + 1
        return TreeSlot(running, root)

    def check(self, root: str, refused: str = NOT_STARTED) -> None:
        """``SubagentLimitError`` when tree ``root`` is full (holds nothing)."""
        if self.running.get(root, 0) >= self.limit:
            raise SubagentLimitError(self.limit, refused)
