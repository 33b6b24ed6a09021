"""Headless progress (cli/progress.py): drawn from the event stream on a terminal, absent otherwise."""

from __future__ import annotations

import io
import json
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
from rich.console import Console

from graphtop.cli.entry import main
from graphtop.cli.progress import start_headless_progress
from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.bus import EventBus

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def final_lines(raw: str) -> list[str]:
    """What the terminal shows at the end: the last frame of rich's live display, without escapes."""
    text = ANSI.sub("", raw).replace("\r", "\n")
    return [line.strip() for line in text.splitlines() if line.strip()]


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def terminal_console(buf: io.StringIO) -> Console:
    return Console(file=buf, force_terminal=True, width=120, color_system=None)


def test_events_drive_loading_capture_and_requests():
    bus, buf = EventBus(), io.StringIO()
    progress = start_headless_progress(bus, total_requests=2, console=terminal_console(buf))
    assert progress is not None
    publish = bus.publish
    publish(ev.EngineStarted(model="/models/smollm2", device_name="CPU", dtype="float32"))
    publish(ev.CaptureStarted(phase="decode", buckets=(2, 1), backend="emulated-full"))
    publish(ev.CaptureProgress(phase="decode", bucket=2, index=1, total=2, seconds=0.5))
    publish(ev.CaptureProgress(phase="decode", bucket=1, index=2, total=2, seconds=0.25))
    publish(ev.CaptureFinished(phase="decode", captured=(1, 2), seconds=0.75))
    for rid in ("a", "b"):
        publish(ev.RequestQueued(request_id=rid, prompt_tokens=3, max_new_tokens=4))
    for rid in ("a", "b"):
        publish(ev.RequestFirstToken(request_id=rid, ttft_ms=1.0))
    for _ in range(4):  # the last step's rows are dropped: both requests ended one step earlier
        publish(ev.StepEvent(phase="decode", batch_size=2, num_tokens=2))
    for rid in ("a", "b"):
        publish(ev.RequestFinished(request_id=rid, output_tokens=4, finish_reason="length"))
    progress.stop()
    shown = "\n".join(final_lines(buf.getvalue()))
    assert "loaded smollm2" in shown and "CPU · float32" in shown
    assert re.search(r"capture decode .*2/2 .*0\.8 s", shown)
    assert re.search(r"requests .*2/2 .*8 tokens · [0-9.]+ tok/s", shown)  # as the finished requests say
    assert not bus.has_subscribers  # stop() unsubscribed


def test_not_a_terminal_means_no_display_and_no_subscription():
    bus = EventBus()
    assert start_headless_progress(bus, 3, stream=io.StringIO()) is None
    assert not bus.has_subscribers  # the engine will not even build step events for it


@pytest.fixture
def headless_run(tiny_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHTOP_CACHE_DIR", str(tmp_path / "cache"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("hello world\n" + json.dumps({"prompt": "Once upon a time", "max_new_tokens": 5}) + "\n")
    args = [
        "--model",
        str(tiny_ckpt("llama")),
        "--device",
        "cpu",
        "--max-total-tokens",
        "2048",
        "--max-running-requests",
        "4",
        "--chunked-prefill-size",
        "64",
        "--cuda-graph-bs-decode",
        "1,2",
        "--cuda-graph-num-tokens-prefill",
        "16,32",
        "--max-new-tokens",
        "6",
        "--prompts",
        str(prompts),
        "--output",
        str(tmp_path / "out.jsonl"),
    ]
    return args


@pytest.mark.usefixtures("torch_one_thread")
def test_headless_run_on_a_terminal_shows_progress_on_stderr(headless_run, monkeypatch, capsys):
    tty = FakeTTY()
    monkeypatch.setattr("sys.stderr", tty)
    assert main(headless_run) == 0
    out = capsys.readouterr().out
    shown = "\n".join(final_lines(tty.getvalue()))
    assert out.startswith("requests 2 (0 failed)")  # stdout is what it always was
    model = headless_run[headless_run.index("--model") + 1]
    assert f"loaded {os.path.basename(model)}" in shown
    assert re.search(r"capture decode .*2/2", shown) and re.search(r"capture prefill .*2/2", shown)
    assert re.search(r"requests .*2/2 .*tokens · [0-9.]+ tok/s", shown)


@pytest.mark.usefixtures("torch_one_thread")
def test_headless_run_without_a_terminal_prints_nothing_extra(headless_run, capsys):
    assert main(headless_run) == 0
    out, err = capsys.readouterr()
    assert out.startswith("requests 2 (0 failed)")
    assert err == ""
