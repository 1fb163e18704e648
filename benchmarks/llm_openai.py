"""dsh-llm-openai benchmark: the adapter's own overhead per streamed chunk and per request.

Everything runs against the loopback chat-completions server of ``dsh_llm_openai.testing``
(127.0.0.1, a pre-rendered SSE body), so the network's cost is as small as it gets and the
adapter's share shows. The ways of reading a figure run in alternation, ``--rounds`` rounds
(the order rotated each round), so what slows the machine for a while slows each of them; each
figure is the median over the rounds, and each difference the median of the rounds' differences:

- *per chunk*: one response of ``--chunks`` text chunks, read (a) through the adapter on its
  builtin transport (the default), (a') through the adapter on the SDK transport
  (``transport = "openai-sdk"``), (b) through the same SDK call without the adapter
  (``client.post(..., cast_to=object)``: SSE parsing, JSON decoding), (c) through the SDK's
  typed ``chat.completions.create`` (a pydantic model per chunk), for comparison. The
  adapter's own cost per chunk is (a') - (b).
- *per request*: ``--requests`` one-chunk responses, each request with a ``--history``-message
  conversation, through the adapter (both transports) and through the bare SDK call; the
  difference (a') - (b) is what the adapter adds per request (building the body, mapping,
  closing the stream).

Each figure is given as wall time and as the CPU time of the thread that reads (the event
loop's; the server's threads are not counted), which moves much less on a busy machine.

    python benchmarks/llm_openai.py                     # 5000 chunks, 300 requests, 9 rounds
    python benchmarks/llm_openai.py --chunks 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import attrs


def _body(chunks: int) -> bytes:
    from dsh_llm_openai.testing import chunk, sse_body

    parts = [chunk(content=f"tok{i} ") for i in range(chunks)]
    parts.append(chunk(finish_reason="stop"))
    parts.append(chunk(usage={"prompt_tokens": 10, "completion_tokens": chunks}))
    return sse_body(parts)


def _history(n: int) -> tuple[Any, ...]:
    from dsh_core import ModelSource, assistant_message, user_message

    source = ModelSource(provider="openai", model="m")
    out: list[Any] = []
    for i in range(n // 2):
        out.append(user_message(f"question {i}: " + "words " * 20))
        out.append(assistant_message(f"answer {i}: " + "words " * 40, source=source))
    out.append(user_message("last question"))
    return tuple(out)


async def _through_adapter(adapter: Any, options: Any) -> int:
    n = 0
    async for _ in adapter.stream(options):
        n += 1
    return n


async def _through_sdk(client: Any, body: dict[str, Any]) -> int:
    import openai

    stream = await client.post(
        "/chat/completions",
        cast_to=object,
        body=body,
        options={"security": {"bearer_auth": True}},
        stream=True,
        stream_cls=openai.AsyncStream[object],
    )
    n = 0
    try:
        async for _ in stream:
            n += 1
    finally:
        await stream.close()
    return n


async def _through_typed_sdk(client: Any, body: dict[str, Any]) -> int:
    stream = await client.chat.completions.create(
        model=body["model"], messages=body["messages"], stream=True
    )
    n = 0
    try:
        async for _ in stream:
            n += 1
    finally:
        await stream.close()
    return n


async def _alternating(
    rounds: int, runs: dict[str, Any]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds of each run in each round, wall and the reading thread's CPU: every round runs
    each once, in an order rotated by one each round (the first of a round is a different one
    each time)."""
    names = list(runs)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            t0, c0 = time.perf_counter(), time.thread_time()
            await runs[name]()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.thread_time() - c0)
    return wall, cpu


def _line(label: str, wall: list[float], cpu: list[float], n: int) -> str:
    w, c = statistics.median(wall), statistics.median(cpu)
    return f"  {label:<32}{w / n * 1e6:8.1f} µs wall {c / n * 1e6:8.1f} µs CPU"


def _diff(a: list[float], b: list[float]) -> float:
    """The median of the rounds' differences ``a - b``."""
    return statistics.median(x - y for x, y in zip(a, b, strict=True))


async def main(args: argparse.Namespace) -> None:
    import openai

    from dsh_core import GenerateOptions
    from dsh_llm_openai import OpenAIAdapter, OpenAIConfig, request_body
    from dsh_llm_openai.testing import ChatCompletionsServer, Reply

    stream_body = _body(args.chunks)
    one_body = _body(1)
    with ChatCompletionsServer(default=Reply(body=stream_body)) as server:
        config = OpenAIConfig(base_url=server.base_url, api_key="bench", max_retries=0)
        builtin = OpenAIAdapter(config)
        adapter = OpenAIAdapter(attrs.evolve(config, transport="openai-sdk"))
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="bench", max_retries=0)
        short = GenerateOptions(provider="openai", model="m", messages=_history(1))
        wire = request_body(short, config)
        try:
            for _ in range(3):  # warm-up: connections, imports, caches
                await _through_adapter(builtin, short)
                await _through_adapter(adapter, short)
                await _through_sdk(client, wire)
            wall, cpu = await _alternating(
                args.rounds,
                {
                    "builtin": lambda: _through_adapter(builtin, short),
                    "adapter": lambda: _through_adapter(adapter, short),
                    "sdk": lambda: _through_sdk(client, wire),
                    "typed": lambda: _through_typed_sdk(client, wire),
                },
            )
            n = args.chunks + 2
            print(
                f"per chunk ({args.chunks} text chunks in one response, median of {args.rounds} "
                "alternating rounds):"
            )
            print(_line("adapter, builtin transport", wall["builtin"], cpu["builtin"], n))
            print(_line("adapter, SDK transport", wall["adapter"], cpu["adapter"], n))
            print(_line("bare SDK call (dict chunks)", wall["sdk"], cpu["sdk"], n))
            print(_line("typed SDK call (pydantic)", wall["typed"], cpu["typed"], n))
            own = _diff(cpu["adapter"], cpu["sdk"])
            print(f"  the adapter's own cost          {own / n * 1e6:8.1f} µs CPU per chunk")
            gain = _diff(cpu["adapter"], cpu["builtin"])
            print(f"  builtin saves over the SDK      {gain / n * 1e6:8.1f} µs CPU per chunk")

            server.default = Reply(body=one_body)
            long = GenerateOptions(provider="openai", model="m", messages=_history(args.history))
            long_wire = request_body(long, config)

            def many(read: Any, *args_: Any) -> Any:
                async def go() -> None:
                    for _ in range(args.requests):
                        await read(*args_)

                return go

            runs = {
                "builtin": many(_through_adapter, builtin, long),
                "adapter": many(_through_adapter, adapter, long),
                "sdk": many(_through_sdk, client, long_wire),
            }
            for go in runs.values():
                await go()
            wall, cpu = await _alternating(args.rounds, runs)
            per = args.requests
            t0 = time.perf_counter()
            for _ in range(per):
                request_body(long, config)
            body_cost = (time.perf_counter() - t0) / per
            print(
                f"per request ({args.requests} one-chunk requests, {len(long.messages)} "
                f"messages each, median of {args.rounds} alternating rounds):"
            )
            print(_line("adapter, builtin transport", wall["builtin"], cpu["builtin"], per))
            print(_line("adapter, SDK transport", wall["adapter"], cpu["adapter"], per))
            print(_line("bare SDK call", wall["sdk"], cpu["sdk"], per))
            own = _diff(cpu["adapter"], cpu["sdk"])
            print(f"  the adapter's own cost          {own / per * 1e6:8.1f} µs CPU per request")
            print(f"  of which building the body      {body_cost * 1e6:8.1f} µs")
        finally:
            await builtin.aclose()
            await adapter.aclose()
            await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=5000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--history", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=9)
    asyncio.run(main(parser.parse_args()))
