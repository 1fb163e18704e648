"""Loading the plugin module is light (PERF-17): every host that discovers plugins imports it."""

from __future__ import annotations

import json
import subprocess
import sys

import dsh_acp_agent

_LOAD = """
import json, sys
import dsh_acp_agent.plugin
print(json.dumps(sorted(m for m in sys.modules if m.startswith("dsh_acp_agent."))))
"""


def test_loading_the_plugin_imports_neither_the_command_config_nor_the_server() -> None:
    """PERF-17: importing dsh_acp_agent.plugin imports neither the command's config module
    nor the server; the package's public names still resolve."""
    done = subprocess.run(
        [sys.executable, "-c", _LOAD], capture_output=True, text=True, timeout=60, check=True
    )
    modules = json.loads(done.stdout)
    assert "dsh_acp_agent._config" not in modules and "dsh_acp_agent._server" not in modules
    for name in dsh_acp_agent.__all__:
        assert getattr(dsh_acp_agent, name) is not None, name
