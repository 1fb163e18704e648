"""The activation setup registry: continuable setup contributions (REG-1..5, seam-continuable 13.5).

Children are made the way the continuation manager makes them: a private scope under the host
(``host.ctx.plugin(..., scope=Scope(...))``), or a real agent whose creation ``setup`` installs
the contributions and returns the installation's ``commit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dsh_subagent.plugin
from dsh_core import Context, ContextError, Registration, Scope
from dsh_core.testing import TestHost, scripted_host
from dsh_subagent import (
    SUBAGENTS,
    ActivationSetupInstallation,
    ActivationSetupRegistry,
    ContinuableSetup,
    SubagentError,
    SubagentState,
)


class Boom(Exception):
    """A setup's or a disposer's own failure."""


@contextlib.asynccontextmanager
async def booted() -> AsyncIterator[TestHost]:
    """A host with ``subagent`` mounted."""
    async with scripted_host("subagent", modules={"subagent": dsh_subagent.plugin}) as host:
        yield host


def child(host: TestHost, name: str) -> Context:
    """A child scope as the manager makes one: a private owner under the host."""
    return host.ctx.plugin(f"activation:{name}", scope=Scope(name))


def setups_of(host: TestHost) -> ActivationSetupRegistry:
    """The host's registry, the one ``register_continuable_setup`` adds to."""
    state = host.ctx.host.services["subagents"]
    assert isinstance(state, SubagentState)
    return state.setups


def key_of(ctx: Context) -> str:
    """The child's scope key (an agent's own scope for a created agent)."""
    return ctx.scope.key if ctx.scope is not None else "?"


@attrs.define
class Journal:
    """What the setups did, in order: ("install" | "dispose", setup name, child scope key)."""

    calls: list[tuple[str, str, str]] = attrs.Factory(list)

    def setup(
        self, name: str, *, fails: bool = False, dispose_fails: bool = False
    ) -> ContinuableSetup:
        def install(ctx: Context) -> Callable[[], None]:
            key = key_of(ctx)
            self.calls.append(("install", name, key))
            if fails:
                raise Boom(f"{name} failed to install")

            def dispose() -> None:
                self.calls.append(("dispose", name, key))
                if dispose_fails:
                    raise Boom(f"{name} failed to dispose")

            return dispose

        return install

    def disposed(self) -> list[tuple[str, str]]:
        return [(n, k) for op, n, k in self.calls if op == "dispose"]

    def take(self) -> list[tuple[str, str, str]]:
        calls, self.calls = self.calls, []
        return calls


# -- REG-1: registration order, one disposer per installation -----------------------------------


async def test_install_applies_every_setup_in_registration_order() -> None:
    """REG-1 (seam-continuable 13.5): install calls each setup once with the child's context,
    in registration order, and release calls their disposers, newest first."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        seen: list[Context] = []
        for name in ("a", "b", "c"):
            registry.register(journal.setup(name), host.ctx)
        registry.register(lambda ctx: seen.append(ctx), host.ctx)  # no disposer: None
        ctx = child(host, "c1")
        installation = registry.install(ctx)
        assert seen == [ctx]
        assert journal.take() == [("install", n, "c1") for n in ("a", "b", "c")]
        installation.commit()
        installation.release()
        assert journal.take() == [("dispose", n, "c1") for n in ("c", "b", "a")]


async def test_the_service_registers_for_the_calling_context() -> None:
    """REG-1, REG-4 (seam-continuable 13.5): register_continuable_setup puts the setup in the
    host's registry, owned by the calling view's context: unmounting that plugin removes it."""
    async with booted() as host:
        plugin = host.ctx.plugin("report-plugin")
        journal = Journal()
        registration = plugin[SUBAGENTS].register_continuable_setup(journal.setup("report"))
        assert isinstance(registration, Registration)
        registry = setups_of(host)
        installation = registry.install(child(host, "c1"))
        assert journal.take() == [("install", "report", "c1")]
        await plugin.dispose()
        assert journal.take() == [("dispose", "report", "c1")]
        assert not registration.active
        registry.install(child(host, "c2"))
        assert journal.take() == []
        installation.release()
        assert journal.take() == []


# -- REG-2: a failing setup rolls the earlier ones back -----------------------------------------


async def test_a_failing_setup_rolls_back_the_earlier_ones_and_surfaces() -> None:
    """REG-2 (seam-continuable 13.5): when a later setup raises, the earlier installations are
    undone newest first, later setups never run, and the setup's own error propagates."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        registry.register(journal.setup("a"), host.ctx)
        registry.register(journal.setup("b"), host.ctx)
        registry.register(journal.setup("bad", fails=True), host.ctx)
        registry.register(journal.setup("never"), host.ctx)
        ctx = child(host, "c1")
        with pytest.raises(Boom, match="bad failed to install"):
            registry.install(ctx)
        assert journal.take() == [
            ("install", "a", "c1"),
            ("install", "b", "c1"),
            ("install", "bad", "c1"),
            ("dispose", "b", "c1"),
            ("dispose", "a", "c1"),
        ]
        await ctx.dispose()  # the child scope owns nothing of the failed install
        assert journal.take() == []


async def test_a_rollback_disposer_failure_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """REG-2 (seam-continuable 13.5): a disposer failing during the rollback is logged; the
    error that surfaces is still the failing setup's, and every earlier disposer ran."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        registry.register(journal.setup("a"), host.ctx)
        registry.register(journal.setup("b", dispose_fails=True), host.ctx)
        registry.register(journal.setup("bad", fails=True), host.ctx)
        with caplog.at_level(logging.ERROR), pytest.raises(Boom, match="bad failed"):
            registry.install(child(host, "c1"))
        assert journal.disposed() == [("b", "c1"), ("a", "c1")]
        assert "rolling back a continuable setup failed" in caplog.text
        assert "b failed to dispose" in caplog.text


async def test_a_failing_setup_means_the_child_is_never_published() -> None:
    """REG-2 (seam-continuable 13.5): as a creation setup, a failing contribution fails the
    creation with its own error; no session/created or agent/created fires."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        registry.register(journal.setup("a"), host.ctx)
        registry.register(journal.setup("bad", fails=True), host.ctx)
        announced: list[str] = []
        host.ctx.on("session/created", lambda *a: announced.append("session/created"))
        host.ctx.on("agent/created", lambda *a: announced.append("agent/created"))
        with pytest.raises(Boom, match="bad failed"):
            await host.create_agent(setup=lambda ctx: registry.install(ctx).commit)
        assert announced == []
        assert host.ctx.agents.list() == []
        assert [n for n, _ in journal.disposed()] == ["a"]


# -- REG-3: removal before publication fails the commit -----------------------------------------


async def test_a_setup_removing_itself_while_installing_fails_the_commit() -> None:
    """REG-3 (seam-continuable 13.5): a setup that removes itself inside its installer has what
    it returned undone at once; commit raises ACTIVATION_SETUP_REVOKED, and releasing the
    installation afterwards disposes nothing twice."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        registry.register(journal.setup("a"), host.ctx)
        own = journal.setup("self")
        registration: list[Registration] = []

        def revoking(ctx: Context) -> Callable[[], object] | None:
            disposer = own(ctx)
            registration[0]()  # remove itself mid-install
            return disposer

        registration.append(registry.register(revoking, host.ctx))
        registry.register(journal.setup("z"), host.ctx)
        installation = registry.install(child(host, "c1"))
        assert journal.take() == [
            ("install", "a", "c1"),
            ("install", "self", "c1"),
            ("dispose", "self", "c1"),
            ("install", "z", "c1"),
        ]
        assert installation.revoked
        with pytest.raises(SubagentError) as raised:
            installation.commit()
        assert raised.value.code == "ACTIVATION_SETUP_REVOKED"
        installation.release()
        installation.release()
        assert journal.take() == [("dispose", "z", "c1"), ("dispose", "a", "c1")]


async def test_removal_between_install_and_commit_fails_the_commit() -> None:
    """REG-3 (seam-continuable 13.5): a contribution removed after install but before
    publication makes commit fail; its disposer ran once, at removal."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        registration = registry.register(journal.setup("a"), host.ctx)
        registry.register(journal.setup("b"), host.ctx)
        installation = registry.install(child(host, "c1"))
        journal.take()
        registration()
        assert journal.take() == [("dispose", "a", "c1")]
        with pytest.raises(SubagentError) as raised:
            installation.commit()
        assert raised.value.code == "ACTIVATION_SETUP_REVOKED"
        installation.release()
        assert journal.take() == [("dispose", "b", "c1")]


async def test_a_contribution_with_no_disposer_still_fails_the_commit_when_removed() -> None:
    """REG-3 (seam-continuable 13.5): a setup that returned None was still applied, so its
    removal before publication fails the commit too."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        registration = registry.register(lambda ctx: None, host.ctx)
        installation = registry.install(child(host, "c1"))
        registration()
        with pytest.raises(SubagentError, match="revoked"):
            installation.commit()


async def test_removal_during_an_async_creation_setup_publishes_nothing() -> None:
    """REG-3, RPT-5 (seam-continuable 13.5): a contribution removed after install, while the
    creation setup still awaits, makes the creation fail with ACTIVATION_SETUP_REVOKED;
    session/created never fires, no agent is live, and every disposer ran exactly once."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        registry.register(journal.setup("a"), host.ctx)
        registration = registry.register(journal.setup("report"), host.ctx)
        announced: list[object] = []
        host.ctx.on("session/created", announced.append)
        installed = asyncio.Event()
        removed = asyncio.Event()

        async def setup(ctx: Context) -> Callable[[], None]:
            installation = registry.install(ctx)
            installed.set()
            async with asyncio.timeout(5):
                await removed.wait()
            return installation.commit

        async def remove() -> None:
            async with asyncio.timeout(5):
                await installed.wait()
            registration()
            removed.set()

        remover = asyncio.ensure_future(remove())
        with pytest.raises(SubagentError) as raised:
            await host.create_agent(setup=setup)
        await remover
        assert raised.value.code == "ACTIVATION_SETUP_REVOKED"
        assert announced == []
        assert host.ctx.agents.list() == []
        assert sorted(n for n, _ in journal.disposed()) == ["a", "report"]


# -- REG-4: removal closes, then revokes; new registrations wait for the next install ----------


async def test_removal_revokes_every_resident_installation_at_once() -> None:
    """REG-4 (seam-continuable 13.5): removing a registration undoes it in every resident child
    immediately, leaves the other setups in place, and later installs skip it."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        keep = registry.register(journal.setup("keep"), host.ctx)
        gone = registry.register(journal.setup("gone"), host.ctx)
        first = registry.install(child(host, "c1"))
        second = registry.install(child(host, "c2"))
        first.commit()
        second.commit()
        journal.take()
        gone()
        assert journal.take() == [("dispose", "gone", "c1"), ("dispose", "gone", "c2")]
        assert keep.active and not gone.active
        registry.install(child(host, "c3"))
        assert journal.take() == [("install", "keep", "c3")]


async def test_removal_closes_the_registration_before_revoking() -> None:
    """REG-4 (seam-continuable 13.5): while a removal revokes resident installations, an
    install started by a disposer no longer applies the removed setup."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        late: list[ActivationSetupInstallation] = []
        registry.register(journal.setup("other"), host.ctx)
        reinstall = journal.setup("gone")

        def gone_setup(ctx: Context) -> Callable[[], None]:
            disposer = reinstall(ctx)

            def dispose() -> None:
                assert disposer is not None
                disposer()
                if not late:
                    late.append(registry.install(child(host, "late")))

            return dispose

        registration = registry.register(gone_setup, host.ctx)
        registry.install(child(host, "c1"))
        journal.take()
        registration()
        assert journal.take() == [("dispose", "gone", "c1"), ("install", "other", "late")]
        late[0].commit()


async def test_a_new_registration_leaves_resident_children_alone() -> None:
    """REG-4 (seam-continuable 13.5): a setup registered after a child was installed is not
    applied to it, its release does not dispose the newcomer, and the next child gets it."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        registry.register(journal.setup("old"), host.ctx)
        resident = registry.install(child(host, "c1"))
        registry.register(journal.setup("new"), host.ctx)
        resident.commit()
        resident.release()
        assert journal.take() == [("install", "old", "c1"), ("dispose", "old", "c1")]
        registry.install(child(host, "c2"))
        assert journal.take() == [("install", "old", "c2"), ("install", "new", "c2")]


async def test_unloading_and_reloading_does_not_restore_resident_children() -> None:
    """REG-4, RPT-5 (seam-continuable 13.5): unloading the registering plugin revokes its
    contribution from a resident child; loading it again does not give it back to that child."""
    async with booted() as host:
        journal = Journal()
        plugin = host.ctx.plugin("report")
        plugin[SUBAGENTS].register_continuable_setup(journal.setup("report"))
        registry = setups_of(host)
        resident = registry.install(child(host, "c1"))
        resident.commit()
        await plugin.dispose()
        reloaded = host.ctx.plugin("report")
        reloaded[SUBAGENTS].register_continuable_setup(journal.setup("report"))
        assert journal.take() == [("install", "report", "c1"), ("dispose", "report", "c1")]
        resident.release()
        assert journal.take() == []


# -- REG-5: every disposer attempted, failures aggregated, idempotent either way ----------------


async def test_removal_attempts_every_disposer_and_aggregates() -> None:
    """REG-5 (seam-continuable 13.5): a removal whose disposers fail in two children attempts
    all of them, then raises ACTIVATION_SETUP_RELEASE_FAILED "failed to release 2
    installation(s)", caused by a group of both failures."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        registration = registry.register(journal.setup("a", dispose_fails=True), host.ctx)
        for name in ("c1", "c2"):
            registry.install(child(host, name))
        with pytest.raises(SubagentError) as raised:
            registration()
        error = raised.value
        assert error.code == "ACTIVATION_SETUP_RELEASE_FAILED"
        assert str(error) == "failed to release 2 installation(s)"
        assert isinstance(error.__cause__, ExceptionGroup)
        assert [str(e) for e in error.__cause__.exceptions] == ["a failed to dispose"] * 2
        assert journal.disposed() == [("a", "c1"), ("a", "c2")]
        registration()  # idempotent: nothing runs again
        assert journal.disposed() == [("a", "c1"), ("a", "c2")]


async def test_release_attempts_every_disposer_and_aggregates() -> None:
    """REG-5 (seam-continuable 13.5): releasing a child attempts every disposer newest first,
    then raises "failed to release 1 installation(s)"; a second release does nothing."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        registry.register(journal.setup("a"), host.ctx)
        registry.register(journal.setup("b", dispose_fails=True), host.ctx)
        registry.register(journal.setup("c"), host.ctx)
        installation = registry.install(child(host, "c1"))
        journal.take()
        with pytest.raises(SubagentError, match=r"^failed to release 1 installation\(s\)$") as e:
            installation.release()
        assert e.value.code == "ACTIVATION_SETUP_RELEASE_FAILED"
        assert journal.take() == [("dispose", n, "c1") for n in ("c", "b", "a")]
        installation.release()
        assert journal.take() == []


async def test_child_scope_disposal_releases_its_installation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """REG-5 (seam-continuable 13.5): disposing the child scope releases its installation
    (before the scope's own registrations unwind) and logs a release failure; it never touches
    another child's installation, and a later release or removal runs nothing twice."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        order: list[str] = []

        def scoped(ctx: Context) -> Callable[[], None]:
            key = key_of(ctx)
            ctx.fiber.add(lambda: order.append(f"scope registration {key}"))
            return lambda: order.append(f"disposer {key}")

        registration = registry.register(scoped, host.ctx)
        registry.register(journal.setup("a", dispose_fails=True), host.ctx)
        ctx = child(host, "c1")
        installation = registry.install(ctx)
        other = registry.install(child(host, "c2"))
        with caplog.at_level(logging.ERROR):
            await ctx.dispose()
        assert order == ["disposer c1", "scope registration c1"]
        assert journal.disposed() == [("a", "c1")]
        assert "failed to release 1 installation(s)" in caplog.text
        installation.release()
        registration()
        assert order == ["disposer c1", "scope registration c1", "disposer c2"]
        assert journal.disposed() == [("a", "c1")]
        with pytest.raises(SubagentError, match="failed to release 1"):
            other.release()
        assert journal.disposed() == [("a", "c1"), ("a", "c2")]


async def test_release_then_removal_and_removal_then_release_undo_once() -> None:
    """REG-5 (seam-continuable 13.5): whichever of removal and release comes first, each
    contribution of each child is undone exactly once, and only that child's."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        registration = registry.register(journal.setup("a"), host.ctx)
        first = registry.install(child(host, "c1"))
        second = registry.install(child(host, "c2"))
        journal.take()
        first.release()
        assert journal.take() == [("dispose", "a", "c1")]
        registration()
        assert journal.take() == [("dispose", "a", "c2")]
        second.release()
        first.release()
        registration()
        assert journal.take() == []


async def test_an_undone_contribution_is_not_kept_alive() -> None:
    """REG-4, REG-5 (seam-continuable 13.5): once undone, by its child's release or by its
    removal, a contribution's disposer is no longer held by the registry or the installation,
    so a long-lived setup does not keep every past child's state."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        refs: list[weakref.ref[Callable[[], None]]] = []

        def setup(ctx: Context) -> Callable[[], None]:
            def dispose() -> None:
                return None

            refs.append(weakref.ref(dispose))
            return dispose

        registration = registry.register(setup, host.ctx)
        released = registry.install(child(host, "c1"))
        revoked = registry.install(child(host, "c2"))
        kept = registry.register(setup, host.ctx)
        resident = registry.install(child(host, "c3"))
        released.release()
        registration()  # revokes c2's and c3's first contribution
        gc.collect()
        assert [r() is None for r in refs] == [True, True, True, False]
        assert revoked.revoked and kept.active and resident.revoked


# -- boundaries ---------------------------------------------------------------------------------


async def test_a_setup_must_be_callable_and_return_a_disposer_or_none() -> None:
    """REG-1, REG-2 (seam-continuable 13.5): a non-callable setup is refused at registration,
    and a setup returning neither a callable nor None fails its install like a raising one
    (ACTIVATION_SETUP_INVALID), rolling the earlier ones back."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        not_callable: Any = "setup"
        with pytest.raises(SubagentError) as refused:
            registry.register(not_callable, host.ctx)
        assert refused.value.code == "ACTIVATION_SETUP_INVALID"
        journal = Journal()
        registry.register(journal.setup("a"), host.ctx)

        async def coroutine_setup(ctx: Context) -> None:
            return None

        bad: Any = coroutine_setup
        registry.register(bad, host.ctx)
        with pytest.raises(SubagentError, match="returned coroutine") as raised:
            registry.install(child(host, "c1"))
        assert raised.value.code == "ACTIVATION_SETUP_INVALID"
        assert journal.disposed() == [("a", "c1")]


async def test_install_into_a_disposed_child_runs_no_setup() -> None:
    """REG-1 (seam-continuable 13.5): a child scope already disposed is refused
    (INACTIVE_EFFECT) before any setup runs; so is registering on a disposed owner."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        journal = Journal()
        registry.register(journal.setup("a"), host.ctx)
        ctx = child(host, "c1")
        await ctx.dispose()
        with pytest.raises(ContextError) as raised:
            registry.install(ctx)
        assert raised.value.code == "INACTIVE_EFFECT"
        owner = host.ctx.plugin("gone")
        await owner.dispose()
        with pytest.raises(ContextError):
            registry.register(journal.setup("b"), owner)
        registry.install(child(host, "c2"))
        assert journal.take() == [("install", "a", "c2")]


async def test_an_async_disposer_is_run_by_the_host() -> None:
    """REG-5 (seam-continuable 13.5): a disposer that returns an awaitable (a Registration of an
    async effect) is still run once, as a host-owned task."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        done = asyncio.Event()

        async def undo() -> None:
            done.set()

        registry.register(lambda ctx: ctx.fiber.add(undo), host.ctx)
        registry.install(child(host, "c1")).release()
        async with asyncio.timeout(5):
            await done.wait()


# -- the property -------------------------------------------------------------------------------


@attrs.define
class _SetupModel:
    name: str
    registration: Registration
    owner: Context
    fails: bool  # on its first install only, so later children still get it
    dispose_fails: bool
    no_disposer: bool
    open: bool = True


@attrs.define
class _ChildModel:
    ctx: Context
    installation: ActivationSetupInstallation | None
    applied: list[str]  # setup names in install order (the whole install)
    resident: list[str]  # those not undone yet (with a disposer or not)
    released: bool = False


_KINDS = st.sampled_from(["plain", "plain", "plain", "fails", "dispose_fails", "no_disposer"])
_OPS = st.lists(
    st.tuples(
        # Registering and installing weigh double, so children often hold several setups.
        st.sampled_from(
            ["register", "register", "install", "install", "remove", "unload", "release", "dispose"]
        ),
        st.integers(0, 7),
        _KINDS,
    ),
    max_size=30,
)


@given(st.lists(_KINDS, max_size=4), _OPS)
async def test_any_sequence_undoes_each_installed_disposer_exactly_once(
    first: list[str], ops: list[tuple[str, int, str]]
) -> None:
    """REG-1..5 (seam-continuable 13.5): after a few registrations, over any sequence of
    register, remove, unload, install, release and child disposal, each call undoes exactly
    the contributions the model says (a release: the child's own, newest first; a removal:
    that setup in every resident child); failures are aggregated with their count; and once
    both sides are released every installed disposer has run exactly once, and none that was
    not installed."""
    async with booted() as host:
        registry = ActivationSetupRegistry()
        calls: list[tuple[str, str]] = []
        every_call: list[tuple[str, str]] = []
        installed: set[tuple[str, str]] = set()  # (dispose name, child) a setup handed back
        setups: list[_SetupModel] = []
        children: list[_ChildModel] = []

        def make(name: str, kind: str) -> ContinuableSetup:
            tried: list[bool] = []

            def install(ctx: Context) -> Callable[[], None] | None:
                key = key_of(ctx)
                calls.append((f"install {name}", key))
                if kind == "fails" and not tried:
                    tried.append(True)
                    raise Boom(name)
                if kind == "no_disposer":
                    return None

                def dispose() -> None:
                    calls.append((f"dispose {name}", key))
                    if kind == "dispose_fails":
                        raise Boom(name)

                return dispose

            return install

        def expect_undo(pairs: list[tuple[str, _ChildModel]]) -> tuple[list[Any], int]:
            """The calls undoing ``pairs`` make, and how many of them fail."""
            expected, failing = [], 0
            for name, c in pairs:
                model = next(s for s in setups if s.name == name)
                c.resident.remove(name)
                if model.no_disposer:
                    continue
                expected.append((f"dispose {name}", key_of(c.ctx)))
                failing += model.dispose_fails
            return expected, failing

        def check_aggregate(raised: BaseException | None, failing: int) -> None:
            if failing:
                assert isinstance(raised, SubagentError)
                assert raised.code == "ACTIVATION_SETUP_RELEASE_FAILED"
                assert str(raised) == f"failed to release {failing} installation(s)"
            else:
                assert raised is None

        for op, n, kind in [("register", 0, k) for k in first] + ops:
            every_call += calls
            calls.clear()
            raised: BaseException | None = None
            if op == "register" or (op in ("remove", "unload") and not setups):
                owner = host.ctx.plugin(f"owner{len(setups)}")
                name = f"s{len(setups)}"
                registration = registry.register(make(name, kind), owner)
                setups.append(
                    _SetupModel(
                        name,
                        registration,
                        owner,
                        fails=kind == "fails",
                        dispose_fails=kind == "dispose_fails",
                        no_disposer=kind == "no_disposer",
                    )
                )
                assert calls == []
            elif op in ("remove", "unload"):
                target = setups[n % len(setups)]
                pairs = [(target.name, c) for c in children if target.name in c.resident]
                if not target.open:
                    pairs = []
                target.open = False
                expected, failing = expect_undo(pairs)
                if op == "remove":
                    try:
                        target.registration()
                    except SubagentError as exc:
                        raised = exc
                    check_aggregate(raised, failing)
                else:
                    await target.owner.dispose()  # failures are logged by the owner
                assert calls == expected
            elif op == "install" or not children:
                key = f"c{len(children)}"
                ctx = child(host, key)
                open_setups = [s for s in setups if s.open]
                failing_at = next((i for i, s in enumerate(open_setups) if s.fails), None)
                try:
                    installation = registry.install(ctx)
                except Boom as exc:
                    raised = exc
                    installation = None
                if failing_at is None:
                    applied = [s.name for s in open_setups]
                    expected = [(f"install {a}", key) for a in applied]
                    assert installation is not None and not installation.revoked
                    installation.commit()
                    handed = open_setups
                else:
                    assert raised is not None and str(raised) == open_setups[failing_at].name
                    open_setups[failing_at].fails = False
                    applied = []
                    ran = open_setups[: failing_at + 1]
                    handed = ran[:-1]
                    expected = [(f"install {s.name}", key) for s in ran]
                    expected += [
                        (f"dispose {s.name}", key) for s in reversed(handed) if not s.no_disposer
                    ]
                installed.update((f"dispose {s.name}", key) for s in handed if not s.no_disposer)
                assert calls == expected
                children.append(_ChildModel(ctx, installation, applied, list(applied)))
            else:  # release or dispose an existing child
                c = children[n % len(children)]
                expected, failing = expect_undo([(a, c) for a in reversed(list(c.resident))])
                if op == "release":
                    if c.installation is not None:
                        try:
                            c.installation.release()
                        except SubagentError as exc:
                            raised = exc
                    check_aggregate(raised, failing if c.installation is not None else 0)
                else:
                    await c.ctx.dispose()
                assert calls == expected
                c.released = True

        # Both sides released: every installed disposer ran exactly once overall.
        for s in setups:
            with contextlib.suppress(SubagentError):
                s.registration()
        for c in children:
            if c.installation is not None:
                with contextlib.suppress(SubagentError):
                    c.installation.release()
        every_call += calls
        disposed = [call for call in every_call if call[0].startswith("dispose ")]
        assert sorted(disposed) == sorted(installed)
