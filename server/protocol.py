"""The request bodies of the OpenAI API as graphtop takes them (after vLLM's
``vllm/entrypoints/openai/protocol.py`` and the OpenAI reference).

Strict on purpose: types are not coerced (``"0.5"`` is not a temperature, ``true`` not a seed), a field
the API does not have is refused by name (``extra="forbid"``), and a field the API has but the engine
does not implement (logprobs, tools, penalties, ...) is refused by name unless it holds its neutral value:
a client that asks for log-probabilities must hear that it will not get them, not receive an answer
without them. ``unsupported_field`` finds the first such field.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 16
"""Choices one request may ask for (each is an engine request)."""
MAX_STOP = 16
"""Stop strings one request may give (OpenAI takes 4; vLLM more)."""
SEED_MAX = 2**64 - 1


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: Optional[bool] = None


class _Common(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=-1)  # vLLM's extension; 0 and -1: no cut
    n: int = Field(1, ge=1, le=MAX_N)
    seed: Optional[int] = Field(None, ge=0, le=SEED_MAX)
    stop: Any = None  # a string or a list of strings: checked by stop_strings
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens even past an end-of-sequence token
    user: Optional[str] = None  # who asked (OpenAI: for abuse monitoring); it changes no output
    # in the API, not in the engine: refused unless neutral (UNSUPPORTED)
    frequency_penalty: Any = None
    presence_penalty: Any = None
    logit_bias: Any = None
    logprobs: Any = None
    best_of: Any = None
    service_tier: Any = None
    metadata: Any = None
    store: Any = None


class CompletionRequest(_Common):
    """``POST /v1/completions``."""

    prompt: Any = Field(...)  # a string, strings, token ids or lists of them: checked by completion_prompts
    echo: Any = None
    suffix: Any = None


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``."""

    messages: Any = Field(...)  # checked by chat.chat_messages
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    top_logprobs: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None


UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logit_bias": ({},),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "best_of": (1,),
    "echo": (False,),
    "suffix": ("",),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "parallel_tool_calls": (),
    "response_format": ({"type": "text"},),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "reasoning_effort": (),
    "web_search_options": (),
    "service_tier": ("auto", "default"),
    "metadata": ({},),
    "store": (False,),
}
"""Fields of the OpenAI API the engine does not implement, and the values that ask for nothing (null
always does). ``True`` is not ``1`` here: ``best_of: true`` is refused."""


def _neutral(value: Any, allowed: tuple[Any, ...]) -> bool:
    return value is None or any(type(value) is type(a) and value == a for a in allowed)


def unsupported_field(body: _Common) -> Optional[tuple[str, Any]]:
    """The first field that asks for something the engine does not do, with its value; None if none."""
    for name, allowed in UNSUPPORTED.items():
        if name in type(body).model_fields and not _neutral(getattr(body, name), allowed):
            return name, getattr(body, name)
    return None


def stop_strings(stop: Any) -> Optional[tuple[str, ...]]:
    """``stop`` as a tuple of strings (None when absent); ValueError with the reason otherwise."""
    if stop is None:
        return None
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise ValueError("stop must be a string or a list of strings")
    if len(items) > MAX_STOP:
        raise ValueError(f"stop takes at most {MAX_STOP} strings, got {len(items)}")
    if any(not s for s in items):
        raise ValueError("stop strings must not be empty")
    return tuple(items)


def completion_prompts(prompt: Any) -> list[Any]:
    """The prompts of a completion request: strings or lists of token ids; ValueError otherwise."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(_token_id(t) for t in prompt):
            return [prompt]
        if all(isinstance(p, list) and p and all(_token_id(t) for t in p) for p in prompt):
            return list(prompt)
    if isinstance(prompt, list) and not prompt:
        raise ValueError("prompt is empty")
    raise ValueError("prompt must be a string, a list of strings, a list of token ids or a list of such lists")


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
