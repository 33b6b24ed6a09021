"""Prompts and checkpoint tweaks the engine tests share."""

from __future__ import annotations

import json
import shutil

from support.tiny_models import shared_tokenizer

PROMPTS = [
    "Once upon a time",
    "The quick brown fox jumps over",
    "In a hole in the ground there lived a hobbit, not a nasty one",
    "Graphs are a fast path",
    "hello",
    "a b c d e f g h i j k",
    "zzz",
    "what is the meaning of life and everything else",
]


def with_extra_eos(src, dst, token):
    """Copy a checkpoint and make `token` an extra EOS through generation_config.json."""
    shutil.copytree(src, dst)
    (dst / "generation_config.json").write_text(json.dumps({"eos_token_id": [shared_tokenizer().eos_token_id, token]}))
    return dst
