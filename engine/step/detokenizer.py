"""Incremental detokenization: O(1) tokenizer work per new token, and no half UTF-8 characters.

Decoding the whole output every token is quadratic; decoding only the new id breaks multi-byte
characters and BPE merges. The usual fix: decode a short window and emit only the stable suffix.
"""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""

    def push(self, token_id: int) -> str:
        """Append a token; return the newly stable text (may be empty)."""
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=self.skip)
        full = decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """At the end: whatever is left, replacement characters included."""
        full = self.tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=self.skip)
        delta = full[len(prefix) :] if len(full) > len(prefix) else ""
        self.text += delta
        self.prefix_offset = self.read_offset = len(self.ids)
        return delta
