"""Random frames from an ACP child against the ``acp`` provider's client side (ROB-35): a fake
agent process writes them before it answers the prompt."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsh_subagent.plugin
import dsh_subagent_acp.plugin
from dsh_core import SessionMeta, blocks_text, text_blocks
from dsh_core.testing import scripted_host
from dsh_subagent import SUBAGENTS, SubagentStartRequest

FAKE_AGENT = str(Path(__file__).with_name("fake_acp_agent.py"))
MODULES = {"subagent": dsh_subagent.plugin, "subagent-acp": dsh_subagent_acp.plugin}
#: Bounded in the default run; the profile's (2000) when thorough.
EXAMPLES = (
    settings.default.max_examples if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else 30
)

METHODS = (
    "session/update", "session/request_permission", "fs/read_text_file", "fs/write_text_file",
    "terminal/create", "$/cancel_request", "_ext/thing", "no/such", "",
)  # fmt: skip
LONE = st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800", "\ud83d\ude00", "\x00"])
texts = st.text(max_size=12) | LONE
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=10,
)
#: Ids of the child's requests, and of its answers: never the prompt's (2), which an answer
#: would settle (a peer may do that; it is not junk).
ids = (
    st.none() | st.sampled_from([-1, 0, 1, 3, 1.5, "a", "2"]) | st.booleans() | st.floats()
    | st.lists(st.integers(), max_size=2) | st.dictionaries(texts, texts, max_size=1)
).filter(lambda i: i != 2)  # fmt: skip
updates = st.fixed_dictionaries(
    {"sessionUpdate": st.sampled_from(["agent_message_chunk", "tool_call", "plan"]) | texts},
    optional={"content": json_values | st.fixed_dictionaries({"type": texts, "text": texts})},
)
params = json_values | st.fixed_dictionaries(
    {"sessionId": (texts | json_values).filter(lambda s: s != "fake-session-1")},
    optional={"update": updates | json_values, "options": json_values, "toolCall": json_values},
)


def _encode(message: Any) -> bytes:
    return json.dumps(message).encode()  # NaN, Infinity as Python writes them: not JSON


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """One line a child might write: a request, a notification, a response to nothing we
    asked, JSON that is no object, a line that is not JSON, a deep or a huge one."""
    kind = draw(st.sampled_from(
        ["request", "notification", "notification", "response", "value", "bytes", "deep", "huge"]
    ))  # fmt: skip
    if kind in ("request", "notification"):
        message: dict[str, Any] = {"jsonrpc": "2.0"}
        if kind == "request":
            message["id"] = draw(ids)
        message["method"] = draw(st.sampled_from(METHODS) | texts | json_values)
        if draw(st.booleans()):
            message["params"] = draw(params)
        return _encode(message)
    if kind == "response":
        body = draw(st.sampled_from(["result", "error"]))
        return _encode({"jsonrpc": "2.0", "id": draw(ids), body: draw(json_values)})
    if kind == "value":
        return _encode(draw(json_values.filter(lambda v: not isinstance(v, dict))))
    if kind == "bytes":
        return draw(st.binary(max_size=30)).replace(b"\n", b" ")
    if kind == "deep":
        depth = draw(st.integers(100, 5000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        inner = opener * depth + "1" + closer * depth
        return f'{{"jsonrpc":"2.0","method":"session/update","params":{inner}}}'.encode()
    size = draw(st.sampled_from([70_000, 2 << 20]))
    update = {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": "x" * size},
    }
    body = {"sessionId": "other", "update": update}
    return _encode({"jsonrpc": "2.0", "method": "session/update", "params": body})


class _Logs(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(junk=st.lists(frames(), min_size=1, max_size=8))
async def test_random_frames_from_the_child_leave_the_run_to_complete(junk: list[bytes]) -> None:
    """ROB-35: random lines from the child before its answer (requests and notifications with
    wrong types, unknown methods, answers to nothing we asked, JSON that is no object, lines
    that are not JSON, deep and huge values, lone surrogates) log no traceback and no error,
    and the run still completes with exactly the child's answer to its prompt."""
    handler = _Logs()
    root = logging.getLogger()
    root.addHandler(handler)
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as f:
        f.write(b"".join(line + b"\n" for line in junk))
    config = {
        "command": sys.executable,
        "args": [FAKE_AGENT, "--prompt", "lines"],
        "env": {"FAKE_ACP_LINES": f.name},
        "dispose_eof_grace_ms": 3000,
        "start_timeout_ms": 10_000,
    }
    try:
        async with scripted_host(
            "subagent", "subagent-acp", modules=MODULES, config={"subagent-acp": config}
        ) as host:
            handle = await host.create_agent(meta=SessionMeta(cwd=os.getcwd()))
            request = SubagentStartRequest(prompt=text_blocks("after junk"), parent=handle.agent)
            run = await handle.agent.ctx[SUBAGENTS].start("acp", request)
            try:
                async with asyncio.timeout(20):
                    result = await run.result
            finally:
                await run.dispose()
                await handle.dispose()
    finally:
        root.removeHandler(handler)
        os.unlink(f.name)
    assert (result.stop_reason, blocks_text(result.output)) == ("completed", "after junk"), (
        result.diagnostic
    )
    assert [r for r in handler.records if r.exc_info or r.levelno >= logging.ERROR] == []
    assert [r for r in handler.records if r.name == "root"] == []
