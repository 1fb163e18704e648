"""The durable identity of a session-backed subagent: the ``subagent/descriptor`` event.

A descriptor is mode-discriminated. ``one-shot`` carries the provider and an optional display
``label``; ``continuable`` carries its required ``label`` plus what cold resume needs: the
resolved model route and the optional persona and tool filter. It never stores the depth
(the header holds it), the output schema, ``max_tokens`` or the whole ``AgentOptions``
(DSC-6). The event is log-only: no surface metadata, never model history (DSC-1..6).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

import attrs

from dsh_core import EventTypeSpec, SessionEvent, ToolRestriction, attrs_eq, attrs_hash, attrs_repr

from ._errors import DescriptorError

__all__ = [
    "DESCRIPTOR_EVENT",
    "DESCRIPTOR_EVENT_TYPE",
    "SUBAGENT_DESCRIPTOR_VERSION",
    "ContinuableDescriptor",
    "DescriptorFold",
    "OneShotDescriptor",
    "SubagentDescriptorData",
    "descriptor_payload",
    "fold_descriptor",
    "parse_descriptor",
    "snapshot_continuable_descriptor",
    "snapshot_one_shot_descriptor",
]

SUBAGENT_DESCRIPTOR_VERSION: Literal[2] = 2
DESCRIPTOR_EVENT = "subagent/descriptor"
#: The session event type the seam registers (free-form JSON payload, skippable by readers
#: that do not know it, so a child log stays loadable without this package).
DESCRIPTOR_EVENT_TYPE = EventTypeSpec(name=DESCRIPTOR_EVENT, ignorable=True)


@attrs.frozen(kw_only=True)
class OneShotDescriptor:
    """Identity of a one-shot child."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    provider: str
    label: str | None = None

    @property
    def mode(self) -> Literal["one-shot"]:
        """``one-shot``."""
        return "one-shot"

    @property
    def version(self) -> Literal[2]:
        """The descriptor format version (``SUBAGENT_DESCRIPTOR_VERSION``, SVC-7)."""
        return SUBAGENT_DESCRIPTOR_VERSION


@attrs.frozen(kw_only=True)
class ContinuableDescriptor:
    """Identity of a continuable child, with what cold resume reapplies."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    provider: str
    label: str
    agent_provider: str | None = None
    agent_model: str | None = None
    persona: str | None = None
    tool_filter: ToolRestriction | None = None

    @property
    def mode(self) -> Literal["continuable"]:
        """``continuable``."""
        return "continuable"

    @property
    def version(self) -> Literal[2]:
        """The descriptor format version (``SUBAGENT_DESCRIPTOR_VERSION``, SVC-7)."""
        return SUBAGENT_DESCRIPTOR_VERSION


SubagentDescriptorData: TypeAlias = OneShotDescriptor | ContinuableDescriptor


def _require_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise DescriptorError(f"{what} is not losslessly JSON-serializable: {value!r}")
    return value


def snapshot_one_shot_descriptor(provider: str, label: str | None = None) -> OneShotDescriptor:
    """The one-shot descriptor of a start (DSC-1: absent fields omitted, strings only)."""
    return OneShotDescriptor(
        provider=_require_str(provider, "provider"),
        label=None if label is None else _require_str(label, "label"),
    )


def snapshot_continuable_descriptor(
    *,
    provider: str,
    label: str,
    agent_provider: str | None = None,
    agent_model: str | None = None,
    persona: str | None = None,
    tool_filter: ToolRestriction | None = None,
) -> ContinuableDescriptor:
    """The continuable descriptor of a start (DSC-1, DSC-6)."""
    if tool_filter is not None:
        for name in (*(tool_filter.allow or ()), *(tool_filter.deny or ())):
            _require_str(name, "tool filter name")
    return ContinuableDescriptor(
        provider=_require_str(provider, "provider"),
        label=_require_str(label, "label"),
        agent_provider=None
        if agent_provider is None
        else _require_str(agent_provider, "agent provider"),
        agent_model=None if agent_model is None else _require_str(agent_model, "agent model"),
        persona=None if persona is None else _require_str(persona, "persona"),
        tool_filter=tool_filter,
    )


def descriptor_payload(descriptor: SubagentDescriptorData) -> dict[str, Any]:
    """The JSON payload of a ``subagent/descriptor`` event (absent fields omitted)."""
    out: dict[str, Any] = {
        "version": descriptor.version,
        "mode": descriptor.mode,
        "provider": descriptor.provider,
    }
    if descriptor.label is not None:
        out["label"] = descriptor.label
    if isinstance(descriptor, ContinuableDescriptor):
        for key in ("agent_provider", "agent_model", "persona"):
            value = getattr(descriptor, key)
            if value is not None:
                out[key] = value
        if descriptor.tool_filter is not None:
            f: dict[str, Any] = {}
            if descriptor.tool_filter.allow is not None:
                f["allow"] = list(descriptor.tool_filter.allow)
            if descriptor.tool_filter.deny is not None:
                f["deny"] = list(descriptor.tool_filter.deny)
            out["tool_filter"] = f
    return out


_ONE_SHOT_KEYS = frozenset({"version", "mode", "provider", "label"})
_CONTINUABLE_KEYS = _ONE_SHOT_KEYS | {"agent_provider", "agent_model", "persona", "tool_filter"}


def _names(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or any(not isinstance(v, str) for v in value):
        raise DescriptorError(f"{where} must be an array of strings")
    return tuple(value)


def parse_descriptor(payload: object) -> SubagentDescriptorData | None:
    """Parse a persisted payload (DSC-2): ``None`` for an unsupported version, else the
    descriptor; a malformed current-version payload raises :class:`DescriptorError`.

    Optional fields are absent, never ``null``: a present key must hold its type.
    """
    # A stored payload is a frozen mapping: known by its class before the slower ABC check.
    if payload.__class__ is not MappingProxyType and not isinstance(payload, Mapping):
        raise DescriptorError("a subagent descriptor must be an object")
    version = payload.get("version")
    if isinstance(version, bool) or not isinstance(version, int | float):
        raise DescriptorError("a subagent descriptor needs a numeric version")
    if version != SUBAGENT_DESCRIPTOR_VERSION:
        return None
    mode = payload.get("mode")
    if mode not in ("one-shot", "continuable"):
        raise DescriptorError(f"unknown subagent descriptor mode {mode!r}")
    allowed = _ONE_SHOT_KEYS if mode == "one-shot" else _CONTINUABLE_KEYS
    extra = set(payload) - allowed
    if extra:
        raise DescriptorError(f"unknown {mode} descriptor keys {sorted(map(str, extra))}")
    provider = payload.get("provider")
    if not isinstance(provider, str):
        raise DescriptorError("descriptor provider must be a string")
    label = payload.get("label")
    if mode == "one-shot":
        if "label" in payload and not isinstance(label, str):
            raise DescriptorError("one-shot descriptor label must be a string when present")
        return OneShotDescriptor(provider=provider, label=label)
    if not isinstance(label, str):
        raise DescriptorError("continuable descriptor label must be a string")
    fields: dict[str, str | None] = {}
    for key in ("agent_provider", "agent_model", "persona"):
        value = payload.get(key)
        if key in payload and not isinstance(value, str):
            raise DescriptorError(f"descriptor {key} must be a string when present")
        fields[key] = value
    raw_filter = payload.get("tool_filter")
    tool_filter = None
    if "tool_filter" in payload:
        if not isinstance(raw_filter, Mapping) or set(raw_filter) - {"allow", "deny"}:
            raise DescriptorError("descriptor tool_filter may only hold allow and deny")
        if "allow" not in raw_filter and "deny" not in raw_filter:
            raise DescriptorError("descriptor tool_filter needs allow and/or deny")
        tool_filter = ToolRestriction(
            allow=_names(raw_filter["allow"], "tool_filter.allow")
            if "allow" in raw_filter
            else None,
            deny=_names(raw_filter["deny"], "tool_filter.deny") if "deny" in raw_filter else None,
        )
    return ContinuableDescriptor(provider=provider, label=label, tool_filter=tool_filter, **fields)


@attrs.frozen(kw_only=True)
class DescriptorFold:
    """What a log's own suffix says about its identity."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    status: Literal["none", "ok", "unsupported"]
    descriptor: SubagentDescriptorData | None = None
    seq: int | None = None


def fold_descriptor(events: Iterable[SessionEvent], seed_length: int | None) -> DescriptorFold:
    """The FIRST descriptor in the log's own suffix (events from ``seed_length`` on), so a fork
    seed's ancestor descriptor is never taken for the child's (DSC-3). Malformed -> raises."""
    start = seed_length or 0
    for event in events:
        if event.seq < start or event.type != DESCRIPTOR_EVENT:
            continue
        parsed = parse_descriptor(event.data)
        if parsed is None:
            return DescriptorFold(status="unsupported", seq=event.seq)
        return DescriptorFold(status="ok", descriptor=parsed, seq=event.seq)
    return DescriptorFold(status="none")
