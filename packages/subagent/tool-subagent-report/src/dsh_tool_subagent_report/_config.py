"""The ``tool-subagent-report`` plugin's configuration (contract §6, decisions table).

Structured strictly like every plugin's config: a wrong type or an unknown key fails the boot
with ``PLUGIN_CONFIG`` naming the row and the key, and so does a value outside the three
deliveries (the class validator names its own key).
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from dsh_core import attrs_eq, attrs_hash, attrs_repr

__all__ = ["REPORT_DELIVERIES", "ReportConfig", "ReportDelivery", "as_delivery"]

#: How an accepted report is scheduled on the parent (see ``SubagentReportOptions``).
ReportDelivery = Literal["quiet", "wakeup", "next-step"]
REPORT_DELIVERIES: tuple[ReportDelivery, ...] = ("quiet", "wakeup", "next-step")


def as_delivery(value: object) -> ReportDelivery:
    """``value`` as one of the three deliveries (``ValueError`` naming the key otherwise)."""
    if type(value) is str and value in REPORT_DELIVERIES:
        return value
    raise ValueError(
        f"key 'report_delivery': must be 'quiet', 'wakeup' or 'next-step', got {value!r}"
    )


def _check_delivery(config: Any, attribute: Any, value: object) -> None:
    as_delivery(value)


@attrs.frozen(kw_only=True)
class ReportConfig:
    """Config of ``tool-subagent-report``.

    ``report_delivery``: ``next-step`` (default: steers, waking an idle parent), ``quiet``
    (injects into the parent's next step, no wake) or ``wakeup`` (a new parent turn). The
    reference accepts only ``quiet`` and ``next-step``; we keep ``wakeup`` because the seam
    builds all three (decisions table, "Report delivery").
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    report_delivery: str = attrs.field(default="next-step", validator=_check_delivery)
