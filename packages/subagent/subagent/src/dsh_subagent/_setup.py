"""The activation setup registry (REG-1..5): contributions installed into continuable children.

A *setup* is a function ``setup(child_ctx) -> disposer | None`` that installs something scoped
to one continuable child (a tool, a prompt section, a listener) after the child's base
composition and before its Activation is published. The continuation manager calls
:meth:`ActivationSetupRegistry.install` on every fresh or resumed child and
:meth:`ActivationSetupInstallation.commit` at publication.

The registry is transactional: a failing setup rolls the earlier ones back (REG-2), a setup
removed before publication makes the commit fail (REG-3), and removing a registration revokes
what it installed in every resident child at once (REG-4). Every applied contribution is
undone exactly once, whichever of its removal and its child's release comes first (REG-5).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TypeAlias

from dsh_core import Context, Registration

from ._errors import SubagentError

__all__ = ["ActivationSetupInstallation", "ActivationSetupRegistry", "ContinuableSetup"]

#: ``setup(child_ctx)`` installs one contribution into a child; it returns the synchronous
#: disposer of that installation (a ``Registration`` will do), or ``None`` when the child
#: scope's own disposal undoes everything it did.
ContinuableSetup: TypeAlias = Callable[[Context], Callable[[], object] | None]


class _Setup:
    """One registration: its function, whether it still takes installs, and where it is."""

    __slots__ = ("fn", "open", "resident")

    def __init__(self, fn: ContinuableSetup) -> None:
        self.fn = fn
        self.open = True
        #: Its applied contributions not undone yet, across children (insertion-ordered).
        self.resident: dict[_Applied, None] = {}


class _Applied:
    """One setup applied to one child: undone once, by removal or by the child's release."""

    __slots__ = ("disposer", "done", "installation", "setup")

    def __init__(
        self,
        setup: _Setup,
        installation: ActivationSetupInstallation,
        disposer: Callable[[], object] | None,
    ) -> None:
        self.setup = setup
        self.installation = installation
        self.disposer = disposer
        self.done = False

    def undo(self) -> Exception | None:
        """Run the disposer (at most once); return what it raised."""
        if self.done:
            return None
        self.done = True
        self.setup.resident.pop(self, None)
        disposer = self.disposer
        if disposer is None:
            return None
        self.disposer = None  # what it closes over goes now, not with its child
        try:
            result = disposer()
            if result is not None and inspect.isawaitable(result):
                # A Registration of an async effect: the host owns the rest of it (its
                # failure is logged there, and host disposal awaits it).
                self.installation._ctx.host.spawn(result, name="activation-setup-release")
        except Exception as exc:  # every disposer is attempted (REG-5)
            return exc
        return None


class ActivationSetupRegistry:
    """The continuable setup contributions of one host (``SubagentState.setups``)."""

    __slots__ = ("_setups",)

    def __init__(self) -> None:
        self._setups: dict[_Setup, None] = {}

    def register(self, setup: ContinuableSetup, owner: Context) -> Registration:
        """Add ``setup`` for every later install; owned by ``owner`` (disposed with it).

        Calling the returned registration (or disposing ``owner``) removes it: closed to new
        installs first, then every resident installation of it is revoked (REG-4). Children
        already installed are not given a setup registered after them.
        """
        fn: object = setup  # checked: a plugin's mistake fails here, not in a child's start
        if not callable(fn):
            raise SubagentError(
                f"a continuable setup must be callable, got {type(fn).__name__}",
                code="ACTIVATION_SETUP_INVALID",
            )
        entry = _Setup(setup)
        registration = owner.fiber.add(lambda: self._remove(entry))
        self._setups[entry] = None
        return registration

    def install(self, child_ctx: Context) -> ActivationSetupInstallation:
        """Apply every open setup to ``child_ctx``, in registration order (REG-1).

        If a setup raises, the ones already applied are undone in reverse order and its error
        propagates (REG-2; a disposer failing during that rollback is logged). A setup removed
        meanwhile is skipped if not applied yet; if it removes itself inside its own call,
        what it returned is undone at once (a failure there is logged) and
        :meth:`~ActivationSetupInstallation.commit` fails (REG-3). The installation is
        released when ``child_ctx`` is disposed, or earlier by
        :meth:`~ActivationSetupInstallation.release`.
        """
        child_ctx._require_active()
        installation = ActivationSetupInstallation(child_ctx)
        if not self._setups:  # the common case: nothing to apply, nothing to own
            return installation
        applied = installation._applied
        setups = self._setups
        try:
            for entry in tuple(setups):
                if entry not in setups:  # removed by an earlier setup of this install
                    continue
                disposer: object = entry.fn(child_ctx)
                if disposer is not None and not callable(disposer):
                    if inspect.iscoroutine(disposer):
                        disposer.close()
                    raise SubagentError(
                        f"a continuable setup returned {type(disposer).__name__}, "
                        "not a disposer or None",
                        code="ACTIVATION_SETUP_INVALID",
                    )
                record = _Applied(entry, installation, disposer)
                applied.append(record)
                if entry.open:
                    entry.resident[record] = None
                else:  # it removed itself while it ran: revoke what it just installed
                    installation._revoked = True
                    failure = record.undo()
                    if failure is not None:
                        child_ctx.logger.error(
                            "revoking a continuable setup failed", exc_info=failure
                        )
            installation._effect = child_ctx.fiber.add(installation.release)
        except BaseException:
            installation._released = True
            while applied:
                failure = applied.pop().undo()
                if failure is not None:
                    child_ctx.logger.error(
                        "rolling back a continuable setup failed", exc_info=failure
                    )
            raise
        return installation

    def _remove(self, entry: _Setup) -> None:
        """Close ``entry`` to new installs, then revoke its resident installations (REG-4)."""
        if not entry.open:
            return
        entry.open = False
        del self._setups[entry]
        failures: list[Exception] = []
        for record in tuple(entry.resident):
            record.installation._revoked = True
            failure = record.undo()
            if failure is not None:
                failures.append(failure)
        if failures:
            raise _release_failed(failures)


class ActivationSetupInstallation:
    """What one install applied to one child; the manager commits it or releases it."""

    __slots__ = ("_applied", "_ctx", "_effect", "_released", "_revoked")

    def __init__(self, child_ctx: Context) -> None:
        self._ctx = child_ctx
        #: Applied contributions in install order (undone ones are skipped on release).
        self._applied: list[_Applied] = []
        self._effect: Registration | None = None
        self._revoked = False
        self._released = False

    @property
    def revoked(self) -> bool:
        """Whether a contribution this installation applied was removed since."""
        return self._revoked

    def commit(self) -> None:
        """Check, at publication, that every applied contribution is still there (REG-3).

        Raises ``SubagentError`` ``ACTIVATION_SETUP_REVOKED`` if one was removed (or the
        installation was released) since; the caller then rolls the child back and
        publishes nothing. Undoes nothing itself: releasing stays the caller's, exactly once.
        """
        if self._revoked or self._released:
            raise SubagentError(
                "a continuable setup was revoked before the child was published",
                code="ACTIVATION_SETUP_REVOKED",
            )

    def release(self) -> None:
        """Undo every contribution still applied, newest first; idempotent (REG-5).

        Every disposer is attempted; failures are aggregated as ``SubagentError``
        ``ACTIVATION_SETUP_RELEASE_FAILED`` ("failed to release N installation(s)"), caused
        by an ``ExceptionGroup`` of them. Contributions already revoked by their removal are
        not undone again, and no other child's are touched.
        """
        self._released = True
        effect = self._effect
        if effect is not None:
            self._effect = None
            effect.forget()
        applied = self._applied
        failures: list[Exception] = []
        while applied:
            failure = applied.pop().undo()
            if failure is not None:
                failures.append(failure)
        if failures:
            raise _release_failed(failures)


def _release_failed(failures: list[Exception]) -> SubagentError:
    """REG-5's aggregate: one error naming the count, caused by all of them."""
    error = SubagentError(
        f"failed to release {len(failures)} installation(s)",
        code="ACTIVATION_SETUP_RELEASE_FAILED",
    )
    error.__cause__ = ExceptionGroup("activation setup release failures", failures)
    return error
