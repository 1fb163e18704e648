"""What a model-facing text must never show (ROB-90): a Python repr, a validator's or a
parser's own wording."""

from __future__ import annotations

import re

__all__ = ["REPR_MARKERS", "repr_markers"]

#: Fragments that give away a Python repr, a traceback, fastjsonschema's or the json module's
#: wording. Checked outside double-quoted JSON strings (a model's own names are shown quoted).
REPR_MARKERS = (
    "['",
    "{'",
    "('",
    "\\x",
    "Traceback",
    "<class",
    " object at 0x",
    "data must",
    "data[",
    "char ",
    "Expecting ",
    "line 1 column",
    "JsonSchema",
    "fastjsonschema",
)
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def repr_markers(text: str) -> list[str]:
    """The :data:`REPR_MARKERS` in ``text`` outside its double-quoted JSON strings, and
    ``"a control character"`` when it holds a raw one other than newline and tab: empty when
    the text reads as plain words."""
    bare = _QUOTED.sub('""', text)
    found = [m for m in REPR_MARKERS if m in bare]
    if _CONTROL.search(text):
        found.append("a control character")
    return found
