"""One bad bucket list, one message, at every door a list comes in by: the CLI flag (exit 2), the graph
config JSON, the engine's recapture (a failed ``recapture_finished``) and the dashboard's editor (✗
inline). ``BucketList`` words the refusal; each door only says which input it was, so a message learnt
at one door reads the same at the others."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.cli_support import assert_usage_error, run
from support.tui_pilot import make_app
from textual.widgets import Button, Input, Label

from graphtop.engine.graphs.bucket_list import BucketList, BucketSpecError
from graphtop.engine.graphs.config import GraphConfigError, build_graph_config
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.bus import EventBus
from graphtop.tui.screens.bucket_editor import BucketEditorScreen
from graphtop.tui.testing import settle

pytestmark = pytest.mark.usefixtures("torch_one_thread", "private_cache_dir")

BAD_LISTS: list[tuple[str, list[Any]]] = [
    ("1,0,4", [1, 0, 4]),
    ("4,x", [4, "x"]),
    ("2,1.5", [2, 1.5]),
    ("", []),
    (",".join(map(str, range(1, 601))), list(range(1, 601))),
    ("1," + "9" * 20, [1, 10**20 - 1]),
]
IDS = ["zero", "not-a-number", "fraction", "empty", "600-items", "20-digits"]


def refusal(values: list[Any]) -> str:
    """What ``BucketList`` says of ``values``: the words every door must show."""
    with pytest.raises(BucketSpecError) as err:
        BucketList(values)
    message = str(err.value)
    assert message and "\n" not in message
    return message


@pytest.mark.parametrize("text, values", BAD_LISTS, ids=IDS)
def test_the_cli_flag_and_the_graph_config_give_the_same_refusal(
    tmp_path, capsys, monkeypatch, text: str, values: list[Any]
) -> None:
    import graphtop.cli.headless as headless

    want = refusal(values)
    with pytest.raises(BucketSpecError) as from_text:  # the text the flag and the editor read
        BucketList.parse(text)
    assert str(from_text.value) == want
    monkeypatch.setattr(headless, "_load_engine", None)  # refused before anything loads
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    rc, out, err = run(capsys, "--model", tmp_path, "--prompts", prompts, "--cuda-graph-bs-decode", text)
    line = assert_usage_error(rc, out, err)
    assert line == f"graphtop: error: --cuda-graph-bs-decode: {want}"
    with pytest.raises(GraphConfigError) as from_json:
        build_graph_config(json.dumps({"decode": {"bs": values}}), {})
    assert str(from_json.value) == f"cuda graph config: decode.bs: {want}"
    with pytest.raises(GraphConfigError) as from_json_text:  # the flag's text inside the JSON
        build_graph_config(json.dumps({"decode": {"bs": text}}), {})
    assert str(from_json_text.value) == f"cuda graph config: decode.bs: {want}"


def test_the_recapture_api_gives_the_same_refusal(tiny_ckpt, make_engine) -> None:
    bus = EventBus()
    sub = bus.subscribe("t", types=["recapture_finished"])
    graphs = build_graph_config(None, {"decode.bs": [1, 2], "prefill.num_tokens": [16]})  # quick to capture
    engine = make_engine(tiny_ckpt("llama"), bus=bus, graphs=graphs)
    try:
        for _, values in BAD_LISTS:
            engine.recapture(decode_bs=values)
            engine.generate(["hi"], SamplingParams(max_new_tokens=1, ignore_eos=True))  # a step applies it
            (finished,) = [e for e in sub.drain() if isinstance(e, ev.RecaptureFinished)]
            assert not finished.ok and finished.message == f"decode buckets: {refusal(values)}"
    finally:
        engine.shutdown()


async def test_the_bucket_editor_gives_the_same_refusal() -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        editor = BucketEditorScreen([1, 2, 4], [16, 32], max_running=8, kv_capacity=4096)
        await app.push_screen(editor)
        await pilot.pause()
        for text, values in BAD_LISTS:
            editor.query_one("#decode-input", Input).value = text
            await pilot.pause()
            shown = str(editor.query_one("#decode-msg", Label).render())
            assert shown == f"✗ {refusal(values)}"
            assert editor.query_one("#confirm", Button).disabled
