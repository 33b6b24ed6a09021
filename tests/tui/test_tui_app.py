"""Pilot tests of the dashboard fed by a scripted FakeSession (no GPU, no model, no clock)."""

from __future__ import annotations

import threading

import pytest
from support.tui_pilot import make_app, pump
from textual.widgets import Button, DataTable, Input

from graphtop.engine.telemetry.events import (
    CaptureFinished,
    CaptureProgress,
    CaptureStarted,
    ConfigDowngrade,
    EngineStarted,
    ErrorEvent,
    StepEvent,
)
from graphtop.tui.app import GraphtopApp
from graphtop.tui.commands import GraphtopCommands
from graphtop.tui.device_probe import DeviceSample
from graphtop.tui.screens.bucket_editor import BucketEditorScreen
from graphtop.tui.screens.capture_table import CaptureTableScreen
from graphtop.tui.screens.help import HelpScreen
from graphtop.tui.sessions.fake import T0, FakeSession, boot_events, step_events
from graphtop.tui.testing import fixed_app, leave_prompt, screen_text, settle, wait_until
from graphtop.tui.widgets.request_view import RequestView
from graphtop.tui.widgets.steps_table import StepsTable

SIZE = (160, 48)


class SlowStartSession(FakeSession):
    """start() blocks until the test releases it, like a model that is still loading."""

    def __init__(self) -> None:
        super().__init__(script=[])
        self.release = threading.Event()

    def start(self) -> None:
        self.release.wait(10)
        super().start()


async def test_opens_at_once_and_shows_capture_progress_live() -> None:
    session = SlowStartSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await pump(pilot)
        assert "loading demo model (fake)" in screen_text(app)
        assert not app.engine_ready
        session.publish(
            EngineStarted(
                model="tiny",
                dtype="float16",
                attention_backend="sdpa",
                decode_graph_backend="full",
                prefill_graph_backend="breakable",
            )
        )
        session.publish(CaptureStarted(phase="decode", buckets=(1, 2, 4, 8), backend="full"))
        session.publish(
            CaptureProgress(phase="decode", bucket=1, index=1, total=4, seconds=0.25, memory_bytes=3 * 1024**2)
        )
        session.publish(
            CaptureProgress(phase="decode", bucket=2, index=2, total=4, seconds=0.5, memory_bytes=5 * 1024**2)
        )
        await pump(pilot)
        text = screen_text(app)
        assert "decode  ██████░░░░░░ 2/4 0.75s 8.0 MiB …" in text  # done/total, time, memory
        assert "bucket      2  0.50s 5.0 MiB" in text  # the bucket just captured
        assert "tiny" in text and "attn sdpa" in text
        session.publish(CaptureProgress(phase="decode", bucket=4, index=3, total=4, ok=False, failure_reason="OOM"))
        await pump(pilot)
        assert "failed: 4 (OOM)" in screen_text(app)
        session.release.set()
        await wait_until(pilot, lambda: app.engine_ready)


PLANNED = {
    "decode": {"backend": "full", "bs": [1, 2, 4, 8]},
    "prefill": {"backend": "breakable", "num_tokens": [64]},
    "emulated": False,
    "available": True,
}


async def test_states_before_any_step_and_while_capture_is_pending() -> None:
    """No 'every step hit a graph' before a step, no 'eager only' while capture is pending, and the
    engine serving while it captures is said plainly."""
    session = SlowStartSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await pump(pilot)
        text = screen_text(app)
        assert "no steps yet" in text and "every step hit a graph" not in text
        assert "prompts typed now run once it is loaded" in text
        session.publish(
            EngineStarted(
                model="tiny", decode_graph_backend="full", prefill_graph_backend="breakable", graph_config=PLANNED
            )
        )
        await pump(pilot)
        text = screen_text(app)
        assert "graph capture starting" in text and "eager" not in text.split("steps")[0]
        session.publish(
            CaptureStarted(phase="decode", buckets=(1, 2, 4, 8), backend="full"),
            CaptureProgress(phase="decode", bucket=1, index=1, total=4, seconds=0.1),
            StepEvent(
                step=1, phase="decode", batch_size=3, num_tokens=3, path="eager", fallback_reason="not_yet_captured"
            ),
        )
        await pump(pilot)
        text = screen_text(app)
        assert "serving while capturing: 1/4 buckets live" in text
        assert "steps of the rest: eager (not_yet_captured)" in text
        assert "not_yet_captured" in text and "every step hit a graph" not in text
        session.publish(  # the next bucket's capture waits for its kernels, compiling in worker processes
            StepEvent(
                step=2, phase="decode", batch_size=3, num_tokens=3, path="eager", fallback_reason="kernels_compiling"
            ),
        )
        await pump(pilot)
        assert "steps of the rest: eager (kernels_compiling)" in screen_text(app)
        session.publish(
            CaptureProgress(phase="decode", bucket=2, index=2, total=4, seconds=0.1),
            CaptureProgress(phase="decode", bucket=4, index=3, total=4, seconds=0.1),
            CaptureProgress(phase="decode", bucket=8, index=4, total=4, seconds=0.1),
            CaptureFinished(phase="decode", captured=(1, 2, 4, 8), seconds=0.4, kernels_compiled=12, kernels_cached=3),
        )
        await pump(pilot)
        text = screen_text(app)
        assert "serving while capturing" not in text
        assert "kernels: 12 compiled ahead, 3 cached" in text
        session.release.set()
        await wait_until(pilot, lambda: app.engine_ready)


async def test_eager_only_is_said_only_when_no_graph_is_planned() -> None:
    session = FakeSession(
        script=[
            EngineStarted(
                model="tiny",
                decode_graph_backend="disabled",
                prefill_graph_backend="disabled",
                graph_config={**PLANNED, "available": False},
            )
        ]
    )
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.engine_ready)
        await pump(pilot)
        text = screen_text(app)
        assert "no graphs configured: every step runs eagerly" in text and "capture starting" not in text


async def test_ui_timer_drains_events_and_streams_without_help() -> None:
    session = FakeSession(reply="x y")
    app = make_app(session, tick_hz=20)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state.total_steps == 40)
        session.publish(*step_events(3, start_step=500))
        await wait_until(pilot, lambda: app.query_one("#steps-table", StepsTable).get_row_at(0)[0] == 502)
        await pilot.press(*"p", "enter")  # the prompt has the focus from the start
        await wait_until(pilot, lambda: app.query_one(RequestView).done)
        assert app.query_one(RequestView).text == "x y"


async def test_panels_show_scripted_data() -> None:
    app = fixed_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        text = screen_text(app)
        # status line
        for part in (
            "demo-tiny-llama",
            "cuda:0 NVIDIA H200",
            "bfloat16",
            "attn flashinfer",
            "graphs decode full · prefill breakable",
        ):
            assert part in text
        assert "EMULATED" not in text
        # capture + ledger
        assert "decode  ████████████ 6/6 0.51s 189 MiB ✓" in text  # capture work: the per-bucket times
        assert "KV pool        ███████░░░  96.0 GiB  68.1%" in text
        assert "decode graphs" in text and "189 MiB" in text
        # KV pool
        assert "running 4/64 · queued 2" in text
        # steps: table newest first, histogram, fallbacks ranked
        table = app.query_one("#steps-table", StepsTable)
        assert table.row_count == 40
        assert table.get_row_at(0)[0] == 60
        assert "bucket hits · padding" in text and "dec    16" in text
        lines = [ln for ln in text.splitlines() if "over_max_bucket" in ln or "exceeds_max_bucket" in ln]
        assert "exceeds_max_bucket" in lines[-2] and "prefill_tokens_over_max_bucket" in lines[-1]
        assert "replay ms" in text and "p50" in text
        # device
        assert "util 87% · power 612 W / 700 W · 61°C" in text


async def test_emulated_is_always_marked() -> None:
    app = fixed_app(emulated=True)
    async with app.run_test(size=(100, 40)) as pilot:  # even on a narrow terminal
        await settle(pilot)
        assert app.query_one("#badge-emulated").display
        assert "EMULATED" in screen_text(app)


async def test_device_panel_without_nvml_is_calm() -> None:
    class NoGpuProbe:
        def sample(self) -> DeviceSample:
            return DeviceSample((), "no NVIDIA GPU", 5.0, 2, 1024**3, 4 * 1024**3, 1024**2)

        def close(self) -> None:
            pass

    app = make_app(poll_device=True, device_sample=None, probe_factory=NoGpuProbe, device_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.query_one("#device").sample is not None)
        await pilot.pause()
        text = screen_text(app)
        assert "no NVIDIA GPU — host only" in text and "host cpu 5% of 2" in text


def test_device_probe_without_nvml(monkeypatch) -> None:
    import pynvml

    from graphtop.tui.device_probe import DeviceProbe

    def boom() -> None:
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", boom)
    sample = DeviceProbe().sample()
    assert sample.gpus == () and sample.gpu_note == "no NVIDIA GPU" and sample.ram_total > 0


async def test_engine_failure_keeps_the_dashboard_open() -> None:
    app = make_app(FakeSession(start_error="no such model: /nope"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.engine_error is not None)
        await pump(pilot)
        assert "engine failed: RuntimeError: no such model: /nope" in screen_text(app)


async def test_prompt_streams_and_several_run_at_once() -> None:
    session = FakeSession(reply="one two three")
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.focused is app.query_one("#prompt")  # from the first frame
        await pilot.press(*"hi", "enter")
        await pilot.press(*"yo", "enter")
        assert [s[0] for s in session.submitted] == ["hi", "yo"]
        assert session.submitted[0][2] is True  # chat template applied when available
        views = list(app.query(RequestView))
        assert len(views) == 2
        await pump(pilot)
        assert [v.text for v in views] == ["one ", "one "]  # both stream on the same tick
        assert not views[0].done
        await pump(pilot, 3)
        assert [v.text for v in views] == ["one two three"] * 2 and all(v.done for v in views)
        assert "done" in screen_text(app) and "#req-2" in screen_text(app)


async def test_sampling_settings_are_sent_and_validated() -> None:
    session = FakeSession(chat=False)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.query_one("#temperature", Input).value = "0.7"
        app.query_one("#seed", Input).value = "42"
        app.query_one("#top-k", Input).value = "20"
        app.query_one("#prompt", Input).focus()
        await pilot.press(*"go", "enter")
        prompt, settings, chat = session.submitted[-1]
        assert (settings.temperature, settings.seed, settings.top_k, settings.max_new_tokens) == (0.7, 42, 20, 128)
        assert chat is False  # no chat template: plain prompt
        app.query_one("#top-p", Input).value = "2"
        await pilot.press(*"bad", "enter")
        await pilot.pause()
        assert len(session.submitted) == 1
        assert any("top-p" in n.message for n in app._notifications)


async def test_prompt_history_up_down() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press(*"first", "enter", *"second", "enter", *"dra")
        prompt = app.query_one("#prompt", Input)
        await pilot.press("up")
        assert prompt.value == "second"
        await pilot.press("up", "up")
        assert prompt.value == "first"
        await pilot.press("down")
        assert prompt.value == "second"
        await pilot.press("down")
        assert prompt.value == "dra"  # the draft comes back


async def test_single_keys_do_not_fire_while_typing() -> None:
    """The prompt has the focus from the first frame: letters are text and no printable key acts
    (space does not pause); escape leaves it, "/" comes back to it at once, q quits."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("q", "b", "space", "question_mark", "slash", "1")
        assert app.query_one("#prompt", Input).value == "qb ?/1"
        assert app.is_running and not app.paused and not isinstance(app.screen, (HelpScreen, BucketEditorScreen))
        await leave_prompt(pilot)
        await pilot.press("slash", *"hi")  # in one burst: the keys after "/" are the prompt's
        assert app.query_one("#prompt", Input).value == "qb ?/1hi" and not app.paused
        await leave_prompt(pilot)
        await pilot.press("q")
    assert app.return_code == 0


async def test_printable_keys_on_the_console_go_to_the_prompt() -> None:
    """With the focus on the conversation or the chat checkbox (clicked, or tabbed to) a printable key
    is still the prompt's: it never reaches the shortcuts (space would pause, q quit)."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.screen.set_focus(app.query_one("#outputs"))
        await pilot.press("space", "q")
        assert app.focused is app.query_one("#prompt") and app.query_one("#prompt", Input).value == " q"
        checkbox = app.query_one("#chat")
        app.screen.set_focus(checkbox)
        await pilot.press("space")  # the checkbox's own key
        assert app.focused is checkbox and not app.paused
        await pilot.press("b")
        assert app.focused is app.query_one("#prompt") and not isinstance(app.screen, BucketEditorScreen)
        assert app.is_running and not app.paused


async def test_space_pauses_the_live_view() -> None:
    session = FakeSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.query_one("#steps-table", StepsTable)
        await leave_prompt(pilot)
        await pilot.press("space")
        assert app.paused and "PAUSED" in screen_text(app)
        session.publish(*step_events(5, start_step=1000))
        await pump(pilot)
        assert table.get_row_at(0)[0] == 40  # frozen
        assert app.state.total_steps == 45  # but nothing was lost
        await pilot.press("space")
        await pump(pilot)
        assert table.get_row_at(0)[0] == 1004


async def test_help_screen() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        assert "Buckets" in screen_text(app) and "^p" in screen_text(app)
        help_text = app.screen.text
        assert "EMULATED" in help_text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await leave_prompt(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)


def test_every_binding_has_id_and_tooltip() -> None:
    from graphtop.tui.screens.capture_table import CaptureTableScreen
    from graphtop.tui.screens.path_prompt import PathPromptScreen
    from graphtop.tui.widgets.history_input import HistoryInput
    from graphtop.tui.widgets.prompt_console import PromptConsole

    for owner in (
        GraphtopApp,
        BucketEditorScreen,
        CaptureTableScreen,
        HelpScreen,
        HistoryInput,
        PathPromptScreen,
        PromptConsole,
    ):
        for b in owner.BINDINGS:
            assert b.id and b.tooltip, (owner.__name__, b.key)


async def _open_editor(pilot) -> BucketEditorScreen:
    await leave_prompt(pilot)
    await pilot.press("b")
    await pilot.pause()
    assert isinstance(pilot.app.screen, BucketEditorScreen)
    return pilot.app.screen


async def _type(pilot, screen: BucketEditorScreen, field: str, text: str) -> str:
    screen.query_one(f"#{field}-input", Input).value = text
    await pilot.pause()
    return str(screen.query_one(f"#{field}-msg").render())


@pytest.mark.parametrize(
    "text, message",
    [
        ("1,2,x", "✗ 'x' is not an integer"),
        ("0,1", "✗ '0': buckets must be ≥ 1"),
        ("1,128", "✗ bucket 128 is over max running (64)"),
        ("", "✗ empty"),
        ("8-4", "✗ '8-4': bad range, 4 is below 8"),
        ("8-64:0", "the step must be ≥ 1"),
    ],
)
async def test_bucket_editor_validation_messages(text: str, message: str) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        editor = await _open_editor(pilot)
        msg = await _type(pilot, editor, "decode", text)
        assert message in msg
        assert editor.query_one("#confirm", Button).disabled
        assert "fix the bucket lists" in str(editor.query_one("#whatif").render())
        await pilot.press("ctrl+s")  # refusing to confirm an invalid list
        assert isinstance(app.screen, BucketEditorScreen)


async def test_bucket_editor_prefill_over_pool() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        editor = await _open_editor(pilot)
        msg = await _type(pilot, editor, "prefill", "64,100000")
        assert "100000 is over the KV pool size (65536)" in msg


async def test_bucket_editor_confirm_recaptures_with_parsed_lists() -> None:
    session = FakeSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        editor = await _open_editor(pilot)
        assert editor.query_one("#decode-input", Input).value == "1,2,4,8,16,32"
        msg = await _type(pilot, editor, "decode", "1-4,8-64:8")
        assert "✓ 12 buckets: 1-4,8-64:8" in msg
        await _type(pilot, editor, "prefill", "64, 128-512:128")
        preview = str(editor.query_one("#whatif").render())
        assert "graph hit rate" in preview and "est. graph memory" in preview and "graphs" in preview
        assert not editor.query_one("#confirm", Button).disabled
        await pilot.click("#confirm")
        await pilot.pause()
        assert session.recaptures == [([1, 2, 3, 4, 8, 16, 24, 32, 40, 48, 56, 64], [64, 128, 256, 384, 512])]
        assert not isinstance(app.screen, BucketEditorScreen)
        await pump(pilot)
        text = screen_text(app)
        assert "last recapture ok" in text
        assert "decode  ████████████ 12/12" in text  # the recaptured decode phase


async def test_bucket_editor_unchanged_phase_is_left_alone_and_prompts_keep_streaming() -> None:
    session = FakeSession(reply="a b c d e f")
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press(*"stream", "enter", "escape")
        await pump(pilot)
        editor = await _open_editor(pilot)
        await _type(pilot, editor, "decode", "1,2,4,8,16,32,48")
        await pilot.press("enter")  # enter in a field confirms too
        assert session.recaptures == [([1, 2, 4, 8, 16, 32, 48], None)]
        await pump(pilot, 6)
        view = app.query_one(RequestView)
        assert view.text == "a b c d e f" and view.done


async def test_bucket_editor_what_if_numbers() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        editor = await _open_editor(pilot)
        await _type(pilot, editor, "decode", "1,2,4,8,16,32,48")  # now covers the bs-48 fallbacks
        preview = str(editor.query_one("#whatif").render())
        line = next(ln for ln in preview.splitlines() if ln.strip().startswith("decode"))
        now, cand = line.split()[1:]
        assert float(cand.rstrip("%")) > float(now.rstrip("%"))
        graphs = next(ln for ln in preview.splitlines() if ln.startswith("graphs"))
        assert graphs.split()[1:] == ["10", "11"]
        await pilot.press("escape")
        assert not isinstance(app.screen, BucketEditorScreen)


async def test_bucket_editor_advise_fills_the_advice_and_the_what_if_shows_it() -> None:
    from graphtop.engine.graphs.bucket_demand import advise_phase
    from graphtop.engine.graphs.bucket_list import format_buckets
    from graphtop.tui.fmt import pct
    from graphtop.tui.whatif import what_if

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        editor = await _open_editor(pilot)
        await pilot.press("ctrl+o")  # works while a field has the focus
        await pilot.pause()
        h = app.state.whatif_inputs()
        advised = {}
        for phase, current in (("decode", [1, 2, 4, 8, 16, 32]), ("prefill", [64, 128, 256, 512])):
            advice, _ = advise_phase(
                h.steps,
                phase,
                costs=h.costs,
                max_padding_waste=h.max_padding_waste,
                current=current,
                max_graphs=len(current),
            )
            advised[phase] = list(advice.buckets) or current  # no advice: the field is left alone
            assert editor.query_one(f"#{phase}-input", Input).value == format_buckets(advised[phase])
        assert 48 in advised["decode"]  # the decode fallbacks get a graph
        # the scripted prefill eager steps cost no more per token than its graphs: nothing to gain
        assert advised["prefill"] == [64, 128, 256, 512]
        preview = str(editor.query_one("#whatif").render())
        cand = what_if(
            h.steps,
            advised["decode"],
            advised["prefill"],
            h.costs,
            current_decode=[1, 2, 4, 8, 16, 32],
            current_prefill=[64, 128, 256, 512],
        )
        hit = next(ln for ln in preview.splitlines() if ln.startswith("graph hit rate"))
        assert hit.split()[-1] == pct(cand.hit_rate) and cand.decode.hit_rate == 1.0
        assert next(ln for ln in preview.splitlines() if ln.startswith("graphs")).split()[1:] == ["10", "10"]
        await pilot.click("#confirm")
        await pilot.pause()
        assert app.session.recaptures == [(advised["decode"], None)]  # prefill unchanged


async def test_bucket_editor_advice_stays_within_the_static_buffers() -> None:
    import dataclasses

    boot = boot_events()
    boot[0] = dataclasses.replace(
        boot[0], graph_config={"decode": {"bs": [1, 2, 4, 8, 16, 32]}, "prefill": {"num_tokens": [64, 128, 256, 512]}}
    )
    app = make_app(FakeSession(boot + step_events()))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert (app.state.graph_max_bucket("decode"), app.state.graph_max_bucket("prefill")) == (32, 512)
        editor = await _open_editor(pilot)
        await pilot.press("ctrl+o")
        await pilot.pause()
        decode = editor.parsed["decode"]
        assert decode and max(decode) <= 32 and len(decode) <= 6  # bs 48 cannot get a graph here


async def test_parity_panel_toggle_checks_and_red_state() -> None:
    from graphtop.engine.telemetry.events import ParityCheck, ParityNotRun
    from graphtop.tui.widgets.parity_panel import ParityPanel

    session = FakeSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        panel = app.query_one(ParityPanel)
        assert not panel.display  # off: no room taken
        hits = [hit async for hit in GraphtopCommands(app.screen).search("parity")]
        assert hits and hits[0].text == "Toggle parity checks (graph vs eager)"
        hits[0].command()
        await pump(pilot)
        assert session.parity_every == app.PARITY_EVERY and panel.display
        assert "1 in 64 · waiting for the first check" in screen_text(app)
        session.publish(ParityNotRun(step=70, reason="discarded", skipped=1, discarded=1, every=64, ts=T0 + 39))
        await pump(pilot)  # no check compared yet, but the stream said one was dropped
        assert "1 in 64 · waiting for the first check" in screen_text(app)
        assert "skipped 1 · discarded 1" in screen_text(app)

        def check(step: int, rel: float, mismatch: bool) -> ParityCheck:
            return ParityCheck(
                step=step,
                phase="decode",
                batch_size=3,
                num_tokens=3,
                bucket=4,
                rows=3,
                max_abs_err=rel,
                max_rel_err=rel,
                argmax_agree=1.0 if not mismatch else 0.0,
                top5_overlap=1.0,
                tolerance=0.1,
                mismatch=mismatch,
                check_ms=9.5,
                every=64,
                skipped=2,
                discarded=1,
                ts=T0 + 40,
            )

        session.publish(check(64, 0.004, False), check(128, 0.006, False))
        await pump(pilot)
        text = screen_text(app)
        assert "1 in 64 · 2 checks · all agree · skipped 2" in text
        assert "worst rel err 0.006 (tol 0.1) · argmax 100.0%" in text
        assert "top-5 100.0% · discarded 1 · last step 128 (9.50 ms)" in text
        assert not panel.has_class("-mismatch")
        session.publish(check(192, 1.7, True))
        await pump(pilot)
        assert "3 checks · 1 mismatch(es)" in screen_text(app) and panel.has_class("-mismatch")
        assert "worst rel err 1.7 (tol 0.1) · argmax 0.0%" in screen_text(app)
        app.action_toggle_parity()
        await pump(pilot)
        assert session.parity_every == 0
        assert panel.display  # the checks seen stay on screen, the rate says off
        assert "off · 3 checks" in screen_text(app)


async def test_capture_table_modal() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await leave_prompt(pilot)
        await pilot.press("c")
        assert isinstance(app.screen, CaptureTableScreen)
        table = app.screen.query_one(DataTable)
        assert table.row_count == 10
        assert table.get_row_at(0)[:2] == ["decode", 1]
        await pilot.press("escape")
        assert not isinstance(app.screen, CaptureTableScreen)


async def test_palette_provider_commands() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        provider = GraphtopCommands(app.screen)
        titles = [hit.text async for hit in provider.discover()]
        for expected in (
            "Recapture graphs (edit buckets)",
            "Export trace",
            "Open trace",
            "Toggle panel: device",
            "Per-bucket capture costs",
        ):
            assert expected in titles
        hits = [hit async for hit in provider.search("toggle device")]
        assert hits and hits[0].text == "Toggle panel: device"
        hits[0].command()
        assert not app.query_one("#device").display


async def test_palette_runs_a_graphtop_command() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"panel: ledger")
        await wait_until(pilot, lambda: "Toggle panel: memory ledger" in screen_text(app))
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.query_one("#ledger").display)


async def test_themes_registered_and_switchable() -> None:
    app = make_app(theme_name="graphtop-light")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.theme == "graphtop-light"
        assert {"graphtop-dark", "graphtop-light"} <= set(app.available_themes)
        app.theme = "graphtop-dark"
        await pilot.pause()
        app.theme = "nord"  # any textual theme works: the stylesheets use theme variables only
        await pilot.pause()
    with pytest.raises(ValueError, match="unknown theme"):
        make_app(theme_name="nope")


async def test_engine_alerts_notify() -> None:
    session = FakeSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        session.publish(
            ErrorEvent(message="graph replay failed", where="decode"),
            ConfigDowngrade(key="prefill_graphs", old="breakable", new="eager", reason="no flashinfer"),
        )
        await pump(pilot)
        messages = [n.message for n in app._notifications]
        assert "graph replay failed" in messages
        assert any("prefill_graphs: breakable → eager" in m for m in messages)


async def test_export_then_open_trace_and_back_to_live(tmp_path) -> None:
    session = FakeSession()
    app = make_app(session)
    path = tmp_path / "out.jsonl"
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app._export_to(str(path))
        await wait_until(pilot, lambda: path.exists())
        await app.open_trace(str(path)).wait()  # read by a worker, then switched to
        await pilot.pause()
        assert app.session.kind == "replay"
        assert not app.query_one("#console").display and app.query_one("#replay-bar").display
        app.session.seek(1000)
        await pump(pilot)
        assert app.state.total_steps == 40
        assert "REPLAY" in screen_text(app)
        app.action_back_to_live()
        assert app.session is session and app.state.total_steps == 40
        await app.open_trace(str(tmp_path / "missing.jsonl")).wait()
        await pilot.pause()
        assert app.session is session
        assert any("cannot read trace" in n.message for n in app._notifications)


async def test_replay_keys_seek_pause_and_speed() -> None:
    from graphtop.tui.sessions.replay import ReplaySession

    class Clock:
        t = 0.0

        def __call__(self) -> float:
            return self.t

    clock = Clock()
    replay = ReplaySession(boot_events() + step_events(40), clock=clock, paused=True, label="t.jsonl")
    app = make_app(replay)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.state.info is not None and app.state.total_steps == 0  # paused at the start
        assert "REPLAY · PAUSED" in screen_text(app) and not app.prompt_console.display
        await pilot.press("right", "right")  # +10 s: all of boot, not yet the steps at +10.0…
        assert app.state.total_steps == 1
        await pilot.press("right")
        assert app.state.total_steps == 40
        assert "event 62/62" in screen_text(app)
        await pilot.press("left", "left")  # back: the state is rebuilt from the start
        assert app.state.total_steps == 0 and app.state.capture
        await pilot.press("shift+right")
        assert replay.cursor == 19 and replay.paused  # one step (+ the KV event of the same instant)
        await pilot.press("plus", "plus")
        assert replay.speed == 4.0
        await pilot.press("space")
        assert not replay.paused
        clock.t += 10
        await pump(pilot)
        assert app.state.total_steps == 40
        await pilot.press("b")  # no bucket editor in a replay
        assert not isinstance(app.screen, BucketEditorScreen)


def test_launch_reports_bad_trace(tmp_path, capsys) -> None:
    from graphtop.cli.launch import run_replay

    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert run_replay(str(bad)) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err


def test_importing_the_tui_package_and_launch_is_free_of_textual() -> None:
    import subprocess
    import sys

    code = (
        "import sys, graphtop.tui, graphtop.cli.launch, graphtop.themes;"
        "print(sorted(m for m in ('textual', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
