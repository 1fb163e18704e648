"""The command's help texts: one description of each model, and examples for every command.

Every ``--help`` ends with examples (argparse epilogs, shown as written). The scripted model is
described once, here, and the help of every command that takes ``--model`` uses the words.
"""

from __future__ import annotations

import shutil
import textwrap
from typing import Final

__all__ = ["DEMO_EPILOG", "MAIN_EPILOG", "PLUGINS_EPILOG", "RUN_EPILOG", "SCRIPTED", "paragraphs"]


def paragraphs(*texts: str) -> str:
    """``texts`` as paragraphs filled to the terminal's width (at most 78 columns): a
    description shown by the raw formatter that keeps the epilog's examples as written."""
    width = min(78, shutil.get_terminal_size((80, 24)).columns - 2)
    return "\n\n".join(textwrap.fill(text, max(width, 40)) for text in texts)


#: The one description of the scripted model (docs/scripted-model.md opens with the same).
SCRIPTED: Final = (
    "the scripted model: offline, no keys; it echoes the prompt, or answers from a script "
    "file of rules (docs/scripted-model.md)"
)

MAIN_EPILOG: Final = """\
examples:
  dsh-subagents demo                      the offline tour of the subagent seam
  dsh-subagents run "Plan my weekend"     one agent on a prompt; it may delegate to subagents
  dsh-subagents plugins                   what is installed, and what failed to load

Stored sessions live under $DSH_SUBAGENTS_HOME (default ~/.dsh-subagents).
`dsh-subagents COMMAND --help` shows a command's options and examples."""

PLUGINS_EPILOG: Final = """\
examples:
  dsh-subagents plugins                   every plugin: entry point, distribution, version
  DSH_PLUGINS=core,subagent-spawn dsh-subagents plugins
                                          only the named entry points or distributions

The exit status is 1 when a plugin failed to load (it is listed with the reason)."""

DEMO_EPILOG: Final = """\
examples:
  dsh-subagents demo                      the tour on the embedded script (offline, no keys)
  dsh-subagents demo --model scripted:my-script.toml --prompt "hello"
                                          the coordinator answers from your script
  OPENAI_API_KEY=sk-... dsh-subagents demo --model openai:gpt-4o-mini
                                          the coordinator and its children on a real model
  dsh-subagents demo --store ./tour       keep the tour's sessions in ./tour

Only the ids, the store's folder and the order of lines of children working at the
same time change between two runs."""

RUN_EPILOG: Final = """\
examples:
  dsh-subagents run "hello"               the offline echo model; it may start subagents
  OPENAI_API_KEY=sk-... dsh-subagents run --model openai:gpt-4o-mini "Name three primes."
  dsh-subagents run --config deepseek.toml "Name three lighthouses."
                                          a composition file (docs/configuration.md)
  dsh-subagents run -c "And the oldest?"  continue the latest stored session
  echo "Summarise this" | dsh-subagents run -u
                                          the prompt from a pipe; tokens used, per turn

The run lasts until every subagent settled. Sessions are stored under
$DSH_SUBAGENTS_HOME/sessions (--no-store keeps them in memory)."""
