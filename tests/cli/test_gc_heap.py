"""The loaded heap is frozen while a headless run serves, and thawed after it (an in-process caller keeps
collecting its own garbage); a capture that freezes the GC itself leaves an outer freeze in place."""

from __future__ import annotations

import gc

import pytest
from support.cli_support import SHORT_RUN, run

import graphtop.cli.headless as headless
from graphtop.engine.gc_freeze import frozen_heap
from graphtop.engine.graphs.emulated import EmulatedGraphBackend

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(autouse=True)
def thawed():
    """Each test starts with nothing frozen (a test elsewhere in this process may have left a freeze)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_headless_run_serves_with_the_loaded_heap_frozen_and_thaws_it(tiny_ckpt, tmp_path, capsys, monkeypatch):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello world\nOnce upon a time\n")
    seen: list[int] = []
    serve = headless._serve

    def watched(*args, **kwargs):
        seen.append(gc.get_freeze_count())
        return serve(*args, **kwargs)

    monkeypatch.setattr(headless, "_serve", watched)
    assert gc.get_freeze_count() == 0
    out = tmp_path / "out.jsonl"
    rc, _, err = run(capsys, "--model", tiny_ckpt("llama"), "--prompts", prompts, "--output", out, *SHORT_RUN)
    assert rc == 0, err
    assert seen and seen[0] > 1000  # the engine, the model, torch's modules: all frozen while it served
    assert gc.get_freeze_count() == 0


def test_a_freeze_inside_a_frozen_heap_keeps_the_outer_one():
    backend = EmulatedGraphBackend()
    backend.freeze_gc = True
    with frozen_heap():
        with backend.capture_session():
            pass
        assert gc.get_freeze_count() > 0  # the capture did not thaw the serving freeze
        with frozen_heap():
            pass
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_the_dashboards_session_freezes_the_heap_once_loaded_and_thaws_it_at_shutdown():
    from graphtop.tui.sessions.local import EngineSession

    class Loaded:
        def start_background(self) -> None:
            pass

        def shutdown(self) -> None:
            pass

    session = EngineSession(None, None, engine_factory=lambda path, config, bus: Loaded())
    assert gc.get_freeze_count() == 0
    session.start()
    try:
        assert gc.get_freeze_count() > 0
    finally:
        session.shutdown()
    assert gc.get_freeze_count() == 0
