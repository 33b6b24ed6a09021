"""The request bodies of the OpenAI API as graphtop takes them, with vLLM's extensions (after vLLM's
``vllm/entrypoints/openai/protocol.py`` and the OpenAI reference), so clients and benchmark tools written
for vLLM or SGLang send their requests unchanged.

Types are strict (``"0.5"`` is not a temperature, ``true`` not a seed). The sampling fields carry the
names of the engine's ``SamplingParams`` and reach it by name (``sampling_values``): their values are
checked there, the one home of what a sampling value may be. A field this model does not know is
accepted and ignored with a warning, once per name, as vLLM does; a field that would change the output
and that graphtop cannot honour (tools, structured output, beam search, ...) is refused by name unless it
holds its neutral value (``unsupported_field``): a client that asks for JSON must hear that it will not
get it, not receive free text.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

from pydantic import BaseModel, ConfigDict, Field

from graphtop.engine.sampling_params import sampling_fields

MAX_N = 16
"""Choices one request may ask for (each is an engine request)."""
MAX_STOP = 16
"""Stop strings one request may give (OpenAI takes 4; vLLM more)."""
MAX_TEMPERATURE = 2.0
"""OpenAI's bound (the engine takes any temperature; the API refuses what OpenAI refuses)."""
DEFAULT_TEMPERATURE = 1.0
"""OpenAI's and vLLM's default (pass ``temperature: 0`` for greedy output)."""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: Optional[bool] = None
    continuous_usage_stats: Optional[bool] = None  # vLLM's: the running usage in every chunk


class _Common(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="allow", strict=True)
    honoured: ClassVar[frozenset[str]] = frozenset()
    """Names of ``UNSUPPORTED`` this endpoint implements (completions' ``echo``)."""

    model: Optional[str] = None
    max_tokens: Optional[int] = None  # checked per endpoint
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    # sampling: SamplingParams' own names and meanings (vLLM's), checked by SamplingParams
    temperature: Optional[float] = Field(None, le=MAX_TEMPERATURE)
    top_p: Optional[float] = None
    top_k: Optional[int] = None  # vLLM's -1 (and 0): no cut
    min_p: Optional[float] = None
    seed: Optional[int] = None
    stop: Any = None  # a string or a list of strings: checked by stop_strings
    stop_token_ids: Optional[list[int]] = None
    min_tokens: Optional[int] = None
    repetition_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None
    ignore_eos: Optional[bool] = None
    skip_special_tokens: Optional[bool] = None
    include_stop_str_in_output: Optional[bool] = None
    return_tokens_as_token_ids: Optional[bool] = None  # logprobs name tokens "token_id:N" (vLLM's)
    # accepted; they change no output
    user: Optional[str] = None
    service_tier: Any = None
    metadata: Any = None
    store: Any = None
    # in the API, not in graphtop: refused unless neutral (UNSUPPORTED)
    best_of: Any = None
    use_beam_search: Any = None
    prompt_logprobs: Any = None
    truncate_prompt_tokens: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    response_format: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None
    logits_processors: Any = None
    add_special_tokens: Any = None


class CompletionRequest(_Common):
    """``POST /v1/completions``."""

    prompt: Any = Field(...)  # a string, strings, token ids or lists of them: checked by completion_prompts
    logprobs: Optional[int] = None  # the top-N alternatives of each token (0: the token's own only)
    echo: Optional[bool] = None  # the prompt (and, with logprobs, its log-probabilities) before the text
    suffix: Any = None

    honoured: ClassVar[frozenset[str]] = frozenset({"echo"})


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``."""

    messages: Any = Field(...)  # checked by chat.chat_messages
    max_completion_tokens: Optional[int] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    add_generation_prompt: Optional[bool] = None
    continue_final_message: Optional[bool] = None
    parallel_tool_calls: Optional[bool] = None  # accepted: there are no tools to call in parallel
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None
    documents: Any = None
    chat_template: Any = None
    echo: Any = None


UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "best_of": (1,),  # a best_of equal to n asks for nothing more (checked in unsupported_field)
    "use_beam_search": (False,),
    "prompt_logprobs": (),  # completions: echo with logprobs gives the prompt's log-probabilities
    "truncate_prompt_tokens": (),
    "allowed_token_ids": ([],),
    "bad_words": ([],),
    "response_format": ({"type": "text"},),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "structured_outputs": (),
    "logits_processors": ([],),
    "suffix": ("",),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "reasoning_effort": (),
    "web_search_options": (),
    "documents": ([],),
    "chat_template": (),
    "echo": (False,),  # chat only: completions take echo
}
"""Fields that would change the output and that graphtop does not implement, and the values that ask
for nothing (null always does). ``True`` is not ``1`` here: ``best_of: true`` is refused."""
NEUTRAL_ADD_SPECIAL_TOKENS = {"CompletionRequest": True, "ChatCompletionRequest": False}
"""``add_special_tokens`` as graphtop tokenizes (vLLM's defaults): a prompt's with, a chat template's without."""

SAMPLING = frozenset(sampling_fields())
"""The engine's sampling fields; a request field of the same name is one of them."""
NAMED_OTHERWISE = {
    "max_new_tokens": "max_tokens (chat: max_completion_tokens, or the rest of the context)",
    "logprobs": "logprobs (chat: logprobs with top_logprobs)",
    "prompt_logprobs": "echo with logprobs (completions)",
    "detokenize": "none: a response is text",
}
"""The sampling fields a request does not carry by their own name, and what sets them. Every other field of
``SamplingParams`` is a request field of ``_Common`` under its own name (tests/engine/test_sampling_record.py
checks both lists, so a new sampling parameter cannot be left out of the API unnoticed)."""


def _neutral(value: Any, allowed: tuple[Any, ...]) -> bool:
    return value is None or any(type(value) is type(a) and value == a for a in allowed)


def unsupported_field(body: _Common) -> Optional[tuple[str, Any]]:
    """The first field that asks for something graphtop does not do, with its value; None if none."""
    for name, allowed in UNSUPPORTED.items():
        if name not in type(body).model_fields or name in body.honoured:
            continue
        value = getattr(body, name)
        if name == "best_of" and type(value) is int and value == body.n:
            continue
        if not _neutral(value, allowed):
            return name, value
    special = body.add_special_tokens
    if special is not None and special is not NEUTRAL_ADD_SPECIAL_TOKENS[type(body).__name__]:
        return "add_special_tokens", special
    return None


def unknown_fields(body: _Common) -> list[str]:
    """Fields of the request that no model here declares (their values are ignored), as dotted names."""
    names = list(body.model_extra or {})
    if body.stream_options is not None:
        names += [f"stream_options.{k}" for k in body.stream_options.model_extra or {}]
    return names


def sampling_values(body: _Common) -> dict[str, Any]:
    """The request's sampling fields by their engine names, those it leaves out at graphtop's defaults for
    the API (OpenAI's temperature of 1), vLLM's ``top_k: -1`` as the engine's 0, ``stop`` checked."""
    values = {name: getattr(body, name) for name in SAMPLING & type(body).model_fields.keys()}
    values = {name: v for name, v in values.items() if v is not None}
    values.setdefault("temperature", DEFAULT_TEMPERATURE)
    if values.get("top_k") == -1:
        values["top_k"] = 0
    values["stop"] = stop_strings(body.stop) or ()
    return values


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
