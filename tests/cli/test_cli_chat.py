"""Headless chat: ``--chat``, a line's ``"chat"`` and ``"messages"`` send prompts through the model's chat
template (an Instruct model answered a bare question with empty text: its prompt had no template)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.cli_support import ENGINE_ARGS, assert_usage_error, run

pytestmark = pytest.mark.usefixtures("torch_one_thread", "private_cache_dir")

QUESTION = "What is the capital of France?"
CONVERSATION = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": QUESTION}]
RUN = [*ENGINE_ARGS, "--max-new-tokens", "6", "--disable-cuda-graph"]


def _results(path):
    return {r["id"]: r for r in map(json.loads, Path(path).read_text().splitlines())}


def _write(path, *lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_chat_lines_go_through_the_demo_models_chat_template(tmp_path, capsys):
    from graphtop.engine import Engine, EngineConfig
    from graphtop.engine.sampling_params import SamplingParams

    prompts = _write(
        tmp_path / "p.jsonl",
        {"id": "plain", "prompt": QUESTION},
        {"id": "chat", "prompt": QUESTION, "chat": True},
        {"id": "conversation", "messages": CONVERSATION},
    )
    rc, _, err = run(capsys, "--prompts", prompts, "--output", tmp_path / "o.jsonl", *RUN)
    assert rc == 0, err
    got = _results(tmp_path / "o.jsonl")
    by_flag = _write(tmp_path / "flag.txt", QUESTION, json.dumps({"id": "opt-out", "prompt": QUESTION, "chat": False}))
    rc, _, err = run(capsys, "--prompts", by_flag, "--output", tmp_path / "flag.jsonl", "--chat", *RUN)
    assert rc == 0, err
    flagged = _results(tmp_path / "flag.jsonl")

    engine = Engine.from_pretrained(
        None, EngineConfig(device="cpu", max_total_tokens=2048, max_running_requests=4, chunked_prefill_size=64)
    )
    try:
        tok = engine.tokenizer
        assert tok.chat_template  # the demo tokenizer has the ChatML template

        def template_ids(messages):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

        want = engine.generate(
            [tok.encode(QUESTION), template_ids([{"role": "user", "content": QUESTION}]), template_ids(CONVERSATION)],
            SamplingParams(max_new_tokens=6),
        )
    finally:
        engine.close()
    plain, chat, conversation = (h.token_ids for h in want)
    assert chat != plain  # the template changes what this model says: the comparisons below tell them apart
    assert got["plain"]["token_ids"] == plain and got["chat"]["token_ids"] == chat
    assert got["conversation"]["token_ids"] == conversation
    assert got["chat"]["prompt"] == QUESTION  # the line's text; a conversation shows what the template made of it
    assert got["conversation"]["prompt"].startswith("<|im_start|>system\nAnswer in one word.<|im_end|>")
    assert flagged["line-1"]["token_ids"] == chat and flagged["opt-out"]["token_ids"] == plain


def test_a_bad_conversation_line_is_rejected_alone(tiny_ckpt, tmp_path, capsys):
    prompts = _write(
        tmp_path / "p.jsonl",
        {"id": "ok", "messages": CONVERSATION},
        {"id": "bad", "messages": [{"role": "robot", "content": "hi"}]},
    )
    rc, out, err = run(
        capsys, "--model", tiny_ckpt("llama"), "--prompts", prompts, "--output", tmp_path / "o.jsonl", *RUN
    )
    assert rc == 1
    got = _results(tmp_path / "o.jsonl")
    assert got["ok"]["finish_reason"] == "length" and len(got["ok"]["token_ids"]) == 6
    assert got["line-2"]["finish_reason"] == "rejected"  # a rejected line's result goes by its line number
    assert got["line-2"]["error"].startswith("line 2: message #0: 'role' must be one of system, user, assistant")
    assert "p.jsonl:line 2: message #0: 'role'" in err


@pytest.fixture
def no_template_model(tiny_ckpt, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_ckpt("llama"), folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_chat_for_a_model_without_a_chat_template(no_template_model, tmp_path, capsys):
    prompts = _write(
        tmp_path / "p.jsonl",
        {"id": "plain", "prompt": QUESTION},
        {"id": "chat", "prompt": QUESTION, "chat": True},
        {"id": "conversation", "messages": CONVERSATION},
    )
    out_file = tmp_path / "o.jsonl"
    rc, out, err = run(capsys, "--model", no_template_model, "--prompts", prompts, "--output", out_file, "--chat", *RUN)
    assert_usage_error(rc, out, err, "--chat: the model has no chat template")
    assert not out_file.exists()
    rc, out, err = run(capsys, "--model", no_template_model, "--prompts", prompts, "--output", out_file, *RUN)
    assert rc == 1
    got = _results(out_file)
    assert got["plain"]["finish_reason"] == "length"
    assert got["chat"]["error"] == 'line 2: "chat": true, but the model has no chat template'
    assert got["conversation"]["error"] == "the model has no chat template: a conversation ('messages') needs one"


@pytest.mark.parametrize("argv", [["--synthetic", "2"], []])
def test_chat_needs_prompt_lines(tmp_path, capsys, argv):
    rc, out, err = run(capsys, "--chat", *argv, *ENGINE_ARGS)
    assert_usage_error(rc, out, err, "--chat applies to the lines of --prompts FILE")
