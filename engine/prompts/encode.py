"""A prompt becomes token ids, and is refused up front when it can never be served."""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from .byte_limit import PromptByteLimit
from .conversation import as_messages, is_conversation

Prompt = Union[str, Sequence[int], Sequence[Mapping[str, str]]]
"""Text, token ids, or a conversation (``[{"role": ..., "content": ...}, ...]``)."""

_NOT_CAUGHT = (KeyboardInterrupt, SystemExit, GeneratorExit)
"""What a tokenizer call may raise that is not about the prompt: a Ctrl-C, an exit, a closing generator."""


class Unencodable(list):
    """The token ids (none) of a prompt that was not tokenized, and why (the tokenizer failed on it, it is
    too long for the context by its bytes alone, a conversation for a model without a chat template):
    ``admission_problem`` rejects it like any prompt that can never be served, so one bad prompt finishes
    as ``rejected`` instead of ending the run (and its finished results) with a traceback."""

    def __init__(self, problem: str) -> None:
        super().__init__()
        self.problem = problem


def _tokenizer_call(call: Callable[[], Any]) -> Any:
    """``call()``, or an ``Unencodable`` naming what it raised. The tokenizers library panics with
    ``pyo3_runtime.PanicException``, a BaseException, which ``except Exception`` (the dashboard's, a
    caller's) does not catch; jinja2 raises at render for a conversation its template refuses."""
    try:
        return call()
    except _NOT_CAUGHT:
        raise
    except BaseException as err:  # a panic is a BaseException; interrupts are re-raised above
        text = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        return Unencodable(f"the tokenizer failed on this prompt ({type(err).__name__}{': ' if text else ''}{text})")


def encode_prompt(
    tokenizer: Any, prompt: Prompt, chat: bool, limit: Optional[PromptByteLimit] = None
) -> tuple[str, list[int]]:
    """(display text, token ids). Text goes through the chat template when asked and the tokenizer has
    one; a conversation always does (its display text is the rendered conversation); token ids are taken
    as they are and decoded for display. ``limit``: text too long for the context by its bytes alone is
    rejected without being tokenized."""
    if isinstance(prompt, (bytes, bytearray)):
        raise TypeError("a prompt is text (str) or a sequence of token ids, got bytes: decode it first")
    if is_conversation(prompt):
        return _encode_conversation(tokenizer, as_messages(prompt), limit)
    if not isinstance(prompt, str):
        ids = [_token_id(i, t) for i, t in enumerate(prompt)]
        text = _tokenizer_call(lambda: tokenizer.decode(ids))  # for display only: admission_problem judges ids
        return ("" if isinstance(text, Unencodable) else text), ids
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"prompt is not valid Unicode ({e.reason} at character {e.start})") from None
    if chat and has_chat_template(tokenizer):
        return prompt, _chat_ids(tokenizer, [{"role": "user", "content": prompt}], limit)[1]
    problem = limit.problem(prompt) if limit is not None else None
    if problem:
        return prompt, Unencodable(problem)
    return prompt, _tokenizer_call(lambda: tokenizer.encode(prompt, add_special_tokens=True))


def _encode_conversation(
    tokenizer: Any, messages: list[dict[str, str]], limit: Optional[PromptByteLimit]
) -> tuple[str, list[int]]:
    if not has_chat_template(tokenizer):
        return "", Unencodable("the model has no chat template: a conversation ('messages') needs one")
    return _chat_ids(tokenizer, messages, limit)


def _chat_ids(
    tokenizer: Any,
    messages: list[dict[str, str]],
    limit: Optional[PromptByteLimit],
    template: Optional[Mapping[str, Any]] = None,
) -> tuple[str, list[int]]:
    """(the rendered conversation, its token ids) through the chat template. The text is rendered on its own
    first (cheap) so one too long for the context is rejected before the tokenizer spends minutes on it;
    the ids come from transformers' own tokenizing render (which guards the template's control tokens).
    ``template``: keyword arguments for the template (``chat_template_options``)."""
    options = {"add_generation_prompt": True, **(template or {})}
    text = _tokenizer_call(lambda: tokenizer.apply_chat_template(messages, tokenize=False, **options))
    if isinstance(text, Unencodable):
        return "", text
    problem = limit.problem(text) if limit is not None and isinstance(text, str) else None
    if problem:
        return text, Unencodable(problem)
    ids = _tokenizer_call(lambda: tokenizer.apply_chat_template(messages, tokenize=True, **options))
    if isinstance(ids, Unencodable):
        return text, ids
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return text, list(ids)


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_messages(
    tokenizer: Any,
    messages: list[dict[str, str]],
    limit: Optional[PromptByteLimit] = None,
    template: Optional[Mapping[str, Any]] = None,
) -> list[int]:
    """A conversation through the tokenizer's chat template, ready for the assistant's turn: its token ids,
    or an ``Unencodable`` saying why it cannot be served. The one home of the template call, for a chat
    prompt of ``submit`` and the HTTP API's chat completions alike, so both give the same ids. ``template``
    (``chat_template_options``) reaches the template: ``add_generation_prompt`` (default true),
    ``continue_final_message``, and a template's own variables such as Qwen3's ``enable_thinking``."""
    return _chat_ids(tokenizer, messages, limit, template)[1]


TEMPLATE_RESERVED = frozenset(
    {"conversation", "messages", "tokenize", "chat_template", "tools", "documents", "tokenizer_kwargs"}
    | {"return_dict", "return_tensors", "return_assistant_tokens_mask", "padding", "truncation", "max_length"}
)
"""Arguments of ``apply_chat_template`` that are not the template's to take from a caller: the call's own
(what it renders, how it returns it) and tools or documents, which graphtop does not serve."""


def chat_template_options(
    kwargs: Optional[Mapping[str, Any]], add_generation_prompt: bool = True, continue_final_message: bool = False
) -> dict[str, Any]:
    """The template's keyword arguments for a chat request: ``kwargs`` (its own variables, and
    ``add_generation_prompt`` / ``continue_final_message`` if given there, as vLLM merges them) over the two
    flags; ValueError (one line) for a reserved name or both flags at once."""
    options: dict[str, Any] = {
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final_message,
    }
    for key, value in (kwargs or {}).items():
        if not isinstance(key, str) or key in TEMPLATE_RESERVED:
            raise ValueError(f"chat_template_kwargs may not set {key!r}")
        options[key] = value
    if options["add_generation_prompt"] is True and options["continue_final_message"] is True:
        raise ValueError("add_generation_prompt and continue_final_message cannot both be true")
    if not options["continue_final_message"]:
        del options["continue_final_message"]  # templates and tokenizers that predate it take no such argument
    return options


def admission_problem(
    ids: Sequence[int], max_context_len: int, kv_capacity_tokens: int, vocab_size: int
) -> Optional[str]:
    """Why a prompt of ``ids`` can never be served (one line), or None."""
    if isinstance(ids, Unencodable):
        return ids.problem
    n = len(ids)
    if n == 0:
        return "empty prompt"
    if n >= max_context_len:
        return f"prompt has {n} tokens; the context limit is {max_context_len}"
    if n + 1 > kv_capacity_tokens:
        return f"prompt has {n} tokens; the KV pool holds only {kv_capacity_tokens}"
    if any(t < 0 or t >= vocab_size for t in ids):
        return f"prompt has token ids outside the vocabulary (size {vocab_size})"
    return None


def _token_id(index: int, value: Any) -> int:
    """An integer token id (numpy integers too); a float, str or bool would be silently misread."""
    if isinstance(value, bool):
        raise TypeError(f"token id #{index} is a bool, not an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"token id #{index} is {value!r:.40} ({type(value).__name__}), not an integer") from None
