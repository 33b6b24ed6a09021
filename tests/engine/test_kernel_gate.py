"""Capture waits for compiled kernels, steps do not: a bucket is captured only once its kernels are
compiled, and until then its steps run eagerly with ``kernels_compiling``.

The compiler here is a stand-in whose compiles finish when the test says so (the real one, worker
processes compiling Triton kernels, runs on CUDA: tests/cuda, and tests/engine/test_precompile.py
where Triton is installed); the dry run that finds a bucket's kernels is the runner's own.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

import pytest

import graphtop.engine.graphs.runners.kernel_gate as kernel_gate_mod
import graphtop.engine.lifecycle.build as build_mod  # where the engine starts its kernel compiles
from graphtop.engine.graphs.runners.capture import CaptureJob
from graphtop.engine.graphs.runners.kernel_gate import Precompile
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.bus import EventBus
from graphtop.models.kernels.precompile import KernelVariant

pytestmark = pytest.mark.usefixtures("torch_one_thread")


KERNEL_A = KernelVariant("graphtop.models.kernels.fused", "_rmsnorm_kernel", '{"key": "a"}')
DRY_RUNS: list[int] = []


class HeldCompiler:
    """Compiles nothing until ``release``; records what it was asked for."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.released = False
        self.closed = False

    def submit(self, variants: Iterable[KernelVariant]) -> list[str]:
        keys = [v.key for v in variants]
        self.asked += [k for k in keys if k not in self.asked]
        return keys

    def done(self, keys: Iterable[str]) -> bool:
        return self.released or not list(keys)

    def wait(self, keys: Iterable[str]) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True

    def origins(self, keys: Iterable[str]) -> dict[str, int]:
        return {"disk": 0, "compiled": len(set(keys)) if self.released else 0, "failed": 0}


class FakeGate:
    def __init__(self, ready: set[int]) -> None:
        self.ready_buckets = ready
        self.looked: list[int] = []
        self.waited: list[int] = []

    def ready(self, bucket: int) -> bool:
        return bucket in self.ready_buckets

    def wait(self, bucket: int) -> None:
        self.waited.append(bucket)

    def look_ahead(self, buckets: Iterable[int], deadline: float, limit: int | None = None) -> None:
        fresh = [b for b in buckets if b not in self.looked]
        self.looked += fresh[:limit] if limit is not None else fresh

    def kernel_counts(self) -> tuple[int, int]:
        return (2, 1)

    def finish(self, ok: bool) -> None:
        self.finished = ok


def job_with(gate: FakeGate, order: list[int]) -> tuple[CaptureJob, list[int]]:
    captured: list[int] = []
    events: list[ev.Event] = []
    import torch

    job = CaptureJob("decode", order, "emulated", torch.device("cpu"), captured.append, events.append, gate=gate)
    job.events = events  # type: ignore[attr-defined]
    return job, captured


def test_a_slice_stops_at_a_bucket_whose_kernels_compile_and_finds_the_next_ones_kernels():
    gate = FakeGate(ready={8})
    job, captured = job_with(gate, [8, 4, 2, 1])
    assert not job.run(budget_s=10.0)
    assert captured == [8] and job.waiting and job.remaining == [4, 2, 1]
    assert gate.looked == [2]  # the next bucket after the waiting one: its kernels compile meanwhile
    assert not job.run(budget_s=10.0) and gate.looked == [2, 1]  # one more each slice
    gate.ready_buckets |= {4, 2, 1}
    assert job.run(budget_s=10.0) and captured == [8, 4, 2, 1] and not job.waiting
    finished = job.events[-1]  # type: ignore[attr-defined]
    assert isinstance(finished, ev.CaptureFinished) and (finished.kernels_compiled, finished.kernels_cached) == (2, 1)


def test_a_job_run_to_the_end_waits_for_each_buckets_kernels():
    gate = FakeGate(ready=set())
    job, captured = job_with(gate, [4, 2])
    assert job.run(budget_s=None)
    assert captured == [4, 2] and gate.waited == [4, 2] and gate.looked == [4, 2]  # all found at once


@contextmanager
def one_variant_per_dry_run() -> Iterator[list[KernelVariant]]:
    DRY_RUNS.append(1)
    found: list[KernelVariant] = [KERNEL_A]
    yield found


def precompile_with(compiler: HeldCompiler, folder) -> object:
    return lambda *a, **k: Precompile(compiler, folder, "the same setup")  # type: ignore[arg-type]


def serve(make_engine, path, compiler: HeldCompiler, monkeypatch, release_after: int, folder):
    """Serve six requests on an engine whose kernels compile in ``compiler``; release its compiles after
    ``release_after`` steps. -> engine, tokens, events."""
    monkeypatch.setattr(build_mod, "kernel_precompile", precompile_with(compiler, folder))
    monkeypatch.setattr(kernel_gate_mod, "record_missing", one_variant_per_dry_run)
    bus = EventBus()
    sub = bus.subscribe("test")
    engine = make_engine(path, bus=bus, capture_before_serving=False)
    prompts = ["Once upon a time", "hello", "The quick brown fox", "a b c", "what is it", "x y"]
    handles = [engine.submit(p, SamplingParams(max_new_tokens=10, ignore_eos=True)) for p in prompts]
    steps = 0
    while engine.step():
        steps += 1
        if steps == release_after:
            compiler.released = True
    assert all(h.finished for h in handles)
    return engine, [h.token_ids for h in handles], sub.drain()


def test_steps_run_eagerly_while_kernels_compile_and_replay_once_captured(
    tiny_ckpt, make_engine, monkeypatch, tmp_path
):
    path = tiny_ckpt("llama")
    compiler = HeldCompiler()
    # the stand-in is wired where the engine builds its compiler, so the emulated (CPU) graphs wait for it
    engine, tokens, events = serve(make_engine, path, compiler, monkeypatch, release_after=6, folder=tmp_path)
    steps = [e for e in events if isinstance(e, ev.StepEvent)]
    early, late = steps[:5], steps[8:]
    assert early and all(s.path == "eager" and s.fallback_reason == "kernels_compiling" for s in early)
    assert any(s.path != "eager" for s in late)
    assert compiler.asked == [KERNEL_A.key]  # every bucket's dry run asked; each variant once
    assert engine.model_runner.compiler is compiler  # what benchmarks read its stats from
    finished = [e for e in events if isinstance(e, ev.CaptureFinished)]
    assert {e.phase for e in finished} == {"decode", "prefill"}
    assert all(e.ok and e.kernels_compiled == 1 and e.kernels_cached == 0 for e in finished)
    assert not engine.capture_pending
    # the same requests on an engine that compiled as it captured: the same tokens
    monkeypatch.undo()
    reference = make_engine(path)
    prompts = ["Once upon a time", "hello", "The quick brown fox", "a b c", "what is it", "x y"]
    want = reference.generate(prompts, SamplingParams(max_new_tokens=10, ignore_eos=True))
    assert tokens == [h.token_ids for h in want]
    engine.close()
    assert not compiler.closed  # the process's compiler outlives an engine (the next one reuses its workers)


def test_a_compile_worker_answers_every_request_with_one_line_even_a_broken_one():
    """The worker's protocol: one JSON answer per request line; a variant it cannot compile is an error
    answer and the worker goes on (here an unknown kernel module)."""
    import io
    import json

    from graphtop.models.kernels.compile_worker import serve as serve_worker

    request = json.dumps({"module": "graphtop.no_such_module", "name": "k", "specialization": "{}"})
    out = io.StringIO()
    serve_worker(io.StringIO(f"{request}\n\n{request}\n"), out)
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(answers) == 2 and all(set(a) == {"error"} and a["error"] for a in answers)


def test_a_dry_run_that_fails_leaves_its_bucket_to_a_plain_capture(monkeypatch):
    """A dry run that raises (say, a Triton whose hook data differs) must not take the step down: the
    bucket counts as ready and its capture compiles what it launches, as without a gate."""
    from graphtop.engine.graphs.runners.kernel_gate import KernelGate

    def dry_run(bucket: int) -> None:
        raise KeyError("specialization_data")

    monkeypatch.setattr(kernel_gate_mod, "record_missing", one_variant_per_dry_run)
    gate = KernelGate(HeldCompiler(), dry_run)  # type: ignore[arg-type]
    assert gate.ready(4) and gate.failures == ["bucket 4: KeyError: 'specialization_data'"]


def test_look_ahead_dry_runs_each_bucket_once_and_at_most_its_limit(monkeypatch):
    from graphtop.engine.graphs.runners.kernel_gate import KernelGate

    monkeypatch.setattr(kernel_gate_mod, "record_missing", one_variant_per_dry_run)
    ran: list[int] = []
    gate = KernelGate(HeldCompiler(), ran.append)  # type: ignore[arg-type]
    gate.look_ahead([8, 4, 2], float("inf"), limit=1)
    gate.look_ahead([8, 4, 2], float("inf"), limit=1)
    assert ran == [8, 4]
    gate.look_ahead([8, 4, 2, 1], float("inf"))
    assert ran == [8, 4, 2, 1]
    gate.look_ahead([16], 0.0)  # past its deadline: nothing
    assert ran == [8, 4, 2, 1]


def test_every_buckets_kernels_are_found_while_the_engine_loads(tiny_ckpt, make_engine, monkeypatch, tmp_path):
    """Before the first step, every configured bucket has been dry-run and its kernels handed to the
    compiler, so they all compile in parallel from the start."""
    compiler = HeldCompiler()
    monkeypatch.setattr(build_mod, "kernel_precompile", precompile_with(compiler, tmp_path))
    monkeypatch.setattr(kernel_gate_mod, "record_missing", one_variant_per_dry_run)
    engine = make_engine(tiny_ckpt("llama"), capture_before_serving=False)
    runners = (engine.model_runner.decode, engine.model_runner.prefill)
    for runner in runners:
        assert runner.gate is not None and set(runner.gate._keys) == set(runner.configured)
    assert compiler.asked == [KERNEL_A.key] and not any(r.buckets for r in runners)  # nothing captured yet
    engine.close()


def test_a_second_start_of_the_same_setup_reads_its_variants_and_dry_runs_nothing(
    tiny_ckpt, make_engine, monkeypatch, tmp_path
):
    """The first capture keeps each phase's variants in a manifest beside the compiled kernels; a start
    with the same setup submits those and dry-runs no bucket; another setup starts its own."""
    path = tiny_ckpt("llama")
    first = HeldCompiler()
    engine, _, _ = serve(make_engine, path, first, monkeypatch, release_after=1, folder=tmp_path)
    engine.close()
    manifests = sorted(p.name.split("-")[0] for p in (tmp_path / "graphtop-manifests").glob("*.json"))
    assert manifests == ["decode", "prefill"]

    DRY_RUNS.clear()
    second = HeldCompiler()
    engine, tokens, events = serve(make_engine, path, second, monkeypatch, release_after=3, folder=tmp_path)
    assert DRY_RUNS == [] and second.asked == [KERNEL_A.key]
    assert not engine.capture_pending and engine.decode_buckets
    engine.close()

    DRY_RUNS.clear()
    monkeypatch.setattr(
        build_mod, "kernel_precompile", lambda *a, **k: Precompile(HeldCompiler(), tmp_path, "another setup")
    )
    engine = make_engine(path, capture_before_serving=False)
    assert DRY_RUNS  # no manifest for this setup: its buckets are dry-run
    engine.close()


def test_buckets_are_found_smallest_and_largest_first():
    from graphtop.engine.graphs.runners.bucketed import ends_first

    assert ends_first([8, 4, 2, 1, 16]) == [1, 16, 2, 8, 4]
    assert ends_first([3]) == [3] and ends_first([]) == []


def test_every_engine_of_a_process_shares_one_compiler():
    from graphtop.models.kernels.compile_pool import shared_compiler

    assert shared_compiler() is shared_compiler()
