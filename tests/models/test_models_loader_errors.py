"""Every way a checkpoint folder can be wrong yields one clear CheckpointError line."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.load_support import load_error
from support.tiny_models import build_tiny_checkpoint, reshard, tiny_config

from graphtop.models import SUPPORTED_ARCHITECTURES, CheckpointError, load_checkpoint
from graphtop.models.registry import spec_from_hf_config


@pytest.fixture
def ckpt(tmp_path):
    return build_tiny_checkpoint(tmp_path, "llama")


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def rewrite_weights(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_missing_folder(tmp_path):
    message = load_error(tmp_path / "nope")
    assert message.startswith("checkpoint folder not found") and "nope" in message


def test_not_a_folder(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    assert "not a folder" in load_error(tmp_path / "file.txt")


def test_no_config(ckpt):
    (ckpt / "config.json").unlink()
    assert load_error(ckpt) == f"no config.json in {ckpt}"


def _denied(monkeypatch, name, target):
    """``os.NAME`` raising PermissionError for ``target``, as for a user without the permission bits
    (tests run as root here, which chmod does not stop)."""
    import errno

    real = getattr(os, name)

    def fake(path, *args, **kwargs):
        if os.fspath(path) == os.fspath(target):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, name, fake)


def test_unreadable_folder_says_permission_denied(ckpt, monkeypatch):
    """A ``chmod 000`` folder was reported as "no config.json"."""
    _denied(monkeypatch, "listdir", ckpt)
    assert load_error(ckpt) == f"cannot read checkpoint folder {ckpt}: Permission denied"


def test_unreadable_weights_file_says_permission_denied(ckpt, monkeypatch):
    """safetensors reports a file it may not open as "No such file or directory"."""
    _denied(monkeypatch, "open", ckpt / "model.safetensors")
    assert load_error(ckpt) == f"cannot read weights file {ckpt / 'model.safetensors'}: Permission denied"


def test_malformed_config(ckpt):
    (ckpt / "config.json").write_text('{\n  "architectures": ["LlamaForCausalLM"],\n  "vocab_size": ,\n}')
    message = load_error(ckpt)
    assert message.startswith("malformed config.json") and "line 3 column 17" in message and str(ckpt) in message


def test_unsupported_architecture(ckpt):
    edit_config(ckpt, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    message = load_error(ckpt)
    assert message.startswith("unsupported architecture 'GPT2LMHeadModel'")
    assert "supported: " + ", ".join(SUPPORTED_ARCHITECTURES) in message and str(ckpt) in message


def test_unsupported_architecture_message_without_path():
    config = tiny_config("llama")
    config.architectures = ["FalconForCausalLM"]
    with pytest.raises(CheckpointError) as info:
        spec_from_hf_config(config)
    assert str(info.value) == (
        "unsupported architecture 'FalconForCausalLM'; supported: "
        "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
        "Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM"
    )


@pytest.mark.parametrize(
    "family, changes, arch, declared",
    [
        ("qwen3", {"architectures": ["LlamaForCausalLM"]}, "LlamaForCausalLM (model_type 'llama')", "'qwen3'"),
        ("qwen2", {"model_type": "llama"}, "Qwen2ForCausalLM (model_type 'qwen2')", "'llama'"),
        ("llama", {"model_type": "phi3"}, "LlamaForCausalLM (model_type 'llama')", "'phi3'"),
    ],
)
def test_architectures_and_model_type_naming_other_families_are_refused(tmp_path, family, changes, arch, declared):
    """graphtop built the family of architectures[0], transformers that of model_type: a silently other model."""
    path = build_tiny_checkpoint(tmp_path, family)
    edit_config(path, **changes)
    assert load_error(path) == (
        f"config.json: 'architectures' names {arch} but 'model_type' is {declared}, which "
        f"transformers would build instead: refused in {path}"
    )


def test_missing_architectures_falls_back_to_model_type(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    del config["architectures"]
    (ckpt / "config.json").write_text(json.dumps(config))
    assert load_checkpoint(ckpt).spec.architecture == "LlamaForCausalLM"


def test_pickle_only_weights_refused(ckpt):
    (ckpt / "model.safetensors").unlink()
    (ckpt / "pytorch_model.bin").write_bytes(b"never unpickled")
    message = load_error(ckpt)
    assert message.startswith("refusing pickle weights (pytorch_model.bin)") and "convert to safetensors" in message


def test_no_weights(ckpt):
    (ckpt / "model.safetensors").unlink()
    assert load_error(ckpt) == f"no weights (*.safetensors) in {ckpt}"


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_safetensors(ckpt, damage):
    file = ckpt / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x00garbage" * 64)
    message = load_error(ckpt)
    assert message.startswith("corrupt or truncated safetensors file") and "model.safetensors" in message


def test_index_names_missing_shard(ckpt):
    reshard(ckpt, max_shard_size="60KB")
    shards = sorted(ckpt.glob("model-*.safetensors"))
    shards[-1].unlink()
    message = load_error(ckpt)
    assert f"names missing shard '{shards[-1].name}'" in message and str(ckpt) in message


def test_index_points_at_wrong_shard(ckpt):
    reshard(ckpt, max_shard_size="60KB")
    index_file = ckpt / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    shards = sorted(set(index["weight_map"].values()))
    name = next(n for n, shard in index["weight_map"].items() if shard != shards[0])
    index["weight_map"][name] = shards[0]
    index_file.write_text(json.dumps(index))
    assert f"tensor '{name}' is not in shard '{shards[0]}'" in load_error(ckpt)


def test_malformed_index(ckpt):
    (ckpt / "model.safetensors.index.json").write_text("{}")
    assert "no 'weight_map'" in load_error(ckpt)


def test_missing_tensor_is_named(ckpt):
    rewrite_weights(ckpt, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    assert load_error(ckpt) == f"missing tensor 'model.layers.1.mlp.up_proj.weight' in {ckpt}"


def test_untied_checkpoint_without_lm_head(ckpt):
    rewrite_weights(ckpt, lambda t: t.pop("lm_head.weight"))
    assert "missing tensor 'lm_head.weight'" in load_error(ckpt)


def test_wrong_shape(ckpt):
    rewrite_weights(ckpt, lambda t: t.__setitem__("model.norm.weight", torch.ones(63)))
    message = load_error(ckpt)
    assert "tensor 'model.norm.weight' has shape [63], expected [64]" in message


def test_harmless_and_unknown_extras_are_ignored(ckpt):
    def add(t):
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
        t["some.unknown.tensor"] = torch.zeros(2)

    rewrite_weights(ckpt, add)
    assert load_checkpoint(ckpt).spec.num_layers == 2


def test_missing_tokenizer(ckpt):
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (ckpt / name).unlink(missing_ok=True)
    message = load_error(ckpt)
    assert message.startswith("no tokenizer files") and str(ckpt) in message


def test_broken_tokenizer(ckpt):
    (ckpt / "tokenizer.json").write_text("{ not json")
    assert load_error(ckpt).startswith("tokenizer failed to load")


def test_short_sliding_window_is_served(tmp_path):
    """Every Mistral layer attends within the window (parity: tests/models/test_new_families.py)."""
    path = build_tiny_checkpoint(tmp_path, "mistral", sliding_window=128)
    assert load_checkpoint(path).spec.layer_windows() == (128, 128)


def test_sliding_window_covering_context_masks_nothing(tmp_path):
    path = build_tiny_checkpoint(tmp_path, "mistral", sliding_window=256)
    spec = load_checkpoint(path).spec
    assert spec.sliding_window == 256 and spec.layer_windows() == (None, None)


def test_unsupported_activation(ckpt):
    """An activation the torch layers do not implement is refused, naming those they do; one the fused kernels
    lack (GELU) is served by the torch layers (tests/models/test_family_layers.py)."""
    edit_config(ckpt, hidden_act="quick_gelu")
    message = load_error(ckpt)
    assert "unsupported hidden_act 'quick_gelu'" in message and "gelu_pytorch_tanh" in message
