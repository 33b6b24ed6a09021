"""The two generation endpoints: a checked request becomes engine requests, and their tokens become a
response or a stream.

Everything about the request is checked before anything is submitted (the model name, fields graphtop
does not implement, the sampling values, the prompt), so a bad request costs the engine nothing. The
sampling values reach the engine by name (``protocol.sampling_values``); an endpoint adds only what it
derives (the token budget, log-probabilities), and a bad value is a 400 naming the request's field. A
client that goes away cancels its requests: a stream's generator is cancelled by Starlette when the
client disconnects, and a non-streaming request watches for the disconnect while it waits.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional, Union

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from graphtop.engine.prompts import Unencodable, chat_template_options, encode_messages, has_chat_template
from graphtop.engine.sampling_params import MAX_NEW_TOKENS, SamplingParamError, SamplingParams

from .chat import chat_messages
from .errors import ApiError, error_body, model_not_found
from .generation import Admission, EngineFailed, Generation, Output
from .logprobs import LogprobWriter
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    completion_prompts,
    sampling_values,
    unknown_fields,
    unsupported_field,
)
from .responses import DONE, Choice, ResponseShape, new_id, sse

COMPLETION_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for ``/v1/completions``; chat defaults to the rest of the context."""

log = logging.getLogger("graphtop.serve")
_warned: set[str] = set()
"""Unknown request fields already warned about (once per name for the process, as vLLM logs them)."""


@dataclass
class ServeContext:
    """What every request needs: the engine, the served names, the in-flight bound."""

    engine: Any
    model_name: str  # the name responses report
    admission: Admission
    default_seed: Optional[int] = None  # the seed of requests that give none (graphtop serve --seed)
    model_aliases: tuple[str, ...] = ()  # other names a request may give (vLLM's --served-model-name A B)

    @property
    def served_names(self) -> tuple[str, ...]:
        return (self.model_name, *self.model_aliases)


def check_common(ctx: ServeContext, body: Union[CompletionRequest, ChatCompletionRequest]) -> None:
    if body.model is not None and body.model not in ctx.served_names:
        raise model_not_found(body.model, ctx.served_names)
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
    for name in unknown_fields(body):
        if name not in _warned:
            _warned.add(name)
            log.warning("request field %r is not one graphtop knows: it is ignored", name)


def sampling(
    ctx: ServeContext, body: Union[CompletionRequest, ChatCompletionRequest], wire: dict[str, str], **values: Any
) -> SamplingParams:
    """The request's ``SamplingParams``: its sampling fields by name (``sampling_values``), then ``values``
    (what the endpoint derives: the token budget, log-probabilities). A bad value is a 400 naming the
    request field (``wire`` maps the engine's name of a derived value back to it)."""
    try:
        fields = sampling_values(body)
    except ValueError as e:
        raise ApiError(400, str(e), param="stop") from None
    fields.update(values)
    fields["max_new_tokens"] = min(fields["max_new_tokens"], MAX_NEW_TOKENS)  # past any context: it ends first
    try:
        params = SamplingParams(**fields)
        problem = params.vocab_problem(ctx.engine.spec.vocab_size)
    except SamplingParamError as e:
        problem = e
    if problem is not None:
        name = wire.get(problem.field, problem.field)
        raise ApiError(400, f"{name} {problem.problem}", param=name, code="invalid_value")
    return params


async def completions(ctx: ServeContext, body: CompletionRequest, request: Request) -> Any:
    check_common(ctx, body)
    try:
        prompts = completion_prompts(body.prompt)
    except ValueError as e:
        raise ApiError(400, str(e), param="prompt") from None
    echo = bool(body.echo)
    max_tokens = COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    if max_tokens < (0 if echo else 1):
        raise ApiError(
            400,
            f"max_tokens must be at least {0 if echo else 1} (0 only with echo), got {max_tokens}",
            param="max_tokens",
            code="invalid_value",
        )
    output = Output(logprobs=body.logprobs is not None, echo=echo, hidden=max_tokens == 0)
    params = sampling(
        ctx,
        body,
        {"max_new_tokens": "max_tokens"},
        max_new_tokens=max(1, max_tokens),
        logprobs=body.logprobs,
        prompt_logprobs=body.logprobs if echo else None,
    )
    shape = ResponseShape(chat=False, model=ctx.model_name, request_id=new_id("cmpl"))
    return await generate(ctx, body, request, prompts, params, shape, "prompt", output)


async def chat_completions(ctx: ServeContext, body: ChatCompletionRequest, request: Request) -> Any:
    check_common(ctx, body)
    budget = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if body.max_tokens is not None and body.max_completion_tokens is not None and body.max_tokens != budget:
        raise ApiError(400, "max_tokens and max_completion_tokens disagree; give one", param="max_tokens")
    if budget is not None and budget < 1:
        name = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        raise ApiError(400, f"{name} must be at least 1, got {budget}", param=name, code="invalid_value")
    if body.top_logprobs and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    messages = chat_messages(body.messages)
    tokenizer = ctx.engine.tokenizer
    if not has_chat_template(tokenizer):
        raise ApiError(
            400, "this model has no chat template: use /v1/completions", param="messages", code="no_chat_template"
        )
    try:
        template = chat_template_options(
            body.chat_template_kwargs,
            True if body.add_generation_prompt is None else body.add_generation_prompt,
            bool(body.continue_final_message),
        )
    except ValueError as e:
        raise ApiError(400, str(e), param="chat_template_kwargs") from None
    ids = encode_messages(tokenizer, messages, ctx.engine.prompt_limit, template)
    if isinstance(ids, Unencodable):
        raise ApiError(400, f"messages: {ids.problem}", param="messages")
    room = max(1, ctx.engine.max_context_len - len(ids))
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    params = sampling(
        ctx,
        body,
        {
            "max_new_tokens": "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens",
            "logprobs": "top_logprobs",
        },
        max_new_tokens=budget or room,
        logprobs=logprobs,
    )
    shape = ResponseShape(chat=True, model=ctx.model_name, request_id=new_id("chatcmpl"))
    return await generate(ctx, body, request, [ids], params, shape, "messages", Output(logprobs=logprobs is not None))


async def generate(
    ctx: ServeContext,
    body: Any,
    request: Request,
    prompts: list[Any],
    params: SamplingParams,
    shape: ResponseShape,
    param: str,
    output: Output,
) -> Any:
    count = len(prompts) * body.n
    ctx.admission.admit(count)
    gen = Generation(ctx.engine, asyncio.get_running_loop(), output, default_seed=ctx.default_seed)
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
    if output.logprobs:
        shape.logprobs = LogprobWriter(ctx.engine.tokenizer, bool(body.return_tokens_as_token_ids))
    if body.stream:
        options = body.stream_options
        shape.include_usage = bool(options and options.include_usage)
        if shape.include_usage and options.continuous_usage_stats:
            shape.running_usage = lambda: gen.usage(len(prompts), body.n)
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
    choices = [Choice() for _ in gen.handles]

    async def consume() -> None:
        async for batch in gen.updates():
            for u in batch:
                choices[u.index].add(u)

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
    return shape.response(choices, gen.usage(prompt_count, n))


async def _disconnected(request: Request) -> None:
    """Returns when the client has closed the connection (the body was read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
