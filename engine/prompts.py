"""A prompt becomes token ids, and is refused up front when it can never be served."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union


def encode_prompt(tokenizer: Any, prompt: Union[str, Sequence[int]], chat: bool) -> tuple[str, list[int]]:
    """(display text, token ids). Text goes through the chat template when asked and the tokenizer has
    one; token ids are taken as they are and decoded for display."""
    if not isinstance(prompt, str):
        ids = [int(t) for t in prompt]
        return tokenizer.decode(ids), ids
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
