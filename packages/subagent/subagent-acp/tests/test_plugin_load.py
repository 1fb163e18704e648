"""Loading the plugin module is light (PERF-17): every host that discovers plugins imports it,
most never mount the ``acp`` provider."""

from __future__ import annotations

import json
import subprocess
import sys

import dsh_subagent_acp

#: The provider's machinery: imported when a row mounts the plugin, not when it loads.
MACHINERY = ("_provider", "_continuable", "_pool", "_process")

_LOAD = """
import json, sys
import dsh_subagent_acp.plugin as plugin
(spec,) = plugin.dsh_plugins()
mine = sorted(m for m in sys.modules if m.startswith("dsh_subagent_acp."))
print(json.dumps([spec.config_type.__name__, mine]))
"""


def test_loading_the_plugin_imports_none_of_the_provider() -> None:
    """PERF-17: importing dsh_subagent_acp.plugin and listing its spec imports its config
    only, none of the provider's modules; the package's public names still resolve."""
    done = subprocess.run(
        [sys.executable, "-c", _LOAD], capture_output=True, text=True, timeout=60, check=True
    )
    config, modules = json.loads(done.stdout)
    assert config == "AcpConfig"
    assert not [m for m in modules if m.rpartition(".")[2] in MACHINERY], modules
    for name in dsh_subagent_acp.__all__:
        assert getattr(dsh_subagent_acp, name) is not None, name
    assert dsh_subagent_acp.AcpProvider.__module__ == "dsh_subagent_acp._provider"
