"""The two generation endpoints: a checked request becomes engine requests, and their tokens become a
response or a stream.

Everything about the request is checked before anything is submitted (the model name, fields the engine
does not implement, the sampling values, the prompt), so a bad request costs the engine nothing. A
client that goes away cancels its requests: a stream's generator is cancelled by Starlette when the
client disconnects, and a non-streaming request watches for the disconnect while it waits.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional, Union

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from graphtop.engine.prompts import Unencodable, encode_messages, has_chat_template
from graphtop.engine.sampling_params import MAX_NEW_TOKENS, SamplingParams

from .chat import chat_messages
from .errors import ApiError, error_body, model_not_found, one_line
from .generation import Admission, EngineFailed, Generation
from .protocol import ChatCompletionRequest, CompletionRequest, completion_prompts, stop_strings, unsupported_field
from .responses import DONE, ResponseShape, new_id, sse

COMPLETION_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for ``/v1/completions``; chat defaults to the rest of the context."""
DEFAULT_TEMPERATURE = 1.0
"""OpenAI's default (pass ``temperature: 0`` for greedy output)."""


@dataclass
class ServeContext:
    """What every request needs: the engine, the served name, the in-flight bound."""

    engine: Any
    model_name: str
    admission: Admission
    default_seed: Optional[int] = None  # the seed of requests that give none (graphtop serve --seed)


def check_common(ctx: ServeContext, body: Union[CompletionRequest, ChatCompletionRequest]) -> None:
    if body.model is not None and body.model != ctx.model_name:
        raise model_not_found(body.model, ctx.model_name)
    bad = unsupported_field(body)
    if bad is not None:
        name, value = bad
        raise ApiError(
            400,
            f"{name} is not supported by graphtop (got {json.dumps(value)[:60]})",
            param=name,
            code="unsupported_field",
        )
    if body.stream_options is not None and not body.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", param="stream_options")


def sampling(body: Union[CompletionRequest, ChatCompletionRequest], max_tokens: int) -> SamplingParams:
    try:
        stop = stop_strings(body.stop)
    except ValueError as e:
        raise ApiError(400, str(e), param="stop") from None
    try:
        return SamplingParams(
            max_new_tokens=min(max_tokens, MAX_NEW_TOKENS),  # past any context: the context ends it first
            temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=0 if body.top_k in (None, -1) else body.top_k,
            seed=body.seed,
            stop=stop or (),
            ignore_eos=body.ignore_eos,
        )
    except ValueError as e:  # SamplingParams names the field in its message
        raise ApiError(400, one_line(str(e))) from None


async def completions(ctx: ServeContext, body: CompletionRequest, request: Request) -> Any:
    check_common(ctx, body)
    try:
        prompts = completion_prompts(body.prompt)
    except ValueError as e:
        raise ApiError(400, str(e), param="prompt") from None
    params = sampling(body, body.max_tokens or COMPLETION_MAX_TOKENS)
    shape = ResponseShape(chat=False, model=ctx.model_name, request_id=new_id("cmpl"))
    return await generate(ctx, body, request, prompts, params, shape, "prompt")


async def chat_completions(ctx: ServeContext, body: ChatCompletionRequest, request: Request) -> Any:
    check_common(ctx, body)
    if (
        body.max_tokens is not None
        and body.max_completion_tokens is not None
        and body.max_tokens != body.max_completion_tokens
    ):
        raise ApiError(400, "max_tokens and max_completion_tokens disagree; give one", param="max_tokens")
    messages = chat_messages(body.messages)
    tokenizer = ctx.engine.tokenizer
    if not has_chat_template(tokenizer):
        raise ApiError(
            400, "this model has no chat template: use /v1/completions", param="messages", code="no_chat_template"
        )
    ids = encode_messages(tokenizer, messages, ctx.engine.prompt_limit)
    if isinstance(ids, Unencodable):
        raise ApiError(400, f"messages: {ids.problem}", param="messages")
    room = max(1, ctx.engine.max_context_len - len(ids))
    params = sampling(body, body.max_completion_tokens or body.max_tokens or room)
    shape = ResponseShape(chat=True, model=ctx.model_name, request_id=new_id("chatcmpl"))
    return await generate(ctx, body, request, [ids], params, shape, "messages")


async def generate(
    ctx: ServeContext,
    body: Any,
    request: Request,
    prompts: list[Any],
    params: SamplingParams,
    shape: ResponseShape,
    param: str,
) -> Any:
    count = len(prompts) * body.n
    ctx.admission.admit(count)
    gen = Generation(ctx.engine, asyncio.get_running_loop(), default_seed=ctx.default_seed)
    released = False

    def release() -> None:  # once, whichever way the request ends
        nonlocal released
        if not released:
            released = True
            gen.cancel()
            ctx.admission.release(count)

    try:
        gen.submit(prompts, params, body.n, shape.request_id, param)
    except BaseException:
        release()
        raise
    if body.stream:
        shape.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _stream(gen, shape, len(prompts), body.n, release),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
            background=BackgroundTask(release),
        )
    try:
        return await _collect(gen, shape, request, len(prompts), body.n)
    finally:
        release()


async def _stream(gen: Generation, shape: ResponseShape, prompt_count: int, n: int, release: Any) -> AsyncIterator[str]:
    """The SSE body. Starlette cancels it when the client disconnects: ``release`` then cancels the
    requests, freeing their KV pages."""
    try:
        if shape.chat:
            yield shape.role_chunk(len(gen.handles))
        async for batch in gen.updates():
            yield shape.update_chunk(batch)
        if shape.include_usage:
            yield shape.usage_chunk(gen.usage(prompt_count, n))
    except EngineFailed as e:  # the status line is sent: the error goes in the stream, as vLLM sends it
        yield sse(e.error_body())
    finally:
        release()
    yield DONE


async def _collect(gen: Generation, shape: ResponseShape, request: Request, prompt_count: int, n: int) -> Any:
    texts = [""] * len(gen.handles)
    reasons: list[Optional[str]] = [None] * len(gen.handles)

    async def consume() -> None:
        async for batch in gen.updates():
            for u in batch:
                texts[u.index] += u.text
                reasons[u.index] = u.finish_reason or reasons[u.index]

    consumer = asyncio.ensure_future(consume())
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not consumer.done():  # the client left: nobody will read the answer
        consumer.cancel()
        gen.cancel()
        return JSONResponse(error_body(400, "the client disconnected"), status_code=400)
    try:
        consumer.result()
    except EngineFailed as e:
        raise e.api_error() from None
    return shape.response(texts, reasons, gen.usage(prompt_count, n))


async def _disconnected(request: Request) -> None:
    """Returns when the client has closed the connection (the body was read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
