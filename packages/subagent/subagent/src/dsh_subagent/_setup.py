"""The activation setup registry (REG-1..5): an interface stand-in with no contributions yet.

Every continuable materialization, fresh or resumed, calls ``install(child_ctx)`` inside the
unpublished creation window, ``commit()`` right before publication (a revoked contribution
raises ``ACTIVATION_SETUP_REVOKED`` there) and ``release()`` when the child's scope is
disposed (idempotent; failures aggregate as ``ACTIVATION_SETUP_RELEASE_FAILED``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsh_core import Context

__all__ = ["ActivationSetupInstallation", "ActivationSetupRegistry"]


class ActivationSetupInstallation:
    """What the registry installed on one child: nothing while no contribution exists."""

    __slots__ = ()

    def commit(self) -> None:
        """Check, right before publication, that no installed contribution was revoked."""

    def release(self) -> None:
        """Release every installation of this child (idempotent)."""


_EMPTY = ActivationSetupInstallation()


class ActivationSetupRegistry:
    """Ordered, transactional, revocable contributions to continuable children."""

    __slots__ = ()

    def install(self, child_ctx: Context) -> ActivationSetupInstallation:
        """Apply every registered contribution to ``child_ctx`` (unpublished), in order."""
        return _EMPTY
