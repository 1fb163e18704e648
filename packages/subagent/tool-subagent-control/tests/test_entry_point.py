"""The distribution announces itself through the `dsh` entry-point group."""

from dsh_core.testing import check_entry_point


def test_entry_point_resolves_from_installed_wheel() -> None:
    """[foundation] The `tool-subagent-control` and `tool-subagent-list-agents` entry points
    load from the installed wheel."""
    check_entry_point(
        "tool-subagent-control",
        distribution="dsh-tool-subagent-control",
        module="dsh_tool_subagent_control.plugin",
    )
    check_entry_point(
        "tool-subagent-list-agents",
        distribution="dsh-tool-subagent-control",
        module="dsh_tool_subagent_control.list_agents_plugin",
    )
