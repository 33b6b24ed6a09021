"""Recordings that ride in-flight steps (``GraphConfig.record_in_flight``).

A capture's stages are of two kinds: RUN stages execute the model on the device (warmup forwards, an
emulated capture that runs its function) and wait for nothing to be in flight; RECORD stages only record
a graph and may run right after a step's launch, while that step is on the device. These tests check the
job's stage protocol, that the step loop puts each kind where it belongs, that the overlap schedule keeps
chaining while only recordings are left, and that tokens do not change.
"""

from __future__ import annotations

from typing import Iterator

import pytest
import torch

import graphtop.engine.graphs.model_runner as model_runner_mod
from graphtop.engine.graphs.config import GraphConfig
from graphtop.engine.graphs.runners.capture import CaptureJob, StageKind
from graphtop.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("torch_one_thread")

RUN, RECORD = StageKind.RUN, StageKind.RECORD
PROMPTS = ["In a hole in the ground there lived", "Once upon a time", "The quick brown fox", "hello there"]
MAX_NEW = [14, 20, 9, 16]


def job_of(stages: list[StageKind], ran: list[tuple[int, int]], buckets: tuple[int, ...] = (8, 4)) -> CaptureJob:
    """A job whose every bucket has ``stages``; ``ran`` collects (bucket, stage index) as each one runs."""

    def capture(bucket: int) -> Iterator[StageKind]:
        for i, kind in enumerate(stages):
            yield kind
            ran.append((bucket, i))

    return CaptureJob("decode", list(buckets), "test", torch.device("cpu"), capture, lambda e: None)


def test_a_job_announces_each_stage_and_runs_only_the_kinds_a_slice_allows() -> None:
    ran: list[tuple[int, int]] = []
    job = job_of([RUN, RECORD, RUN, RECORD], ran)
    assert job.next_kind is RUN  # a bucket still to begin may run the model
    assert not job.run(by_stage=True, kinds={RECORD}) and ran == []  # nothing begins in a ride
    job.run(budget_s=0.0, by_stage=True, kinds={RUN})
    assert ran == [(8, 0)] and job.next_kind is RECORD
    job.run(budget_s=1.0, by_stage=True, kinds={RUN})  # the next stage records: a RUN slice stops before it
    assert ran == [(8, 0)]
    job.run(budget_s=1.0, by_stage=True, kinds={RECORD})  # one recording, then a RUN comes: the ride stops
    assert ran == [(8, 0), (8, 1)] and job.next_kind is RUN
    job.run(by_stage=True, kinds={RUN})
    job.run(by_stage=True, kinds={RECORD})
    assert ran[-1] == (8, 3) and job.captured == [8] and job.next_kind is RUN  # bucket 8 over, 4 to begin
    assert job.run()  # a slice of any kind runs the rest
    assert ran[-4:] == [(4, 0), (4, 1), (4, 2), (4, 3)] and job.done and job.next_kind is None


def test_a_bucket_whose_first_stage_records_waits_for_a_ride() -> None:
    ran: list[tuple[int, int]] = []
    job = job_of([RECORD], ran)
    job.run(by_stage=True, kinds={RUN})  # begins bucket 8 (runs nothing), finds a recording first
    assert ran == [] and job.next_kind is RECORD and job.mid_bucket
    assert job.run(budget_s=1.0, by_stage=True, kinds={RECORD}) is False
    assert ran == [(8, 0)] and job.captured == [8] and job.next_kind is RUN


def serve(make_engine, path, record_in_flight: bool):
    """The prompts submitted at once while the first capture runs; tokens, the engine, every capture stage
    with whether it ran inside a ride and whether it executed the model, and the steps the overlap
    schedule chained before the capture ended."""
    engine = make_engine(path, graphs=GraphConfig(record_in_flight=record_in_flight), capture_before_serving=False)
    seen: list[tuple[bool, bool]] = []  # (in a ride, the capture executed its function)
    riding = [False]
    ride = engine.loop._ride

    def watched_ride() -> None:
        riding[0] = True
        try:
            ride()
        finally:
            riding[0] = False

    engine.loop._ride = watched_ride
    chained_while_capturing: list[int] = []
    advance = engine.model_runner.advance_capture

    def watched_advance(**kw):  # type: ignore[no-untyped-def]
        done = advance(**kw)
        if done and not chained_while_capturing:
            chained_while_capturing.append(engine.loop.overlapped_steps)
        return done

    engine.model_runner.advance_capture = watched_advance
    for runner in (engine.model_runner.decode, engine.model_runner.prefill):
        backend = runner.backend
        capture_one = backend.capture_one

        def watched(key, fn, backend=backend, capture_one=capture_one):  # type: ignore[no-untyped-def]
            seen.append((riding[0], backend.executes_at_capture))
            return capture_one(key, fn)

        backend.capture_one = watched
    handles = [engine.submit(p, SamplingParams(max_new_tokens=m, ignore_eos=True)) for p, m in zip(PROMPTS, MAX_NEW)]
    engine.run_until_done(handles)
    return [h.token_ids for h in handles], engine, seen, chained_while_capturing[0]


def test_recordings_ride_in_flight_steps_and_tokens_do_not_change(tiny_ckpt, make_engine, monkeypatch) -> None:
    monkeypatch.setattr(model_runner_mod, "RECAPTURE_SLICE_S", 0.0)  # a stage per slice: capture spans the run
    path = tiny_ckpt("llama")
    want, before, seen_before, chained_before = serve(make_engine, path, record_in_flight=False)
    got, engine, seen, chained = serve(make_engine, path, record_in_flight=True)
    assert got == want
    assert not any(riding for riding, _ in seen_before)  # off: no capture ever rides a step
    assert not any(riding and executes for riding, executes in seen)  # a capture that runs the model never rides
    assert sum(1 for riding, _ in seen if riding) >= 3  # recordings did ride in-flight steps
    assert not engine.model_runner.capture_pending and engine.model_runner.decode.buckets == [1, 2, 4, 8]
    # with only recordings left, the overlap schedule kept chaining steps while capturing
    assert chained_before == 0 and chained > 0
    engine.close()
    before.close()


def test_launch_ms_excludes_the_wait_for_a_sampled_step(tiny_ckpt, make_engine) -> None:
    """A step sampled at once holds its device wait in ``host_ms``; ``launch_ms`` stops at the launch."""
    from graphtop.engine.telemetry.bus import EventBus

    bus = EventBus()
    sub = bus.subscribe("t", types={"step"})
    engine = make_engine(tiny_ckpt("llama"), bus=bus)
    handles = [engine.submit(p, SamplingParams(max_new_tokens=4, temperature=0.7, seed=1)) for p in PROMPTS[:2]]
    engine.run_until_done(handles)
    steps = sub.drain()
    engine.close()
    assert steps and all(s.launch_ms is not None and 0.0 <= s.launch_ms <= s.host_ms for s in steps)
    assert any(s.launch_ms < s.host_ms for s in steps)  # sampling came after the launch
