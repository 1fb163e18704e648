"""The scripted model's example file (docs/examples/scripted-model.toml) does what
docs/scripted-model.md says (dx 12.3; host-core §2, the scripted adapter)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import dsh_core.plugin
from dsh_core import (
    AgentOptions,
    Context,
    CreateAgentOptions,
    DshError,
    PluginRow,
    ScriptedAdapter,
    SessionMeta,
    ToolDefinition,
    boot_host,
    make_plugin_manager,
    user_message,
)
from dsh_core.testing import last_answer, scripted_host

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "scripted-model.toml"
PAGE = ROOT / "docs" / "scripted-model.md"


async def _clock(args: object, run: object) -> str:
    return "12:00 UTC"


CLOCK = ToolDefinition(
    name="clock",
    description="The time of day in a zone.",
    parameters={"type": "object", "properties": {"zone": {"type": "string"}}},
    execute=_clock,
)


def test_the_page_shows_the_committed_file() -> None:
    """dx 12.3, host-core §2: the example on docs/scripted-model.md is the committed file."""
    page = PAGE.read_text(encoding="utf-8")
    assert f"```toml\n{EXAMPLE.read_text(encoding='utf-8')}```\n" in page


async def test_the_example_runs_through_the_llm_scripted_plugin() -> None:
    """dx 12.3, host-core §2: a composition mounting `llm-scripted` with `script = FILE`
    answers from the example: a greeting, a tool call and its follow-up, max-tokens, an error,
    the default."""
    pm = make_plugin_manager(autoload=False, plugins={"core": dsh_core.plugin})
    rows: list[str | PluginRow] = [
        "sessions",
        "llm",
        PluginRow(plugin="llm-scripted", config={"script": str(EXAMPLE)}),
        "tools",
        "system-prompt",
        "agents",
    ]

    def setup(agent_ctx: Context) -> None:
        agent_ctx.tools.register(CLOCK)

    async with await boot_host(rows, pm=pm) as host:
        handle = await host.ctx.agents.create(
            CreateAgentOptions(
                meta=SessionMeta(cwd=os.getcwd()),
                agent_options=AgentOptions(provider="scripted", model="scripted-1"),
                setup=setup,
            )
        )
        agent = handle.agent
        outcomes = []
        for text in ("Hello there", "what time is it?", "an essay, please", "fail now", "bye"):
            agent.followup(user_message(text))
            await agent.when_idle()
            reason = agent.session.events[-1].data.reason
            code = reason.error.code if reason.error is not None else None
            outcomes.append((reason.kind, code, last_answer(agent)))
        types = [e.type for e in agent.session.events]
        await handle.dispose()
    assert outcomes == [
        ("completed", None, "Hello! I am a scripted model."),
        ("completed", None, "The clock says 12:00 UTC."),
        ("max-tokens", None, "Once upon a"),
        ("error", "SCRIPTED_FAILURE", "Once upon a"),
        ("completed", None, "You said: bye"),
    ]
    assert types.count("tool/call") == types.count("tool/result") == 1


async def test_the_example_matches_on_the_system_prompt_and_offered_tools() -> None:
    """dx 12.3, host-core §2: `system` matches the persona; `tool` needs the tool offered
    (without `clock`, the time question falls through to the default)."""
    model = ScriptedAdapter.from_file(EXAMPLE)
    pirate = {"system-prompt": {"persona": "You are a pirate."}}
    async with scripted_host(model=model, config=pirate) as host:
        agent = (await host.create_agent()).agent
        assert await host.run(agent, "who are you?") == "Arr."
        assert await host.run(agent, "what time is it?") == "Arr."
    async with scripted_host(model=ScriptedAdapter.from_file(EXAMPLE)) as host:
        agent = (await host.create_agent()).agent
        assert await host.run(agent, "what time is it?") == "You said: what time is it?"
        assert await host.run(agent, "hello") == "Hello! I am a scripted model."
        blocks = agent.session.derive_messages()[-1].content
        assert [b.type for b in blocks] == ["reasoning", "text"]


def test_a_malformed_script_is_refused_when_loaded(tmp_path: Path) -> None:
    """dx 12.3, host-core §2: an unknown key fails at load with SCRIPT_INVALID, naming the rule."""
    bad = tmp_path / "bad.toml"
    bad.write_text(
        EXAMPLE.read_text(encoding="utf-8").replace("last_role =", "last_rol ="), encoding="utf-8"
    )
    with pytest.raises(DshError) as caught:
        ScriptedAdapter.from_file(bad)
    assert caught.value.code == "SCRIPT_INVALID" and isinstance(caught.value, ValueError)
    assert "rule 0" in str(caught.value)


def test_the_demo_runs_on_the_example(monkeypatch: pytest.MonkeyPatch) -> None:
    """dx 12.3: `dsh-subagents demo --model scripted:docs/examples/scripted-model.toml` answers
    from it."""
    import io

    from dsh_subagents.cli import main

    monkeypatch.setenv("DSH_PLUGINS", "core")
    out = io.StringIO()
    assert main(["demo", "--model", f"scripted:{EXAMPLE}", "--prompt", "hello"], out=out) == 0
    assert "assistant > Hello! I am a scripted model." in out.getvalue()
