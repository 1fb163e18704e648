"""dsh-acp-agent: streamed text leaves as the very frame the SDK's models would make (ACPC-70)."""

from __future__ import annotations

from acp.schema import SessionNotification
from acp.utils import serialize_params
from hypothesis import given
from hypothesis import strategies as st

from dsh_acp_agent._server import _Text


@given(
    thought=st.booleans(),
    parts=st.lists(st.text(), min_size=1, max_size=4),
    session_id=st.text(min_size=1),
)
def test_streamed_text_params_match_the_sdk_serialization(
    thought: bool, parts: list[str], session_id: str
) -> None:
    """ACPC-70: the params built for streamed text (answer or reasoning, one part or several)
    are what the SDK serializes from the update's models, key for key."""
    text = _Text(thought, parts[0])
    text.parts.extend(parts[1:])
    expected = serialize_params(SessionNotification(session_id=session_id, update=text.update()))
    assert text.params(session_id) == expected
