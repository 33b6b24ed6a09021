"""GGUF files that transformers converts without an error into a wrong model (missing tensors filled with
random values, a tiny file declaring a huge model allocated before any check): each is refused with one
line naming the .gguf, before the model is allocated, and leaves nothing in the cache."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import numpy as np  # noqa: E402
from support.gguf_files import build_gguf  # noqa: E402

from graphtop.models import CheckpointError, load_checkpoint  # noqa: E402
from graphtop.models.checkpoint import gguf as gguf_mod  # noqa: E402


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHTOP_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def folder(tiny_ckpt):
    return tiny_ckpt("llama")


def refused(path, cache_dir) -> str:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message and message.endswith(f" in {path}"), message
    entries = list((cache_dir / "gguf").iterdir()) if (cache_dir / "gguf").exists() else []
    assert entries == [], entries  # no conversion kept, no staging folder left
    return message


@pytest.fixture
def no_allocation(monkeypatch):
    """transformers' model loading must not be reached: the refusal comes from the metadata alone."""
    from transformers import AutoModelForCausalLM

    def fail(*args, **kwargs):
        raise AssertionError("the model was allocated before the refusal")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fail)


def test_a_complete_gguf_converts_and_loads(folder, tmp_path, cache_dir):
    loaded = load_checkpoint(build_gguf(folder, tmp_path / "ok.gguf"))
    assert loaded.spec.num_layers == 2 and len(list((cache_dir / "gguf").iterdir())) == 1


@pytest.mark.parametrize(
    "tensor, hf_name",
    [("blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"), ("output_norm.weight", "model.norm.weight")],
)
def test_a_missing_tensor_is_refused_by_name(folder, tmp_path, cache_dir, capfd, no_allocation, tensor, hf_name):
    path = build_gguf(folder, tmp_path / "m.gguf", edit=lambda t: t.pop(tensor))
    assert refused(path, cache_dir) == f"GGUF file lacks tensor '{tensor}' ({hf_name}) in {path}"
    assert "LOAD REPORT" not in capfd.readouterr().err


def test_what_transformers_reports_missing_is_refused_too(folder, tmp_path, cache_dir, capfd, monkeypatch):
    """The check of transformers' loading info, for tensors the name map does not cover: no random weight
    is ever written to the cache, and its load report stays off stderr."""
    monkeypatch.setattr(gguf_mod, "_gguf_names", lambda reader, layers: None)
    path = build_gguf(folder, tmp_path / "m.gguf", edit=lambda t: t.pop("blk.1.ffn_up.weight"))
    assert refused(path, cache_dir) == f"GGUF file lacks tensor 'model.layers.1.mlp.up_proj.weight' in {path}"
    assert "LOAD REPORT" not in capfd.readouterr().err


def test_a_tensor_of_another_shape_is_refused(folder, tmp_path, cache_dir, no_allocation):
    def shrink(t):
        t["blk.0.ffn_up.weight"] = np.zeros((64, 64), np.float32)

    path = build_gguf(folder, tmp_path / "s.gguf", edit=shrink)
    assert refused(path, cache_dir) == (
        f"GGUF tensor 'blk.0.ffn_up.weight' has shape [64, 64], the model its "
        f"metadata declares needs [128, 64] in {path}"
    )


def test_a_tiny_file_declaring_a_huge_model_is_refused_before_allocation(folder, tmp_path, cache_dir, no_allocation):
    path = build_gguf(
        folder,
        tmp_path / "h.gguf",
        edit=lambda t: t.clear(),
        meta={"embedding_length": 65536, "feed_forward_length": 2**24, "block_count": 64},
    )
    message = refused(path, cache_dir)
    assert message.startswith("the model (") and "needs ~" in message and "available" in message


def test_a_file_declaring_more_layers_than_it_holds_is_refused_before_allocation(
    folder, tmp_path, cache_dir, no_allocation
):
    path = build_gguf(folder, tmp_path / "l.gguf", meta={"block_count": 8})
    assert refused(path, cache_dir).startswith("GGUF file lacks tensor 'blk.2.")


def test_metadata_out_of_range_is_refused_like_a_config_json(folder, tmp_path, cache_dir, capfd, no_allocation):
    path = build_gguf(folder, tmp_path / "e.gguf", eos=100000)
    assert refused(path, cache_dir) == (
        f"GGUF metadata: 'eos_token_id' must be a token id in [0, 512) or a list of them, got 100000 in {path}"
    )
    assert "Model config:" not in capfd.readouterr().err


def test_metadata_transformers_refuses_keeps_its_reason(folder, tmp_path, cache_dir, no_allocation):
    """transformers' message spans lines and its first names only the validator: the reason was cut off."""
    from transformers import LlamaConfig

    with pytest.raises(Exception) as reference:
        LlamaConfig(hidden_size=64, num_attention_heads=7)
    reason = [line.strip() for line in str(reference.value).splitlines() if line.strip()]
    assert len(reason) > 1
    path = build_gguf(folder, tmp_path / "h.gguf", meta={"head_count": 7, "head_count_kv": 7})
    message = refused(path, cache_dir)
    assert message.startswith("GGUF metadata not readable by transformers (") and reason[-1] in message, message


def test_a_broken_chat_template_is_refused_naming_the_gguf(folder, tmp_path, cache_dir, no_allocation):
    path = build_gguf(folder, tmp_path / "c.gguf", chat_template="{% for m in messages %}{{ m.content ")
    assert refused(path, cache_dir).startswith("chat template is not valid Jinja at line 1")


def _tensor_info(path):
    """The file's tensors by name, from a reader that writes through to it (to damage its tensor table)."""
    return {t.name: t for t in gguf.GGUFReader(str(path), "r+").tensors}


def test_tensors_sharing_data_bytes_are_refused(folder, tmp_path, cache_dir, no_allocation):
    """A tensor table pointing two tensors at one data range: gguf-py and transformers serve both from it
    (a silently wrong model)."""
    path = build_gguf(folder, tmp_path / "o.gguf")
    tensors = _tensor_info(path)
    tensors["blk.0.ffn_down.weight"].field.parts[-1][0] = tensors["blk.0.ffn_gate.weight"].field.parts[-1][0]
    tensors["blk.0.ffn_down.weight"].field.parts[-1].flush()
    message = refused(path, cache_dir)
    assert message.startswith("GGUF tensors 'blk.0.ffn_") and "overlap in the file" in message, message
    assert {"'blk.0.ffn_down.weight'", "'blk.0.ffn_gate.weight'"} <= set(message.split()), message


@pytest.mark.parametrize("damage", ["cut", "offset"])
def test_data_past_the_end_of_the_file_is_refused_as_truncated(folder, tmp_path, cache_dir, damage):
    """gguf-py said "cannot reshape array of size …" for a file cut short or a tensor offset past its end."""
    path = build_gguf(folder, tmp_path / "t.gguf")
    size = path.stat().st_size
    if damage == "cut":
        os.truncate(path, size - 100)
    else:
        offset = _tensor_info(path)["blk.1.ffn_up.weight"].field.parts[-1]
        offset[0] = size
        offset.flush()
    message = refused(path, cache_dir)
    assert message.startswith("GGUF file is truncated: its tensor table or data reaches byte "), message
    assert "reshape" not in message


def test_weights_that_dequantize_to_nan_are_refused_before_the_cache(folder, tmp_path, cache_dir, capfd, recwarn):
    """A Q8_0 block whose scale is infinite dequantizes to NaN (infinity times 0): the folder was written to the
    cache, then refused at every load naming the cache file, with numpy's RuntimeWarning on stderr."""
    name = "blk.0.ffn_down.weight"

    def infinite_scale(t):
        blocks = gguf.quants.quantize(t[name], gguf.GGMLQuantizationType.Q8_0)
        blocks.reshape(-1, 34)[0, :2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
        blocks.reshape(-1, 34)[0, 2] = 0  # infinity times 0: NaN
        t[name] = blocks

    path = build_gguf(folder, tmp_path / "nan.gguf", edit=infinite_scale)
    message = refused(path, cache_dir)
    assert message.startswith("tensor 'model.layers.0.mlp.down_proj.weight' holds 32 non-finite values"), message
    assert capfd.readouterr().err == "" and [str(w.message) for w in recwarn] == []  # numpy's RuntimeWarning


# --- outputs into the converted folder -----------------------------------------------------------


@pytest.mark.parametrize("flag", ["--output", "--record"])
@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_an_output_into_the_converted_folder_is_refused(folder, tmp_path, capsys, flag, name):
    """Every later load of the .gguf reads its converted folder: overwriting a file there breaks the model
    for good (the cache entry looks complete)."""
    from support.cli_support import SHORT_RUN, assert_usage_error, run

    path = build_gguf(folder, tmp_path / "ok.gguf")
    converted = gguf_mod.gguf_folder(path)
    target = converted / name
    before = target.read_bytes()
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    outputs = {"--output": tmp_path / "out.jsonl", "--record": tmp_path / "trace.jsonl"}
    outputs[flag] = target
    rc, out, err = run(
        capsys,
        "--model",
        path,
        "--prompts",
        prompts,
        "--output",
        outputs["--output"],
        "--record",
        outputs["--record"],
        *SHORT_RUN,
    )
    assert_usage_error(rc, out, err, f"{flag} {target} is the same file as a file of --model's converted folder")
    assert target.read_bytes() == before


def test_the_conversion_says_how_far_it_is_and_a_cached_load_says_nothing(folder, tmp_path, cache_dir):
    """A first load of a .gguf showed "loading model 0/?" for its whole conversion: it now reports each step,
    and each tensor dequantized of how many."""
    path = build_gguf(folder, tmp_path / "ok.gguf")
    heard = []
    load_checkpoint(path, progress=lambda label, step, done, total: heard.append((label, step, done, total)))
    assert {label for label, *_ in heard} == {gguf_mod.CONVERTING}
    steps = [step for _, step, _, _ in heard]
    assert steps[0] == "reading the metadata" and steps[-1] == "writing the converted folder"
    tensors = [(done, total) for _, step, done, total in heard if step == "tensor"]
    count = len(gguf.GGUFReader(str(path)).tensors)
    assert tensors == [(i, count) for i in range(count + 1)]  # 0 of N, then each one as it is done
    again = []
    load_checkpoint(path, progress=lambda *a: again.append(a))
    assert again == []  # read from the cache: nothing to convert


def test_a_mixture_of_experts_is_refused_before_allocation(folder, tmp_path, cache_dir, no_allocation):
    """llama.cpp writes Mixtral as a llama file with an expert count: read as the dense llama it would load."""
    path = build_gguf(folder, tmp_path / "x.gguf", meta={"expert_count": 4, "expert_used_count": 2})
    assert refused(path, cache_dir) == (
        "GGUF metadata declares a mixture of 4 experts: GGUF files of mixture-of-experts models are not "
        f"supported (load the Hugging Face checkpoint) in {path}"
    )
