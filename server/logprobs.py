"""Log-probabilities in the two shapes of the OpenAI API, from the engine's ``TokenLogprob`` entries.

The values are the engine's: the log-softmax of the model's raw logits (vLLM's default), the chosen token
and its most likely alternatives. Written as OpenAI (and vLLM) write them:

- completions (the legacy format): ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, one
  item per token; ``top_logprobs`` maps each of the N most likely tokens, and the chosen one when it is not
  among them (so up to N + 1), to its log-probability; with ``echo`` the prompt's tokens come first, the
  first of them with ``null`` (nothing scores it); ``text_offset`` counts the characters of the token
  strings before each token, from the start of the returned text;
- chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}``
  with exactly N alternatives.

A token's string is its own decode (special tokens included), ``bytes`` that string's UTF-8 (a token that
is part of a character decodes to U+FFFD, as in vLLM), or ``token_id:N`` with
``return_tokens_as_token_ids``. A log-probability of -inf is written -9999.0 (JSON has no infinity).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from graphtop.engine.request import TokenLogprob

FLOOR = -9999.0
"""What a log-probability of -inf is written as (vLLM's)."""

Scored = tuple[int, Optional[TokenLogprob]]
"""A token and its log-probabilities (None for the prompt's first token, which nothing scores)."""


class LogprobWriter:
    """Token strings for one response, decoded once per token id."""

    def __init__(self, tokenizer: Any, as_ids: bool = False) -> None:
        self.tokenizer = tokenizer
        self.as_ids = as_ids
        self._strings: dict[int, str] = {}

    def _decode(self, ids: Sequence[int]) -> None:
        new = sorted({i for i in ids if i not in self._strings})
        if not new or self.as_ids:
            for i in new:
                self._strings[i] = f"token_id:{i}"
            return
        for i, text in zip(new, self.tokenizer.batch_decode([[i] for i in new], skip_special_tokens=False)):
            self._strings[i] = text

    def _prepare(self, entries: Sequence[Scored]) -> None:
        ids = [t for t, _ in entries]
        ids += [t for _, lp in entries if lp is not None for t, _ in lp.top]
        self._decode(ids)

    def completion(self, entries: Sequence[Scored], offset: int = 0) -> tuple[dict[str, Any], int]:
        """The legacy object for ``entries``, the first at character ``offset``; and the offset after them."""
        self._prepare(entries)
        s = self._strings
        tokens, values, tops, offsets = [], [], [], []
        for token, lp in entries:
            tokens.append(s[token])
            offsets.append(offset)
            offset += len(s[token])
            if lp is None:
                values.append(None)
                tops.append(None)
                continue
            values.append(_value(lp.logprob))
            top = {}
            for t, v in lp.top:
                top.setdefault(s[t], _value(v))
            top.setdefault(s[token], _value(lp.logprob))
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}, offset

    def chat(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        """The chat object for generated tokens."""
        self._prepare([(lp.token, lp) for lp in entries])
        return {
            "content": [
                {
                    **self._one(lp.token, lp.logprob),
                    "top_logprobs": [self._one(t, v) for t, v in lp.top],
                }
                for lp in entries
            ]
        }

    def _one(self, token: int, value: float) -> dict[str, Any]:
        text = self._strings[token]
        return {"token": text, "logprob": _value(value), "bytes": list(text.encode("utf-8", errors="replace"))}


def _value(logprob: float) -> float:
    return max(logprob, FLOOR)
