"""dsh-llm-openai benchmark: the adapter's own overhead per streamed chunk and per request.

Everything runs against the loopback chat-completions server of ``dsh_llm_openai.testing``
(127.0.0.1, a pre-rendered SSE body), so the network's cost is as small as it gets and the
adapter's share shows. The ways of reading a figure run in alternation, ``--rounds`` rounds
(the order rotated each round), so what slows the machine for a while slows each of them; each
figure is the median over the rounds, and each difference the median of the rounds' differences:

- *per chunk*: one response of ``--chunks`` text chunks, read (a) through the adapter, (b)
  through the same SDK call without the adapter (``client.post(..., cast_to=object)``: SSE
  parsing, JSON decoding), (c) through the SDK's typed ``chat.completions.create`` (a pydantic
  model per chunk), for comparison. The adapter's own cost per chunk is (a) - (b).
- *per request*: ``--requests`` one-chunk responses, each request with a ``--history``-message
  conversation, through the adapter and through the bare SDK call; the difference is what
  the adapter adds per request (building the body, mapping, closing the stream).

    python benchmarks/llm_openai.py                     # 5000 chunks, 300 requests, 9 rounds
    python benchmarks/llm_openai.py --chunks 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any


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


async def _alternating(rounds: int, runs: dict[str, Any]) -> dict[str, list[float]]:
    """Seconds of each run in each round: every round runs each once, in an order rotated by
    one each round (the first of a round is a different one each time)."""
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            t0 = time.perf_counter()
            await runs[name]()
            times[name].append(time.perf_counter() - t0)
    return times


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
        adapter = OpenAIAdapter(config)
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="bench", max_retries=0)
        short = GenerateOptions(provider="openai", model="m", messages=_history(1))
        wire = request_body(short, config)
        try:
            for _ in range(3):  # warm-up: connections, imports, caches
                await _through_adapter(adapter, short)
                await _through_sdk(client, wire)
            chunked = await _alternating(
                args.rounds,
                {
                    "adapter": lambda: _through_adapter(adapter, short),
                    "sdk": lambda: _through_sdk(client, wire),
                    "typed": lambda: _through_typed_sdk(client, wire),
                },
            )
            a, b, c = (statistics.median(chunked[k]) for k in ("adapter", "sdk", "typed"))
            own = _diff(chunked["adapter"], chunked["sdk"])
            n = args.chunks + 2
            print(
                f"per chunk ({args.chunks} text chunks in one response, median of {args.rounds} "
                "alternating rounds):"
            )
            print(f"  through the adapter          {a / n * 1e6:8.1f} µs")
            print(f"  bare SDK call (dict chunks)  {b / n * 1e6:8.1f} µs")
            print(f"  typed SDK call (pydantic)    {c / n * 1e6:8.1f} µs")
            print(f"  the adapter's own cost       {own / n * 1e6:8.1f} µs per chunk")

            server.default = Reply(body=one_body)
            long = GenerateOptions(provider="openai", model="m", messages=_history(args.history))
            long_wire = request_body(long, config)

            async def many_adapter() -> None:
                for _ in range(args.requests):
                    await _through_adapter(adapter, long)

            async def many_sdk() -> None:
                for _ in range(args.requests):
                    await _through_sdk(client, long_wire)

            await many_adapter()
            await many_sdk()
            requested = await _alternating(args.rounds, {"adapter": many_adapter, "sdk": many_sdk})
            ra, rb = (statistics.median(requested[k]) for k in ("adapter", "sdk"))
            own = _diff(requested["adapter"], requested["sdk"])
            per = args.requests
            t0 = time.perf_counter()
            for _ in range(per):
                request_body(long, config)
            body_cost = (time.perf_counter() - t0) / per
            print(
                f"per request ({args.requests} one-chunk requests, {len(long.messages)} "
                f"messages each, median of {args.rounds} alternating rounds):"
            )
            print(f"  through the adapter          {ra / per * 1e6:8.1f} µs")
            print(f"  bare SDK call                {rb / per * 1e6:8.1f} µs")
            print(f"  the adapter's own cost       {own / per * 1e6:8.1f} µs per request")
            print(f"  of which building the body   {body_cost * 1e6:8.1f} µs")
        finally:
            await adapter.aclose()
            await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=5000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--history", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=9)
    asyncio.run(main(parser.parse_args()))
