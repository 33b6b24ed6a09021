"""Live advice in the dashboard: the status line says when the advice is ready, ``a`` opens the
bucket editor on it, and enter recaptures with it (requests kept, as any edit)."""

from __future__ import annotations

from support.tui_pilot import make_app
from textual.widgets import Input

from graphtop.engine.graphs.bucket_list import format_buckets
from graphtop.engine.telemetry.events import StepEvent
from graphtop.tui.screens.bucket_editor import BucketEditorScreen
from graphtop.tui.sessions.fake import T0, FakeSession, boot_events
from graphtop.tui.testing import leave_prompt, screen_text, settle

SIZE = (160, 48)


def _traffic(n: int = 240) -> list[StepEvent]:
    """Decode batches of 3, 5-7 and 12 under 1,2,4,8,16,32: every one pads, and the same mix all along."""
    mix = (3, 5, 6, 7, 12, 3, 6)
    out = []
    for i in range(n):
        b = mix[i % len(mix)]
        bucket = next(x for x in (1, 2, 4, 8, 16, 32) if x >= b)
        out.append(
            StepEvent(
                step=i + 1,
                phase="decode",
                batch_size=b,
                num_tokens=b,
                bucket=bucket,
                padded=bucket - b,
                padding_waste=(bucket - b) / bucket,
                path="graph",
                host_ms=0.3,
                replay_ms=1.0,
                ts=T0 + 10 + 0.01 * i,
            )
        )
    return out


async def test_live_advice_is_shown_and_applied_with_one_key() -> None:
    session = FakeSession(boot_events() + _traffic())
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await leave_prompt(pilot)
        await pilot.press("a")  # nothing advised yet: it says so and changes nothing
        await pilot.pause()
        assert not isinstance(app.screen, BucketEditorScreen)
        proposal = app.refresh_live_advice()  # what the timer does on a worker thread
        await pilot.pause()
        assert proposal is not None and proposal.buckets("prefill") is None  # no prefill steps seen
        advised = proposal.buckets("decode")
        assert advised is not None and len(advised) <= 6 and {3, 7, 12} <= set(advised)
        gain = proposal.phases[0].gain
        assert gain > 0.05
        assert f"advice ready: decode −{100 * gain:.1f} % step cost" in screen_text(app)
        await pilot.press("a")
        await pilot.pause()
        editor = app.screen
        assert isinstance(editor, BucketEditorScreen)
        assert editor.query_one("#decode-input", Input).value == format_buckets(advised)
        assert editor.query_one("#prefill-input", Input).value == format_buckets([64, 128, 256, 512])
        preview = str(editor.query_one("#whatif").render())
        now, advice = next(ln for ln in preview.splitlines() if ln.startswith("padding waste")).split()[-2:]
        assert now != "0.0%" and advice == "0.0%"  # the what-if shows the advice against the lists in use
        await pilot.press("enter")
        await pilot.pause()
        assert session.recaptures == [(advised, None)]  # prefill left as it is
