"""``spawn`` runs the provider contract suite (dsh_subagent.testing)."""

from __future__ import annotations

import contextlib

import dsh_subagent.plugin
import dsh_subagent_spawn.plugin
from dsh_subagent.testing import ContractHost, ProviderContract, in_process_contract_host


class TestSpawnContract(ProviderContract):
    """The ``spawn`` provider against the shared contract."""

    def contract_host(self) -> contextlib.AbstractAsyncContextManager[ContractHost]:
        return in_process_contract_host(
            "subagent-spawn",
            provider_name="spawn",
            modules={"subagent": dsh_subagent.plugin, "subagent-spawn": dsh_subagent_spawn.plugin},
        )
