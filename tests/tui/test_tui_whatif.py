"""What-if numbers: hit rate, padding waste, graph count, interpolated graph memory."""

from __future__ import annotations

import pytest

from graphtop.engine.graphs.bucket_policy import pick_bucket
from graphtop.engine.telemetry.capture import BucketCost
from graphtop.engine.telemetry.capture import estimate_cost as estimate
from graphtop.engine.telemetry.events import StepEvent
from graphtop.tui.whatif import what_if


def decode(bs: int, path: str = "graph", bucket: int | None = None, reason: str | None = None) -> StepEvent:
    return StepEvent(
        step=0, phase="decode", batch_size=bs, num_tokens=bs, bucket=bucket, path=path, fallback_reason=reason, ts=0.0
    )


def prefill(tokens: int, path: str = "graph", reason: str | None = None) -> StepEvent:
    return StepEvent(
        step=0, phase="prefill", batch_size=1, num_tokens=tokens, path=path, fallback_reason=reason, ts=0.0
    )


def test_pick_bucket() -> None:
    assert pick_bucket([1, 2, 4, 8], 3) == 4
    assert pick_bucket([1, 2, 4, 8], 4) == 4
    assert pick_bucket([1, 2, 4, 8], 9) is None


def test_estimate_interpolates_and_extrapolates() -> None:
    pts = {8: 80.0, 16: 160.0, 32: 200.0}
    assert estimate(pts, 16) == 160.0
    assert estimate(pts, 12) == pytest.approx(120.0)
    assert estimate(pts, 24) == pytest.approx(180.0)
    assert estimate(pts, 64) == pytest.approx(280.0)  # slope of (16, 32): 2.5/bucket
    assert estimate(pts, 4) == pytest.approx(40.0)  # slope of (8, 16)
    assert estimate({8: 80.0, 16: 40.0}, 64) == 0.0  # clamped at zero
    assert estimate({8: 50.0}, 100) == 50.0  # one point: constant
    assert estimate({}, 8) is None


def test_hit_rate_and_padding_for_candidate() -> None:
    steps = [decode(3), decode(5), decode(8), decode(20, path="eager", reason="too big")]
    w = what_if(steps, [4, 8], [64], current_decode=[4, 8], current_prefill=[64])
    # 3→4 (1 pad), 5→8 (3 pad), 8→8 (0); 20 has no bucket
    assert w.decode.graph_steps == 3
    assert w.decode.hit_rate == pytest.approx(0.75)
    assert w.decode.padding_waste == pytest.approx(4 / 20)
    bigger = what_if(steps, [4, 8, 32], [64], current_decode=[4, 8], current_prefill=[64])
    assert bigger.decode.hit_rate == 1.0
    assert bigger.decode.padding_waste == pytest.approx((4 + 12) / 52)
    assert bigger.graph_count == 4


def test_non_size_fallbacks_stay_eager() -> None:
    # bs 3 fits the current buckets yet ran eager: something else was wrong, buckets cannot fix it
    steps = [decode(3, path="eager", reason="capture failed"), decode(4)]
    w = what_if(steps, [1, 2, 4, 8], [64], current_decode=[4], current_prefill=[64])
    assert w.decode.graph_steps == 1
    # without the current lists every step is judged by size alone
    assert what_if(steps, [4], [64]).decode.graph_steps == 2


def test_prefill_and_mixed_use_prefill_buckets_by_tokens() -> None:
    mixed = StepEvent(step=0, phase="mixed", batch_size=4, num_tokens=100, path="graph", ts=0.0)
    w = what_if([prefill(100), prefill(300), mixed], [1], [128, 256])
    assert w.prefill.steps == 3
    assert w.prefill.graph_steps == 2
    assert w.prefill.padding_waste == pytest.approx(56 / 256)
    assert w.hit_rate == pytest.approx(2 / 3)


def test_memory_from_ledger() -> None:
    costs = [
        BucketCost("decode", 8, 0.1, 8_000),
        BucketCost("decode", 16, 0.2, 16_000),
        BucketCost("decode", 64, 0.5, 0, ok=False),
        BucketCost("prefill", 128, 1.0, 50_000),
    ]
    w = what_if([], [8, 12, 16, 32], [128, 256], costs)
    assert w.decode.est_memory_bytes == pytest.approx(8_000 + 12_000 + 16_000 + 32_000)
    assert w.prefill.est_memory_bytes == pytest.approx(100_000)  # single point: constant per graph
    assert w.est_memory_bytes == pytest.approx(168_000)
    assert w.decode.est_capture_seconds == pytest.approx(0.1 + 0.15 + 0.2 + 0.4)
    assert w.graph_count == 6
    assert what_if([], [8], [128]).est_memory_bytes is None  # no ledger yet: unknown, not zero


def test_no_steps_gives_no_rates() -> None:
    w = what_if([], [1, 2], [64])
    assert w.hit_rate is None and w.padding_waste is None and w.steps == 0


def test_prefill_padding_cap_decides_both_ways() -> None:
    # ran under [16, 64] with a 50 % cap: 30 tokens → 64 was refused (53 %), 10 tokens → 16 replayed
    steps = [prefill(30, path="eager", reason="prefill_padding_over_cap"), prefill(10)]
    w = what_if(steps, [1], [24, 40, 64], max_padding_waste=0.5, current_prefill=[16, 64])
    # under the candidate 30 → 40 (25 %) replays, 10 → 24 (58 %) is refused
    assert (w.prefill.graph_steps, w.prefill.padded_tokens, w.prefill.bucket_tokens) == (1, 10, 40)
    no_cap = what_if(steps, [1], [24, 40, 64], current_prefill=[16, 64])
    assert no_cap.prefill.graph_steps == 2


def test_named_reasons_decide_what_buckets_can_fix() -> None:
    steps = [
        decode(3, path="eager", reason="context_exceeds_graph"),
        decode(9, path="eager", reason="exceeds_max_bucket"),
        decode(2, path="eager", reason="capture_failed"),
        decode(5, path="eager", reason="recapture_in_progress"),
        decode(6, path="eager", reason="not_yet_captured"),
        decode(7, path="eager", reason="kernels_compiling"),
    ]
    w = what_if(steps, [1, 2, 4, 8, 16], [64], current_decode=[4, 8])
    # 9 → 16 (exceeds the max bucket), and 5, 6, 7 → 8: eager only while their bucket was being
    # captured, so a captured list decides them; the context and the failed capture stay eager
    assert (w.decode.steps, w.decode.graph_steps, w.decode.padded_tokens) == (6, 4, 7 + 3 + 2 + 1)


async def test_a_phase_with_graphs_disabled_is_read_only_and_left_out_of_recaptures() -> None:
    """``--cuda-graph-backend-prefill disabled``: the editor required both lists (decode could not be
    changed) and "Recapture graphs with the current buckets" sent [] for prefill, which the engine refuses."""
    import dataclasses

    from support.tui_pilot import make_app
    from textual.widgets import Input, Label

    from graphtop.tui.screens.bucket_editor import BucketEditorScreen
    from graphtop.tui.sessions.fake import FakeSession, boot_events, step_events
    from graphtop.tui.testing import leave_prompt, settle

    boot = [ev for ev in boot_events() if getattr(ev, "phase", None) != "prefill"]
    boot[0] = dataclasses.replace(
        boot[0],
        graph_config={
            "decode": {"backend": "full", "bs": [1, 2, 4, 8, 16, 32]},
            "prefill": {"backend": "disabled", "num_tokens": []},
        },
    )
    session = FakeSession(boot + [ev for ev in step_events() if getattr(ev, "phase", None) != "prefill"])
    app = make_app(session)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await leave_prompt(pilot)
        await pilot.press("b")
        await pilot.pause()
        editor = app.screen
        assert isinstance(editor, BucketEditorScreen)
        assert app.focused is editor.query_one("#decode-input")
        assert editor.query_one("#prefill-input", Input).disabled
        assert "prefill graphs are disabled" in str(editor.query_one("#prefill-msg", Label).render())
        await pilot.press("ctrl+u", *"1,2", "enter")
        assert session.recaptures == [([1, 2], None)]
        await settle(pilot)
        await app.run_action("recapture_same")
        assert session.recaptures[-1] == ([1, 2], None)
