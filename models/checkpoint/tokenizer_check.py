"""What a loaded tokenizer must be before a model is served with it.

transformers loads some broken tokenizer folders without an error: a folder whose vocabulary file is
nearly empty gives a tokenizer of one or a few tokens that turns every prompt into nothing, and a chat
template is compiled only on the first chat request, so a template with a syntax error (or one that raises
for any conversation) fails there, long after the load said all was well. Both are refused here with one
CheckpointError line.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Optional

from ..errors import CheckpointError

PROBE_CONVERSATION = [{"role": "user", "content": "Hello"}]
"""The smallest conversation every chat template must render (the dashboard's chat submits this shape)."""


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


def check_tokenizer(tokenizer: Any, vocab_size: int, where: str, folder: Optional[Path] = None) -> None:
    """The vocabulary and the chat template of a loaded tokenizer; ``folder``: where its files are, to name
    the file a chat template came from."""
    check_vocabulary(tokenizer, vocab_size, where)
    check_chat_template(tokenizer, where, folder)


def check_vocabulary(tokenizer: Any, vocab_size: int, where: str) -> None:
    """Refuse a tokenizer with fewer than half the model's tokens: its vocabulary files are missing or
    incomplete. A tokenizer somewhat smaller than ``vocab_size`` is normal (embeddings padded to a multiple
    of 64 or 128, reserved rows: Qwen2.5 has 151,665 tokens for 152,064 rows)."""
    size = len(tokenizer)
    if size == 0 or 2 * size < vocab_size:
        raise CheckpointError(
            f"the tokenizer has {size:,} tokens for a model of {vocab_size:,} (vocab_size): its vocabulary "
            f"files (tokenizer.json, or vocab.json + merges.txt, or tokenizer.model) are missing or incomplete "
            f"in {where}"
        )


def check_chat_template(tokenizer: Any, where: str, folder: Optional[Path] = None) -> None:
    """Every chat template must compile, and the one a chat request uses must render a one-message
    conversation: otherwise the first chat submit raises a jinja2 error instead of the load refusing."""
    templates = getattr(tokenizer, "chat_template", None)
    if not templates:
        return
    named = templates if isinstance(templates, dict) else {"default": templates}
    for name, text in named.items():
        _compile(name, text, where, folder)
    if "default" not in named:
        return  # encode_prompt falls back to plain encoding only without any template: nothing to render
    try:
        tokenizer.apply_chat_template(PROBE_CONVERSATION, add_generation_prompt=True, tokenize=False)
    except Exception as err:
        raise CheckpointError(
            f"chat template{_source('default', folder)} fails on a one-message conversation "
            f"({type(err).__name__}: {first_line(err)}) in {where}"
        ) from None


def check_template_text(text: str, where: str) -> None:
    """A chat template given apart from the checkpoint (``--chat-template``) compiles as transformers will
    compile it; CheckpointError naming ``where`` otherwise."""
    _compile("default", text, where, None)


def _compile(name: str, text: Any, where: str, folder: Optional[Path]) -> None:
    """Compile ``text`` as transformers will (its sandboxed environment and extensions)."""
    if not isinstance(text, str):
        raise CheckpointError(f"chat template{_source(name, folder)} is not text in {where}")
    if importlib.util.find_spec("jinja2") is None:
        return  # transformers refuses chat requests itself then, with its own message
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        _compile_jinja_template(text)
    except Exception as err:
        line = getattr(err, "lineno", None)
        at = f" at line {line}" if line else ""
        raise CheckpointError(
            f"chat template{_source(name, folder)} is not valid Jinja{at} ({first_line(err)}) in {where}"
        ) from None


def _source(name: str, folder: Optional[Path]) -> str:
    """`` 'NAME' (FILE)``: the file transformers read the template from, when the folder tells."""
    label = "" if name == "default" else f" '{name}'"
    if folder is None:
        return label
    candidates = (
        ["chat_template.jinja", "chat_template.json"]
        if name == "default"
        else [f"additional_chat_templates/{name}.jinja"]
    ) + ["tokenizer_config.json"]
    file = next((c for c in candidates if (folder / c).is_file()), None)
    return f"{label} ({file})" if file else label
