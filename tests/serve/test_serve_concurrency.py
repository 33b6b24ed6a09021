"""Many clients at once: 64 concurrent streams through the official async client all complete, each with
the text the engine produced for it, and the engine is left idle."""

from __future__ import annotations

import asyncio

import openai
from support.serve_support import MODEL_NAME, TIMEOUT_S, engine_idle, wait_until

STREAMS = 64
MAX = 8


async def _one(client: openai.AsyncOpenAI, i: int) -> tuple[str, str, int]:
    stream = await client.completions.create(
        model=MODEL_NAME,
        prompt=f"Request number {i} says",
        max_tokens=MAX,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    text, reason, tokens = "", "", 0
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
            reason = chunk.choices[0].finish_reason or reason
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return text, reason, tokens


async def _all(url: str) -> list[tuple[str, str, int]]:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S) as client:
        return await asyncio.wait_for(asyncio.gather(*(_one(client, i) for i in range(STREAMS))), 4 * TIMEOUT_S)


def test_64_concurrent_streams_all_complete(served) -> None:
    results = asyncio.run(_all(served.url))
    assert len(results) == STREAMS
    assert all(reason == "length" and tokens == MAX for _, reason, tokens in results), results
    assert all(text for text, _, _ in results)
    wait_until(lambda: engine_idle(served.engine), what="the engine to be idle")
