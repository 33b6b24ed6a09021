"""A prompt becomes token ids, and is refused up front when it can never be served."""

from __future__ import annotations

import operator
from typing import Any, Optional, Sequence, Union


def encode_prompt(tokenizer: Any, prompt: Union[str, Sequence[int]], chat: bool) -> tuple[str, list[int]]:
    """(display text, token ids). Text goes through the chat template when asked and the tokenizer has
    one; token ids are taken as they are and decoded for display."""
    if isinstance(prompt, (bytes, bytearray)):
        raise TypeError("a prompt is text (str) or a sequence of token ids, got bytes: decode it first")
    if not isinstance(prompt, str):
        ids = [_token_id(i, t) for i, t in enumerate(prompt)]
        try:  # for display only: ids outside the vocabulary are refused by admission_problem
            return tokenizer.decode(ids), ids
        except (OverflowError, ValueError, TypeError, IndexError):
            return "", ids
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"prompt is not valid Unicode ({e.reason} at character {e.start})") from None
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return prompt, list(ids)
    return prompt, tokenizer.encode(prompt, add_special_tokens=True)


def admission_problem(ids: Sequence[int], max_context_len: int, kv_capacity_tokens: int,
                      vocab_size: int) -> Optional[str]:
    """Why a prompt of ``ids`` can never be served (one line), or None."""
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
