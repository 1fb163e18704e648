"""The ``tool-subagent`` plugin's configuration (contract §4).

Structuring checks every key's type strictly, as for every plugin; the validators below check
the values at the same time, so a bad row fails the boot with ``PLUGIN_CONFIG`` naming the row
and the key. Optional keys that are absent stay absent: ``agent_options`` and ``tool_filter``
are never filled in as ``{}`` (an empty filter would deny everything).
"""

from __future__ import annotations

from typing import Any

import attrs

from dsh_core import AgentOptions, ToolRestriction, attrs_eq, attrs_hash, attrs_repr
from dsh_subagent import MAX_SAFE_INTEGER

__all__ = [
    "BACKGROUND_MODES",
    "PROVIDER_MANAGED",
    "AgentOptionsConfig",
    "SubagentToolConfig",
    "ToolFilterConfig",
]

PROVIDER_MANAGED = "provider-managed"
BACKGROUND_MODES = ("one-shot", "continuable")


def _positive(instance: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"key 'agent_options': {attribute.name} must be at least 1, got {value!r}")


@attrs.frozen(kw_only=True)
class AgentOptionsConfig:
    """``agent_options``: the child's model route and limit; only the keys given are set."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    provider: str | None = None
    model: str | None = None
    max_tokens: int | None = attrs.field(default=None, validator=_positive)
    max_steps: int | None = attrs.field(default=None, validator=_positive)

    def to_options(self) -> AgentOptions:
        """The request's ``agent_options`` (keys not given stay ``None``: inherited)."""
        return AgentOptions(
            provider=self.provider,
            model=self.model,
            max_tokens=self.max_tokens,
            max_steps=self.max_steps,
        )


def _filter_has_a_key(instance: ToolFilterConfig) -> None:
    if instance.allow is None and instance.deny is None:
        raise ValueError(
            "key 'tool_filter': needs allow and/or deny (an empty filter is refused, never "
            "read as deny-all)"
        )


@attrs.frozen(kw_only=True)
class ToolFilterConfig:
    """``tool_filter``: tool names the child keeps (``allow``) and/or drops (``deny``)."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] | None = None

    def __attrs_post_init__(self) -> None:
        _filter_has_a_key(self)

    def to_restriction(self) -> ToolRestriction:
        """The request's ``tool_filter``: missing keys stay ``None``."""
        return ToolRestriction(allow=self.allow, deny=self.deny)


def _check_mode(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in BACKGROUND_MODES:
        raise ValueError(
            f"key 'background_mode': must be 'one-shot' or 'continuable', got {value!r}"
        )


def check_max_depth(value: object) -> int | str:
    """``max_depth``: a non-negative safe integer or ``'provider-managed'`` (else
    ``TypeError`` naming the key, TOOL-5)."""
    if value == PROVIDER_MANAGED and type(value) is str:
        return value
    if type(value) is int and 0 <= value <= MAX_SAFE_INTEGER:
        return value
    raise TypeError(
        f"key 'max_depth': must be a non-negative safe integer or 'provider-managed', got {value!r}"
    )


def _check_depth(instance: object, attribute: attrs.Attribute[Any], value: int | str) -> None:
    check_max_depth(value)


def _check_name(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if not value:
        raise ValueError(f"key {attribute.name!r}: must not be empty")


@attrs.frozen(kw_only=True)
class SubagentToolConfig:
    """Config of ``tool-subagent``: one row binds one provider to one tool name."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    provider: str = attrs.field(validator=_check_name)  # required: no default
    tool_name: str = attrs.field(default="subagent", validator=_check_name)
    enable_run_in_background: bool = True
    background_mode: str = attrs.field(default="one-shot", validator=_check_mode)
    agent_options: AgentOptionsConfig | None = None
    persona: str | None = None
    tool_filter: ToolFilterConfig | None = None
    max_depth: int | str = attrs.field(default=3, validator=_check_depth)

    @property
    def continuable(self) -> bool:
        """Whether background calls start continuable children."""
        return self.background_mode == "continuable"
