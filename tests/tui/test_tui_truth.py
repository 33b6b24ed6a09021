"""States that tell the truth: recapture estimate beside what it took, the bucket editor during a
recapture, CPU memory, an idle KV pool, the prompt console's history, and every number explained."""

from __future__ import annotations

import pytest
from support.tui_pilot import make_app, pump
from textual.widgets import Input

from graphtop.engine.graphs.fallback import FallbackReason
from graphtop.engine.telemetry.events import (
    CaptureFinished,
    CaptureProgress,
    CaptureStarted,
    KVPoolState,
    MemoryLedger,
    RecaptureFinished,
    RecaptureRequested,
    StepEvent,
)
from graphtop.engine.telemetry.recapture import estimate_capture_seconds
from graphtop.tui.explain import FALLBACK_REASONS, LEDGER_ROWS, explain_fallback
from graphtop.tui.screens.bucket_editor import BucketEditorScreen
from graphtop.tui.screens.help import HelpScreen
from graphtop.tui.sessions.fake import T0, FakeSession, boot_events, step_events
from graphtop.tui.testing import leave_prompt, screen_text, settle, wait_until
from graphtop.tui.widgets.level_spark import LevelSparkline
from graphtop.tui.widgets.request_view import RequestView

SIZE = (160, 48)


def recapture_step(step: int) -> StepEvent:
    return StepEvent(
        step=step,
        phase="decode",
        batch_size=3,
        num_tokens=3,
        bucket=None,
        path="eager",
        fallback_reason="recapture_in_progress",
        host_ms=4.0,
        ts=T0 + 31,
    )


async def test_recapture_requested_capturing_and_done_say_estimate_and_actual() -> None:
    session = FakeSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        # the estimate comes from the measured per-bucket capture times (0.06 + 0.07 + 0.08 + 0.09 s)
        estimate = estimate_capture_seconds(app.state.bucket_costs(), {"decode": [1, 2, 4, 8]})
        assert estimate == pytest.approx(0.30)
        session.publish(RecaptureRequested(decode_bs=(1, 2, 4, 8), ts=T0 + 30))
        await pump(pilot)
        text = screen_text(app)
        assert "recapture requested: runs at the next step" in text and "est. 0.30s capture work" in text
        session.publish(
            CaptureStarted(phase="decode", buckets=(8, 4, 2, 1), reason="recapture", ts=T0 + 30.5),
            CaptureProgress(phase="decode", bucket=8, index=1, total=4, seconds=0.5, memory_bytes=1, ts=T0 + 31),
            recapture_step(61),
            recapture_step(62),
        )
        await pump(pilot)
        text = screen_text(app)
        assert "recapture requested" not in text  # it runs now: the request line is gone
        assert "recapturing 1/4 · 0.50s of est. 0.30s" in text
        assert "recapture_in_progress" in text  # one reason for the steps meanwhile, in the fallbacks too
        for bucket in (4, 2, 1):
            session.publish(
                CaptureProgress(
                    phase="decode", bucket=bucket, index=2, total=4, seconds=0.5, memory_bytes=1, ts=T0 + 32
                )
            )
        session.publish(
            CaptureFinished(phase="decode", captured=(1, 2, 4, 8), seconds=9.0, memory_bytes=4, ts=T0 + 39),
            RecaptureFinished(ok=True, decode_bs=(1, 2, 4, 8), seconds=9.5, message="recaptured", ts=T0 + 39.5),
        )
        await pump(pilot)
        text = screen_text(app)
        assert "last recapture ok" in text and "capture 2.00s (est. 0.30s) · wall 9.50s" in text
        assert "decode  ████████████ 4/4 2.00s" in text  # the phase line shows capture work, not wall time
        session.publish(
            RecaptureRequested(decode_bs=(0,), ts=T0 + 40),
            RecaptureFinished(ok=False, decode_bs=(1, 2, 4, 8), message="decode bucket 0 must be positive", ts=T0 + 40),
        )
        await pump(pilot)
        text = screen_text(app)
        assert "last recapture failed:" in text and "decode bucket 0 must be positive" in text


class RecapturingSession(FakeSession):
    """While decode is being recaptured the engine's decode list is empty (nothing replayable yet)."""

    def buckets(self):  # type: ignore[override]
        return [], [64, 128, 256, 512]


async def test_bucket_editor_during_a_recapture_shows_the_lists_being_captured() -> None:
    session = RecapturingSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        session.publish(
            RecaptureRequested(decode_bs=(1, 2, 4, 8), ts=T0 + 30),
            CaptureStarted(phase="decode", buckets=(8, 4, 2, 1), reason="recapture", ts=T0 + 30),
        )
        await pump(pilot)
        await leave_prompt(pilot)
        await pilot.press("b")
        editor = app.screen
        assert isinstance(editor, BucketEditorScreen)
        assert editor.query_one("#decode-input", Input).value == "1,2,4,8"
        assert editor.query_one("#prefill-input", Input).value == "64,128,256,512"
        assert "✗" not in str(editor.query_one("#decode-msg").render())
        assert "recapture is under way" in str(editor.query_one("#editor-note").render())
        preview = str(editor.query_one("#whatif").render())
        assert "est. recapture work" in preview and "unchanged" in preview  # unchanged lists: nothing to recapture
        await pilot.press("ctrl+u", *"1,2", "tab")
        preview = str(editor.query_one("#whatif").render())
        assert "0.13s" in preview  # 0.06 + 0.07 s, measured, for the one phase that changes


async def test_cpu_ledger_free_reads_not_applicable_and_rows_explain_themselves() -> None:
    cpu = MemoryLedger(
        device="cpu", total=700 * 1024**2, weights=200 * 1024**2, kv_pool=500 * 1024**2, free=0, ts=T0 + 1
    )
    session = FakeSession(boot_events() + [cpu] + step_events(20))
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "free           not applicable on CPU" in text and "0.0%" not in text.split("free")[1][:40]
        assert "cpu host memory used 700 MiB" in text
        body = app.query_one("#ledger-body")
        rows = [line.split()[0] for line in str(body.render()).splitlines()]
        await pilot.hover("#ledger-body", offset=(2, rows.index("free")))
        assert "not applicable on CPU" in str(body.tooltip)
        await pilot.hover("#ledger-body", offset=(2, 1))
        tip = str(body.tooltip)  # tooltips are Content: never parsed as markup
        assert tip.startswith("KV pool: ") and "--mem-fraction-static" in tip


async def test_a_mixture_of_experts_ledger_shows_its_expert_weights_under_the_weights() -> None:
    moe = MemoryLedger(
        device="cpu",
        total=700 * 1024**2,
        weights=200 * 1024**2,
        kv_pool=500 * 1024**2,
        experts=150 * 1024**2,
        ts=T0 + 1,
    )
    session = FakeSession(boot_events() + [moe] + step_events(20))
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        body = app.query_one("#ledger-body")
        lines = str(body.render()).splitlines()
        rows = [line.split()[0] for line in lines]
        assert rows[:3] == ["weights", "experts", "KV"]
        assert "150 MiB" in lines[1] and "21.4%" in lines[1]  # of the 700 MiB used, not added to them
        await pilot.hover("#ledger-body", offset=(2, 1))
        assert str(body.tooltip).startswith("experts: of the weights")
        session.publish(MemoryLedger(device="cpu", total=700 * 1024**2, weights=200 * 1024**2, ts=T0 + 2))
        await pump(pilot)
        assert "experts" not in str(body.render())  # a dense model's ledger has no such row


async def test_kv_sparkline_at_zero_use_draws_nothing_and_full_use_full_columns() -> None:
    idle = [KVPoolState(capacity_tokens=1000, used_tokens=0, page_size=16, ts=T0 + i) for i in range(5)]
    session = FakeSession(boot_events() + idle)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        spark = app.query_one(LevelSparkline)
        lines = [spark.render_line(y).text for y in range(spark.size.height)]
        assert all(set(line) <= {" "} for line in lines), lines
        session.publish(
            KVPoolState(capacity_tokens=1000, used_tokens=1000, page_size=16, ts=T0 + 9),
            KVPoolState(capacity_tokens=1000, used_tokens=500, page_size=16, ts=T0 + 10),
        )
        await pump(pilot)
        lines = [spark.render_line(y).text for y in range(spark.size.height)]
        assert [line[-2:] for line in lines] == ["█ ", "██"]  # full, then half of two rows


def test_every_fallback_reason_and_ledger_row_is_explained() -> None:
    for reason in FallbackReason:
        ex = FALLBACK_REASONS[reason.value]
        assert ex.meaning and ex.action and reason.value in ex.line(reason.value)
    assert explain_fallback("made up").meaning.startswith("a reason this graphtop does not know")
    assert set(LEDGER_ROWS) == {"weights", "experts", "KV pool", "decode graphs", "prefill graphs", "reserve", "free"}


async def test_help_screen_explains_every_reason_row_and_status_item() -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        text = app.screen.text
        for reason, ex in FALLBACK_REASONS.items():
            assert reason in text and ex.meaning in text and ex.action in text
        for row, ex in LEDGER_ROWS.items():
            assert ex.meaning in text
        for item in ("graph hits", "dropped", "Below 120 columns", "4 prompts"):
            assert item in text
        assert app.focused is app.screen.query_one("#help-scroll")  # arrows scroll at once


async def test_fallbacks_and_step_rows_explain_their_reason_on_hover() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        fallbacks = app.query_one("#fallbacks")
        lines = str(fallbacks.render()).splitlines()
        y = next(i for i, line in enumerate(lines) if "exceeds_max_bucket" in line)
        await pilot.hover("#fallbacks", offset=(10, y))
        assert str(fallbacks.tooltip) == FALLBACK_REASONS["exceeds_max_bucket"].line("exceeds_max_bucket")
        table = app.query_one("#steps-table")
        row = next(i for i in range(table.row_count) if table.get_row_at(i)[7] == "prefill_tokens_over_max_bucket")
        await pilot.hover("#steps-table", offset=(5, row + 1))
        await pilot.pause()
        assert "lower --chunked-prefill-size" in str(table.tooltip)
        graph_row = next(i for i in range(table.row_count) if table.get_row_at(i)[6] == "graph")
        await pilot.hover("#steps-table", offset=(5, graph_row + 1))  # a graph step: nothing to explain
        await pilot.pause()
        assert table.tooltip is None
        status_tip = str(app.query_one("#status").tooltip)
        assert "graph hits: share of steps" in status_tip
        assert status_tip.endswith("\n\nsetup: flashinfer selected · model kernels: triton-fused")  # the engine's note


async def test_prompt_console_keeps_the_conversation_scrollable_and_bounded(monkeypatch) -> None:
    import graphtop.tui.widgets.prompt_console as console_mod

    monkeypatch.setattr(console_mod, "KEEP", 6)
    session = FakeSession(reply=" ".join(f"word{i}" for i in range(40)))
    app = make_app(session)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        for i in range(8):
            await pilot.press(*f"q{i}", "enter")
            await pump(pilot, 45)
        views = list(app.query(RequestView))
        assert [v.prompt for v in views] == [f"q{i}" for i in range(2, 8)] and all(v.done for v in views)
        assert "2 earlier request(s) let go: the console keeps the last 6" in str(
            app.query_one("#outputs-note").render()
        )
        outputs = app.query_one("#outputs")
        assert outputs.max_scroll_y > 0 and outputs.scroll_y == outputs.max_scroll_y  # follows the newest
        await pilot.press("pageup", "pageup")
        await pilot.pause()
        top = outputs.scroll_y
        assert top < outputs.max_scroll_y
        await pilot.press(*"q8", "enter")
        await pump(pilot, 45)
        assert outputs.scroll_y == top  # reading back is not interrupted by a new stream
        await wait_until(pilot, lambda: list(app.query(RequestView))[-1].done)


async def test_prompt_console_lets_finished_requests_go_as_they_finish(monkeypatch) -> None:
    """The limit was applied only when a prompt was sent: with more than KEEP in flight, every one of
    them stayed on screen after they finished, until the next prompt."""
    import graphtop.tui.widgets.prompt_console as console_mod
    from graphtop.tui.sessions.base import SamplingSettings
    from graphtop.tui.widgets.prompt_console import PromptConsole

    class Held:
        """A stream that finishes when the test says so."""

        def __init__(self, n: int) -> None:
            self.request_id, self.finished, self.finish_reason, self.error = f"r{n}", False, None, None

        def new_text(self) -> str:
            return ""

    monkeypatch.setattr(console_mod, "KEEP", 4)
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        console = app.query_one(PromptConsole)
        handles = [Held(n) for n in range(7)]
        for n, handle in enumerate(handles):
            console.add_request(handle, f"q{n}", SamplingSettings())  # type: ignore[arg-type]
        await pilot.pause()
        assert len(console.views) == 7  # none finished: nothing may go
        for handle in handles:
            handle.finished, handle.finish_reason = True, "stop"
        await pump(pilot, 2)  # the UI tick polls the streams
        await wait_until(pilot, lambda: len(console.views) == 4)
        assert [v.prompt for v in console.views] == ["q3", "q4", "q5", "q6"] and console.removed == 3
