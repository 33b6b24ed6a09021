"""A long load says what it does: the first load of a .gguf (its one-time conversion into the cache) showed
"loading model 0/?" for half a minute. It now publishes ``load_progress`` events (each tensor of how
many), which the headless progress line and the dashboard's capture panel show, and a trace keeps."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from support.cli_support import SHORT_RUN, run
from support.load_support import require_gguf_packages

from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.bus import EventBus

pytestmark = pytest.mark.usefixtures("private_cache_dir")

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CONVERTING = "converting GGUF to the cache (one time)"


def test_a_first_gguf_load_publishes_its_conversion_tensor_by_tensor(tiny_ckpt, tmp_path, capsys):
    require_gguf_packages()
    from support.gguf_files import build_gguf

    from graphtop.engine.trace_tools.trace import read_trace

    model = build_gguf(tiny_ckpt("llama"), tmp_path / "tiny.gguf")
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    trace = tmp_path / "t.jsonl"
    rc, _, err = run(capsys, "--model", model, "--prompts", prompts, "--record", trace, *SHORT_RUN)
    assert rc == 0, err
    events = read_trace(trace).events
    loads = [e for e in events if isinstance(e, ev.LoadProgress)]
    started = next(i for i, e in enumerate(events) if isinstance(e, ev.EngineStarted))
    assert loads and all(events.index(e) < started for e in loads)  # all of them before the engine started
    assert {e.label for e in loads} == {CONVERTING}
    tensors = [(e.done, e.total) for e in loads if e.step == "tensor"]
    assert tensors[-1][0] == tensors[-1][1] > 0 and len(tensors) == tensors[-1][1] + 1
    assert loads[-1].describe() == f"{CONVERTING} — writing the converted folder"

    rc, _, err = run(capsys, "--model", model, "--prompts", prompts, "--record", trace, *SHORT_RUN)
    assert rc == 0, err
    assert not any(isinstance(e, ev.LoadProgress) for e in read_trace(trace).events)  # converted already


def _frames(raw: str) -> str:
    return ANSI.sub("", raw).replace("\r", "\n")


def test_the_progress_line_names_the_conversion_and_counts_tensors():
    from graphtop.cli.progress import start_headless_progress

    bus, buf = EventBus(), io.StringIO()
    progress = start_headless_progress(
        bus, total_requests=1, console=Console(file=buf, force_terminal=True, width=140, color_system=None)
    )
    bus.publish(ev.LoadProgress(label=CONVERTING, step="tensor", done=3, total=10))
    progress.stop()
    last = [line for line in _frames(buf.getvalue()).splitlines() if line.strip()][-1]
    assert re.search(f"{re.escape(CONVERTING)} — tensor .*3/10", last) and "loading model" not in last


def test_the_dashboard_shows_the_conversion_until_the_engine_starts():
    from graphtop.tui.state import DashboardState
    from graphtop.tui.widgets.capture_panel import load_lines

    state = DashboardState()
    assert load_lines(state) == []
    state.apply(ev.LoadProgress(label=CONVERTING, step="tensor", done=5, total=20))
    text = [str(line) for line in load_lines(state)]
    assert text[0].strip() == CONVERTING and text[1].strip().endswith("tensor 5/20")
    state.apply(ev.LoadProgress(label=CONVERTING, step="writing the converted folder"))
    assert str(load_lines(state)[1]).strip() == "writing the converted folder…"
    state.apply(ev.EngineStarted(model="m"))
    assert load_lines(state) == []
