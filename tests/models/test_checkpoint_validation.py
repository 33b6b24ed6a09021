"""Checkpoint boundary: config.json values (types, ranges, finiteness, sizes that would not fit), weights
(non-finite values, non-float dtypes) and files that resolve outside the folder, each refused with one
CheckpointError line before anything big is allocated."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.load_support import load_error

from graphtop.models import CheckpointError, load_checkpoint
from graphtop.models.checkpoint.config_check import MAX_LAYERS, model_bytes, parameter_count


def edit_config(path, **changes):
    """Set config.json keys; a string value "RAW:TEXT" is written as the raw JSON literal TEXT (1e400)."""
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    text = json.dumps(config)
    for value in changes.values():
        if isinstance(value, str) and value.startswith("RAW:"):
            text = text.replace(json.dumps(value), value[4:])
    (path / "config.json").write_text(text)


def rewrite_weights(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


# --- config.json ---------------------------------------------------------------------------------

BAD_CONFIG = {
    "zero layers": ({"num_hidden_layers": 0}, "'num_hidden_layers' must be in [1, 1024], got 0"),
    "a million layers": ({"num_hidden_layers": 10**6}, f"'num_hidden_layers' must be in [1, {MAX_LAYERS}]"),
    "negative vocab": ({"vocab_size": -5}, "'vocab_size' must be in [1, "),
    "string vocab": ({"vocab_size": "512"}, "'vocab_size' must be an integer"),
    "float hidden": ({"hidden_size": 64.0}, "'hidden_size' must be an integer"),
    "bool heads": ({"num_attention_heads": True}, "'num_attention_heads' must be an integer"),
    "missing hidden": ({"hidden_size": None}, "'hidden_size' must be an integer"),
    "odd head_dim": ({"head_dim": 15}, "'head_dim' must be even"),
    "negative rope_theta": ({"rope_theta": -1}, "'rope_theta' must be > 1"),
    "zero rope_theta": ({"rope_theta": 0}, "'rope_theta' must be > 1"),
    "string rope_theta": ({"rope_theta": "1e4"}, "'rope_theta' must be a finite number"),
    "infinite rope_theta": ({"rope_theta": "RAW:1e400"}, "'rope_theta' must be a finite number"),
    "huge integer eps": ({"rms_norm_eps": "RAW:1" + "0" * 400}, "rms_norm_eps"),
    "linear factor 0": ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "'rope_scaling.factor' must be > 0"),
    "linear factor negative": ({"rope_scaling": {"rope_type": "linear", "factor": -2.0}}, "rope_scaling.factor"),
    "llama3 equal freq factors": (
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 2.0,
                "high_freq_factor": 2.0,
                "original_max_position_embeddings": 128,
            }
        },
        "high_freq_factor",
    ),
    "rope_scaling not an object": ({"rope_scaling": [1, 2]}, "'rope_scaling' must be an object"),
    "eps zero": ({"rms_norm_eps": 0}, "'rms_norm_eps' must be in (0, 1]"),
    "eps negative": ({"rms_norm_eps": -1e-6}, "rms_norm_eps"),
    "tie string": ({"tie_word_embeddings": "yes"}, "'tie_word_embeddings' must be true or false"),
    "eos string": ({"eos_token_id": "</s>"}, "'eos_token_id' must be a token id"),
    "eos negative": ({"eos_token_id": [-1]}, "'eos_token_id' must be a token id"),
    "sliding window zero": ({"sliding_window": 0}, "'sliding_window' must be in [1, "),
}


@pytest.mark.parametrize("case", BAD_CONFIG)
def test_bad_config_value_is_one_line_naming_the_key(ckpt, case):
    changes, needle = BAD_CONFIG[case]
    edit_config(ckpt, **changes)
    message = load_error(ckpt)
    assert needle in message and str(ckpt) in message, message


@pytest.mark.parametrize(
    "text,needle",
    [
        ('{"architectures": ["LlamaForCausalLM"], "rope_theta": NaN}', "NaN is not a finite number"),
        ('{"architectures": ["LlamaForCausalLM"], "rope_theta": -Infinity}', "-Infinity is not a finite number"),
        ('{"architectures": ["LlamaForCausalLM"], "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"architectures": ["LlamaForCausalLM"], "vocab_size": 1' + "0" * 5000 + "}", "malformed config.json"),
    ],
)
def test_config_json_that_is_not_strict_json_is_refused(ckpt, text, needle):
    (ckpt / "config.json").write_text(text)
    message = load_error(ckpt)
    assert message.startswith("malformed config.json") and needle in message


@pytest.mark.parametrize(
    "changes,what",
    [
        ({"vocab_size": 10**9}, "weights"),
        ({"max_position_embeddings": 10**9}, "rope table for 1,000,000,000 positions"),
        ({"intermediate_size": 2**31 - 1, "num_hidden_layers": 64}, "weights"),
    ],
)
def test_model_that_would_not_fit_is_refused_before_allocation_with_the_estimate(ckpt, changes, what):
    edit_config(ckpt, **changes)
    message = load_error(ckpt)
    assert "needs ~" in message and "GiB" in message and "available" in message and what in message, message


def test_size_estimate_matches_the_built_model(tiny_ckpt):
    for family in ("llama", "qwen3"):
        loaded = load_checkpoint(tiny_ckpt(family))
        assert parameter_count(loaded.spec) == sum(p.numel() for p in loaded.model.parameters())
        assert model_bytes(loaded.spec, torch.float32)[0] == loaded.weights_bytes


# --- weights -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weight_is_refused(ckpt, value, dtype):
    def poison(t):
        t["model.layers.1.mlp.down_proj.weight"][3, 5] = value

    rewrite_weights(ckpt, poison)
    message = load_error(ckpt, dtype=dtype)
    assert "tensor 'model.layers.1.mlp.down_proj.weight' holds 1 non-finite values" in message


def test_non_finite_weight_in_a_bf16_checkpoint_loaded_as_float32_is_refused(ckpt):
    """bf16 -> float32 is exact, so the stored (smaller) tensor is the one checked."""

    def to_bf16_with_nan(t):
        for name in list(t):
            t[name] = t[name].to(torch.bfloat16)
        t["model.layers.0.self_attn.q_proj.weight"][0, 0] = float("nan")

    rewrite_weights(ckpt, to_bf16_with_nan)
    assert "tensor 'model.layers.0.self_attn.q_proj.weight' holds 1 non-finite" in load_error(ckpt, dtype="float32")


def test_the_smaller_tensor_is_checked_only_when_the_conversion_is_exact():
    from graphtop.models.checkpoint.weight_checks import tensor_to_check

    def pair(src, dst):
        return torch.zeros(2, dtype=src), torch.zeros(2, dtype=dst)

    for src, dst in ((torch.bfloat16, torch.float32), (torch.float16, torch.float32)):
        s, d = pair(src, dst)
        assert tensor_to_check(s, d) is s
    for src, dst in (
        (torch.float32, torch.float16),
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.float16),
        (torch.float32, torch.float32),
    ):
        s, d = pair(src, dst)
        assert tensor_to_check(s, d) is d
    # loaded onto a device: the loaded tensor (device checks run at the end; no source is kept till then)
    s, d = torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.float32, device="meta")
    assert tensor_to_check(s, d) is d


def test_non_finite_weight_is_refused_after_conversion_to_half(ckpt):
    """A finite float32 value beyond float16's range becomes infinity when loaded as float16."""
    rewrite_weights(ckpt, lambda t: t["model.norm.weight"].__setitem__(0, 1e6))
    assert "tensor 'model.norm.weight' holds 1 non-finite" in load_error(ckpt, dtype="float16")


def test_huge_finite_weights_are_not_mistaken_for_non_finite(ckpt):
    """Weights near float32's maximum (whose sum would overflow) are finite and load."""
    rewrite_weights(ckpt, lambda t: t["model.norm.weight"].fill_(3e38))
    assert load_checkpoint(ckpt).model.model.norm.weight[0].item() == pytest.approx(3e38)


def test_float64_weights_load_converted_and_checked(ckpt):
    """F64 was refused as "a quantized format" ('F64' starts with 'F6'): it loads as F32 and F16 do, and a
    value float32 cannot hold is refused as it overflows."""
    name = "model.layers.0.mlp.up_proj.weight"
    stored = load_file(ckpt / "model.safetensors")[name].double() * (1 + 1e-12)
    rewrite_weights(ckpt, lambda t: t.__setitem__(name, stored.clone()))
    loaded = load_checkpoint(ckpt).model.state_dict()[name]
    assert loaded.dtype == torch.float32 and torch.equal(loaded, stored.float())

    def overflow(t):
        t[name][2, 3] = 1e300

    rewrite_weights(ckpt, overflow)
    assert f"tensor '{name}' holds 1 non-finite values" in load_error(ckpt)


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.uint8, torch.bool])
def test_integer_tensor_where_floats_are_expected_is_refused(ckpt, dtype):
    name = "model.embed_tokens.weight"
    rewrite_weights(ckpt, lambda t: t.__setitem__(name, torch.zeros(t[name].shape, dtype=dtype)))
    message = load_error(ckpt)
    assert f"tensor '{name}' is stored as" in message and "not floating point" in message


# --- files outside the folder --------------------------------------------------------------------


def _shard(ckpt, name):
    """Turn the single file into a one-shard index that names ``name``."""
    tensors = load_file(ckpt / "model.safetensors")
    index = {"metadata": {}, "weight_map": {t: name for t in tensors}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_index_naming_a_file_outside_the_folder_is_refused(ckpt, name):
    shutil.copy(ckpt / "model.safetensors", ckpt.parent / "outside.safetensors")
    _shard(ckpt, name)
    for allow in (False, True):  # no flag makes '..' or an absolute shard path acceptable
        message = load_error(ckpt, allow_external_weights=allow)
        assert f"shard '{name}' is outside the checkpoint folder" in message


@pytest.mark.parametrize("file", ["model.safetensors", "config.json", "tokenizer.json"])
def test_link_out_of_the_folder_is_refused_unless_allowed(ckpt, tmp_path, file):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ckpt / file).rename(elsewhere / file)
    (ckpt / file).symlink_to(elsewhere / file)
    message = load_error(ckpt)
    assert f"'{file}' is a link to {elsewhere / file}, outside the checkpoint folder" in message
    assert "--allow-external-weights" in message
    assert load_checkpoint(ckpt, allow_external_weights=True).spec.num_layers == 2


def test_sharded_link_out_of_the_folder_is_refused(ckpt, tmp_path):
    (ckpt / "model.safetensors").rename(tmp_path / "blob")
    (ckpt / "model-00001-of-00001.safetensors").symlink_to(tmp_path / "blob")
    tensors = load_file(tmp_path / "blob")
    (ckpt / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {t: "model-00001-of-00001.safetensors" for t in tensors}})
    )
    assert "shard 'model-00001-of-00001.safetensors' is a link to" in load_error(ckpt)
    assert load_checkpoint(ckpt, allow_external_weights=True).spec.num_layers == 2


def test_links_that_stay_inside_the_folder_are_fine(ckpt):
    (ckpt / "blobs").mkdir()
    (ckpt / "model.safetensors").rename(ckpt / "blobs" / "w")
    (ckpt / "model.safetensors").symlink_to("blobs/w")
    assert load_checkpoint(ckpt).spec.num_layers == 2


@pytest.mark.parametrize(
    "file", ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "chat_template.jinja"]
)
@pytest.mark.parametrize("allow", [False, True])
def test_a_link_loop_is_one_line_naming_the_file(ckpt, file, allow):
    """pathlib's resolve() raised a bare RuntimeError for a link loop (a traceback, exit 1)."""
    (ckpt / file).unlink(missing_ok=True)
    (ckpt / file).symlink_to(file)
    message = load_error(ckpt, allow_external_weights=allow)
    assert file in message and "Too many levels of symbolic links" in message, message


def test_an_unknown_home_folder_is_one_line(tmp_path):
    """pathlib's expanduser() raised a bare RuntimeError for ``~nosuchuser``."""
    assert load_error("~graphtop-nosuchuser/model") == (
        "checkpoint path ~graphtop-nosuchuser/model: cannot expand ~graphtop-nosuchuser (no such user or no home "
        "folder)"
    )


def test_a_path_that_is_not_utf8_is_refused_as_such(ckpt, tmp_path):
    """The safetensors reader opens only UTF-8 paths: a folder name with a raw byte was reported as "corrupt or
    truncated safetensors file" while the weights were fine."""
    import os

    folder = tmp_path / os.fsdecode(b"m\xff")
    shutil.copytree(ckpt, folder)
    assert load_error(folder) == (
        f"checkpoint path {tmp_path}/m\\xff is not valid UTF-8, and the safetensors and "
        "tokenizers readers open only UTF-8 paths: rename it"
    )


def test_device_weights_are_checked_together_and_the_culprit_named(tmp_path):
    """The GPU path's one multi-tensor pass (run here on host tensors: it is device-agnostic): finite
    weights pass, an L1 sum that overflows is not mistaken for a non-finite weight, and a NaN is
    reported with its tensor's name."""
    from graphtop.models.checkpoint.weight_checks import check_finite_on_device

    f = tmp_path / "model.safetensors"
    fine = [("a", torch.randn(8, 8), f), ("b", torch.randn(5).to(torch.bfloat16), f), ("empty", torch.empty(0), f)]
    check_finite_on_device(fine)
    check_finite_on_device(fine + [("huge", torch.full((4,), 3e38), f)])  # its L1 norm overflows to inf
    bad = torch.randn(6).to(torch.bfloat16)
    bad[3] = float("inf")
    with pytest.raises(CheckpointError, match=r"tensor 'bad' holds 1 non-finite values"):
        check_finite_on_device(fine + [("bad", bad, f)])
