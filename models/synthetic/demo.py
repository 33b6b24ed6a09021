"""The demo checkpoint: a tiny random Qwen3-family model built locally in seconds.

It lets graphtop run end to end (load, prefill, decode, graphs, TUI) on any machine with
no download. The weights are random, so the text is noise; the shapes exercise the
interesting paths (GQA, Qwen3 q/k norm, head_dim != hidden/heads, tied embeddings, bf16).
Built once per cache folder, atomically (models/checkpoint/cache.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..checkpoint.cache import CACHE_ENV, build_once, cache_root, no_progress_bars
from ..errors import CheckpointError
from .demo_corpus import CORPUS
from .tokenizer_train import CHAT_TOKENS, EOS_TOKEN, train_byte_level_bpe

DEMO_NOTE = "demo model: tiny Qwen3-family model with random weights — output is gibberish by design"
DEMO_DIRNAME = "demo-qwen3-v1"  # bump when anything below changes the files
DEMO_SEED = 0


def demo_cache_root(cache_dir: Path | str | None = None) -> Path:
    """Explicit argument, else $GRAPHTOP_CACHE_DIR, else the platform user cache dir."""
    return cache_root(cache_dir)


def _build(folder: Path) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = train_byte_level_bpe(CORPUS, vocab_size=1024)
    eos_ids = tokenizer.convert_tokens_to_ids([EOS_TOKEN, CHAT_TOKENS[1]])
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,  # != hidden_size / num_attention_heads (32), as in real Qwen3
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_ids,
        pad_token_id=eos_ids[0],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(DEMO_SEED)
        model = Qwen3ForCausalLM(config)
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    with no_progress_bars():  # the TUI owns the terminal
        model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _cache_label(root: Path, cache_dir: Path | str | None) -> str:
    if cache_dir is None and os.environ.get(CACHE_ENV):
        return f"{CACHE_ENV}={os.environ[CACHE_ENV]}"
    return f"cache folder {root}"


def check_demo_cache(cache_dir: Path | str | None = None) -> None:
    """Raise CheckpointError (one line) unless the demo model is built or can be built in its cache folder.

    A cache that already holds the model only has to be readable (a read-only mount is fine).
    """
    root = demo_cache_root(cache_dir)
    if (root / DEMO_DIRNAME / "config.json").is_file():
        return
    label = _cache_label(root, cache_dir)
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise CheckpointError(f"{label}: {existing} is not a folder, so the demo model cannot be built there")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CheckpointError(f"{label}: {existing} is not writable (read-only?), so the demo model cannot be built")


def ensure_demo_model(cache_dir: Path | str | None = None) -> Path:
    """Path of the demo checkpoint, building it on first use (a few seconds on CPU)."""
    root = demo_cache_root(cache_dir)
    target = root / DEMO_DIRNAME
    if (target / "config.json").is_file():
        return target
    check_demo_cache(cache_dir)
    from safetensors import SafetensorError

    try:
        return build_once(target, _build)
    # A disk that fills up or turns read-only mid-build: an OSError from the tokenizer's files, a
    # SafetensorError (not an OSError) from the weights. build_once removes the staging folder either way.
    except (OSError, SafetensorError) as err:
        raise CheckpointError(f"{_cache_label(root, cache_dir)}: cannot build the demo model: {_reason(err)}") from None


def _reason(err: Exception) -> str:
    """The part of a build error worth one line: an OSError's strerror, else the message's first line."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
