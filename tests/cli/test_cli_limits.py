"""Command-line flags, graph config and environment: numbers range-checked and finite, sizes that would
not fit in memory refused with the estimate, a bad GRAPHTOP_CACHE_DIR one line -- all exit 2, no
traceback, and (for everything a flag alone decides) before the model loads."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from support.cli_support import SHORT_RUN, assert_usage_error, run

import graphtop.models.synthetic.demo as demo
from graphtop.models import CheckpointError

pytestmark = pytest.mark.usefixtures("torch_one_thread", "private_cache_dir")


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("hello\n")
    return path


FLAG_CASES = {
    "synthetic-rate nan": (["--synthetic", "2", "--synthetic-rate", "nan"], "--synthetic-rate", "not a finite"),
    "synthetic-rate inf": (["--synthetic", "2", "--synthetic-rate", "inf"], "--synthetic-rate", "not a finite"),
    "synthetic-rate 0": (["--synthetic", "2", "--synthetic-rate", "0"], "--synthetic-rate", "must be positive"),
    "synthetic count": (["--synthetic", "100000000"], "--synthetic", "over the limit of 100000"),
    "lognormal sigma": (["--synthetic", "2", "--synthetic-prompt-len", "lognormal:100:1e6"], "SIGMA must be in"),
    "padding waste nan": (
        ["--prompts", "P", "--cuda-graph-max-padding-waste", "nan"],
        "--cuda-graph-max-padding-waste",
    ),
    "padding waste json NaN": (
        ["--prompts", "P", "--cuda-graph-config", '{"prefill": {"max_padding_waste": NaN}}'],
        "NaN is not a finite number",
    ),
    "15,000 json buckets": (
        ["--prompts", "P", "--cuda-graph-config", json.dumps({"decode": {"bs": list(range(1, 15001))}})],
        "over the limit of 512",
    ),
    "seed too big": (["--prompts", "P", "--seed", str(2**64)], "--seed", "over the limit"),
    "seed negative": (["--prompts", "P", "--seed", "-1"], "--seed", "must be >= 0"),
    "temperature nan": (["--prompts", "P", "--temperature", "nan"], "--temperature", "not a finite"),
    "temperature inf": (["--prompts", "P", "--temperature", "inf"], "--temperature", "not a finite"),
    "top-p nan": (["--prompts", "P", "--top-p", "nan"], "--top-p", "not a finite"),
    "mem fraction nan": (["--prompts", "P", "--mem-fraction-static", "nan"], "--mem-fraction-static"),
    "mem fraction 2": (["--prompts", "P", "--mem-fraction-static", "2"], "--mem-fraction-static", "<= 1"),
    "max-new-tokens 2**40": (["--prompts", "P", "--max-new-tokens", str(2**40)], "over the limit"),
    "page size 2**40": (["--prompts", "P", "--page-size", str(2**40)], "--page-size", "over the limit"),
    "bs list over 512": (["--prompts", "P", "--cuda-graph-bs-decode", "1-600"], "over the limit of 512"),
}


@pytest.mark.parametrize("case", FLAG_CASES)
def test_bad_flag_value_is_refused_before_the_model_loads(tmp_path, prompts, capsys, case, monkeypatch):
    import graphtop.cli.headless as headless

    monkeypatch.setattr(headless, "_load_engine", None)  # any attempt to load would crash the test
    argv, *needles = FLAG_CASES[case]
    argv = [str(prompts) if a == "P" else a for a in argv]
    rc, _, err = run(capsys, "--model", tmp_path, "--output", tmp_path / "o.jsonl", *argv)
    assert_usage_error(rc, "", err, *needles)
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--cuda-graph-bs-decode", "1,1000000000"], "decode.bs bucket 1,000,000,000 is over the KV pool's"),
        (["--cuda-graph-config", '{"prefill": {"num_tokens": [16, 999999]}}'], "prefill.num_tokens bucket 999,999"),
        (["--cuda-graph-max-bs-decode", "2000000000"], "decode.max_bs 2,000,000,000 is over the KV pool's"),
    ],
)
def test_bucket_over_the_pool_is_one_line_error(tiny_ckpt, tmp_path, prompts, capsys, argv, needle):
    """The issue's example: --cuda-graph-bs-decode 1000000000 was killed by the OOM killer at 22.9 GB."""
    rc, _, err = run(
        capsys, "--model", tiny_ckpt("llama"), "--prompts", prompts, "--output", tmp_path / "o.jsonl", *SHORT_RUN, *argv
    )
    assert_usage_error(rc, "", err, needle)


def test_a_context_over_the_models_positions_is_refused_not_lowered(tiny_ckpt, tmp_path, prompts, capsys):
    """--max-context-len above max_position_embeddings ran with the model's length and no word about it."""
    out_file = tmp_path / "o.jsonl"
    rc, _, err = run(
        capsys,
        "--model",
        tiny_ckpt("llama"),
        "--prompts",
        prompts,
        "--output",
        out_file,
        *SHORT_RUN,
        "--max-context-len",
        "1000000000",
    )
    assert_usage_error(rc, "", err, "max context len 1000000000 is above the model's 256 positions", "use at most 256")
    assert not out_file.exists()
    rc, _, err = run(
        capsys,
        "--model",
        tiny_ckpt("llama"),
        "--prompts",
        prompts,
        "--output",
        out_file,
        *SHORT_RUN,
        "--max-context-len",
        "256",
    )  # the model's own length is accepted
    assert rc == 0, err


def test_kv_budget_beyond_host_memory_is_refused_with_the_estimate(tiny_ckpt, tmp_path, prompts, capsys):
    rc, _, err = run(
        capsys,
        "--model",
        tiny_ckpt("llama"),
        "--prompts",
        prompts,
        "--output",
        tmp_path / "o.jsonl",
        "--device",
        "cpu",
        "--kv-budget-mb",
        "1000000000",
    )
    assert_usage_error(rc, "", err, "a KV pool of", "tokens needs ~", "GiB", "available", "--kv-budget-mb")


def test_no_room_for_a_cpu_kv_pool_names_the_cpu_flags(tiny_ckpt, tmp_path, prompts, capsys):
    """On a CPU the advice named --mem-fraction-static, a CUDA-only flag that changes nothing there."""
    rc, _, err = run(
        capsys,
        "--model",
        tiny_ckpt("llama"),
        "--prompts",
        prompts,
        "--output",
        tmp_path / "o.jsonl",
        "--device",
        "cpu",
        "--kv-budget-mb",
        "1",
        "--page-size",
        "1000000",
    )
    line = assert_usage_error(
        rc,
        "",
        err,
        "no room for a KV pool on cpu: --kv-budget-mb 1 holds",
        "less than two pages of 1,000,000 (one is the reserved dummy page); raise --kv-budget-mb or lower --page-size",
    )
    assert "--mem-fraction-static" not in line


def test_graph_buffers_beyond_memory_are_refused_with_the_estimate(tiny_ckpt, tmp_path, monkeypatch):
    """A bucket that fits the pool can still need more memory than the machine has (logits rows x vocab)."""
    import graphtop.engine.memory_plan as memory_plan
    from graphtop.engine.config import EngineConfig
    from graphtop.engine.engine import Engine
    from graphtop.engine.graphs.config import build_graph_config
    from graphtop.engine.memory_plan import MemoryPlanError

    monkeypatch.setattr(
        memory_plan,
        "fit_problem",
        lambda what, need, device: (
            f"{what} needs ~{need} but {device} has 1 byte available" if what.startswith("graph") else None
        ),
    )
    config = EngineConfig(
        device="cpu",
        max_total_tokens=2048,
        max_running_requests=4,
        chunked_prefill_size=64,
        graphs=build_graph_config(None, {"decode.bs": [1, 2]}),
    )
    with pytest.raises(MemoryPlanError, match=r"graph buffers for decode bs 2 and prefill 64 tokens needs ~\d+"):
        Engine.from_pretrained(tiny_ckpt("llama"), config=config)


# --- environment ---------------------------------------------------------------------------------


def test_cache_dir_that_is_a_file_is_one_line_error(tmp_path, prompts, capsys, monkeypatch):
    cache = tmp_path / "a-file"
    cache.write_text("x")
    monkeypatch.setenv("GRAPHTOP_CACHE_DIR", str(cache))
    rc, _, err = run(capsys, "--prompts", prompts, "--output", tmp_path / "o.jsonl", *SHORT_RUN)
    assert_usage_error(rc, "", err, f"GRAPHTOP_CACHE_DIR={cache}", "is not a folder")
    monkeypatch.setenv("GRAPHTOP_CACHE_DIR", str(cache / "below"))
    rc, _, err = run(capsys, "--prompts", prompts, "--output", tmp_path / "o.jsonl", *SHORT_RUN)
    assert_usage_error(rc, "", err, "is not a folder")


def test_read_only_cache_dir_is_one_line_error(tmp_path, prompts, capsys, monkeypatch):
    cache = tmp_path / "ro"
    cache.mkdir()
    monkeypatch.setenv("GRAPHTOP_CACHE_DIR", str(cache / "graphtop"))
    real_access = os.access
    # root ignores permissions and there is no read-only mount here: access() reports what EROFS would
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(cache) else real_access(p, mode))
    rc, _, err = run(capsys, "--prompts", prompts, "--output", tmp_path / "o.jsonl", *SHORT_RUN)
    assert_usage_error(rc, "", err, f"GRAPHTOP_CACHE_DIR={cache / 'graphtop'}", "not writable")


def test_a_cache_that_already_holds_the_model_may_be_read_only(tmp_path, monkeypatch):
    built = tmp_path / "cache" / demo.DEMO_DIRNAME
    built.mkdir(parents=True)
    (built / "config.json").write_text("{}")
    monkeypatch.setattr(os, "access", lambda p, mode: False)
    assert demo.ensure_demo_model(tmp_path / "cache") == built


def test_a_build_that_fails_mid_way_is_one_line_checkpoint_error(tmp_path, monkeypatch):
    def full_disk(folder):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(demo, "_build", full_disk)
    with pytest.raises(CheckpointError) as info:
        demo.ensure_demo_model(tmp_path / "cache")
    assert str(info.value) == f"cache folder {tmp_path / 'cache'}: cannot build the demo model: No space left on device"
    assert not [p for p in (tmp_path / "cache").iterdir()]  # no half-built folder left behind
    shutil.rmtree(tmp_path / "cache")
