"""The distribution announces itself through the `dsh` entry-point group."""

from dsh_core.testing import check_entry_point


def test_entry_point_resolves_from_installed_wheel() -> None:
    """[foundation] The `acp-agent` entry point loads from the installed wheel."""
    check_entry_point("acp-agent", distribution="dsh-acp-agent", module="dsh_acp_agent.plugin")
