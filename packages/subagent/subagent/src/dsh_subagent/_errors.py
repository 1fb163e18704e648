"""Errors of the subagent seam. ``SubagentError.code`` is stable (see the table in the README).

``SubagentDepthError`` is deliberately *not* a ``SubagentError`` (DEP-2): a depth refusal is a
policy outcome of the request, not a fault of the seam. Invalid ``max_depth`` values and
mistyped request fields raise a ``TypeError``, and depths outside the safe-integer range an
``OverflowError`` (DEP-1/2, SVC-6).
"""

from __future__ import annotations

from collections.abc import Iterable

from dsh_core import DshError, quote_name

__all__ = [
    "DepthOverflowError",
    "DescriptorError",
    "InvalidMaxDepthError",
    "InvalidStartRequestError",
    "SubagentDepthError",
    "SubagentError",
    "UnsupportedSchemaError",
]


class SubagentError(DshError):
    """A refusal of the subagent service; ``code`` names the rule (e.g. ``NO_PROVIDER``)."""

    code = "SUBAGENT_ERROR"


class SubagentDepthError(DshError):
    """The child's delegation depth would exceed ``max_depth`` (DEP-2)."""

    code = "SUBAGENT_DEPTH_EXCEEDED"

    def __init__(self, attempted_depth: int, max_depth: int) -> None:
        super().__init__(f"subagent depth {attempted_depth} exceeds maxDepth {max_depth}")
        self.attempted_depth = attempted_depth
        self.max_depth = max_depth


class InvalidMaxDepthError(DshError, TypeError):
    """``max_depth`` (or a runtime depth) is not a non-negative safe integer."""

    code = "INVALID_MAX_DEPTH"


class InvalidStartRequestError(DshError, TypeError):
    """A start request field has the wrong type (hardening 11.6): refused before anything
    exists, so a bad request can never leave a half-made child behind (DRV-3)."""

    code = "INVALID_START_REQUEST"


class DepthOverflowError(DshError, OverflowError):
    """A derived delegation depth left the safe-integer range."""

    code = "DEPTH_OVERFLOW"


class UnsupportedSchemaError(DshError, ValueError):
    """An ``output_schema`` is outside the supported object-rooted JSON Schema subset."""

    code = "UNSUPPORTED_SCHEMA"


class DescriptorError(DshError, ValueError):
    """A persisted ``subagent/descriptor`` payload of the current version is malformed."""

    code = "SUBAGENT_DESCRIPTOR_INVALID"


#: Provider names the project's own distributions register, for NO_PROVIDER's hint.
_KNOWN_PROVIDERS = {
    "spawn": "dsh-subagent-spawn",
    "fork": "dsh-subagent-fork",
    "acp": "dsh-subagent-acp",
}


def no_provider(name: str, registered: Iterable[str]) -> str:
    """NO_PROVIDER's text: what is registered, and where a well-known name comes from."""
    message = f"no subagent provider is registered as {quote_name(name)}; registered providers: "
    message += ", ".join(map(quote_name, registered)) or "none"
    distribution = _KNOWN_PROVIDERS.get(name)
    if distribution is not None:
        message += (
            f". {quote_name(name)} is provided by {distribution}: install it and mount its plugin "
            f"{distribution.removeprefix('dsh-')}"
        )
    return message
