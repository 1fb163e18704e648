"""A dependency-free fake ACP agent: JSON-RPC 2.0 over stdio with the standard library only.

Each test picks its behaviour with flags (see ``main``). It starts in a few tens of
milliseconds, where an agent on the SDK pays about a second of imports.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import types

#: What ``--prompt`` makes of a prompt (see ``main``).
PROMPT_MODES = (
    "echo", "slow", "ignore-cancel", "crash", "env", "permission", "refuse", "answer-exit",
    "exit0", "close-stdout", "foreign-ids", "big", "other-session", "no-options", "non-utf8",
    "long-stop", "malformed", "junk", "raw-prompt", "surrogate-in", "bad-error", "lines",
    "terminal", "turns", "message-ids",
)  # fmt: skip

#: What ``--prompt junk`` writes before its answer, and the code each one is answered with.
JUNK = (
    ("42", -32600),
    ('"x"', -32600),
    ("[]", -32600),
    ("null", -32600),
    ('[{"jsonrpc": "2.0", "id": 9, "method": "session/update", "params": {}}]', -32600),
    ("this is not json {", -32700),
    ("{}", -32600),
    ('{"jsonrpc": "2.0", "id": [1], "result": {}}', -32600),
    ('{"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"id": 0}}', None),
    ('{"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": 5}}', None),
    ('{"jsonrpc": "2.0", "method": "no/such", "params": {}}', None),
)


def send(message: object) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(request_id: object, result: dict) -> None:
    send({"jsonrpc": "2.0", "id": request_id, "result": result})


def update(session_id: str, body: dict) -> None:
    send(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": session_id, "update": body},
        }
    )


def chunk(session_id: str, text: str, kind: str = "agent_message_chunk") -> None:
    update(session_id, {"sessionUpdate": kind, "content": {"type": "text", "text": text}})


#: The flags: a switch (``False`` until given) or a value (its default; an ``int`` default
#: makes the value an int). ``--prompt`` takes one of ``PROMPT_MODES``.
FLAGS: dict[str, object] = {
    "prompt": "echo",
    "stop": "end_turn",  # the stopReason of an echo
    "no-init": False,  # never answer initialize
    "no-session-id": False,
    "exit-at-init": False,  # exit 5 on initialize
    "trap-term": False,  # ignore SIGTERM
    "hold-eof": False,  # keep running after stdin EOF
    "garbage": False,  # garbage lines before answers
    "flood-stderr": 0,  # lines written to stderr
    "extras": False,  # thoughts, tool cards, images
    "grandchild": False,  # start a SIGTERM-proof child
    "daemon": False,  # start a child in a session of its own that keeps our stdout and stderr
    "say": "",  # a line for stderr at start
    "echo-prefix": "echo: ",
    "hold-text": None,  # a prompt answered as --prompt slow
    "hang-new": False,  # never answer session/new
    "linger-ms": 0,  # work this long after EOF
    "load": False,  # advertise loadSession; a load replays REPLAYED
    "resume": False,  # advertise session resume only
}


def parse_flags(argv: list[str]) -> types.SimpleNamespace:
    """``--name value`` or ``--name=value`` for a value, ``--name`` for a switch; anything else
    exits 1 with a line on stderr, as argparse would (with 2) (whose import alone costs each of the
    many processes the tests start about a fifth of its start-up)."""
    values = dict(FLAGS)
    rest = list(argv)
    while rest:
        word = rest.pop(0)
        name, given, value = word[2:].partition("=")
        if not word.startswith("--") or name not in FLAGS:
            sys.exit(f"fake_acp_agent: unknown argument {word!r}")
        if FLAGS[name] is False:
            if given:
                sys.exit(f"fake_acp_agent: --{name} takes no value")
            values[name] = True
            continue
        if not given:
            if not rest:
                sys.exit(f"fake_acp_agent: --{name} needs a value")
            value = rest.pop(0)
        if isinstance(FLAGS[name], int):
            try:
                values[name] = int(value)
            except ValueError:
                sys.exit(f"fake_acp_agent: --{name} needs a whole number, got {value!r}")
        else:
            values[name] = value
    if values["prompt"] not in PROMPT_MODES:
        sys.exit(f"fake_acp_agent: --prompt must be one of {', '.join(PROMPT_MODES)}")
    return types.SimpleNamespace(**{k.replace("-", "_"): v for k, v in values.items()})


def hold() -> None:
    """Stay alive, doing nothing (until a signal that is not ignored ends us)."""
    while True:
        time.sleep(3600)


def main() -> None:
    args = parse_flags(sys.argv[1:])

    if args.trap_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pidfile = os.environ.get("FAKE_ACP_PIDFILE")
    if args.grandchild:
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.closerange(0, 3)
            hold()
        if pidfile:
            with open(pidfile + ".grandchild", "w") as f:
                f.write(str(pid))
    if args.daemon:
        pid = os.fork()
        if pid == 0:
            os.setsid()
            os.close(0)
            time.sleep(30)
            os._exit(0)
        if pidfile:
            with open(pidfile + ".daemon", "w") as f:
                f.write(str(pid))
    if pidfile:
        with open(pidfile, "w") as f:
            f.write(str(os.getpid()))
    if args.say:
        sys.stderr.write(args.say + "\n")
        sys.stderr.flush()

    session_id = "fake-session-1"
    seen: dict = {}
    pending_prompt: object = None
    permission_for: object = None
    methods_log = os.environ.get("FAKE_ACP_METHODS", "").replace("{pid}", str(os.getpid()))
    for raw in sys.stdin:
        try:
            message = json.loads(raw)
        except ValueError:
            continue
        method = message.get("method")
        request_id = message.get("id")
        if methods_log and method is not None:
            with open(methods_log, "a") as log:
                log.write(method + "\n")
        if args.garbage and method is not None:  # not on an answer (to our garbage, say)
            sys.stdout.write("this is not json {\n")
            sys.stdout.flush()
        if method in ("initialize", "session/new"):
            seen[method] = message.get("params")
        if method == "initialize":
            if args.exit_at_init:
                sys.exit(5)
            if args.no_init:
                continue
            answer(
                request_id,
                {
                    "protocolVersion": 1,
                    "agentCapabilities": {
                        "loadSession": args.load,
                        "sessionCapabilities": {"resume": {}} if args.resume else {},
                    },
                    "agentInfo": {"name": "fake", "version": "0"},
                    "authMethods": [],
                },
            )
        elif method == "session/new":
            if args.hang_new:
                sys.stderr.write("waiting in session/new\n")
                sys.stderr.flush()
                continue
            answer(request_id, {} if args.no_session_id else {"sessionId": session_id})
        elif method == "session/prompt":
            blocks = message["params"]["prompt"]
            text = "".join(b.get("text", "") for b in blocks)
            if args.flood_stderr:
                line = "x" * 200 + "\n"
                for _ in range(args.flood_stderr):
                    sys.stderr.write(line)
                sys.stderr.flush()
            if args.extras:
                chunk(session_id, "thinking about it", "agent_thought_chunk")
                update(
                    session_id,
                    {"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "look around"},
                )
                update(
                    session_id,
                    {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "image", "data": "AAAA", "mimeType": "image/png"},
                    },
                )
            mode = "slow" if text == args.hold_text else args.prompt
            if mode == "echo":
                chunk(session_id, args.echo_prefix)
                chunk(session_id, text)
                answer(request_id, {"stopReason": args.stop})
            elif mode == "env":
                report = {
                    "seen": seen,
                    "cwd": os.getcwd(),
                    "env": dict(os.environ),
                    "blocks": [b.get("type") for b in blocks],
                }
                chunk(session_id, json.dumps(report))
                answer(request_id, {"stopReason": "end_turn"})
            elif mode in ("slow", "ignore-cancel"):
                chunk(session_id, "partial")
                pending_prompt = request_id if mode == "slow" else None
            elif mode == "answer-exit":  # a one-shot agent: answer, then leave at once
                chunk(session_id, "done")
                answer(request_id, {"stopReason": "end_turn"})
                sys.exit(0)
            elif mode == "exit0":
                sys.exit(0)
            elif mode == "close-stdout":
                os.close(1)
                sys.stderr.write("stdout closed\n")
                sys.stderr.flush()
                hold()
            elif mode == "foreign-ids":  # answers to requests we never got
                for foreign in (999, "x", None, -1, 1.5, request_id + 1000):
                    send({"jsonrpc": "2.0", "id": foreign, "result": {"stopReason": "refusal"}})
                chunk(session_id, "after foreign ids")
                answer(request_id, {"stopReason": "end_turn"})
            elif mode == "malformed":  # JSON, but no JSON-RPC message
                send([1, 2])
                send({"jsonrpc": "2.0", "id": [request_id], "result": {}})
                chunk(session_id, "after malformed")
                answer(request_id, {"stopReason": "end_turn"})
            elif mode == "junk":  # each line, then the answers to those that get one
                for line, _ in JUNK:
                    sys.stdout.write(line + "\n")
                sys.stdout.flush()
                codes = []
                for _ in [code for _, code in JUNK if code is not None]:
                    got = json.loads(sys.stdin.readline())
                    codes.append(f"{got['id']}:{got['error']['code']}")
                chunk(session_id, " ".join(codes))
                answer(request_id, {"stopReason": "end_turn"})
            elif mode == "lines":  # the lines of the file FAKE_ACP_LINES, then an echo
                with open(os.environ["FAKE_ACP_LINES"], "rb") as f:
                    sys.stdout.flush()
                    sys.stdout.buffer.write(f.read())
                    sys.stdout.buffer.flush()
                chunk(session_id, text)
                answer(request_id, {"stopReason": "end_turn"})
            elif mode == "terminal":  # ask for a terminal; report the answer we got
                send(
                    {
                        "jsonrpc": "2.0",
                        "id": "term-1",
                        "method": "terminal/create",
                        "params": {"sessionId": session_id, "command": "ls"},
                    }
                )
                got = json.loads(sys.stdin.readline())
                chunk(session_id, json.dumps(got.get("error", got.get("result"))))
                answer(request_id, {"stopReason": "end_turn"})
            elif mode == "turns":  # a prompt that spans two turns of the agent
                chunk(session_id, "waiting for my helper")
                chunk(session_id, "the helper finished", "user_message_chunk")
                chunk(session_id, "final ")
                chunk(session_id, "answer")
                answer(request_id, {"stopReason": "end_turn"})
            elif mode == "message-ids":  # two messages told apart only by their ids
                for mid, text in (("m1", "one"), ("m1", " more"), ("m2", "two")):
                    update(
                        session_id,
                        {
                            "sessionUpdate": "agent_message_chunk",
                            "content": {"type": "text", "text": text},
                            "messageId": mid,
                        },
                    )
                answer(request_id, {"stopReason": "end_turn"})
            elif mode == "raw-prompt":  # the prompt's line as it came, as the answer
                chunk(session_id, raw)
                answer(request_id, {"stopReason": "end_turn"})
            elif mode == "surrogate-in":
                chunk(session_id, "in \ud800 put")  # json.dumps escapes it: "\ud800"
                answer(request_id, {"stopReason": "end_turn"})
            elif mode == "bad-error":
                send({"jsonrpc": "2.0", "id": request_id, "error": "boom"})
            elif mode == "big":
                chunk(session_id, "y" * (3 << 20))
                answer(request_id, {"stopReason": "end_turn"})
            elif mode == "other-session":
                chunk("someone-else", "not for you")
                chunk(session_id, "for you")
                answer(request_id, {"stopReason": "end_turn"})
            elif mode == "no-options":
                pending_prompt = request_id
                permission_for = "perm-1"
                send(
                    {
                        "jsonrpc": "2.0",
                        "id": permission_for,
                        "method": "session/request_permission",
                        "params": {
                            "sessionId": session_id,
                            "toolCall": {"toolCallId": "t1", "title": "x"},
                            "options": [],
                        },
                    }
                )
            elif mode == "non-utf8":
                sys.stdout.flush()
                sys.stdout.buffer.write(b'\xff\xfe{"jsonrpc": "2.0"}\n')
                sys.stdout.buffer.flush()
                chunk(session_id, "caf\u00e9")
                answer(request_id, {"stopReason": "end_turn"})
            elif mode == "long-stop":
                answer(request_id, {"stopReason": "z" * 10000})
            elif mode == "crash":
                chunk(session_id, "partial")
                sys.exit(3)
            elif mode == "refuse":
                error = {
                    "code": -32603,
                    "message": "no\nbecause " + "x" * 500,
                    "data": {"payload": "SECRET-DATA"},
                }
                send({"jsonrpc": "2.0", "id": request_id, "error": error})
            elif mode == "permission":
                pending_prompt = request_id
                permission_for = "perm-1"
                options = [
                    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
                    {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "always", "name": "Always", "kind": "allow_always"},
                ]
                if os.environ.get("FAKE_ACP_NO_ALLOW"):
                    options = options[:1]
                send(
                    {
                        "jsonrpc": "2.0",
                        "id": permission_for,
                        "method": "session/request_permission",
                        "params": {
                            "sessionId": session_id,
                            "toolCall": {"toolCallId": "t1", "title": "rm -rf /tmp/x"},
                            "options": options,
                        },
                    }
                )
        elif method in ("session/load", "session/resume"):
            session_id = message["params"]["sessionId"]
            if method == "session/load":
                chunk(session_id, "REPLAYED question", "user_message_chunk")
                chunk(session_id, "REPLAYED answer")
            answer(request_id, {})
        elif method == "session/cancel":
            if pending_prompt is not None:
                answer(pending_prompt, {"stopReason": "cancelled"})
                pending_prompt = None
        elif method is None and request_id == permission_for and permission_for is not None:
            outcome = message.get("result", {}).get("outcome", {})
            if outcome.get("outcome") == "selected":
                chunk(session_id, f"permission: selected {outcome.get('optionId')}")
                answer(pending_prompt, {"stopReason": "end_turn"})
            else:
                chunk(session_id, "permission: cancelled")
                answer(pending_prompt, {"stopReason": "cancelled"})
            pending_prompt = permission_for = None
        elif request_id is not None and method is not None:
            send(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "error": {"code": -32601, "message": "Method not found"},
                }
            )
    if args.hold_eof:
        hold()
    if args.linger_ms:  # flushing its state, say: then it says so and leaves by itself
        time.sleep(args.linger_ms / 1000)
        sys.stderr.write("flushed after EOF\n")
        sys.stderr.flush()


if __name__ == "__main__":
    main()
