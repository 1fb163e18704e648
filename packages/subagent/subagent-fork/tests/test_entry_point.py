"""The distribution announces itself through the `dsh` entry-point group."""

from dsh_core.testing import check_entry_point


def test_entry_point_resolves_from_installed_wheel() -> None:
    """[foundation] The `subagent-fork` entry point loads from the installed wheel."""
    check_entry_point(
        "subagent-fork", distribution="dsh-subagent-fork", module="dsh_subagent_fork.plugin"
    )
