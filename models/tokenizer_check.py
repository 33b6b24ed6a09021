"""What a loaded tokenizer must be before a model is served with it.

transformers loads some broken tokenizer folders without an error: a folder whose vocabulary file is
nearly empty gives a tokenizer of one or a few tokens that turns every prompt into nothing. Such a
tokenizer is refused here with one CheckpointError line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from .errors import CheckpointError


def check_tokenizer(tokenizer: Any, vocab_size: int, where: str, folder: Optional[Path] = None) -> None:
    """The vocabulary of a loaded tokenizer; ``folder``: where its files are."""
    check_vocabulary(tokenizer, vocab_size, where)


def check_vocabulary(tokenizer: Any, vocab_size: int, where: str) -> None:
    """Refuse a tokenizer with fewer than half the model's tokens: its vocabulary files are missing or
    incomplete. A tokenizer somewhat smaller than ``vocab_size`` is normal (embeddings padded to a multiple
    of 64 or 128, reserved rows: Qwen2.5 has 151,665 tokens for 152,064 rows)."""
    size = len(tokenizer)
    if size == 0 or 2 * size < vocab_size:
        raise CheckpointError(
            f"the tokenizer has {size:,} tokens for a model of {vocab_size:,} (vocab_size): its vocabulary "
            f"files (tokenizer.json, or vocab.json + merges.txt, or tokenizer.model) are missing or incomplete "
            f"in {where}")
