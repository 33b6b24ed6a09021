"""A prompt too long for the context by its bytes alone is rejected before it is tokenized (a 50 MB line
was tokenized for minutes only to be rejected), and the bytes-per-token bound it rests on is safe: never
below what a token of the tokenizer covers, and no bound at all for a tokenizer that may drop text."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
from support.tiny_models import shared_tokenizer

from graphtop.engine.prompts.byte_limit import PromptByteLimit, max_bytes_per_token
from graphtop.engine.request import FinishReason
from graphtop.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("torch_one_thread")

TEXTS = [
    "hello world",
    " " * 5000,
    "\n\n\t  " * 300,
    "ééé ∑∑∑ 中文字 🙂🙂" * 50,
    "aaaa" * 2000,
    "".join(chr(c) for c in range(32, 3000)),
    "<|im_start|>" * 100,
]


def _fast(model, normalizer=None, pre_tokenizer=None):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(model)
    core.normalizer = normalizer
    core.pre_tokenizer = pre_tokenizer
    return PreTrainedTokenizerFast(tokenizer_object=core)


def test_the_bound_covers_every_token_of_a_byte_level_tokenizer():
    tok = shared_tokenizer()
    bound = max_bytes_per_token(tok)
    longest = max(len(tok.decode([i]).encode("utf-8")) for i in range(len(tok)))
    assert bound is not None and longest <= bound <= 4 * longest
    for text in TEXTS:  # a text of n bytes has at least n / bound tokens
        assert len(tok.encode(text, add_special_tokens=False)) * bound >= len(text.encode("utf-8")), text[:20]


def test_tokenizers_that_may_drop_text_get_no_bound():
    from tokenizers import models, normalizers, pre_tokenizers

    vocab = {"[UNK]": 0, "a": 1, "b": 2}
    # WordPiece: an unknown word of any length is one [UNK]; the BERT pre-tokenizer drops spaces
    assert (
        max_bytes_per_token(
            _fast(models.WordPiece(vocab, unk_token="[UNK]"), pre_tokenizer=pre_tokenizers.BertPreTokenizer())
        )
        is None
    )
    bpe = models.BPE(vocab, [], unk_token="[UNK]")
    assert max_bytes_per_token(_fast(bpe)) == 5  # "[UNK]": the longest token
    assert max_bytes_per_token(_fast(bpe, normalizers.StripAccents())) is None  # removes combining marks
    assert max_bytes_per_token(_fast(bpe, pre_tokenizer=pre_tokenizers.Whitespace())) is None  # drops spaces
    assert max_bytes_per_token(_fast(bpe, pre_tokenizer=pre_tokenizers.Split(" ", "removed"))) is None
    assert max_bytes_per_token(_fast(models.BPE(vocab, []))) is None  # no unk token: an unknown char vanishes
    assert max_bytes_per_token(_fast(models.BPE(vocab, [], unk_token="[UNK]", fuse_unk=True))) is None
    assert max_bytes_per_token(_fast(bpe, normalizers.NFKC())) == 20  # "Ａ" (3 bytes) -> "A", "𝐀" (4) -> "A"


def test_bytes_a_byte_level_vocabulary_has_no_token_for_are_not_counted():
    """SmolLM2's vocabulary has no character for some control bytes: the tokenizer drops them, so a prompt
    of millions of them is a few tokens and must not be rejected by its size."""
    from tokenizers import models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = bytes_to_unicode()
    vocab = {c: i for i, c in enumerate(c for b, c in sorted(chars.items()) if b != 0x04)}
    tok = _fast(models.BPE(vocab, []), pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=False))
    limit = PromptByteLimit(tok, max_context_len=256)
    assert limit.bound.dropped == b"\x04" and limit.bound.per_token == 4
    text = "ab" + "\x04" * 100_000
    assert len(tok.encode(text)) == 2 and limit.problem(text) is None
    assert limit.problem("ab" * 100_000).startswith("prompt has at least 50000 tokens (200000 bytes)")


def test_the_limit_says_it_in_the_token_count_rejections_words():
    limit = PromptByteLimit(shared_tokenizer(), max_context_len=256)
    bound = limit.bytes_per_token
    assert limit.problem("x" * 255) is None  # shorter than the context in bytes: it may fit
    assert limit.problem("x" * (255 * bound)) is None  # at most 255 tokens by the bound: tokenized and counted
    assert limit.problem("x" * (256 * bound)) == (
        f"prompt has at least 256 tokens ({256 * bound} bytes); the context limit is 256"
    )


@pytest.fixture(scope="module")
def engine(tiny_ckpt, make_engine):
    eng = make_engine(tiny_ckpt("llama"), graphs=False)
    yield eng
    eng.close()


def _spy_on_tokenizer(monkeypatch, tok):
    """Every tokenizer call that tokenizes text (a chat template rendered as text only is not one)."""
    tokenized = []
    for name in ("encode", "__call__", "apply_chat_template"):
        real = getattr(type(tok), name)

        def spy(self, text, *a, _real=real, _name=name, **k):
            if _name != "apply_chat_template" or k.get("tokenize", True):
                tokenized.append((_name, len(text) if isinstance(text, str) else len(text[-1]["content"])))
            return _real(self, text, *a, **k)

        monkeypatch.setattr(type(tok), name, spy)
    return tokenized


def test_an_over_long_prompt_is_rejected_without_tokenizing_it(engine, monkeypatch):
    huge = "once upon a time " * 300_000  # 5 MB: tens of seconds to tokenize on a small CPU
    tokenized = _spy_on_tokenizer(monkeypatch, engine.tokenizer)
    plain = engine.submit(huge, SamplingParams(max_new_tokens=2))
    chat = engine.submit(huge, SamplingParams(max_new_tokens=2), chat=True)
    conversation = engine.submit([{"role": "system", "content": "be brief"}, {"role": "user", "content": huge}])
    for handle in (plain, chat, conversation):
        assert handle.finish_reason is FinishReason.REJECTED and handle.token_ids == []
        assert handle.error.startswith("prompt has at least ") and handle.error.endswith("the context limit is 256")
    assert tokenized == []
    short = engine.submit("once upon a time", SamplingParams(max_new_tokens=2), chat=True)
    assert tokenized[0] == ("apply_chat_template", len("once upon a time"))  # the spy sees what does tokenize
    engine.run_until_done([short])


def test_a_prompt_just_past_the_context_is_still_judged_by_its_token_count(engine):
    handle = engine.submit("word " * 300, SamplingParams(max_new_tokens=2))  # 1,500 bytes: under the byte bound
    assert handle.finish_reason is FinishReason.REJECTED
    assert handle.error.startswith("prompt has ") and "at least" not in handle.error
    assert handle.error.endswith("tokens; the context limit is 256")
