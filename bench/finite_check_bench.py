"""Cost of refusing non-finite weights at load (models/checkpoint/weight_checks.py), as a share of load time.

Builds a random checkpoint in a published shape (safetensors written directly, no transformers model
init), then loads it ``--rounds`` times in alternation with the check on and off (``check_finite``
replaced by a no-op), after one warm-up load of each so both read from the page cache. Prints, per
round and as medians: load seconds with and without the check and their ratio (the figure that counts
on a quiet machine), and the CPU time of the check as a share of the load's wall time: what the check
could add at most (it runs on its own thread, overlapping the copy), and the robust figure on a shared,
busy machine, where wall-clock ratios swing by tens of percent.

    python3 bench/finite_check_bench.py                       # Qwen3-0.6B shape, loaded as float32 on CPU
    python3 bench/finite_check_bench.py --dtype bfloat16 --device cuda
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

import graphtop.models.checkpoint.weight_checks as weight_checks
from graphtop.models import load_checkpoint
from graphtop.models.synthetic.demo_corpus import CORPUS
from graphtop.models.registry import model_class, spec_from_hf_config
from graphtop.models.synthetic.tokenizer_train import train_byte_level_bpe

SHAPES = {
    "qwen3-0.6b": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, hidden_size=1024,
                       intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, hidden_act="silu", torch_dtype="bfloat16"),
    "tiny": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=1024, hidden_size=128,
                 intermediate_size=384, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=64, max_position_embeddings=2048, rope_theta=1e6, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, hidden_act="silu", torch_dtype="bfloat16"),
}


def build(folder: Path, shape: str) -> None:
    from transformers import AutoConfig

    config = dict(SHAPES[shape], eos_token_id=0, bos_token_id=None)
    (folder / "config.json").write_text(json.dumps(config))
    spec = spec_from_hf_config(AutoConfig.from_pretrained(str(folder)))
    with torch.device("meta"):
        names = {n: tuple(p.shape) for n, p in model_class(spec)(spec).named_parameters()}
    gen = torch.Generator().manual_seed(0)
    tensors = {n: (torch.randn(s, generator=gen) * 0.02).to(torch.bfloat16) for n, s in names.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    train_byte_level_bpe(CORPUS, vocab_size=512).save_pretrained(folder)


def timed_load(folder: Path, device: str, dtype: str, check: bool) -> tuple[float, float]:
    """(load wall seconds, CPU seconds the checking thread spent inside check_finite).

    CPU time, not wall time, for the check: on a shared machine a thread's wall time includes the time
    other processes held its core, while its CPU time is what the check itself costs."""
    inside = [0.0]
    real = weight_checks.check_finite

    def measured(*args: object) -> None:
        t = time.thread_time()
        real(*args)  # type: ignore[arg-type]
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        inside[0] += time.thread_time() - t

    weight_checks.check_finite = measured if check else (lambda *args: None)  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        ckpt = load_checkpoint(folder, device=device, dtype=dtype)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    finally:
        weight_checks.check_finite = real
    del ckpt
    return seconds, inside[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None,
                    help="intra-op threads of the loading thread (the checking thread always uses one)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="graphtop-finite-bench-"))
    try:
        t = time.perf_counter()
        build(folder, args.shape)
        size = (folder / "model.safetensors").stat().st_size
        print(f"checkpoint {args.shape}: {size / 2**30:.2f} GiB bf16 on disk, built in {time.perf_counter() - t:.1f} s;"
              f" loading as {args.dtype} on {args.device}, torch threads {torch.get_num_threads()}")
        timed_load(folder, args.device, args.dtype, True)  # warm-up: page cache, lazy imports
        timed_load(folder, args.device, args.dtype, False)
        on, off, inside = [], [], []
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            for check in order:
                seconds, in_check = timed_load(folder, args.device, args.dtype, check)
                (on if check else off).append(seconds)
                if check:
                    inside.append(in_check / seconds)
            print(f"round {r + 1}: with check {on[-1]:.3f} s, without {off[-1]:.3f} s, "
                  f"ratio {on[-1] / off[-1]:.4f}, check CPU time {100 * inside[-1]:.2f} % of the load")
        m_on, m_off = statistics.median(on), statistics.median(off)
        ratio = statistics.median(a / b for a, b in zip(on, off))
        print(f"medians: with check {m_on:.3f} s, without {m_off:.3f} s; median of the per-round ratios {ratio:.4f} "
              f"({100 * (ratio - 1):+.2f} %); check CPU time {100 * statistics.median(inside):.2f} % of the load's "
              "wall time (target <= 2 %)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
