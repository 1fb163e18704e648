"""dsh-acp-agent's own cost per prompt: stdin read in buffers the heap serves (PERF-23), a
prompt's last updates written with its answer, in one write (PERF-24), its answer's frame
handed to the SDK as it is (PERF-25), and frames encoded by one encoder (PERF-26)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from acp.schema import PromptResponse
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from dsh_acp_agent import AgentServerConfig, cli
from dsh_acp_agent._server import _ANSWERS, _SDK_DUMP
from dsh_acp_agent._wire import _ENCODE, HOLD_LIMIT, GuardedTransport
from dsh_acp_agent.cli import serve

#: The bound on every wait of these tests.
BOUND = 30.0


class RecordingWriter:
    """A stream writer that keeps each ``write`` call's bytes (and writes nothing)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.written = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.written.set()

    async def drain(self) -> None:
        return None

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        return None

    def lines(self, write: int) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.writes[write].splitlines()]


def _transport(writer: RecordingWriter) -> GuardedTransport:
    return GuardedTransport(
        asyncio.StreamReader(), writer,  # type: ignore[arg-type]
        peer="test", log=logging.getLogger("test"),
    )  # fmt: skip


def _note(n: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "session/update", "params": {"n": n}}


async def test_a_prompts_last_updates_and_its_answer_leave_in_one_write(tmp_path: Path) -> None:
    """PERF-24: a turn that never waits (the echo model) has its update written with the
    prompt's answer, in one write, the update first; the frames are the same as before."""
    to_server = os.pipe()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(to_server[0], "rb", buffering=0)
    )
    writer = RecordingWriter()
    server = asyncio.ensure_future(serve(AgentServerConfig(), reader, writer))  # type: ignore[arg-type]
    client = os.fdopen(to_server[1], "wb", buffering=0)

    async def call(request_id: int, method: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        writer.written.clear()
        before = len(writer.writes)
        frame = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        client.write(json.dumps(frame).encode() + b"\n")
        while not any(
            m.get("id") == request_id for w in writer.writes[before:] for m in json.loads(
                b"[" + b",".join(w.splitlines()) + b"]"
            )
        ):  # fmt: skip
            await writer.written.wait()
            writer.written.clear()
        assert len(writer.writes) == before + 1, writer.writes[before:]
        return writer.lines(before)

    try:
        async with asyncio.timeout(BOUND):
            await call(1, "initialize", {"protocolVersion": 1})
            sid = (await call(2, "session/new", {"cwd": str(tmp_path), "mcpServers": []}))[0][
                "result"
            ]["sessionId"]
            for n in range(3):
                prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": f"hi {n}"}]}
                update, answer = await call(10 + n, "session/prompt", prompt)
                assert update == {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {
                        "sessionId": sid,
                        "update": {
                            "content": {"text": f"hi {n}", "type": "text"},
                            "sessionUpdate": "agent_message_chunk",
                        },
                    },
                }
                assert answer == {
                    "jsonrpc": "2.0",
                    "id": 10 + n,
                    "result": {"stopReason": "end_turn"},
                }
    finally:
        client.close()
        async with asyncio.timeout(BOUND):
            await server


async def test_held_frames_leave_with_the_response_release_or_close() -> None:
    """PERF-24: frames sent after ``hold()`` are written, in their order, in one write with
    the next response; ``release()`` and ``close()`` write what is held without one; more
    than ``HOLD_LIMIT`` bytes held are written at once; without ``hold()`` every frame is a
    write of its own."""
    writer = RecordingWriter()
    wire = _transport(writer)
    await wire.send(_note(0))
    wire.hold()
    await wire.send(_note(1))
    await wire.send(_note(2))
    assert len(writer.writes) == 1
    await wire.send({"jsonrpc": "2.0", "id": 5, "result": {}})
    assert [m.get("params", m.get("id")) for m in writer.lines(1)] == [{"n": 1}, {"n": 2}, 5]
    await wire.send(_note(3))  # the hold ended with the response
    assert len(writer.writes) == 3

    wire.hold()
    await wire.send(_note(4))
    wire.release()
    assert writer.lines(3) == [_note(4)]

    wire.hold()
    big = {"jsonrpc": "2.0", "method": "session/update", "params": {"text": "x" * HOLD_LIMIT}}
    await wire.send(_note(5))
    await wire.send(big)
    assert writer.lines(4) == [_note(5), big]

    wire.hold()
    await wire.send(_note(6))
    await wire.close()
    assert writer.lines(5) == [_note(6)]
    assert len(writer.writes) == 6


async def test_stdin_is_read_in_buffers_below_the_mapping_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PERF-23: the console script's reads of stdin ask for at most 64 KiB each (asyncio's
    256 KiB buffer was a mapping of its own, made and unmade per prompt), and a line longer
    than that still arrives whole."""
    sizes: list[int] = []
    real_read = os.read

    def read(fd: int, n: int) -> bytes:
        sizes.append(n)
        return real_read(fd, n)

    read_fd, write_fd = os.pipe()
    out_read, out_write = os.pipe()
    line = b'{"text": "' + b"y" * (200 << 10) + b'"}\n'
    monkeypatch.setattr(sys, "stdin", os.fdopen(read_fd, "rb", buffering=0))
    monkeypatch.setattr(os, "read", read)
    feeder = threading.Thread(target=lambda: (os.write(write_fd, line), os.close(write_fd)))
    try:
        reader, writer = await cli._streams(os.fdopen(out_write, "wb", buffering=0))
        feeder.start()
        async with asyncio.timeout(BOUND):
            assert await reader.readuntil(b"\n") == line
        assert sizes
        assert max(sizes) <= 64 << 10
        writer.close()
    finally:
        feeder.join(BOUND)
        os.close(out_read)


def test_answers_give_the_sdk_their_frame_without_pydantics_serializer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PERF-25: each prompt answer, dumped the way the SDK dumps a result, is the frame
    pydantic makes of a plain ``PromptResponse`` with its stop reason, built without pydantic's
    serializer; any other dump of it is pydantic's."""
    frames = {
        kind: PromptResponse(stop_reason=answer.stop_reason).model_dump(**_SDK_DUMP)
        for kind, answer in _ANSWERS.items()
    }
    assert set(frames) == {"completed", "max-tokens", "max-steps", "aborted", "blocked"}
    assert all(frame == {"stopReason": frame["stopReason"]} for frame in frames.values())
    assert _ANSWERS["completed"].model_dump(by_alias=True)["stopReason"] == "end_turn"

    def refused(self: Any, **kwargs: Any) -> Any:
        raise AssertionError("pydantic's serializer ran")

    monkeypatch.setattr(BaseModel, "model_dump", refused)
    for kind, answer in _ANSWERS.items():
        assert isinstance(answer, PromptResponse)
        assert answer.model_dump(**_SDK_DUMP) == frames[kind]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=("Cs",))),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


@given(value=_JSON)
def test_frames_are_encoded_by_one_encoder_as_json_dumps_would(value: Any) -> None:
    """PERF-26: a frame's text is what ``json.dumps`` makes of it (compact, non-ASCII as
    itself), from one encoder built once rather than one per frame."""
    expected = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    real = json.encoder.c_make_encoder

    def refused(*args: Any) -> Any:
        raise AssertionError("an encoder was built for this frame")

    json.encoder.c_make_encoder = refused  # type: ignore[assignment]
    try:
        assert _ENCODE(value) == expected
    finally:
        json.encoder.c_make_encoder = real


def test_values_json_refuses_are_still_refused() -> None:
    """PERF-26: a number that is not finite, a value JSON has no form for and a circular
    value are refused as the standard encoder refuses them (a circular one by the recursion
    limit), so the transport's repair still takes over."""
    with pytest.raises(ValueError):
        _ENCODE({"x": float("nan")})
    with pytest.raises(TypeError):
        _ENCODE({"x": object()})
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(RecursionError):
        _ENCODE(loop)
