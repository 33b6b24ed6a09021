"""Incremental detokenization: O(1) tokenizer work per new token, and no half UTF-8 characters.

Decoding the whole output every token is quadratic; decoding only the new id breaks multi-byte
characters and BPE merges. The usual fix: decode a short window and emit only the stable suffix.

The window must stay short whatever the tokens are. It only moves on when the new tokens decode to
stable text, so tokens that decode to nothing (ids the tokenizer does not know, special tokens that are
skipped: a random-weight model repeating one such id) or to an unfinished character for ever would
make it span the whole output, and every token would decode the whole output again (a decode step
growing with its context). Past ``MAX_PENDING`` unstable tokens the window is cut: no character or
merge spans that many tokens, so what they decode to is as final as it gets.

The text is kept as pieces, one per stable delta, and joined only when read: appending to one growing
string copies all of it every token.
"""

from __future__ import annotations

from typing import Any

MAX_PENDING = 16
"""Unstable tokens (decoded to nothing new, or to a replacement character) the window holds before it is
cut; a UTF-8 character is at most 4 bytes, so at most 4 byte-level tokens."""
KEEP = 4
"""Tokens a cut window keeps as the decode prefix of the next one (merges and leading spaces read the
tokens before them)."""


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.pieces: list[str] = []
        self.length = 0  # characters in ``pieces``

    @property
    def text(self) -> str:
        """The stable text so far (joined here, once per read, and kept joined)."""
        if len(self.pieces) > 1:
            self.pieces = ["".join(self.pieces)]
        return self.pieces[0] if self.pieces else ""

    def push(self, token_id: int) -> str:
        """Append a token; return the newly stable text (may be empty)."""
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=self.skip)
        full = decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return self._add(full[len(prefix) :])
        if len(self.ids) - self.read_offset < MAX_PENDING:
            return ""
        # the window is cut: what the pending tokens decode to now is what they give
        self.read_offset = len(self.ids)
        self.prefix_offset = max(0, self.read_offset - KEEP)
        return self._add(full[len(prefix) :] if len(full) > len(prefix) else "")

    def flush(self) -> str:
        """At the end: whatever is left, replacement characters included."""
        full = self.tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=self.skip)
        self.prefix_offset = self.read_offset = len(self.ids)
        return self._add(full[len(prefix) :] if len(full) > len(prefix) else "")

    def _add(self, delta: str) -> str:
        if delta:
            self.pieces.append(delta)
            self.length += len(delta)
        return delta
