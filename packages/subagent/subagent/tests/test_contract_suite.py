"""The provider contract suite itself (dsh_subagent.testing): its continuable checks are opt-in
and fail a provider that breaks the rules they name (issue 13 point 6)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

import dsh_subagent.plugin
from dsh_core import Context, PluginSpec, hookimpl
from dsh_subagent import ContinuableCreateRequest, ContinuableCreateSpec, SubagentError
from dsh_subagent.in_process import (
    IN_PROCESS_CAPABILITIES,
    completed_turn_prefix,
    start_in_process_run,
)
from dsh_subagent.testing import ContractHost, ProviderContract, in_process_contract_host

CONTINUABLE_CHECKS = (
    "test_continuable_child_runs_and_settles",
    "test_continuable_child_resumes_cold_without_its_provider",
    "test_continuable_seed_and_turn_numbering",
    "test_concurrent_continuable_prepares_are_independent",
)


class OneShotOnly:
    """A provider of one-shot children only (no ``prepare_continuable``)."""

    name = "probe"
    capabilities = IN_PROCESS_CAPABILITIES
    inherits_parent_context = False
    start = staticmethod(start_in_process_run)


class Fresh(OneShotOnly):
    """Fresh continuable children, as ``spawn`` makes them."""

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        return ContinuableCreateSpec()


class Refusing(OneShotOnly):
    """Claims continuable children and refuses to prepare any."""

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        raise SubagentError("no continuable children today", code="PROBE_REFUSED")


class Fickle(OneShotOnly):
    """Seeds the first child it prepares with the parent's turns, and no later one."""

    inherits_parent_context = True

    def __init__(self) -> None:
        self.calls = 0

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        self.calls += 1
        seed = completed_turn_prefix(request.parent) if self.calls == 1 else None
        return ContinuableCreateSpec(seed=seed)


class _Plugin:
    """Plugin ``subagent-probe``: registers the given provider."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider

    def _apply(self, ctx: Context, _: None) -> None:
        ctx.subagents.register_provider(self.provider)

    @hookimpl
    def dsh_plugins(self) -> list[PluginSpec]:
        return [PluginSpec(name="subagent-probe", apply=self._apply, requires=("subagents",))]


def contract(provider: Any) -> ProviderContract:
    """The contract suite bound to ``provider``."""

    class Probe(ProviderContract):
        def contract_host(self) -> contextlib.AbstractAsyncContextManager[ContractHost]:
            return in_process_contract_host(
                "subagent-probe",
                provider_name=provider.name,
                modules={"subagent": dsh_subagent.plugin, "subagent-probe": _Plugin(provider)},
            )

    return Probe()


@pytest.mark.parametrize("check", CONTINUABLE_CHECKS)
async def test_continuable_checks_skip_a_provider_without_prepare_continuable(check: str) -> None:
    """SVC-1 (prepare_continuable is optional, its presence the capability): a one-shot-only
    provider skips every continuable check."""
    with pytest.raises(pytest.skip.Exception):
        await getattr(contract(OneShotOnly()), check)()


@pytest.mark.parametrize("check", CONTINUABLE_CHECKS)
async def test_continuable_checks_pass_a_fresh_provider(check: str) -> None:
    """CONT-2/10, SET-2, DSC-5, SVC-13: a provider of fresh continuable children passes every
    continuable check (the same one the failures below start from)."""
    await getattr(contract(Fresh()), check)()


async def test_a_provider_that_cannot_prepare_fails_the_run_check() -> None:
    """CONT-1 step 8: a provider whose preparation fails never gets a child started."""
    with pytest.raises(SubagentError) as caught:
        await contract(Refusing()).test_continuable_child_runs_and_settles()
    assert caught.value.code == "PROBE_REFUSED"


async def test_a_seed_the_child_did_not_get_fails_the_seed_check() -> None:
    """DSC-5: the seed check compares the child's log with what prepare_continuable returns;
    a provider whose answer changes between calls fails it."""
    with pytest.raises(AssertionError):
        await contract(Fickle()).test_continuable_seed_and_turn_numbering()
