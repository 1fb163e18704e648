"""The distribution announces itself through the `dsh` entry-point group."""

from dsh_core.testing import check_entry_point


def test_entry_point_resolves_from_installed_wheel() -> None:
    """[foundation] The `core` entry point loads from the installed wheel."""
    check_entry_point("core", distribution="dsh-core", module="dsh_core.plugin")


def test_dsh_core_is_a_library_that_imports_no_sibling() -> None:
    """[cli] 1: dsh-core imports no other dsh distribution (no dsh_subagent, no provider, no
    tool, no command) and ships no console script: the command lives in dsh-subagents."""
    import ast
    import importlib.metadata as md
    import re
    from pathlib import Path

    import dsh_core

    source = Path(dsh_core.__file__).parent
    offenders = []
    # Only a file naming another dsh_* module can import one: the others are not parsed.
    sibling = re.compile(r"\bdsh_(?!core\b)\w")
    for path in sorted(source.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if not sibling.search(text):
            continue
        tree = ast.parse(text)
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (  # importlib.import_module("dsh_x") / find_spec("dsh_x") / __import__
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None))
                in {"import_module", "find_spec", "__import__"}
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                names = [node.args[0].value]
            for name in names:
                top = name.split(".")[0]
                if top.startswith("dsh_") and top != "dsh_core":
                    offenders.append(f"{path.relative_to(source)}:{node.lineno} {name}")
    assert offenders == []
    scripts = [
        ep for ep in md.distribution("dsh-core").entry_points if ep.group == "console_scripts"
    ]
    assert scripts == []
