"""The distribution announces itself through the `dsh` entry-point group."""

from dsh_core.testing import check_entry_point


def test_entry_point_resolves_from_installed_wheel() -> None:
    """[foundation] The `subagent` entry point loads from the installed wheel."""
    check_entry_point("subagent", distribution="dsh-subagent", module="dsh_subagent.plugin")
