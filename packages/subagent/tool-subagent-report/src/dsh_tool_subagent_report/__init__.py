"""The child-scoped ``report`` tool of continuable subagents (contract §6)."""

from __future__ import annotations

from .__about__ import __version__
from ._config import REPORT_DELIVERIES, ReportConfig, ReportDelivery
from ._tool import (
    REPORT_DESCRIPTION,
    REPORT_PARAMETERS,
    REPORT_SECTION,
    REPORT_SECTION_ORDER,
    REPORT_SECTION_TEXT,
    REPORT_TOOL,
    ReportSetupError,
    report_setup,
)

__all__ = [
    "REPORT_DELIVERIES",
    "REPORT_DESCRIPTION",
    "REPORT_PARAMETERS",
    "REPORT_SECTION",
    "REPORT_SECTION_ORDER",
    "REPORT_SECTION_TEXT",
    "REPORT_TOOL",
    "ReportConfig",
    "ReportDelivery",
    "ReportSetupError",
    "__version__",
    "report_setup",
]
