"""Errors of the ``acp`` provider: refusals before a run is published (ACP-2, ACP-4)."""

from __future__ import annotations

from dsh_subagent import SubagentError

__all__ = ["ABORTED_BEFORE_START", "AcpError"]

#: ACP-2: the text of an abort that landed before the child was published.
ABORTED_BEFORE_START = "subagent request was aborted before the ACP child started"


class AcpError(SubagentError):
    """``start()`` could not publish an ACP child; ``code`` says why.

    ``ACP_NO_CWD`` / ``ACP_CWD_INVALID``: no usable working directory (ACP-4);
    ``ACP_SPAWN_FAILED``: the command could not be started; ``ACP_START_TIMEOUT``: the child
    did not answer ``initialize`` and ``session/new`` within ``start_timeout_ms``;
    ``ACP_START_FAILED``: it exited or refused during set-up; ``ACP_NO_SESSION_ID``: its
    ``session/new`` answer held no session id. Every one is raised after the child was reaped.
    """

    code = "ACP_START_FAILED"
