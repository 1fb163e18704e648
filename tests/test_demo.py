"""`dsh-subagents demo` as a person runs it: a subprocess on every installed distribution, whose
transcript shows the tour of the subagent seam (tools 15.5)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dsh_core import Message, TextBlock, ToolCallDelta, user_message
from dsh_core._llm import GenerateOptions
from dsh_core.testing import ScriptedAdapter
from dsh_subagents._demo import TOUR_SCRIPT, demo_store

ID = r"session-[0-9a-f]+"
#: A child's name in the transcript: a word of its label and its id's last four characters.
NAME = r"[a-z0-9]+·[0-9a-f]{4}"


def _demo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
    env["DSH_SUBAGENTS_HOME"] = str(tmp_path / "home")
    env["COLUMNS"] = "80"
    return subprocess.run(
        [sys.executable, "-m", "dsh_subagents.cli", "demo", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One run of `dsh-subagents demo` with its default store: the transcript and
    $DSH_SUBAGENTS_HOME."""
    tmp_path = tmp_path_factory.mktemp("demo")
    done = _demo(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, tmp_path / "home"


def _lines(text: str, who: str, mark: str) -> list[str]:
    """The entries of ``who`` with ``mark`` (first lines only)."""
    return [line for line in text.splitlines() if re.match(rf"  {who}\s+{mark} ", line)]


def test_the_coordinator_fans_out_three_continuable_children_in_one_response(
    tour: tuple[str, Path],
) -> None:
    """tools 15.5, TOOL-9, TOOL-10, CLI-60, CLI-61: three `subagent` calls in one response each
    start a continuable spawn child (`started subagent <name>`), named by a word of its label
    and its id's last characters; each child's lines follow the result that started it."""
    text, _ = tour
    lines = text.splitlines()
    calls = [i for i, line in enumerate(lines) if re.match(r"  coordinator\s+→ subagent ", line)]
    assert len(calls) == 3
    between = lines[calls[0] : calls[-1] + 1]  # nothing else happens between the three calls
    assert all(re.match(r"  (coordinator\s+→ subagent|\s{17})", line) for line in between)
    for name, label in (
        ("flights", "Find Lisbon flights"),
        ("hotel", "Find an Alfama hotel"),
        ("weather", "Check the weekend weather"),
    ):
        started = next(
            i for i, line in enumerate(lines) if re.search(rf"← started subagent {name}·", line)
        )
        assert re.match(rf'  {name}·[0-9a-f]{{4}}\s+⇢ started: spawn child "{label}"',
                        lines[started + 1]), lines[started : started + 2]  # fmt: skip


def test_children_report_and_every_epoch_sends_a_settlement_notice(
    tour: tuple[str, Path],
) -> None:
    """tools 15.5, RPT-3, SET-1, SET-2: two children call `report` and the coordinator receives
    both reports; each of the six epochs that ended sends one settlement notice."""
    text, _ = tour
    assert len([s for s in text.splitlines() if re.match(rf"  {NAME}\s+→ report ", s)]) == 2
    arrived = _lines(text, "coordinator", "⇐")
    reports = [s for s in arrived if re.search(rf"Background subagent {NAME} reported:$", s)]
    notices = [s for s in arrived if re.search(rf"Background subagent {NAME} finished", s)]
    assert len(reports) == 2
    assert len(notices) == 6  # four children, two of them twice
    assert text.count("Its closing message:") == 6


def test_the_coordinator_follows_up_with_a_settled_child_by_a_cold_resume(
    tour: tuple[str, Path],
) -> None:
    """tools 15.5, CTL-1, CTL-2, CONT-7, CONT-10: after the flights child settled,
    `send_message` brings it back in a second epoch from the store, and it answers."""
    text, home = tour
    call, _ = _lines(text, "coordinator", "→ send_message")  # the flights child, the postcard
    child = re.search(rf'"subagent_id": "({NAME})"', call)
    assert child is not None
    name = child.group(1)
    first_notice = text.index(f"Background subagent {name} finished")
    assert text.index("→ send_message") > first_notice  # it had settled: a cold resume
    assert re.search(rf"{name}\s+⇢ resumed \(epoch 2: a cold resume from the store\)", text)
    assert f"message queued as the next turn for subagent {name}" in text
    assert "Return: TP1356" in text
    (full,) = re.findall(rf"^│ +(session-[0-9a-f]*{name[-4:]})$", text, re.MULTILINE)
    assert (home / "demo" / f"{full}.jsonl").is_file()


def test_a_fork_child_runs_in_the_foreground_seeded_with_completed_turns(
    tour: tuple[str, Path],
) -> None:
    """tools 15.5, FORK-1, FORK-2, TOOL-7: the `fork` tool runs a one-shot fork child in the
    foreground; it is seeded with the coordinator's completed turns and its answer is the
    tool result."""
    text, _ = tour
    assert _lines(text, "coordinator", "→ fork")
    assert re.search(r"⇢ started: fork child \(seeded with the coordinator's completed", text)
    assert re.search(r"  coordinator\s+← Within budget", text)


def test_the_coordinator_lists_its_agents_answers_and_the_tree_is_printed(
    tour: tuple[str, Path],
) -> None:
    """tools 15.5, CTL-4, CTL-5, BUG-4, LIST-6: `list_agents` shows the four continuable
    children `[ready]`; the final answer follows; the child tree read back from the store
    lists five children, the flights child with two epochs."""
    text, _ = tour
    assert _lines(text, "coordinator", "→ list_agents")
    assert len(re.findall(rf"{NAME} \[ready\] — ", text)) == 4
    answers = _lines(text, "coordinator", ">")
    assert answers[-1].split("> ", 1)[1].startswith("Your weekend in Lisbon")
    tree = text.split("the child tree, read back from the store", 1)[1]
    assert re.search(r'flights·\w{4} "Find Lisbon flights" \(spawn, continuable, 2 epochs\)', tree)
    assert re.search(r'fork·\w{4} "Review the plan\'s budget" \(fork, one-shot\)', tree)
    assert len(re.findall(rf"^(├|└)── {NAME}", tree, re.MULTILINE)) == 5
    assert len(re.findall(rf"^(│|\s)\s+({ID}|[0-9a-f]+)$", tree, re.MULTILINE)) == 5


def test_an_acp_child_is_one_of_the_coordinators_children(tour: tuple[str, Path]) -> None:
    """acp 16.4, CLI-62, ACPC-1: the coordinator's `postcard` tool (a continuable `subagent` row
    for the `acp` provider) runs a child in another process (a dsh-acp-agent) over ACP, in the
    transcript and in the tree; its settlement notice, with the child's answer, reaches the
    coordinator, whose `send_message` follow-up is a second epoch in the same ACP session;
    there is no separate ACP section."""
    text, _ = tour
    assert _lines(text, "coordinator", "→ postcard")
    started = r"  postcard·\w{4}\s+⇢ started: acp child \(another process, over ACP\)"
    assert re.search(started, text)
    assert re.search(r"  coordinator\s+← started subagent postcard·\w{4}", text)
    notice = r"  coordinator\s+⇐ Background subagent postcard·\w{4} finished"
    assert re.search(notice, text)
    answered = notice + r"(.*\n){1,3}?\s+Its closing message:\n\s+Lisbon, Friday to Sunday: TP1351"
    assert re.search(answered, text), text
    assert re.search(r'→ send_message \{"subagent_id": "postcard·\w{4}", "message":', text)
    follow_up = r"postcard·\w{4}\s+⇢ resumed \(epoch 2: a follow-up in the same ACP session\)"
    assert re.search(follow_up, text)
    assert re.search(r"  postcard·\w{4}\s+> Sign it: with love", text)
    tree = text.split("the child tree, read back from the store", 1)[1]
    assert re.search(r'── postcard·\w{4} "Write the postcard" \(acp, continuable, 2 epochs', tree)
    assert "one ACP child" not in text


def test_the_demo_opens_with_one_line_about_plugins_and_fits_the_terminal(
    tour: tuple[str, Path],
) -> None:
    """CLI-63: the demo says in one line how many plugins it found (the `plugins` command
    lists them), and no line is wider than the terminal (COLUMNS=80)."""
    text, _ = tour
    first = text.splitlines()[0]
    assert re.fullmatch(r"\d+ plugins from \d+ distributions \(`dsh-subagents plugins`.*\)", first)
    assert "entry point" not in text
    # The store's folder is printed whole (a path cannot be wrapped); every other line fits.
    wide = [
        line
        for line in text.splitlines()
        if len(line) > 80 and not line.startswith("  sessions are kept in ")
    ]
    assert wide == []


#: A script whose coordinator answers and delegates nothing (the scripted-model guide's).
EXAMPLE = Path(__file__).parents[1] / "docs" / "examples" / "scripted-model.toml"


@pytest.fixture(scope="module")
def on_a_script(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One run of `dsh-subagents demo --model scripted:EXAMPLE --prompt hello --store kept`
    from a fresh folder: the transcript and that folder."""
    tmp_path = tmp_path_factory.mktemp("script")
    done = _demo(tmp_path, "--model", f"scripted:{EXAMPLE}", "--prompt", "hello", "--store",
                 "kept")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, tmp_path


def test_the_demo_keeps_its_store_under_dsh_home_or_store(
    on_a_script: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tools 15.5, [cli] 1: the demo's JSONL store is `--store DIR`, else
    `$DSH_SUBAGENTS_HOME/demo`, else `~/.dsh-subagents/demo` (never DeepSeek Harness's
    `$DSH_HOME` or `~/.dsh`). The default store holds the tour's children (the cold-resume
    test finds one there); `--store` is checked on a run with a script."""
    text, where = on_a_script
    assert f"sessions are kept in {Path('kept')}" in text
    assert len(list((where / "kept").glob("*.jsonl"))) == 1  # the coordinator: no children
    assert not (where / "home" / "demo").exists()
    assert demo_store("elsewhere") == Path("elsewhere")
    monkeypatch.delenv("DSH_SUBAGENTS_HOME", raising=False)
    monkeypatch.setenv("DSH_HOME", str(tmp_path / "other-tool"))
    assert demo_store(None) == Path.home() / ".dsh-subagents" / "demo"
    monkeypatch.setenv("DSH_SUBAGENTS_HOME", str(tmp_path))
    assert demo_store(None) == tmp_path / "demo"


def test_the_embedded_script_is_a_valid_script() -> None:
    """tools 15.5, host-core §2: the tour's embedded script loads as script data."""
    assert ScriptedAdapter.from_data(TOUR_SCRIPT)


def test_the_coordinator_runs_on_a_script_file(on_a_script: tuple[str, Path]) -> None:
    """tools 15.5, dx 12.3: `dsh-subagents demo --model scripted:FILE --prompt TEXT` runs the tour's
    coordinator on the script; a coordinator that delegates nothing has no children."""
    text, _ = on_a_script
    assert f"on the offline scripted model (the script {EXAMPLE})" in text
    assert re.search(r"  coordinator\s+> Hello! I am a scripted model\.", text)
    assert "└── (no children)" in text


def _notice(child: str, closing: str) -> Message:
    summary = f"Background subagent {child} finished and will do no further work unless you "
    return Message(
        id=f"n-{child}-{closing[:6]}",
        role="user",
        content=tuple(
            TextBlock(text=t) for t in (summary + "send it more.", "Its closing message:", closing)
        ),
    )


async def _coordinator_calls(*messages: Message) -> list[str]:
    """The tools the embedded script's coordinator calls after ``messages`` ('' for text)."""
    options = GenerateOptions(
        provider="scripted",
        model="tour",
        messages=messages,
        system="You coordinate a small team of helper agents.",
    )
    chunks = [c async for c in ScriptedAdapter.from_data(TOUR_SCRIPT).stream(options)]
    return [c.name for c in chunks if isinstance(c, ToolCallDelta)] or [""]


async def test_the_coordinator_reviews_only_once_every_notice_is_in() -> None:
    """tools 15.5, SET-2: the embedded coordinator follows up on the flights child's first
    notice and forks the review only when the notices of all three children, the flights
    child's second one included, have arrived, in whichever order and batches they came."""
    said = Message(id="a", role="assistant", content=(TextBlock(text="ok"),))
    outbound = _notice("f", "Outbound: TP1351")
    ret, hotel, sun = _notice("f", "Return: TP1356"), _notice("h", "Memmo"), _notice("w", "Sunny")
    assert await _coordinator_calls(user_message("plan it")) == ["subagent"] * 3
    assert await _coordinator_calls(said, outbound) == ["send_message"]
    assert await _coordinator_calls(hotel, said, ret) == [""]  # the weather is still out
    assert await _coordinator_calls(hotel, said, ret, said, sun) == ["fork"]
    assert await _coordinator_calls(sun, hotel, said, ret) == ["fork"]


def test_the_demo_runs_on_a_real_model_route(tmp_path: Path) -> None:
    """CLI-65: `demo --model openai:MODEL` runs the coordinator and its children on that model
    through dsh-llm-openai (here the loopback server): the coordinator's `subagent` call starts a
    spawn child whose requests go to the same model with the researcher's persona; the tour ends
    when everything settled."""
    from dsh_llm_openai.testing import ChatCompletionsServer, Reply, chunk, text_reply

    call = {
        "index": 0,
        "id": "c1",
        "function": {
            "name": "subagent",
            "arguments": '{"description": "Find Lisbon flights", "prompt": "Find a flight."}',
        },
    }
    first = Reply(chunks=(chunk(tool_calls=[call]), chunk(finish_reason="tool_calls")))
    with ChatCompletionsServer(first, default=text_reply("Done.")) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DSH_", "OPENAI_"))}
        env.update(
            DSH_SUBAGENTS_HOME=str(tmp_path / "home"),
            COLUMNS="80",
            OPENAI_BASE_URL=server.base_url,
            OPENAI_API_KEY="sk-loopback",
        )
        done = subprocess.run(
            [sys.executable, "-m", "dsh_subagents.cli", "demo", "--model", "openai:loop-1"],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False,
        )  # fmt: skip
        requests = list(server.requests)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "on the model loop-1 (provider openai)" in done.stdout
    assert re.search(r"  flights·\w{4}\s+⇢ started: spawn child", done.stdout)
    assert {r.body["model"] for r in requests} == {"loop-1"}
    systems = [str(r.body["messages"][0]["content"]) for r in requests]
    assert any("travel researcher" in s for s in systems)  # the child's persona
    assert len(requests) >= 3  # the coordinator, the child, the coordinator again
