"""The ``dsh-acp-agent`` console script: a dsh host served as an ACP agent over stdio.

``dsh-acp-agent [--config FILE]``. The protocol owns stdout: before anything else runs, the
real stdout is kept for it and file descriptor 1 is pointed at stderr, so a stray ``print``
of any plugin lands in the log, never in the protocol stream. Logs go to stderr. The process
serves until stdin closes (or SIGTERM / SIGINT), then disposes the host and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import stat
import sys
from collections.abc import Sequence
from typing import Any, BinaryIO, cast

from .__about__ import __version__
from ._config import AgentServerConfig, ConfigError, load_config

__all__ = ["main", "serve"]

#: The collector's first threshold in the server process (CPython's default is 700).
YOUNG_THRESHOLD = 10_000
#: The most bytes one read of stdin asks for (asyncio's pipe transport asks for 256 KiB).
READ_SIZE = 64 * 1024


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsh-acp-agent",
        description="Serve a dsh host as an Agent Client Protocol agent over stdio.",
    )
    parser.add_argument("--version", action="version", version=f"dsh-acp-agent {__version__}")
    parser.add_argument(
        "--config", metavar="FILE", help="a TOML file: plugins, model, store (docs/acp.md)"
    )
    parser.add_argument(
        "--log-level", default="WARNING", help="level of the log on stderr (default WARNING)"
    )
    return parser


def _claim_stdout() -> BinaryIO:
    """Keep the real stdout for the protocol; point fd 1 (and ``sys.stdout``) at stderr."""
    sys.stdout.flush()
    protocol = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    return protocol


class _FileWriter:
    """The protocol's writer when stdout is a regular file (``dsh-acp-agent > log``): the
    event loop's pipe transport refuses one (ACPC-5), and a write to a file does not block
    the way a full pipe does, so each frame is written at once."""

    def __init__(self, out: BinaryIO) -> None:
        self._fd = out.fileno()
        self._closed = False

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    async def drain(self) -> None:
        return None

    def is_closing(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True

    async def wait_closed(self) -> None:
        return None


async def _streams(out: BinaryIO) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=50 * 1024 * 1024)
    pipe, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    _read_size(pipe)
    if stat.S_ISREG(os.fstat(out.fileno()).st_mode):
        return reader, cast("asyncio.StreamWriter", _FileWriter(out))
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, out)
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return reader, writer


def _read_size(pipe: asyncio.ReadTransport) -> None:
    """Read stdin :data:`READ_SIZE` bytes at most at a time (PERF-23).

    Each read allocates a buffer of the size asked for, then shrinks it to what came. At
    asyncio's 256 KiB that buffer is above the C allocator's threshold for a mapping of its
    own: every prompt's read cost an ``mmap``, an ``mremap``, a ``munmap`` and a fresh zeroed
    page. 64 KiB comes from the heap; a longer line is read in more passes, whole as before.
    """
    if hasattr(pipe, "max_size"):  # asyncio's Unix pipe transport (3.11 to 3.13 have it)
        pipe.max_size = READ_SIZE


async def serve(
    config: AgentServerConfig,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    peer: str = "client",
) -> None:
    """Boot the host ``config`` describes and serve it on ``reader``/``writer`` until EOF;
    log lines about what the client sent name it ``peer``."""
    from ._server import open_agent, serve_connection

    async with open_agent(config) as agent:
        await serve_connection(agent, writer, reader, peer=peer)


async def _main(config: AgentServerConfig, out: BinaryIO) -> None:
    reader, writer = await _streams(out)
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
    with contextlib.suppress(asyncio.CancelledError):
        await serve(config, reader, writer, peer=f"client (pid {os.getppid()})")


def _stdin_problem() -> str | None:
    """Why stdin cannot carry the protocol, if it cannot: the event loop reads a pipe, a
    socket or a terminal; a regular file or ``/dev/null`` would fail, or never end."""
    try:
        mode = os.fstat(0).st_mode
    except OSError as exc:
        return f"stdin is not open ({exc.strerror})"
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(0):
        return None
    return "stdin must be a pipe or a socket to the ACP client (got a file or a device)"


def _tune_collector() -> None:
    """Collect the youngest generation every ``YOUNG_THRESHOLD`` allocations.

    A prompt allocates a few hundred short-lived objects (events, updates, JSON), so at
    CPython's 700 the collector ran every few prompts and promoted what was still alive to be
    scanned again; at 10,000 most of it dies before a collection (3 to 5 % of a warm
    prompt's in-process cost). Only the console script does this: its process is its own.
    """
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


def _no_docstrings(*args: object, **kwargs: object) -> None:
    """In place of pydantic's reading of attribute docstrings (see :func:`_import_sdk`)."""


def _import_sdk() -> None:
    """Import the SDK's protocol models without reading their fields' docstrings (ACPC-71).

    The SDK's models ask pydantic for ``use_attribute_docstrings``: at import, pydantic reads
    and parses the source of each of some 280 classes to find them, about a fifth of the
    process's start (hundreds of ms on a small machine). A docstring only becomes a field's
    ``description`` in a JSON schema; this process never makes one, and validation and the
    frames it sends do not read it. Only the console script does this, as its process is its
    own, and only around the SDK's import: models imported later keep their docstrings. With
    a pydantic that has no such hook it is a plain import.
    """
    fields: Any = None
    with contextlib.suppress(ImportError):
        from pydantic._internal import _fields as fields
    original = getattr(fields, "_update_fields_from_docstrings", None)
    if original is not None:
        fields._update_fields_from_docstrings = _no_docstrings
    try:
        import acp.schema  # noqa: F401
    finally:
        if original is not None:
            fields._update_fields_from_docstrings = original


def _exit_now(status: int) -> None:
    """End the process without the interpreter's teardown (ACPC-9).

    By now the host is disposed (every session written and closed) and the protocol stream
    is unbuffered; what remains is freeing the heap object by object, which took about a
    second after EOF, while the client waits for the exit. Logs and stdio are flushed first.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def run() -> None:
    """The console script: :func:`main`, then a quick exit with its status."""
    _exit_now(main())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dsh-acp-agent`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="dsh-acp-agent %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"dsh-acp-agent: error: {exc}", file=sys.stderr)
        return 2
    problem = _stdin_problem()
    if problem is not None:
        print(f"dsh-acp-agent: error: {problem}", file=sys.stderr)
        return 2
    out = _claim_stdout()
    _tune_collector()
    _import_sdk()
    try:
        asyncio.run(_main(config, out))
    except Exception as exc:  # a boot that failed: a plugin missing, a config refused
        code = getattr(exc, "code", type(exc).__name__)
        print(f"dsh-acp-agent: error: {exc} [{code}]", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    run()
