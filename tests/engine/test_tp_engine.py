"""Tensor parallelism end to end on CPU: rank 0 in this process, a spawned worker rank, gloo.

Greedy tokens with ``tp_size=2`` equal ``tp_size=1`` (fp32) for every family (a mixture of experts' experts
sharded too), through emulated graphs (decode and prefill buckets), chunked prefill, preemption and the
overlap schedule; the worker's capture, ledger and replay times reach rank 0's bus with its rank; a killed
worker ends a CLI run with one line, a non-zero exit status and no hang.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry.bus import EventBus

pytestmark = pytest.mark.slow

PROMPTS = [
    "Once upon a time there was a tiny model that served tokens on two ranks",
    "The quick brown fox jumps over the lazy dog while the graphs replay",
    "Graphs are a fast path, never the only path: a batch a graph cannot take runs eagerly",
    "Tensor parallel",
]
# A 96-token pool for four requests that want ~40 tokens each: decode runs out of pages and preempts;
# 16-token prefill chunks split every prompt.
SMALL = dict(max_total_tokens=96, chunked_prefill_size=16, max_running_requests=4)


def serve(make_engine, path: Path, tp: int, bus: EventBus | None = None):
    eng = make_engine(path, bus=bus, tp_size=tp, **SMALL)
    try:
        handles = eng.generate(PROMPTS, SamplingParams(max_new_tokens=24, ignore_eos=True))
        facts = dict(
            preemptions=eng.scheduler.num_preemptions,
            overlapped=eng.overlapped_steps,
            decode_buckets=eng.decode_buckets,
            prefill_buckets=eng.prefill_buckets,
            pids=dict(eng.tp.worker_pids) if eng.tp else {},
        )
        return [h.token_ids for h in handles], facts
    finally:
        eng.close()


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral"])
def test_tp2_greedy_tokens_equal_tp1(tiny_ckpt, make_engine, torch_one_thread, family):
    path = tiny_ckpt(family)
    want, solo = serve(make_engine, path, 1)
    bus = EventBus()
    sub = bus.subscribe("test", maxsize=1_000_000)
    got, duo = serve(make_engine, path, 2, bus)
    assert got == want
    assert solo["preemptions"] > 0 and duo["preemptions"] == solo["preemptions"]
    assert duo["overlapped"] > 0  # decode steps fed by the previous step's tokens on the device
    assert duo["decode_buckets"] == solo["decode_buckets"] and duo["prefill_buckets"] == solo["prefill_buckets"]

    events = sub.drain()
    steps = [e for e in events if e.type == "step"]
    assert {(s.phase, s.path) for s in steps} >= {("decode", "graph"), ("prefill", "graph")}
    assert max(s.num_tokens for s in steps if s.phase == "prefill") <= SMALL["chunked_prefill_size"]
    finished = {(e.rank, e.phase): e for e in events if e.type == "capture_finished"}
    for phase in ("decode", "prefill"):  # every rank captured the same buckets, each in its own pool
        assert finished[(1, phase)].captured == finished[(0, phase)].captured and finished[(1, phase)].ok
    ledgers = {e.rank: e for e in events if e.type == "memory_ledger"}
    assert set(ledgers) == {0, 1} and ledgers[1].kv_pool == ledgers[0].kv_pool
    assert ledgers[1].experts == ledgers[0].experts and (ledgers[0].experts > 0) == (family in ("qwen3_moe", "mixtral"))
    replayed = [s for e in events if e.type == "rank_replay" and e.rank == 1 for s in e.steps]
    graph_steps = {s.step for s in steps if s.path == "graph"}
    assert replayed and set(replayed) <= graph_steps


def test_worker_env_and_an_error_outside_a_mirrored_call(tiny_ckpt, make_engine, torch_one_thread, monkeypatch, capfd):
    """Spawned workers inherit NVLink multicast switched off and print their stacks on SIGUSR1 (and
    carry on); an error in sampling (outside any call the workers mirror) fails that step only, and
    the group serves on."""
    import signal
    import time

    import graphtop.engine.step.loop as step_loop

    eng = make_engine(tiny_ckpt("llama"), tp_size=2, **SMALL)
    try:
        (pid,) = eng.tp.worker_pids.values()
        env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
        assert env["NCCL_NVLS_ENABLE"] == "0"
        assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
        # Each try asks for a fresh dump and reads the capture once it is written: a read that lands in
        # the middle of a dump can lose its tail (the capture is truncated after each read, while the
        # worker writes to the same file), so a try never joins pieces of two dumps.
        deadline = time.monotonic() + 30
        err = ""
        while not ("worker.py" in err and "serve" in err) and time.monotonic() < deadline:
            os.kill(pid, signal.SIGUSR1)
            time.sleep(0.5)
            err = capfd.readouterr().err
        assert "worker.py" in err and "serve" in err  # the worker's stack, waiting for rank 0's next call

        def broken(*args):
            raise RuntimeError("sampling broke")

        first = eng.submit(PROMPTS[0], SamplingParams(max_new_tokens=8, ignore_eos=True))
        monkeypatch.setattr(step_loop, "sample_step", broken)
        with pytest.raises(RuntimeError, match="sampling broke"):
            eng.step()  # the prefill ran on both ranks; only its sampling failed
        monkeypatch.undo()
        assert eng.tp.failure is None
        eng.cancel(first.request_id)
        handles = eng.generate(PROMPTS[1:], SamplingParams(max_new_tokens=8, ignore_eos=True))
        assert [len(h.token_ids) for h in handles] == [8, 8, 8]
    finally:
        eng.close()
    want, _ = serve(make_engine, tiny_ckpt("llama"), 1)
    assert [h.token_ids for h in handles] == [t[:8] for t in want[1:]]


def test_tp_that_does_not_divide_the_heads_is_one_line_before_any_spawn(tiny_ckpt, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "graphtop.cli.entry",
            "--model",
            str(tiny_ckpt("llama")),
            "--device",
            "cpu",
            "--tp",
            "3",
            "--synthetic",
            "1",
            "--output",
            str(tmp_path / "o.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"graphtop: error: --tp 3 does not divide num_attention_heads=4 in {tiny_ckpt('llama')}"
    ]


def test_killing_a_worker_mid_run_ends_with_one_line(tiny_ckpt, tmp_path):
    from support.tp_procs import kill_worker_mid_run

    trace, output = tmp_path / "trace.jsonl", tmp_path / "out.jsonl"
    rc, stdout, stderr = kill_worker_mid_run(
        [
            "--model",
            str(tiny_ckpt("llama")),
            "--device",
            "cpu",
            "--tp",
            "2",
            "--synthetic",
            "64",
            "--synthetic-output-len",
            "uniform:100:120",
            "--max-total-tokens",
            "4096",
            "--record",
            str(trace),
            "--output",
            str(output),
        ],
        trace,
        start_timeout=120,
        end_timeout=60,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert rc == 1
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("graphtop:")]
    assert errors == ["graphtop: error: tensor-parallel rank 1 died (killed by SIGKILL)"]
    results = [line for line in output.read_text().splitlines() if line]  # what was done is still written
    assert len(results) > 0
    assert "FATAL tensor-parallel: tensor-parallel rank 1 died" in stdout  # the recorded trace names the rank


def test_tp2_recapture_mid_run_stays_in_step(tiny_ckpt, make_engine, torch_one_thread):
    """A live recapture runs on every rank, one bucket per step boundary, and serving goes on."""
    path = tiny_ckpt("qwen3")
    tokens = {}
    for tp in (1, 2):
        bus = EventBus()
        sub = bus.subscribe("test", maxsize=1_000_000)
        eng = make_engine(path, bus=bus, tp_size=tp, **SMALL)
        try:
            handles = [eng.submit(p, SamplingParams(max_new_tokens=24, ignore_eos=True)) for p in PROMPTS]
            for _ in range(6):
                eng.step()
            eng.recapture(decode_bs=[1, 3], prefill_num_tokens=[16, 8])
            eng.run_until_idle()
            tokens[tp] = [h.token_ids for h in handles]
            assert eng.decode_buckets == [1, 3] and eng.prefill_buckets == [8, 16]
        finally:
            eng.close()
        events = sub.drain()
        done = [e for e in events if e.type == "recapture_finished"]
        assert len(done) == 1 and done[0].ok
        passes = {(e.rank, e.phase) for e in events if e.type == "capture_started" and e.reason == "recapture"}
        assert passes == {(r, p) for r in range(tp) for p in ("decode", "prefill")}
    assert tokens[2] == tokens[1]


@pytest.mark.parametrize("background", [False, True])
def test_a_failed_group_refuses_new_work_and_finishes_what_was_queued(
    tiny_ckpt, make_engine, torch_one_thread, background
):
    """Once a rank has died, submit (and every other command) raises the failure at once instead of
    queueing work no step will ever serve; requests in flight or still queued finish ``cancelled``
    with it."""
    import signal
    import time

    from graphtop.engine.errors import TensorParallelError
    from graphtop.engine.request import FinishReason

    eng = make_engine(tiny_ckpt("llama"), tp_size=2, **SMALL)
    try:
        long = SamplingParams(max_new_tokens=200, ignore_eos=True)
        running = eng.submit(PROMPTS[0], long)
        if background:
            eng.start_background()
            while not running.token_ids:
                time.sleep(0.01)
        else:
            eng.step()
        queued = eng.submit(PROMPTS[1], long)  # without the background thread: still a queued command
        os.kill(eng.tp.worker_pids[1], signal.SIGKILL)
        assert eng.tp.await_failure(30) == "tensor-parallel rank 1 died (killed by SIGKILL)"
        t0 = time.monotonic()
        for call in (
            lambda: eng.submit("after the failure"),
            lambda: eng.generate(["after"]),
            eng.start_background,
            lambda: eng.recapture(decode_bs=[1]),
            eng.wait_for_capture,
        ):
            with pytest.raises(TensorParallelError, match="^tensor-parallel rank 1 died"):
                call()
        assert time.monotonic() - t0 < 5
        if not background:
            with pytest.raises(TensorParallelError):
                eng.run_until_done([running, queued])
        assert running.wait(30) and queued.wait(30)
        for h in (running, queued):
            assert h.finish_reason is FinishReason.CANCELLED and "tensor-parallel rank 1 died" in h.error
        assert eng.pool.used_pages == 0 and eng.commands.empty()
    finally:
        eng.close()


def test_a_second_tp_engine_while_one_is_open_is_one_line_before_any_spawn(tiny_ckpt, make_engine, torch_one_thread):
    """One tensor-parallel engine per process (one torch.distributed group): a second is refused up front,
    with nothing spawned (it failed after its worker had loaded, ~14 s, with torch's RuntimeError)."""
    import time

    from support.tp_procs import spawned_workers

    from graphtop.engine.errors import EngineError

    first = make_engine(tiny_ckpt("llama"), tp_size=2, **SMALL)
    try:
        workers = spawned_workers(os.getpid())
        t0 = time.monotonic()
        with pytest.raises(EngineError, match="^this process already has a torch.distributed process group") as e:
            make_engine(tiny_ckpt("llama"), tp_size=2, **SMALL)
        assert len(str(e.value).splitlines()) == 1 and "one tensor-parallel engine per process" in str(e.value)
        assert time.monotonic() - t0 < 5 and spawned_workers(os.getpid()) == workers
    finally:
        first.close()


def test_a_program_without_a_main_guard_is_told_why_its_worker_died(tiny_ckpt, tmp_path):
    """The worker re-imports the main module, builds an engine there and dies in multiprocessing's
    bootstrapping check: the program heard only "rank 1 died (exit code 1)", the reason was in the
    worker's stderr."""
    script = tmp_path / "no_guard.py"
    script.write_text(
        "import sys\n"
        "from graphtop.engine import Engine\n"
        "from graphtop.engine.config import EngineConfig\n"
        "try:\n"
        "    Engine.from_pretrained(sys.argv[1], config=EngineConfig(device='cpu', dtype='float32', tp_size=2,\n"
        "                                                            max_total_tokens=256)).close()\n"
        "    print('built')\n"
        "except Exception as exc:\n"
        "    print(f'{type(exc).__name__}: {exc}', flush=True)\n"
        "    raise\n"
    )
    out = subprocess.run(
        [sys.executable, str(script), str(tiny_ckpt("llama"))],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    said = [line for line in out.stdout.splitlines() if line.startswith("TensorParallelError")]
    assert said == [
        "TensorParallelError: tensor-parallel rank 1 died (exit code 1): it ended before it started (if "
        'the program builds the engine at import time, put that under `if __name__ == "__main__":`: '
        "each worker is a spawned process that imports the main module again)"
    ], out.stdout
