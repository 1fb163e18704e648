"""Test support for dsh distributions and for users' own tests (public API).

See ``docs/testing.md``. Nothing here is imported by the runtime.
"""

from __future__ import annotations

from ._distributions import write_distribution
from ._entry_points import check_entry_point

__all__ = ["check_entry_point", "write_distribution"]
