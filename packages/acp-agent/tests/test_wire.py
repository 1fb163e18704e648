"""dsh-acp-agent on the wire (ROB-20..ROB-29): served in this process on a pair of real pipes,
and a raw peer that writes and reads bytes on the other ends (what a client on the wire sees)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh_acp_agent import AgentServerConfig
from dsh_acp_agent.cli import serve

#: How long one read from the server may take in a test.
READ_S = 30.0
#: Random-frame examples: bounded in the default run, the profile's (2000) when thorough.
EXAMPLES = (
    settings.default.max_examples if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else 40
)


async def _pipe_streams(
    read_fd: int, write_fd: int, limit: int = 1 << 26
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", buffering=0)
    )
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(write_fd, "wb", buffering=0)
    )
    return reader, asyncio.StreamWriter(transport, protocol, None, loop)


class RawPeer:
    """The client's end: raw lines out, decoded lines in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.next_id = 1000
        self.notifications: list[dict[str, Any]] = []
        self.raw: list[bytes] = []  # every line the server wrote

    async def line(self, data: bytes | str) -> None:
        """Write ``data`` (one line; a newline is added) as it is."""
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogatepass")
        self.writer.write(data + b"\n")
        await self.writer.drain()

    async def send(self, message: Any) -> None:
        await self.line(json.dumps(message))

    async def read(self) -> Any:
        """The next line the server wrote, decoded (strict UTF-8: a frame that is not is a
        failure of the test)."""
        async with asyncio.timeout(READ_S):
            raw = await self.reader.readline()
        assert raw.endswith(b"\n"), f"the server closed the stream: {raw!r}"
        self.raw.append(raw)
        return json.loads(raw.decode("utf-8"))

    async def answer(self, request_id: Any) -> dict[str, Any]:
        """Read until the response to ``request_id``; notifications are kept."""
        while True:
            message = await self.read()
            if "method" in message:
                self.notifications.append(message)
            elif message.get("id") == request_id:
                return message  # type: ignore[no-any-return]

    async def request(self, method: str, params: Any) -> dict[str, Any]:
        self.next_id += 1
        request_id = self.next_id
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return await self.answer(request_id)

    async def new_session(self, cwd: str) -> str:
        answer = await self.request("session/new", {"cwd": cwd, "mcpServers": []})
        return answer["result"]["sessionId"]  # type: ignore[no-any-return]

    async def prompt(self, session_id: str, text: str) -> dict[str, Any]:
        params = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
        return await self.request("session/prompt", params)


@contextlib.asynccontextmanager
async def piped(config: AgentServerConfig | None = None) -> AsyncIterator[RawPeer]:
    """``dsh_acp_agent.cli.serve`` on two pipes; the peer's end closes at exit (EOF)."""
    to_server = os.pipe()
    to_client = os.pipe()
    server_reader, server_writer = await _pipe_streams(to_server[0], to_client[1])
    client_reader, client_writer = await _pipe_streams(to_client[0], to_server[1])
    config = config or AgentServerConfig()
    server = asyncio.ensure_future(serve(config, server_reader, server_writer))
    peer = RawPeer(client_reader, client_writer)
    try:
        await peer.request("initialize", {"protocolVersion": 1})
        yield peer
    finally:
        client_writer.close()
        try:
            async with asyncio.timeout(10):
                await server
        finally:
            server_writer.close()
            client_reader.feed_eof()


class Logs(logging.Handler):
    """Every record logged anywhere while it is installed on the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def at_least(self, level: int) -> list[logging.LogRecord]:
        return [r for r in self.records if r.levelno >= level]

    def assert_no_traceback(self) -> None:
        """No record carries a traceback, and nothing reached the root logger itself."""
        assert [r for r in self.records if r.exc_info] == []
        assert [r for r in self.records if r.name == "root"] == []


@pytest.fixture
def logs() -> Iterator[Logs]:
    handler = Logs()
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


@pytest.fixture
def hold(monkeypatch: pytest.MonkeyPatch) -> AgentServerConfig:
    """A server whose model is the test plugin ``hold_model`` (provider ``hold``)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    return AgentServerConfig(
        modules={"hold-model": "hold_model"}, plugins=({"plugin": "hold-model"},),
        provider="hold",
    )  # fmt: skip


BATCH = '[{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":1}}]'


@pytest.mark.parametrize("line", ["42", '"x"', "[]", "null", "true", "{}", BATCH])
async def test_json_that_is_not_a_request_is_answered_invalid_request(
    tmp_path: Path, logs: Logs, line: str
) -> None:
    """ROB-20: a line that is JSON but no JSON-RPC object (a number, a string, an array, null,
    a batch array, an object with neither method nor id) is answered -32600 with id null,
    logged once in one line naming the client, and the connection goes on: the session made
    before it still answers a prompt."""
    async with piped() as peer:
        sid = await peer.new_session(str(tmp_path))
        await peer.line(line)
        answer = await peer.read()
        assert answer["id"] is None and answer["error"]["code"] == -32600
        prompt = await peer.prompt(sid, "still here")
        assert prompt["result"]["stopReason"] == "end_turn"
    logs.assert_no_traceback()
    (warning,) = logs.at_least(logging.WARNING)
    assert warning.name == "dsh.acp_agent"
    assert "client" in warning.getMessage() and "-32600" in warning.getMessage()
    assert "\n" not in warning.getMessage()


@pytest.mark.parametrize(
    ("line", "answered_id"),
    [
        ('{"jsonrpc":"2.0","id":[1],"method":"initialize","params":{}}', None),
        ('{"jsonrpc":"2.0","id":{"a":1},"result":{}}', None),
        ('{"jsonrpc":"2.0","id":true,"method":"initialize","params":{}}', None),
        ('{"jsonrpc":"2.0","id":3,"method":5,"params":{}}', 3),
        ('{"jsonrpc":"2.0","id":"k","method":["session/new"]}', "k"),
    ],
)
async def test_an_object_the_sdk_cannot_route_is_answered_invalid_request(
    tmp_path: Path, logs: Logs, line: str, answered_id: Any
) -> None:
    """ROB-25: an object whose id is no string, number or null, or whose method is not a
    string, is answered -32600 (with its id when that one is usable), never passed on to the
    SDK, which raised on it and ended the connection."""
    async with piped() as peer:
        sid = await peer.new_session(str(tmp_path))
        await peer.line(line)
        answer = await peer.read()
        assert answer["id"] == answered_id and answer["error"]["code"] == -32600
        assert (await peer.prompt(sid, "on"))["result"]["stopReason"] == "end_turn"
    logs.assert_no_traceback()
    assert len(logs.at_least(logging.WARNING)) == 1


@pytest.mark.parametrize(
    "line", [b"this is not json {", b'{"jsonrpc": "2.0", "id": 1', b"NaN", b"\xff\xfe{}"]
)
async def test_a_line_that_is_not_json_is_one_log_line_and_a_parse_error(
    tmp_path: Path, logs: Logs, line: bytes
) -> None:
    """ROB-21: a line that is not JSON (or not UTF-8 and not JSON once repaired) is answered
    -32700 with id null and logged in one line: no traceback on the root logger (the SDK
    logged twelve lines of one)."""
    async with piped() as peer:
        sid = await peer.new_session(str(tmp_path))
        await peer.line(line)
        answer = await peer.read()
        assert answer == {
            "jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"},
        }  # fmt: skip
        assert (await peer.prompt(sid, "on"))["result"]["stopReason"] == "end_turn"
    logs.assert_no_traceback()
    warnings = [r.getMessage() for r in logs.at_least(logging.WARNING)]
    assert any("-32700" in w for w in warnings)
    assert all("\n" not in w for w in warnings)


async def test_cancel_request_and_stray_notifications_are_quiet(tmp_path: Path, logs: Logs) -> None:
    """ROB-22: `$/cancel_request` is accepted quietly (the SDK logged an ERROR traceback); an
    unknown notification and a session/cancel with params of the wrong type cost one line at
    most, never a traceback, and nothing is answered to a notification."""
    async with piped() as peer:
        sid = await peer.new_session(str(tmp_path))
        await peer.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"id": 3}})
        await peer.send({"jsonrpc": "2.0", "method": "no/such", "params": {}})
        await peer.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": 5}})
        await peer.send({"jsonrpc": "2.0", "method": "session/cancel", "params": 42})
        answer = await peer.prompt(sid, "on")
        assert answer["result"]["stopReason"] == "end_turn"
        assert [n["method"] for n in peer.notifications] == ["session/update"]
    logs.assert_no_traceback()
    assert logs.at_least(logging.ERROR) == []
    assert not [r for r in logs.at_least(logging.WARNING) if "cancel_request" in r.getMessage()]
    assert [r.levelno for r in logs.records if "$/cancel_request accepted" in r.getMessage()] == [
        logging.DEBUG
    ]
    assert len(logs.at_least(logging.WARNING)) <= 2


async def test_text_the_wire_cannot_carry_is_replaced_and_the_log_keeps_it(
    tmp_path: Path, logs: Logs, hold: AgentServerConfig
) -> None:
    """ROB-23: a lone surrogate the model said (in its text, and in a tool call's arguments
    echoed in the tool card) leaves as U+FFFD in valid UTF-8, never as a `\\ud800` escape a
    strict peer refuses; one warning per connection, not per frame; the session keeps what
    was said."""
    import hold_model

    config = attrs.evolve(hold, store="jsonl", store_root=str(tmp_path / "sessions"))
    async with piped(config) as peer:
        sid = await peer.new_session(str(tmp_path))
        for _ in range(2):
            answer = await peer.prompt(sid, "surrogate")
            assert answer["result"]["stopReason"] == "end_turn"
        wire = b"".join(peer.raw)
        wire.decode("utf-8")  # strict
        assert b"\\ud800" not in wire.lower()
        texts = json.dumps([n["params"]["update"] for n in peer.notifications], ensure_ascii=False)
        assert "bad \ufffd text" in texts and "x\ufffd" in texts
    logs.assert_no_traceback()
    (warning,) = [r for r in logs.at_least(logging.WARNING) if "U+FFFD" in r.getMessage()]
    assert "client" in warning.getMessage()
    stored = [
        json.dumps(json.loads(line), ensure_ascii=False)
        for path in (tmp_path / "sessions").rglob("*.jsonl")
        for line in path.read_bytes().decode("utf-8", "surrogatepass").splitlines()
    ]
    said = "bad " + hold_model.LONE + " text"
    assert any(said in entry for entry in stored)
    assert any('agent_id\\":\\"x' + hold_model.LONE in entry for entry in stored)


async def test_values_json_cannot_carry_leave_as_null(logs: Logs) -> None:
    """ROB-23: a frame holding a number that is not finite, a value nested deeper than the
    limit, or an object JSON has no form for still leaves as one line of strict JSON (the
    number and the deep part as null, the object as its text), with the one warning of the
    connection; the caller's value is not changed."""
    from dsh_acp_agent._wire import GuardedTransport

    to_server, to_peer = os.pipe(), os.pipe()
    reader, writer = await _pipe_streams(to_server[0], to_peer[1])
    peer_reader, peer_writer = await _pipe_streams(to_peer[0], to_server[1])
    transport = GuardedTransport(reader, writer, peer="test", log=logging.getLogger("t"))
    deep: Any = 1
    for _ in range(1000):
        deep = [deep]
    message = {"jsonrpc": "2.0", "method": "x", "params": {
        "nan": float("nan"), "inf": float("-inf"), "deep": deep, "odd": {1, 2} - {1, 2},
    }}  # fmt: skip
    try:
        await transport.send(message)
        await transport.send({"jsonrpc": "2.0", "id": 1, "result": {"n": float("inf")}})
        async with asyncio.timeout(READ_S):
            first = json.loads(await peer_reader.readline(), parse_constant=_no_constant)
            second = json.loads(await peer_reader.readline(), parse_constant=_no_constant)
    finally:
        for w in (writer, peer_writer):
            w.close()
    assert first["params"]["nan"] is None and first["params"]["inf"] is None
    assert first["params"]["odd"] == "set()"
    depth, part = 0, first["params"]["deep"]
    while isinstance(part, list):
        depth, part = depth + 1, part[0]
    assert part is None and 100 < depth < 1000
    assert second == {"jsonrpc": "2.0", "id": 1, "result": {"n": None}}
    assert isinstance(message["params"]["nan"], float)  # type: ignore[index]
    assert (
        len([r for r in logs.at_least(logging.WARNING) if "U+FFFD or null" in r.getMessage()]) == 1
    )


def _no_constant(name: str) -> Any:
    raise AssertionError(f"{name} on the wire")


async def test_lone_surrogates_from_the_client_are_read_as_replacement_characters(
    tmp_path: Path, logs: Logs
) -> None:
    """ROB-24: a frame with a lone surrogate escaped in its JSON (`"\\ud800"`), or with a byte
    that is not UTF-8 in a string (the SDK dropped the whole line with a traceback), crashes
    nothing: the prompt's text reaches the session as U+FFFD (one warning per connection and
    kind), the answer and its updates are valid UTF-8, and an escaped surrogate pair stays
    the character it encodes."""
    config = AgentServerConfig(store="jsonl", store_root=str(tmp_path / "sessions"))
    async with piped(config) as peer:
        sid = await peer.new_session(str(tmp_path))
        for text in ("one \\ud800 two", "\\udfff", "pair \\ud83d\\ude00"):
            request = (
                f'{{"jsonrpc":"2.0","id":{peer.next_id + 1},"method":"session/prompt",'
                f'"params":{{"sessionId":"{sid}","prompt":[{{"type":"text","text":"{text}"}}]}}}}'
            )
            peer.next_id += 1
            await peer.line(request)
            assert (await peer.answer(peer.next_id))["result"]["stopReason"] == "end_turn"
        await peer.line(
            b'{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"'
            + sid.encode()
            + b'","prompt":[{"type":"text","text":" caf\xe9"}]}}'
        )
        assert (await peer.answer(2))["result"]["stopReason"] == "end_turn"
        await peer.line('{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":'
                        '{"sessionId":"\\udc00","prompt":[]}}')  # fmt: skip
        assert (await peer.answer(1))["error"]["code"] == -32002
        echoed = "".join(n["params"]["update"]["content"]["text"] for n in peer.notifications)
        assert echoed == "one \ufffd two\ufffdpair \U0001f600 caf\ufffd"
        b"".join(peer.raw).decode("utf-8")
    log = (tmp_path / "sessions").rglob("*.jsonl")
    stored = "".join(p.read_text("utf-8") for p in log)
    assert "one \\ufffd two" in stored or "one \ufffd two" in stored
    logs.assert_no_traceback()
    replaced = [
        r.getMessage() for r in logs.at_least(logging.WARNING) if "U+FFFD" in r.getMessage()
    ]
    assert len(replaced) == 2


async def test_a_frame_larger_than_the_limit_is_refused_and_skipped(
    tmp_path: Path, logs: Logs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ROB-28: a line longer than the frame limit is read to its end without being kept,
    answered -32600 with id null, and the connection goes on (a peer cannot make the server
    buffer without bound)."""
    from dsh_acp_agent import _wire

    monkeypatch.setattr(_wire, "MAX_FRAME", 4096)
    async with piped() as peer:
        sid = await peer.new_session(str(tmp_path))
        await peer.line('{"pad": "' + "x" * 100_000 + '"}')
        answer = await peer.read()
        assert answer["id"] is None and answer["error"]["code"] == -32600
        assert (await peer.prompt(sid, "on"))["result"]["stopReason"] == "end_turn"
    logs.assert_no_traceback()
    (warning,) = logs.at_least(logging.WARNING)
    assert "4096" in warning.getMessage()


async def test_a_message_nested_too_deep_is_refused_with_its_id(tmp_path: Path, logs: Logs) -> None:
    """ROB-37: a request nested more than 200 levels deep (JSON the parser still reads) is
    answered -32600 with its own id, never handed to the SDK, whose error answer would echo
    it deeper than a peer's parser reads; the connection goes on. 200 levels pass."""
    async with piped() as peer:
        sid = await peer.new_session(str(tmp_path))
        deep = "[" * 900 + "1" + "]" * 900
        await peer.line('{"jsonrpc":"2.0","id":7,"method":"session/new","params":' + deep + "}")
        answer = await peer.read()
        assert answer["id"] == 7 and answer["error"]["code"] == -32600
        within = "[" * 198 + "1" + "]" * 198  # 199 levels with the message's own object
        await peer.line('{"jsonrpc":"2.0","id":8,"method":"session/new","params":' + within + "}")
        answer = await peer.read()
        assert answer["id"] == 8 and answer["error"]["code"] == -32602  # the SDK's own answer
        assert (await peer.prompt(sid, "on"))["result"]["stopReason"] == "end_turn"
    logs.assert_no_traceback()
    assert any("200 levels" in r.getMessage() for r in logs.at_least(logging.WARNING))


async def test_a_flood_of_bad_frames_is_answered_but_logged_only_so_far(
    tmp_path: Path, logs: Logs
) -> None:
    """ROB-27: every bad frame is answered, but only the first LOG_LIMIT of a connection are
    logged (the last of them says so): a client writing junk in a loop cannot fill the log."""
    from dsh_acp_agent._wire import LOG_LIMIT

    async with piped() as peer:
        sid = await peer.new_session(str(tmp_path))
        for _ in range(LOG_LIMIT + 15):
            await peer.line("42")
        for _ in range(LOG_LIMIT + 15):
            assert (await peer.read())["error"]["code"] == -32600
        assert (await peer.prompt(sid, "on"))["result"]["stopReason"] == "end_turn"
    warnings = [r.getMessage() for r in logs.at_least(logging.WARNING)]
    assert len(warnings) == LOG_LIMIT
    assert "the last logged" in warnings[-1]


async def test_any_host_serving_itself_on_streams_is_guarded(logs: Logs) -> None:
    """ROB-31: `ctx.acp_agent.serve(writer, reader)` on byte streams reads through the same
    guard: `42` is answered -32600 and logged naming `client`, and the connection goes on."""
    import dsh_acp_agent.plugin
    from dsh_core.testing import scripted_host

    async with scripted_host("acp-agent", modules={"acp-agent": dsh_acp_agent.plugin}) as host:
        to_server, to_client = os.pipe(), os.pipe()
        server_reader, server_writer = await _pipe_streams(to_server[0], to_client[1])
        client_reader, client_writer = await _pipe_streams(to_client[0], to_server[1])
        server = asyncio.ensure_future(host.ctx.acp_agent.serve(server_writer, server_reader))
        peer = RawPeer(client_reader, client_writer)
        try:
            await peer.line("42")
            assert (await peer.read())["error"] == {"code": -32600, "message": "Invalid Request"}
            answer = await peer.request("initialize", {"protocolVersion": 1})
            assert answer["result"]["protocolVersion"] == 1
        finally:
            client_writer.close()
            async with asyncio.timeout(10):
                await server
            server_writer.close()
    (warning,) = logs.at_least(logging.WARNING)
    assert warning.getMessage().startswith("client: sent a JSON number")


@pytest.mark.slow
def test_the_console_script_survives_junk_and_names_its_client(tmp_path: Path) -> None:
    """ROB-26: the dsh-acp-agent process given `42`, `null` and a line that is not JSON
    answers each (-32600, -32600, -32700), still answers initialize after them and exits 0 at
    EOF (it exited 1, or 0 with the request unanswered); stderr holds one line per bad frame,
    naming the client by its pid."""
    lines = [
        "42", "null", "not json",
        json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                    "params": {"protocolVersion": 1}}),
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "dsh_acp_agent"],
        input="".join(line + "\n" for line in lines),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(a["id"], a.get("error", {}).get("code")) for a in answers] == [
        (None, -32600), (None, -32600), (None, -32700), (0, None),
    ]  # fmt: skip
    assert answers[3]["result"]["protocolVersion"] == 1
    errors = done.stderr.splitlines()
    assert len(errors) == 3, done.stderr
    assert all(f"client (pid {os.getpid()})" in line for line in errors)


# -- ROB-29: random frames --------------------------------------------------------------------

#: Every error code a frame from the client may be answered with (docs/acp.md).
DOCUMENTED = {-32700, -32600, -32601, -32602, -32002}
METHODS = (
    "initialize", "session/new", "session/prompt", "session/cancel", "session/load",
    "session/set_mode", "authenticate", "session/update", "$/cancel_request", "_ext/thing",
    "no/such", "",
)  # fmt: skip
LONE = st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800", "\ud83d\ude00", "\x00"])
texts = st.text(max_size=12) | LONE
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=10,
)
ids = (
    st.none() | st.integers(-2, 3) | st.sampled_from(["a", "b", "final"]) | st.booleans()
    | st.floats() | st.lists(st.integers(), max_size=2) | st.dictionaries(texts, texts, max_size=1)
)  # fmt: skip
blocks = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image", "resource_link", "x"]) | json_values},
    optional={"text": texts | json_values, "uri": texts, "name": texts},
)
params = (
    json_values
    | st.fixed_dictionaries(
        {"sessionId": texts | json_values, "prompt": st.lists(blocks, max_size=3) | json_values}
    )
    | st.fixed_dictionaries(
        {"cwd": st.sampled_from(["/", "/tmp", "relative", ""]) | json_values},
        optional={"mcpServers": st.just([]) | json_values, "protocolVersion": json_values},
    )
)


def _encode(message: Any) -> bytes:
    return json.dumps(message).encode()  # NaN, Infinity as Python writes them: not JSON


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """One line a client might write: a request, a notification, a response, JSON that is no
    object, a line that is not JSON, a deep or a huge one."""
    kind = draw(st.sampled_from(
        ["request", "request", "notification", "response", "value", "bytes", "deep", "huge"]
    ))  # fmt: skip
    if kind in ("request", "notification"):
        message: dict[str, Any] = {"jsonrpc": draw(st.sampled_from(["2.0", "1.0", 2]))}
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
        return f'{{"jsonrpc":"2.0","id":1,"method":"session/new","params":{inner}}}'.encode()
    size = draw(st.sampled_from([70_000, 1 << 20]))
    return _encode({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
                    "params": {"sessionId": "x" * size, "prompt": []}})  # fmt: skip


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(junk=st.lists(frames(), min_size=1, max_size=8))
async def test_random_frames_get_documented_answers_and_lose_no_session(junk: list[bytes]) -> None:
    """ROB-29: random lines from a client (requests with wrong types, unknown methods,
    notifications, responses, duplicate ids, JSON that is no object, lines that are not
    JSON, deep and huge values, lone surrogates) get nothing but documented errors, every
    line the server writes is valid UTF-8 JSON, nothing logs a traceback, and the session made
    before them still answers a prompt."""
    handler = Logs()
    logging.getLogger().addHandler(handler)
    try:
        async with piped() as peer:
            sid = await peer.new_session("/")
            for line in junk:
                await peer.line(line)
            params = {"sessionId": sid, "prompt": [{"type": "text", "text": "after junk"}]}
            final = {"jsonrpc": "2.0", "id": "final!", "method": "session/prompt", "params": params}
            await peer.send(final)
            while True:
                message = await peer.read()
                assert isinstance(message, dict)
                if "method" in message:
                    assert message["method"] == "session/update"
                    peer.notifications.append(message)
                    continue
                if "error" in message:
                    assert message["error"]["code"] in DOCUMENTED, message["error"]
                if message.get("id") == "final!":
                    break
            assert message["result"] == {"stopReason": "end_turn"}
            mine = [n for n in peer.notifications if n["params"]["sessionId"] == sid]
            assert mine[-1]["params"]["update"]["content"]["text"] == "after junk"
    finally:
        logging.getLogger().removeHandler(handler)
    handler.assert_no_traceback()
    assert [r for r in handler.records if r.levelno >= logging.ERROR] == []
