"""dsh-acp-agent's process start: the SDK's models imported without their docstrings (ACPC-71)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_SDK_IMPORT_PROBE = """
import json
from pydantic import BaseModel, ConfigDict
from pydantic._internal import _fields
from dsh_acp_agent import cli

hook = _fields._update_fields_from_docstrings
cli._import_sdk()
import acp.schema as s

class Later(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)
    x: int
    '''the docstring'''

frame = {"sessionId": "s", "prompt": [{"type": "text", "text": "hi"}]}
request = s.PromptRequest.model_validate(frame)
print(json.dumps({
    "sdk": s.PromptRequest.model_fields["prompt"].description,
    "restored": _fields._update_fields_from_docstrings is hook,
    "later": Later.model_fields["x"].description,
    "frame": request.model_dump(mode="json", by_alias=True, exclude_none=True),
}))
"""


def test_console_script_imports_the_sdk_models_without_their_docstrings(tmp_path: Path) -> None:
    """ACPC-71: the console script imports the SDK's models without reading their fields'
    docstrings (none becomes a description), puts pydantic's hook back at once (a model made
    later keeps its docstring), and the models validate and serialize as ever."""
    probe = tmp_path / "probe.py"  # a file: pydantic reads a class's docstrings from its source
    probe.write_text(_SDK_IMPORT_PROBE, encoding="utf-8")
    found = subprocess.run(
        [sys.executable, "-P", str(probe)],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    assert json.loads(found.stdout) == {
        "sdk": None,
        "restored": True,
        "later": "the docstring",
        "frame": {"sessionId": "s", "prompt": [{"type": "text", "text": "hi"}]},
    }
