"""The `dsh-subagents plugins` and `demo` commands on installed fake distributions."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from dsh_core.testing import write_distribution
from dsh_subagents import _help
from dsh_subagents.cli import main

GOOD = """
from dsh_core import PluginSpec, hookimpl

@hookimpl
def dsh_plugins():
    return [PluginSpec(name="{spec}", apply=lambda ctx, config: None)]
"""


@pytest.fixture
def fake_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Three installed distributions: two good plugins and one that fails to import."""
    root = tmp_path / "site"
    write_distribution(
        root,
        "dsh-alpha",
        version="1.2.3",
        entry_points={"alpha": "alpha_plugin"},
        modules={"alpha_plugin": GOOD.format(spec="alpha")},
    )
    write_distribution(
        root,
        "dsh-beta",
        entry_points={"beta": "beta_plugin"},
        modules={"beta_plugin": GOOD.format(spec="beta")},
    )
    write_distribution(
        root,
        "dsh-broken",
        version="0.0.9",
        entry_points={"broken": "broken_plugin"},
        modules={"broken_plugin": "raise ImportError('this plugin is broken on purpose')\n"},
    )
    monkeypatch.syspath_prepend(str(root))
    return root


def test_cli_plugins_lists_and_exits_nonzero_on_failure(
    fake_plugins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[foundation] `dsh-subagents plugins` lists plugins with distribution and version; a
    failure -> 1."""
    monkeypatch.setenv("DSH_PLUGINS", "alpha,beta,broken")
    out = io.StringIO()
    assert main(["plugins"], out=out) == 1
    text = out.getvalue()
    assert "alpha" in text and "dsh-alpha" in text and "1.2.3" in text
    assert "broken (dsh-broken 0.0.9): import failed: ImportError" in text
    monkeypatch.setenv("DSH_PLUGINS", "alpha,beta")
    assert main(["plugins"], out=io.StringIO()) == 0


def test_cli_demo_runs_one_offline_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """[foundation], tools 15.5: `dsh-subagents demo` lists the plugins; without the tour's
    distributions it names the missing plugins and runs one turn on the scripted model."""
    monkeypatch.setenv("DSH_PLUGINS", "core")
    out = io.StringIO()
    assert main(["demo"], out=out) == 0
    text = out.getvalue()
    assert text.startswith("1 plugin from 1 distribution (`dsh-subagents plugins` lists")
    assert "needs plugins that no installed distribution mounts: subagent (dsh-subagent)" in text
    assert "tool-subagent-list-agents (dsh-tool-subagent-control)" in text
    assert "assistant > hello from the demo" in text
    assert "turn/start" in text and "turn/end" in text


def test_cli_demo_runs_on_a_script_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """dx 12.3: `dsh-subagents demo --model scripted:FILE --prompt TEXT` answers from the script; a
    script that cannot be read is a one-line error (exit 2), an unknown model a usage error."""
    monkeypatch.setenv("DSH_PLUGINS", "core")
    script = tmp_path / "script.toml"
    script.write_text('default = "echo: {{last_user}}"\n[[rules]]\nwhen = { last_user = "hi" }\n'
                      'reply = "scripted hello"\n')  # fmt: skip
    out = io.StringIO()
    assert main(["demo", "--model", f"scripted:{script}", "--prompt", "hi there"], out=out) == 0
    assert "assistant > scripted hello" in out.getvalue()
    out = io.StringIO()
    assert main(["demo", "--model", "scripted", "--prompt", "plain"], out=out) == 0
    assert "assistant > plain" in out.getvalue()
    assert main(["demo", "--model", f"scripted:{tmp_path / 'missing.toml'}"], out=out) == 2
    assert "[SCRIPT_INVALID]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--model", "anthropic:claude"], out=out)
    assert exc.value.code == 2
    assert "unknown model 'anthropic:claude'" in capsys.readouterr().err
    # CLI-64: a real model the installed plugins cannot reach is an error, never an offline run
    assert main(["demo", "--model", "openai:gpt-4o-mini"], out=out) == 2
    err = capsys.readouterr().err
    assert "llm-openai (dsh-llm-openai)" in err and "pip install" in err


@pytest.mark.parametrize("command", [[], ["plugins"], ["demo"], ["run"]])
def test_every_help_ends_with_examples(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """CLI-67: `--help` of the command and of every subcommand shows examples that start with
    `dsh-subagents`, and the scripted model is described in the one set of words."""
    with pytest.raises(SystemExit) as exc:
        main([*command, "--help"], out=io.StringIO())
    assert exc.value.code == 0
    text = capsys.readouterr().out
    examples = text.split("examples:\n", 1)[1]
    assert examples.lstrip().startswith("dsh-subagents ") or "dsh-subagents" in examples
    if command == ["demo"]:
        assert " ".join(_help.SCRIPTED.split()) in " ".join(text.split())
