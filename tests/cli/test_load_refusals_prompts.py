"""A tokenizer that fails on one prompt (a tokenizers panic is a BaseException, outside ``except
Exception``) rejects that request; the run, its other requests and their results go on."""

from __future__ import annotations

import json

import pytest
from support.cli_support import SHORT_RUN, run

from graphtop.engine.prompts import Unencodable, admission_problem, encode_prompt

pytestmark = pytest.mark.usefixtures("private_cache_dir")

PanicException = type("PanicException", (BaseException,), {"__module__": "pyo3_runtime"})
"""What the tokenizers library raises when its Rust code panics (pyo3_runtime.PanicException)."""


class PanickyTokenizer:
    """Encodes by characters; panics on a prompt holding 'PANIC', as a broken tokenizer.json can."""

    chat_template = None

    def encode(self, text, add_special_tokens=True):
        if "PANIC" in text:
            raise PanicException("called `Option::unwrap()` on a `None` value")
        return [ord(c) % 64 for c in text]

    def decode(self, ids):
        raise PanicException("decode panicked")


def test_a_panic_while_encoding_becomes_a_rejection_reason():
    text, ids = encode_prompt(PanickyTokenizer(), "a PANIC prompt", chat=False)
    assert text == "a PANIC prompt" and ids == [] and isinstance(ids, Unencodable)
    assert admission_problem(ids, 100, 100, 64) == (
        "the tokenizer failed on this prompt (PanicException: called `Option::unwrap()` on a `None` value)"
    )
    assert encode_prompt(PanickyTokenizer(), "fine", chat=False)[1] == [ord(c) % 64 for c in "fine"]


def test_a_panic_while_decoding_token_ids_for_display_is_no_text():
    assert encode_prompt(PanickyTokenizer(), [1, 2, 3], chat=False) == ("", [1, 2, 3])


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_interrupts_are_not_turned_into_rejections(interrupt):
    class Interrupted(PanickyTokenizer):
        def encode(self, text, add_special_tokens=True):
            raise interrupt()

    with pytest.raises(interrupt):
        encode_prompt(Interrupted(), "hello", chat=False)


def test_a_headless_run_rejects_the_prompt_the_tokenizer_panics_on_and_serves_the_rest(
    tiny_ckpt, tmp_path, capsys, monkeypatch
):
    from graphtop.models import loader

    real_load = loader._load_tokenizer

    def panicky(path):
        tokenizer = real_load(path)
        encode = tokenizer.encode

        def encode_or_panic(text, *args, **kwargs):
            if "PANIC" in text:
                raise PanicException("called `Option::unwrap()` on a `None` value")
            return encode(text, *args, **kwargs)

        tokenizer.encode = encode_or_panic
        return tokenizer

    monkeypatch.setattr(loader, "_load_tokenizer", panicky)
    prompts, out = tmp_path / "p.txt", tmp_path / "out.jsonl"
    prompts.write_text("hello world\nPANIC now\nonce upon a time\n")
    rc, stdout, err = run(capsys, "--model", tiny_ckpt("llama"), "--prompts", prompts, "--output", out, *SHORT_RUN)
    assert "Traceback" not in err and "PanicException" not in err, err
    assert rc == 1 and stdout.startswith("requests 3 (1 failed)"), stdout
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["finish_reason"] for r in results] == ["length", "rejected", "length"]
    assert results[1]["error"].startswith("the tokenizer failed on this prompt (PanicException: ")
