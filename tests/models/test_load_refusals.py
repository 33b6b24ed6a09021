"""Hostile checkpoint folders that used to load (and serve a wrong model, hang or print transformers'
warnings): each is refused with one CheckpointError line naming the file and the problem."""

from __future__ import annotations

import json
import os
import subprocess
from contextlib import contextmanager

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.load_support import load_error

from graphtop.models import load_checkpoint


def edit_json(file, **changes):
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps(data))


def rewrite_weights(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


# --- quantized checkpoints -----------------------------------------------------------------------

FP8_QUANT = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}


def test_config_with_a_quantization_config_is_refused(ckpt):
    edit_json(ckpt / "config.json", quantization_config=FP8_QUANT)
    message = load_error(ckpt)
    assert "config.json: 'quantization_config' ('fp8') is set" in message and str(ckpt) in message


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_weights_are_refused_naming_the_tensor(ckpt, dtype):
    """Even without quantization_config: an e4m3 weight copied alone (its scale ignored) is a wrong model."""
    name = "model.layers.0.mlp.up_proj.weight"

    def to_fp8(t):
        t[name] = t[name].to(dtype)
        t[name.replace("weight", "weight_scale_inv")] = torch.ones(1, 1)

    rewrite_weights(ckpt, to_fp8)
    message = load_error(ckpt)
    assert f"tensor '{name}' is stored as F8_" in message and "quantized" in message
    assert str(ckpt / "model.safetensors") in message


# --- files that are not regular files, tensors in two files -------------------------------------


@contextmanager
def fifo_at(file):
    """A FIFO at ``file``. A helper process opens and closes its writing end whenever a reader waits, so a
    loader that opens it anyway reads an empty file and the test fails instead of hanging (a process, not
    a thread: safetensors opens files holding the GIL)."""
    if os.path.lexists(file):
        file.unlink()
    os.mkfifo(file)
    writer = subprocess.Popen(["sh", "-c", 'while :; do : > "$0"; done', str(file)])
    try:
        yield file
    finally:
        writer.kill()
        writer.wait()


@pytest.mark.parametrize(
    "name",
    [
        "config.json",
        "model.safetensors",
        "model.safetensors.index.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "chat_template.jinja",
        "chat_template.json",
        "additional_chat_templates/tool.jinja",
    ],
)
def test_a_fifo_among_the_checkpoint_files_is_refused(ckpt, name):
    (ckpt / "additional_chat_templates").mkdir()
    with fifo_at(ckpt / name):
        message = load_error(ckpt)
    assert f"'{name.split('/')[-1]}' is a FIFO, not a regular file: refused" in message, message


def test_a_folder_named_like_a_weights_file_is_refused(ckpt):
    (ckpt / "model.safetensors").rename(ckpt / "model-00001.safetensors")
    (ckpt / "zz.safetensors").mkdir()
    assert "weights file 'zz.safetensors' is a folder, not a regular file" in load_error(ckpt)


def test_a_link_to_a_fifo_is_refused(ckpt):
    with fifo_at(ckpt / "pipe"):
        (ckpt / "tokenizer_config.json").unlink()
        (ckpt / "tokenizer_config.json").symlink_to("pipe")
        assert "'tokenizer_config.json' is a FIFO" in load_error(ckpt)


def test_a_tensor_in_two_unindexed_files_is_refused_naming_both(ckpt):
    tensors = load_file(ckpt / "model.safetensors")
    (ckpt / "model.safetensors").unlink()
    save_file(tensors, ckpt / "a.safetensors", metadata={"format": "pt"})
    save_file({"model.norm.weight": torch.zeros(64)}, ckpt / "b.safetensors", metadata={"format": "pt"})
    message = load_error(ckpt)
    assert "tensor 'model.norm.weight' is in both 'a.safetensors' and 'b.safetensors'" in message
    assert str(ckpt) in message


def _split_with_index(ckpt, weight_map_text=None):
    """The single file as two indexed shards (``weight_map_text``: the index's raw weight_map JSON)."""
    tensors = load_file(ckpt / "model.safetensors")
    names = sorted(tensors)
    shards = {"s1.safetensors": names[:5], "s2.safetensors": names[5:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, ckpt / shard, metadata={"format": "pt"})
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    text = weight_map_text(weight_map) if weight_map_text else json.dumps(weight_map)
    (ckpt / "model.safetensors.index.json").write_text('{"metadata": {}, "weight_map": ' + text + "}")
    return tensors


def test_an_index_beside_a_model_safetensors_it_does_not_name_is_refused(ckpt):
    """transformers serves the single file, graphtop served the shards: which is the model is ambiguous."""
    tensors = _split_with_index(ckpt)
    save_file({k: v * 2 for k, v in tensors.items()}, ckpt / "model.safetensors", metadata={"format": "pt"})
    assert load_error(ckpt) == (
        "both model.safetensors.index.json (with its shards) and a model.safetensors it does "
        f"not name: which holds the weights is ambiguous (remove one) in {ckpt}"
    )
    (ckpt / "model.safetensors").unlink()
    assert torch.equal(load_checkpoint(ckpt).model.model.norm.weight, tensors["model.norm.weight"])


def test_a_tensor_listed_twice_in_the_weight_map_is_refused(ckpt):
    """json keeps the last of two equal keys without a word."""
    _split_with_index(ckpt, lambda wm: json.dumps(wm)[:-1] + ', "model.norm.weight": "s1.safetensors"}')
    (ckpt / "model.safetensors").unlink()
    assert load_error(ckpt) == (
        f"malformed model.safetensors.index.json: key 'model.norm.weight' appears twice in "
        f"{ckpt / 'model.safetensors.index.json'}"
    )


def test_tensors_split_over_unindexed_files_still_load(ckpt):
    tensors = load_file(ckpt / "model.safetensors")
    (ckpt / "model.safetensors").unlink()
    names = sorted(tensors)
    save_file({k: tensors[k] for k in names[:5]}, ckpt / "a.safetensors", metadata={"format": "pt"})
    save_file({k: tensors[k] for k in names[5:]}, ckpt / "b.safetensors", metadata={"format": "pt"})
    assert torch.equal(load_checkpoint(ckpt).model.model.norm.weight, tensors["model.norm.weight"])


# --- tie_word_embeddings with a stored lm_head -----------------------------------------------------


def _logits(model, ids):
    from graphtop.models.layers.reference_attention import ContiguousAttention

    with torch.no_grad():
        return model.compute_logits(model(ids, torch.arange(len(ids)), ContiguousAttention()))


def test_tied_config_with_a_different_stored_lm_head_serves_it_as_transformers_does(ckpt):
    """transformers 5 does not tie when both tensors are stored with different values (it warns); tying
    would serve other logits than the reference."""
    from transformers import AutoModelForCausalLM

    edit_json(ckpt / "config.json", tie_word_embeddings=True)
    stored = load_file(ckpt / "model.safetensors")
    assert not torch.equal(stored["lm_head.weight"], stored["model.embed_tokens.weight"])
    loaded = load_checkpoint(ckpt)
    assert not loaded.spec.tie_word_embeddings
    assert torch.equal(loaded.model.lm_head.weight, stored["lm_head.weight"])
    assert torch.equal(loaded.model.model.embed_tokens.weight, stored["model.embed_tokens.weight"])
    ref = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    ids = torch.arange(1, 17)
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    torch.testing.assert_close(_logits(loaded.model, ids), want, atol=1e-4, rtol=1e-4)


def test_tied_config_with_an_identical_stored_lm_head_stays_tied(ckpt):
    def same_head(t):
        t["lm_head.weight"] = t["model.embed_tokens.weight"].to(torch.bfloat16).float().clone()
        t["model.embed_tokens.weight"] = t["lm_head.weight"].to(torch.bfloat16)  # same values, other dtype

    edit_json(ckpt / "config.json", tie_word_embeddings=True)
    rewrite_weights(ckpt, same_head)
    loaded = load_checkpoint(ckpt)
    assert loaded.spec.tie_word_embeddings
    assert loaded.model.lm_head.weight.data_ptr() == loaded.model.model.embed_tokens.weight.data_ptr()


# --- special token ids ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, value",
    [("eos_token_id", 512), ("eos_token_id", [0, 100000]), ("bos_token_id", 100000), ("bos_token_id", True)],
)
def test_config_eos_or_bos_outside_the_vocabulary_is_refused(ckpt, key, value):
    edit_json(ckpt / "config.json", **{key: value})
    message = load_error(ckpt)
    assert f"config.json: '{key}' must be a token id in [0, 512) or a list of them" in message
    assert str(ckpt) in message


@pytest.mark.parametrize("value", [-7, 512])
def test_a_bad_pad_token_id_is_ignored_with_one_line_of_ours(ckpt, value, caplog, capfd):
    """vLLM never reads pad_token_id, and many Hub configs store -1: ignored, and transformers' own
    warning about it stays off stderr."""
    edit_json(ckpt / "config.json", pad_token_id=value)
    loaded = load_checkpoint(ckpt)
    assert loaded.hf_config.pad_token_id is None
    assert "Model config:" not in capfd.readouterr().err
    assert [r.getMessage() for r in caplog.records if "pad_token_id" in r.getMessage()] == [
        f"ignoring config.json pad_token_id={value!r}: not a token id of the vocabulary (graphtop does not "
        f"use it) in {ckpt}"
    ]


@pytest.mark.parametrize("value", [10**30, -1, True, [2.7], [0, 100000], "0", {"a": 1}, [], 512])
def test_generation_config_eos_that_is_not_a_token_id_is_refused(ckpt, value):
    """A float was truncated, a bool read as 1, a string iterated, an id past the vocabulary never matched."""
    (ckpt / "generation_config.json").write_text(json.dumps({"eos_token_id": value}))
    message = load_error(ckpt)
    assert message.startswith("generation_config.json: 'eos_token_id' must be a token id in [0, 512)"), message
    assert message.endswith(f" in {ckpt}")


def test_generation_config_eos_ids_are_added_to_the_stop_tokens(ckpt):
    eos = json.loads((ckpt / "config.json").read_text())["eos_token_id"]
    (ckpt / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 511]}))
    assert load_checkpoint(ckpt).spec.eos_token_ids[:3] == (eos, 7, 511)


# --- tokenizers ----------------------------------------------------------------------------------


def _drop_tokenizer_json(ckpt, tokenizer_class):
    (ckpt / "tokenizer.json").unlink()
    edit_json(ckpt / "tokenizer_config.json", tokenizer_class=tokenizer_class)


@pytest.mark.parametrize("tokenizer_class", ["Qwen2Tokenizer", "LlamaTokenizer", "TokenizersBackend"])
def test_tokenizer_config_alone_is_refused(ckpt, tokenizer_class):
    """transformers builds a tokenizer of 1-3 tokens from it (every prompt became 'empty prompt'), or fails
    asking for sentencepiece or tiktoken."""
    _drop_tokenizer_json(ckpt, tokenizer_class)
    message = load_error(ckpt)
    assert message == (
        f"no tokenizer vocabulary (tokenizer.json, vocab.json or tokenizer.model; "
        f"tokenizer_config.json alone names none) in {ckpt}"
    )


def test_a_tokenizer_far_smaller_than_the_vocabulary_is_refused(ckpt):
    """A vocabulary file that is there but nearly empty: what is left of the len() check."""
    (ckpt / "tokenizer.json").unlink()
    (ckpt / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "<|endoftext|>": 2}))
    (ckpt / "merges.txt").write_text("#version: 0.2\n")
    edit_json(ckpt / "tokenizer_config.json", tokenizer_class="GPT2Tokenizer")
    message = load_error(ckpt)
    assert message.startswith("the tokenizer has 3 tokens for a model of 512 (vocab_size): its vocabulary files"), (
        message
    )


def test_a_tokenizer_slightly_smaller_than_a_padded_vocabulary_loads(tiny_ckpt, tmp_path):
    """Embeddings padded to a multiple of 64 or 128 leave rows no token uses (Qwen2.5: 151,665 of 152,064)."""
    from support.tiny_models import shared_tokenizer

    loaded = load_checkpoint(tiny_ckpt("llama", vocab_size=len(shared_tokenizer()) + 64))
    assert loaded.spec.vocab_size == len(loaded.tokenizer) + 64


def test_a_sentencepiece_only_folder_without_sentencepiece_is_one_clear_line(ckpt, capfd, monkeypatch):
    import importlib.util

    from graphtop.models import loader

    real = importlib.util.find_spec
    monkeypatch.setattr(
        loader.importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("sentencepiece", "tiktoken") else real(name, *a),
    )
    (ckpt / "tokenizer.json").unlink()
    (ckpt / "tokenizer.model").write_bytes(b"\x00garbage" * 10)
    message = load_error(ckpt)
    assert message == (
        f"the tokenizer is only a tokenizer.model (no tokenizer.json), and reading it needs the "
        f"sentencepiece package (pip install sentencepiece) in {ckpt}"
    )
    assert "SentencePiece" not in capfd.readouterr().err


# --- chat templates ------------------------------------------------------------------------------


def _set_template(ckpt, where, text):
    (ckpt / "chat_template.jinja").unlink(missing_ok=True)
    if where == "chat_template.jinja":
        (ckpt / "chat_template.jinja").write_text(text)
    else:
        edit_json(ckpt / "tokenizer_config.json", chat_template=text)


@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
def test_a_chat_template_that_is_not_valid_jinja_is_refused_at_load(ckpt, where):
    _set_template(ckpt, where, "{% for m in messages %}{{ m.content ")
    message = load_error(ckpt)
    assert message.startswith(f"chat template ({where}) is not valid Jinja at line 1 (unexpected end of template")
    assert message.endswith(f" in {ckpt}")


def test_a_chat_template_that_raises_for_a_plain_conversation_is_refused_at_load(ckpt):
    _set_template(ckpt, "chat_template.jinja", "{{ raise_exception('roles must alternate') }}")
    assert load_error(ckpt) == (
        f"chat template (chat_template.jinja) fails on a one-message conversation "
        f"(TemplateError: roles must alternate) in {ckpt}"
    )


def test_a_broken_named_chat_template_is_refused(ckpt):
    (ckpt / "additional_chat_templates").mkdir()
    (ckpt / "additional_chat_templates" / "tool_use.jinja").write_text("{% if %}")
    message = load_error(ckpt)
    assert message.startswith("chat template 'tool_use' (additional_chat_templates/tool_use.jinja) is not valid")


def test_a_template_that_raises_only_for_other_conversations_loads(ckpt):
    text = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    _set_template(ckpt, "chat_template.jinja", text)
    assert load_checkpoint(ckpt).tokenizer.chat_template == text
