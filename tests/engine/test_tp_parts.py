"""Tensor parallelism's parts, without processes: the per-step message, bucket agreement, events per
rank (old traces still read), and the dashboard's view of several ranks."""

from __future__ import annotations

import json
from array import array

import pytest

from graphtop.engine.batch import ForwardBatch, ForwardMode
from graphtop.engine.distributed.lockstep import _agreement
from graphtop.engine.distributed.wire import ForwardDecoder, ForwardEncoder, decode_control, encode_control
from graphtop.engine.graphs.backend import ShapeKey
from graphtop.engine.graphs.config import GraphConfig
from graphtop.engine.graphs.fallback import FallbackReason
from graphtop.engine.telemetry import events as ev
from graphtop.engine.trace_tools.report import format_summary
from graphtop.engine.trace_tools.summary import summarize
from graphtop.tui.sessions.fake import FakeSession, boot_events, step_events
from graphtop.tui.state import DashboardState
from graphtop.tui.testing import screen_text, settle


class _Req:
    def __init__(self, *pages: int) -> None:
        self.pages = array("i", pages)


def _batch(mode: ForwardMode, reqs: list[_Req], ids_on_device: bool = False) -> ForwardBatch:
    n = len(reqs)
    if mode is ForwardMode.DECODE:
        ids, pos, loc, ext, rows = (
            list(range(11, 11 + n)),
            list(range(40, 40 + n)),
            list(range(500, 500 + n)),
            [1] * n,
            list(range(n)),
        )
    else:
        ext = [2] * n
        ids, pos, loc, rows = list(range(2 * n)), [0, 1] * n, list(range(30, 30 + 2 * n)), [2 * n - 1]
    return ForwardBatch(
        mode=mode,
        requests=reqs,
        input_ids=ids,
        positions=pos,
        out_cache_loc=loc,
        seq_lens=[len(r.pages) for r in reqs],
        extend_lens=ext,
        prefix_lens=[0] * n,
        req_pages=[r.pages for r in reqs],
        page_size=16,
        sample_rows=rows,
        input_ids_device=object() if ids_on_device else None,
    )


def _same(got: ForwardBatch, want: ForwardBatch) -> None:
    for field in (
        "mode",
        "input_ids",
        "positions",
        "out_cache_loc",
        "seq_lens",
        "extend_lens",
        "prefix_lens",
        "sample_rows",
        "page_size",
        "batch_size",
    ):
        assert getattr(got, field) == getattr(want, field), field
    assert [list(p) for p in got.req_pages] == [list(p) for p in want.req_pages]
    assert got.input_ids_device is None


def test_forward_steps_round_trip_and_ship_only_new_pages():
    enc, dec = ForwardEncoder(), ForwardDecoder()
    a, b, c = _Req(3, 4, 5), _Req(7), _Req(9, 10)
    first = _batch(ForwardMode.PREFILL, [a, b, c])
    step = dec.decode(enc.encode(first, seq=1))
    assert step.seq == 1 and not step.ids_on_device
    _same(step.batch, first)

    a.pages.extend([6])  # decode: a grew a page, b and c did not
    second = _batch(ForwardMode.DECODE, [a, b, c], ids_on_device=True)
    message = enc.encode(second, seq=2)
    step = dec.decode(message)
    assert step.seq == 2 and step.ids_on_device
    _same(step.batch, second)
    # a 30-byte header, then int32s: 3 per token, 6 per request, the one new page, the sampled rows
    assert len(message) == 1 + 30 + 4 * (3 * 3 + 6 * 3 + 1 + 3)

    b.pages = array("i", [12, 13])  # b preempted and re-admitted: a new list, sent whole
    c.pages = array("i")  # c finished: not in the batch, its slot is released on both sides
    third = _batch(ForwardMode.DECODE, [a, b])
    step = dec.decode(enc.encode(third, seq=3))
    _same(step.batch, third)
    assert len(dec.pages) == 2 and len(enc._sent) == 2


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
        # the ranks agree as each capture slice is adopted (every rank adopts in step): first nothing yet,
        # finally all four captured here, one flag per configured bucket
        assert group.masks[0] == [0, 0, 0, 0] and group.masks[-1] == [1, 1, 1, 1]
        assert eng.decode_buckets == [1, 2, 4]
        assert not decode.backend.can_run(ShapeKey("decode", 8))  # its graph was released here too
        batch = ForwardBatch(
            mode=ForwardMode.DECODE,
            requests=[None] * 6,
            input_ids=[1] * 6,
            positions=[0] * 6,
            out_cache_loc=[0] * 6,
            seq_lens=[1] * 6,
            extend_lens=[1] * 6,
            prefix_lens=[0] * 6,
            req_pages=[[1]] * 6,
            page_size=1,
        )
        assert eng.model_runner.fallback_reason(batch) is FallbackReason.CAPTURE_FAILED
    finally:
        eng.close()


def test_old_trace_lines_without_rank_still_read():
    line = {
        "type": "capture_progress",
        "ts": 1.0,
        "phase": "decode",
        "bucket": 4,
        "index": 1,
        "total": 1,
        "seconds": 0.1,
        "memory_bytes": 0,
        "ok": True,
        "failure_reason": None,
    }
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
            out.append(
                ev.CaptureProgress(
                    phase=phase,
                    bucket=b,
                    index=i,
                    total=len(buckets),
                    seconds=0.1,
                    ok=not bad,
                    failure_reason="out of memory" if bad else None,
                    rank=1,
                )
            )
        captured = tuple(b for b in buckets if b != fail_rank1)
        failed = tuple(b for b in buckets if b == fail_rank1)
        out.append(ev.CaptureFinished(phase=phase, captured=captured, failed=failed, ok=not failed, rank=1))
    out.append(
        ev.MemoryLedger(device="cuda:1", total=141 << 30, weights=8 << 30, kv_pool=90 << 30, free=30 << 30, rank=1)
    )
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
    st.apply(
        ev.ErrorEvent(
            message="tensor-parallel rank 1 died (killed by SIGKILL)", where="tensor-parallel", fatal=True, rank=1
        )
    )
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


def test_only_from_pretrained_starts_worker_ranks(tiny_ckpt):
    from graphtop.engine.config import EngineConfig
    from graphtop.engine.engine import Engine, EngineError
    from graphtop.models import load_checkpoint

    with pytest.raises(EngineError, match="tp_size=2 needs Engine.from_pretrained"):
        Engine(load_checkpoint(tiny_ckpt("llama")), EngineConfig(device="cpu", tp_size=2))
