"""Tensor parallelism's parts, without processes: the per-step message, bucket agreement, events per
rank (old traces still read), and the dashboard's view of several ranks."""

from __future__ import annotations

import json
from array import array

import pytest

from graphtop.engine.batch import ForwardBatch, ForwardMode
from graphtop.engine.distributed.lockstep import _agreement
from graphtop.engine.distributed.wire import decode_control, decode_forward, encode_control, encode_forward
from graphtop.engine.graphs.backend import ShapeKey
from graphtop.engine.graphs.config import GraphConfig
from graphtop.engine.graphs.fallback import FallbackReason
from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.summary import summarize
from graphtop.engine.telemetry.report import format_summary
from graphtop.tui.fake_session import FakeSession, boot_events, step_events
from graphtop.tui.state import DashboardState
from graphtop.tui.testing import screen_text, settle


def _batch(mode: ForwardMode) -> ForwardBatch:
    pages = [array("i", [3, 4, 5]), array("i", [7]), array("i", [9, 10])]
    if mode is ForwardMode.DECODE:
        ids, pos, loc = [11, 12, 13], [40, 2, 20], [501, 77, 93]
        ext, prefix, seq = [1, 1, 1], [40, 2, 20], [41, 3, 21]
        rows = [0, 1, 2]
    else:
        ids, pos, loc = [5, 6, 7, 8, 9], [0, 1, 2, 0, 1], [30, 31, 32, 70, 71]
        ext, prefix, seq = [3, 0, 2], [0, 0, 0], [3, 0, 2]
        rows = [2, 4]
    return ForwardBatch(mode=mode, requests=["a", "b", "c"], input_ids=ids, positions=pos, out_cache_loc=loc,
                        seq_lens=seq, extend_lens=ext, prefix_lens=prefix, req_pages=pages, page_size=16,
                        sample_rows=rows, sample_requests=["a", "c"])


@pytest.mark.parametrize("mode", list(ForwardMode))
def test_a_forward_step_round_trips_through_one_message(mode):
    batch = _batch(mode)
    batch.input_ids_device = object() if mode is ForwardMode.DECODE else None  # ids still on the device
    message = encode_forward(batch, seq=42)
    step = decode_forward(message)
    got = step.batch
    assert step.seq == 42 and step.ids_on_device == (mode is ForwardMode.DECODE)
    assert got.mode is mode and got.batch_size == 3 and got.page_size == 16
    for field in ("input_ids", "positions", "out_cache_loc", "seq_lens", "extend_lens", "prefix_lens",
                  "sample_rows"):
        assert getattr(got, field) == getattr(batch, field), field
    assert [list(p) for p in got.req_pages] == [list(p) for p in batch.req_pages]
    assert got.max_pages == 3 and got.input_ids_device is None
    # a 26-byte header, then int32s: 3 per token, 4 per request, the pages, the sampled rows
    assert len(message) == 1 + 26 + 4 * (3 * len(batch.input_ids) + 4 * 3 + 6 + len(batch.sample_rows))


def test_control_messages_round_trip():
    assert decode_control(encode_control("recapture", (1, 2), None)) == ("recapture", ((1, 2), None))


class _Group:
    """Stands in for the process group: the other rank failed to capture ``missing``."""

    def __init__(self, missing: set[int]) -> None:
        self.missing = missing
        self.masks: list[list[int]] = []

    def agree_min(self, values: list[int]) -> list[int]:
        self.masks.append(values)
        return values


def test_a_bucket_one_rank_failed_is_dropped_on_every_rank(tiny_ckpt, make_engine, torch_one_thread):
    eng = make_engine(tiny_ckpt("llama"), graphs=GraphConfig(prefill_backend="disabled"))
    try:
        decode = eng.model_runner.decode
        group = _Group(missing={8})
        agree = _agreement(group, decode)

        def other_rank_lost_8(replayable: list[int]) -> list[int]:
            kept = agree(replayable)
            return [b for b in kept if b not in group.missing]

        decode.agree_buckets = other_rank_lost_8
        eng.recapture(decode_bs=[1, 2, 4, 8])
        eng.run_until_idle()  # the recapture finishes between polls
        assert group.masks == [[1, 1, 1, 1]]  # this rank captured all four: one flag per configured bucket
        assert eng.decode_buckets == [1, 2, 4]
        assert not decode.backend.can_run(ShapeKey("decode", 8))  # its graph was released here too
        batch = ForwardBatch(mode=ForwardMode.DECODE, requests=[None] * 6, input_ids=[1] * 6, positions=[0] * 6,
                             out_cache_loc=[0] * 6, seq_lens=[1] * 6, extend_lens=[1] * 6, prefix_lens=[0] * 6,
                             req_pages=[[1]] * 6, page_size=1)
        assert eng.model_runner.fallback_reason(batch) is FallbackReason.CAPTURE_FAILED
    finally:
        eng.close()


def test_old_trace_lines_without_rank_still_read():
    line = {"type": "capture_progress", "ts": 1.0, "phase": "decode", "bucket": 4, "index": 1, "total": 1,
            "seconds": 0.1, "memory_bytes": 0, "ok": True, "failure_reason": None}
    got = ev.event_from_dict(json.loads(json.dumps(line)))
    assert got.rank == 0
    old_error = {"type": "error", "ts": 1.0, "message": "x", "where": "step", "fatal": False}
    assert ev.event_from_dict(old_error).rank is None
    with pytest.raises(ev.SchemaError, match="missing field 'bucket'"):  # only added fields may be absent
        ev.validate_event_dict({k: v for k, v in line.items() if k != "bucket"})


def _two_ranks(fail_rank1: int | None = None) -> list[ev.Event]:
    """Boot events of rank 0 plus a worker rank's capture and ledger, as the relay publishes them."""
    out = boot_events(decode=(1, 2, 4), prefill=(64, 128))
    out[0] = ev.EngineStarted(**{**out[0].__dict__, "tp_size": 2})
    for phase, buckets in (("decode", (4, 2, 1)), ("prefill", (128, 64))):
        out.append(ev.CaptureStarted(phase=phase, buckets=buckets, backend="full", rank=1))
        for i, b in enumerate(buckets, 1):
            bad = b == fail_rank1
            out.append(ev.CaptureProgress(phase=phase, bucket=b, index=i, total=len(buckets), seconds=0.1, ok=not bad,
                                          failure_reason="out of memory" if bad else None, rank=1))
        captured = tuple(b for b in buckets if b != fail_rank1)
        failed = tuple(b for b in buckets if b == fail_rank1)
        out.append(ev.CaptureFinished(phase=phase, captured=captured, failed=failed, ok=not failed, rank=1))
    out.append(ev.MemoryLedger(device="cuda:1", total=141 << 30, weights=8 << 30, kv_pool=90 << 30, free=30 << 30,
                               rank=1))
    return out


def test_state_keeps_rank_zero_for_the_single_rank_views_and_every_rank_beside():
    st = DashboardState()
    st.apply_all(_two_ranks(fail_rank1=2) + step_events(20))
    assert st.tp_size == 2
    assert st.ledger.rank == 0 and sorted(st.ledgers) == [0, 1]
    assert st.capture["decode"].rank == 0 and st.current_buckets("decode") == [1, 2, 4]  # rank 1 did not overwrite
    assert all(c.phase in ("decode", "prefill") for c in st.bucket_costs())  # costs: rank 0's only
    assert st.rank_alerts() == ["rank 1: decode bucket 2 failed (out of memory); every rank runs it eagerly"]
    assert st.slowest_rank() is None  # rank 1 has not replayed yet
    st.apply(ev.RankReplay(rank=1, steps=(2, 3), replay_ms=(9.0, 11.0)))
    assert st.slowest_rank() == (1, 10.0)
    st.apply(ev.ErrorEvent(message="tensor-parallel rank 1 died (killed by SIGKILL)", where="tensor-parallel",
                           fatal=True, rank=1))
    assert st.rank_alerts()[0] == "tensor-parallel rank 1 died (killed by SIGKILL)"
    assert st.failed == "tensor-parallel rank 1 died (killed by SIGKILL)"


def test_trace_summary_lists_every_rank():
    events = _two_ranks() + step_events(20) + [ev.RankReplay(rank=1, steps=(2,), replay_ms=(1.5,))]
    summary = summarize(events)
    assert sorted(summary.ranks) == [0, 1] and summary.memory.rank == 0
    assert summary.ranks[1].replay_ms.p50 == 1.5
    assert [c.rank for c in summary.captures] == [0, 0]  # the capture ledger is rank 0's
    report = format_summary(summary)
    assert "Tensor parallel (2 ranks)" in report and "rank 1  decode 3/3  prefill 2/2  replay p50 1.500 ms" in report


async def test_dashboard_shows_ranks_side_by_side():
    from graphtop.tui.app import GraphtopApp
    from graphtop.tui.testing import FIXED_DEVICE

    script = _two_ranks(fail_rank1=4) + step_events(20) + [ev.RankReplay(rank=1, steps=(2,), replay_ms=(25.0,))]
    app = GraphtopApp(FakeSession(script), poll_device=False, device_sample=FIXED_DEVICE, animate=False, tick_hz=None)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        text = screen_text(app)
    assert "rank 0" in text and "rank 1" in text  # the ledger, one column per rank
    assert "rank 1 decode 3/3 ✗" in text and "rank 1: decode bucket 4 failed (out of memory)" in text
    assert "slowest rank 1 25.00" in text
