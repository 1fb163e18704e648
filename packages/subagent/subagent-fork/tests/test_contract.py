"""``fork`` runs the provider contract suite (dsh_subagent.testing)."""

from __future__ import annotations

import contextlib

import dsh_subagent.plugin
import dsh_subagent_fork.plugin
from dsh_subagent.testing import ContractHost, ProviderContract, in_process_contract_host


class TestForkContract(ProviderContract):
    """The ``fork`` provider against the shared contract."""

    def contract_host(self) -> contextlib.AbstractAsyncContextManager[ContractHost]:
        return in_process_contract_host(
            "subagent-fork",
            provider_name="fork",
            modules={"subagent": dsh_subagent.plugin, "subagent-fork": dsh_subagent_fork.plugin},
        )
