"""Train a byte-level BPE tokenizer locally (no downloads), deterministically.

Used by the demo model and the test checkpoints: byte-level BPE round-trips any UTF-8
text, so a tiny vocabulary still tokenises everything the engine may be fed.
"""

from __future__ import annotations

from typing import Any

EOS_TOKEN = "<|endoftext|>"
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_byte_level_bpe(text: str, vocab_size: int) -> Any:
    """A PreTrainedTokenizerFast with EOS `<|endoftext|>`, ChatML tokens and a chat template.

    The vocabulary may end up smaller than `vocab_size` if the text runs out of merges;
    size the model from `len(tokenizer)`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, *CHAT_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(text.splitlines(keepends=True), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
