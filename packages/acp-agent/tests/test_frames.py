"""dsh-acp-agent: text leaves as the very frame the SDK's models would make (ACPC-70)."""

from __future__ import annotations

from acp import helpers
from acp.schema import SessionNotification
from acp.utils import serialize_params
from hypothesis import given
from hypothesis import strategies as st

from dsh_acp_agent._server import _MESSAGE, _THOUGHT, _USER, _Text

#: Each kind of text update and the SDK's own helper that builds it.
_HELPERS = {
    _MESSAGE: helpers.update_agent_message_text,
    _THOUGHT: helpers.update_agent_thought_text,
    _USER: helpers.update_user_message_text,
}


@given(
    kind=st.sampled_from(sorted(_HELPERS)),
    parts=st.lists(st.text(), min_size=1, max_size=4),
    session_id=st.text(min_size=1),
)
def test_text_params_match_the_sdk_serialization(
    kind: str, parts: list[str], session_id: str
) -> None:
    """ACPC-70: the params built for text (an answer, its reasoning, or a replayed user
    message; one part or several) are what the SDK serializes from its own helper's update,
    key for key."""
    text = _Text(kind, parts[0])
    text.parts.extend(parts[1:])
    update = _HELPERS[kind]("".join(parts))
    expected = serialize_params(SessionNotification(session_id=session_id, update=update))
    assert text.params(session_id) == expected
    assert serialize_params(SessionNotification(session_id=session_id, update=text.update())) == (
        expected
    )
