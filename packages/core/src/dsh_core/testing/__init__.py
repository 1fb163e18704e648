"""Test support for dsh distributions and for users' own tests (public API).

See ``docs/testing.md``. Nothing here is imported by the runtime. The host builder and the
scripted model need nothing extra; ``pytest_plugin`` and ``check_entry_point`` need pytest and
``strategies`` needs hypothesis (``pip install "dsh-core[testing]"``).
"""

from __future__ import annotations

from .._scripted import ScriptedAdapter, ScriptedReply, ScriptedRequest, ScriptedToolCall
from ._distributions import write_distribution
from ._entry_points import check_entry_point
from ._host import SCRIPTED, TestHost, default_options, last_answer, scripted_host
from ._replies import held_reply, max_tokens_reply, model_error_reply, tool_call_reply
from ._words import REPR_MARKERS, repr_markers

__all__ = [
    "REPR_MARKERS",
    "SCRIPTED",
    "ScriptedAdapter",
    "ScriptedReply",
    "ScriptedRequest",
    "ScriptedToolCall",
    "TestHost",
    "check_entry_point",
    "default_options",
    "held_reply",
    "last_answer",
    "max_tokens_reply",
    "model_error_reply",
    "repr_markers",
    "scripted_host",
    "tool_call_reply",
    "write_distribution",
]
