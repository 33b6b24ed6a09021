"""GPU tensor-parallel tests (``-m cuda``; two GPUs, e.g. nvidia-h200-x2): Llama-3.1-8B shape, random
bf16 weights saved to disk once (``TP_CHECKPOINT``, shared with bench/tp_bench.py), every rank loading
its slices from the files.

The module runs three engines, one after another, teacher-forced on the same tokens (token_agreement):
``--tp 2`` eager (NCCL all-reduce) is the reference; ``--tp 2`` with decode and prefill graphs (the
default all-reduce: symmetric-memory one-shot where its self-test passes) must agree with it; ``--tp 1``
with graphs must agree too. One process holds one tensor-parallel group at a time, and the
symmetric-memory path is set up once per process, hence the fixed order in one module fixture.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)  # and two of them

from graphtop.engine.config import EngineConfig  # noqa: E402
from graphtop.engine.engine import Engine  # noqa: E402
from graphtop.engine.graphs.config import GraphConfig  # noqa: E402
from graphtop.engine.kernel_config import KernelConfig  # noqa: E402
from graphtop.engine.telemetry.bus import EventBus  # noqa: E402

TP_CHECKPOINT = Path("/tmp/graphtop-llama-3.1-8b-random")
DECODE_BS = [1, 2, 4, 8, 16, 32, 64]
PREFILL_TOKENS = [64, 128, 256, 512]


def checkpoint() -> Path:
    from graphtop.models.synthetic.random_model import save_random_checkpoint

    return save_random_checkpoint("llama-3.1-8b", TP_CHECKPOINT, dtype=torch.bfloat16, device="cuda:0")


def engine(path: Path, tp: int, graphs: bool, all_reduce: str = "auto", bus: EventBus | None = None) -> Engine:
    g = GraphConfig()
    if graphs:
        g.set("decode.bs", DECODE_BS)
        g.set("prefill.num_tokens", PREFILL_TOKENS)
    else:
        g.set("decode.backend", "disabled")
        g.set("prefill.backend", "disabled")
    cfg = EngineConfig(
        device="cuda",
        dtype="bfloat16",
        tp_size=tp,
        max_context_len=1024,
        max_total_tokens=32 * 1024,
        chunked_prefill_size=512,
        max_running_requests=64,
        graphs=g,
        kernels=KernelConfig(all_reduce=all_reduce),
    )
    return Engine.from_pretrained(path, config=cfg, bus=bus)


def _ids(n: int, seed: int, vocab: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab - 10, (n,), generator=gen).tolist()


@pytest.fixture(scope="module")
def runs():
    from support.token_agreement import Recorder, serve

    path = checkpoint()
    vocab = 128256
    prompts = [_ids(n, i, vocab) for i, n in enumerate([5, 17, 64, 130, 3, 250, 33, 700])]
    max_new = [32] * len(prompts)
    out: dict = {}
    with pytest.MonkeyPatch.context() as mp:
        ref = Recorder()
        eng = engine(path, 2, graphs=False, all_reduce="nccl")
        try:
            serve(eng, prompts, max_new, ref, mp)
        finally:
            eng.close()
        bus = EventBus()
        sub = bus.subscribe("steps", maxsize=1_000_000, types={"step", "capture_finished", "rank_replay"})
        graph = Recorder(reference=ref)
        eng = engine(path, 2, graphs=True, bus=bus)
        try:
            out["all_reduce"] = eng.tp.comm.note
            print(f"tp 2 all-reduce: {out['all_reduce']}")
            serve(eng, prompts, max_new, graph, mp)
        finally:
            eng.close()
        out["events"] = sub.drain()
        solo = Recorder(reference=ref)
        eng = engine(path, 1, graphs=True)
        try:
            serve(eng, prompts, max_new, solo, mp)
        finally:
            eng.close()
    out.update(ref=ref, graph=graph, solo=solo)
    return out


def test_tp2_decode_graph_replay_equals_eager(runs):
    from support.token_agreement import _assert_agree

    events = runs["events"]
    steps = [e for e in events if e.type == "step"]
    assert sum(1 for s in steps if s.phase == "decode" and s.path == "graph") >= 25  # 8 requests x 31 decode tokens
    assert any(s.phase == "prefill" and s.path == "graph" for s in steps)
    finished = {(e.rank, e.phase): e.captured for e in events if e.type == "capture_finished"}
    assert finished[(0, "decode")] == finished[(1, "decode")] == tuple(DECODE_BS)
    assert any(e.type == "rank_replay" and e.rank == 1 for e in events)
    _assert_agree(
        runs["ref"], runs["graph"], f"tp 2 graphs ({runs['all_reduce']}) vs tp 2 eager (nccl)", logits_tol=1e-2
    )


def test_tp2_agrees_with_tp1(runs):
    """Row-parallel sums add in another order, so bf16 logits differ by rounding: tie-aware agreement."""
    from support.token_agreement import _assert_agree

    _assert_agree(runs["ref"], runs["solo"], "tp 1 graphs vs tp 2 eager", logits_tol=3e-2)


def test_a_killed_cuda_worker_ends_the_run_with_one_line(tmp_path):
    """NCCL waits forever for a dead peer inside a replayed graph: the relay notices the death, aborts
    the communicator, and the run ends with one line (at worst the watchdog's exit) — never a hang."""
    from support.tiny_models import build_tiny_checkpoint
    from support.tp_procs import kill_worker_mid_run

    path = build_tiny_checkpoint(tmp_path, "llama", max_position_embeddings=4096)
    trace, output = tmp_path / "trace.jsonl", tmp_path / "out.jsonl"
    rc, _, stderr = kill_worker_mid_run(  # ~300k tokens to generate: still serving when the worker is killed
        [
            "--model",
            str(path),
            "--device",
            "cuda",
            "--tp",
            "2",
            "--attention-backend",
            "torch",
            "--synthetic",
            "128",
            "--synthetic-prompt-len",
            "uniform:16:64",
            "--synthetic-output-len",
            "uniform:2000:3000",
            "--max-running-requests",
            "128",
            "--max-total-tokens",
            "400000",
            "--record",
            str(trace),
            "--output",
            str(output),
        ],
        trace,
        start_timeout=240,
        end_timeout=90,
    )
    print(stderr[-2000:])
    assert rc == 1
    errors = [line for line in stderr.splitlines() if line.startswith("graphtop:")]
    assert errors == ["graphtop: error: tensor-parallel rank 1 died (killed by SIGKILL)"]
    assert "Traceback" not in stderr
