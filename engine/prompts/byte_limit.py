"""A prompt too long for the context, known from its length in bytes before it is tokenized.

Tokenizing is the slow part of refusing an over-long prompt: a 50 MB line took minutes to tokenize only
to be rejected for its token count. A token covers at most ``bytes_per_token`` bytes of the text the
tokenizer was given, so a text of ``n`` bytes has at least ``ceil(n / bytes_per_token)`` tokens; when
that is already past the context limit the prompt is rejected at once, in the words of the token-count
rejection.

The bound must never reject a prompt that would fit, so it is given only for tokenizers whose every
step is known not to drop text: a ``tokenizers`` (fast) tokenizer with a BPE model that covers every
byte or character it meets (byte-level BPE, byte fallback, or an unknown token per character), a
pre-tokenizer that removes nothing, and a normalizer that shrinks text by a known factor at most. Any
other tokenizer (WordPiece, Unigram, a normalizer that strips accents, spaces or control characters)
gets no bound, and its prompts are tokenized and judged by their count as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

UNKNOWN_CHAR_BYTES = 4
"""An unknown token stands for one character: at most 4 bytes of UTF-8."""

_SHRINK = {"NFD": 1, "NFC": 3, "NFKD": 4, "NFKC": 4, "Lowercase": 3, "Prepend": 1}
"""How many bytes of input one byte of a normalizer's output may stand for, per normalizer type: NFC
composes a 3-character Hangul syllable (9 bytes) into one of 3 bytes, NFKC maps a 4-byte mathematical
letter to a 1-byte one, lowercase maps the 3-byte Kelvin sign to "k". A type not listed may remove text
(Strip, StripAccents, BertNormalizer, Precompiled): no bound."""

_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Split", "Digits", "Punctuation", "UnicodeScripts", "Sequence"}
"""Pre-tokenizers that split text without removing any (Split and Punctuation unless told to remove);
Whitespace, WhitespaceSplit and BertPreTokenizer drop the spaces they split at."""


UTF8_NEVER = frozenset([0xC0, 0xC1, *range(0xF5, 0x100)])
"""Bytes no UTF-8 text holds: a byte-level vocabulary may lack their characters (SmolLM2's does)."""


def _byte_level_chars() -> dict[int, str]:
    """The character byte-level BPE (GPT-2's ``bytes_to_unicode``) stands each byte for: printable bytes
    for themselves, the others for 256 + n in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _state(component: Any) -> Optional[dict]:
    return None if component is None else json.loads(component.__getstate__())


def _shrink_factor(normalizer: Optional[dict]) -> Optional[float]:
    """Bytes of input per byte of normalized text at most (None: unbounded, or not known)."""
    if normalizer is None:
        return 1.0
    kind = normalizer.get("type")
    if kind == "Sequence":
        factor = 1.0
        for part in normalizer.get("normalizers", []):
            inner = _shrink_factor(part)
            if inner is None:
                return None
            factor *= inner
        return factor
    if kind == "Replace":  # a literal string replaced: the content may be shorter than what it replaces
        pattern, content = normalizer.get("pattern", {}).get("String"), normalizer.get("content", "")
        if not isinstance(pattern, str) or not content:
            return None  # a regular expression, or text replaced by nothing
        return max(1.0, len(pattern.encode("utf-8")) / len(content.encode("utf-8")))
    return _SHRINK.get(kind)


def _keeps_text(pre_tokenizer: Optional[dict]) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind not in _KEEPING_PRE_TOKENIZERS or str(pre_tokenizer.get("behavior", "")).lower() == "removed":
        return False
    return all(_keeps_text(p) for p in pre_tokenizer.get("pretokenizers", []))


def _is_byte_level(pre_tokenizer: Optional[dict]) -> bool:
    if pre_tokenizer is None:
        return False
    parts = pre_tokenizer.get("pretokenizers", [])
    return pre_tokenizer.get("type") == "ByteLevel" or any(_is_byte_level(p) for p in parts)


@dataclass(frozen=True)
class TokenBytes:
    """What a tokenizer's tokens cover: at most ``per_token`` bytes each, and the ``dropped`` bytes (of a
    byte-level vocabulary without their character, SmolLM2's control bytes) none at all."""

    per_token: int
    dropped: bytes = b""

    def counted(self, data: bytes) -> int:
        """The bytes of ``data`` some token covers."""
        return len(data) - sum(data.count(b) for b in self.dropped)


MAX_DROPPED = 32
"""A byte-level vocabulary lacking more byte characters than this is not trusted with a bound."""


def token_bytes(tokenizer: Any) -> Optional[TokenBytes]:
    """The bound on what one token of ``tokenizer`` covers, or None when no safe bound is known."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        model = _state(backend.model)
        normalizer, pre_tokenizer = _state(backend.normalizer), _state(backend.pre_tokenizer)
        vocab = backend.get_vocab(with_added_tokens=False)
        added = set(backend.get_vocab(with_added_tokens=True)) - set(vocab)
    except (AttributeError, TypeError, ValueError):  # not a tokenizers object as this reads it
        return None
    factor = _shrink_factor(normalizer)
    if model is None or model.get("type") != "BPE" or factor is None or not _keeps_text(pre_tokenizer):
        return None
    byte_level = _is_byte_level(pre_tokenizer)
    dropped = b""
    if byte_level and not model.get("byte_fallback") and model.get("unk_token") is None:
        chars = _byte_level_chars()  # a byte whose character is no token is dropped by the tokenizer
        dropped = bytes(b for b in range(256) if b not in UTF8_NEVER and chars[b] not in vocab)
        if len(dropped) > MAX_DROPPED:
            return None
    elif (
        not byte_level and not model.get("byte_fallback") and (model.get("unk_token") is None or model.get("fuse_unk"))
    ):
        return None  # an unknown character is dropped, or a run of them is one token

    byte_chars = set(_byte_level_chars().values()) if byte_level else set()

    def covered(token: str) -> int:  # a byte-level character stands for one byte
        if byte_level:
            return sum(1 if c in byte_chars else len(c.encode("utf-8")) for c in token)
        return len(token.encode("utf-8"))

    longest = max([covered(t) for t in vocab] + [len(t.encode("utf-8")) for t in added] + [UNKNOWN_CHAR_BYTES])
    return TokenBytes(int(longest * factor + 0.999999), dropped)


def max_bytes_per_token(tokenizer: Any) -> Optional[int]:
    """The most bytes of prompt text one token can stand for, or None when no safe bound is known."""
    bound = token_bytes(tokenizer)
    return bound.per_token if bound is not None else None


@dataclass
class PromptByteLimit:
    """Rejects a prompt text whose bytes alone put it past the context limit (see the module's docstring).

    The tokenizer's bound is worked out on the first prompt long enough to need it (reading a large
    vocabulary costs a few tens of milliseconds), once."""

    tokenizer: Any
    max_context_len: int
    _bound: Optional[TokenBytes] = field(default=None, init=False, repr=False)
    _known: bool = field(default=False, init=False, repr=False)

    @property
    def bound(self) -> Optional[TokenBytes]:
        if not self._known:
            self._bound, self._known = token_bytes(self.tokenizer), True
        return self._bound

    @property
    def bytes_per_token(self) -> Optional[int]:
        return self.bound.per_token if self.bound is not None else None

    def problem(self, text: str) -> Optional[str]:
        """Why ``text`` can never fit in the context, judged from its bytes alone; None when it may fit."""
        if len(text) < self.max_context_len:  # at least a byte a token: it may fit whatever the tokenizer
            return None
        bound = self.bound
        if bound is None or len(text) * 4 < self.max_context_len * bound.per_token:  # 4: most bytes of a character
            return None
        data = text.encode("utf-8", "surrogatepass")
        size = bound.counted(data)
        at_least = -(-size // bound.per_token)
        if at_least < self.max_context_len:
            return None
        return f"prompt has at least {at_least} tokens ({len(data)} bytes); the context limit is {self.max_context_len}"
