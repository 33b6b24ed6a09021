"""The ``graphtop`` command line, run in-process through ``main([...])`` (plus one real console-script
run): usage errors are one stderr line and exit 2, headless runs write one result line per prompt,
and recorded traces round-trip through ``trace summary`` and ``trace export --perfetto``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.cli_support import ENGINE_ARGS, SHORT_RUN, assert_usage_error, console_script, run

from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry import events as ev
from graphtop.engine.trace_tools.trace import read_trace

pytestmark = pytest.mark.usefixtures("torch_one_thread", "private_cache_dir")

RESULT_KEYS = {"id", "prompt", "text", "token_ids", "finish_reason"}


@pytest.fixture(scope="module")
def ckpt(tiny_ckpt):
    return tiny_ckpt("llama")


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("hello world\n" + json.dumps({"prompt": "Once upon a time", "max_new_tokens": 5}) + "\n")
    return path


# --- bad checkpoints ----------------------------------------------------------------------------


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _edit_weights(folder, edit):
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _truncate(folder):
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _pickle_only(folder):
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"never unpickled")


def _no_tokenizer(folder):
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)


DAMAGE = {
    "missing-folder": (None, ["checkpoint folder not found"]),
    "no-config": (lambda f: (f / "config.json").unlink(), ["no config.json in"]),
    "malformed-config": (
        lambda f: (f / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "x": ,}'),
        ["malformed config.json"],
    ),
    "unsupported-architecture": (
        lambda f: _edit_config(f, architectures=["GPT2LMHeadModel"], model_type="gpt2"),
        ["unsupported architecture 'GPT2LMHeadModel'", "LlamaForCausalLM"],
    ),
    "pickle-only-weights": (_pickle_only, ["refusing pickle weights (pytorch_model.bin)"]),
    "truncated-safetensors": (_truncate, ["corrupt or truncated safetensors file", "model.safetensors"]),
    "missing-tensor": (
        lambda f: _edit_weights(f, lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
        ["missing tensor 'model.layers.1.mlp.up_proj.weight'"],
    ),
    "wrong-shape": (
        lambda f: _edit_weights(f, lambda t: t.__setitem__("model.norm.weight", torch.ones(63))),
        ["tensor 'model.norm.weight' has shape [63], expected [64]"],
    ),
    "missing-tokenizer": (_no_tokenizer, ["no tokenizer files"]),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_bad_checkpoint_is_one_line_exit_2(ckpt, tmp_path, prompts_file, capsys, damage):
    edit, needles = DAMAGE[damage]
    folder = tmp_path / "model"
    if edit is not None:
        shutil.copytree(ckpt, folder)
        edit(folder)
    rc, out, err = run(
        capsys, "--model", folder, "--prompts", prompts_file, "--output", tmp_path / "o.jsonl", *ENGINE_ARGS
    )
    line = assert_usage_error(rc, out, err, *needles)
    assert str(folder) in line  # names the checkpoint too
    assert not (tmp_path / "o.jsonl").exists()


def test_a_run_that_fails_to_load_keeps_an_older_trace(ckpt, tmp_path, prompts_file, capsys):
    folder = tmp_path / "model"
    shutil.copytree(ckpt, folder)
    _truncate(folder)
    trace = tmp_path / "precious.jsonl"
    trace.write_text("an older trace\n")
    rc, out, err = run(capsys, "--model", folder, "--prompts", prompts_file, "--record", trace, *ENGINE_ARGS)
    assert_usage_error(rc, out, err, "model.safetensors")
    assert trace.read_text() == "an older trace\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "precious.jsonl", "prompts.txt"]


def test_a_demo_model_that_fails_to_load_is_one_line_without_the_demo_note(tmp_path, prompts_file, capsys, caplog):
    """The demo note (random weights) is said once the model has loaded, never before a load error (on a
    terminal it was a second stderr line)."""
    from graphtop.models import DEMO_NOTE

    rc, out, err = run(capsys, "--tp", "3", "--prompts", prompts_file, "--output", tmp_path / "o.jsonl", *ENGINE_ARGS)
    assert_usage_error(rc, out, err, "--tp 3 does not divide")
    assert not (tmp_path / "o.jsonl").exists()
    assert DEMO_NOTE not in caplog.text
    rc, out, err = run(capsys, "--prompts", prompts_file, "--output", tmp_path / "o.jsonl", *SHORT_RUN)
    assert rc == 0 and DEMO_NOTE in caplog.text  # said once the model loaded


@pytest.mark.parametrize("flag,name", [("--record", "model.safetensors"), ("--output", "config.json")])
def test_outputs_never_overwrite_a_file_of_the_model(ckpt, tmp_path, prompts_file, capsys, flag, name):
    folder = tmp_path / "model"
    shutil.copytree(ckpt, folder)
    before = (folder / name).read_bytes()
    rc, out, err = run(capsys, "--model", folder, "--prompts", prompts_file, flag, folder / name, *ENGINE_ARGS)
    assert_usage_error(rc, out, err, flag, "a file of --model", "would destroy the input")
    assert (folder / name).read_bytes() == before


# --- bad prompts, outputs, options --------------------------------------------------------------


def test_empty_and_missing_prompts_file(ckpt, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    rc, out, err = run(capsys, "--model", ckpt, "--prompts", empty, "--output", tmp_path / "o.jsonl")
    assert_usage_error(rc, out, err, f"prompts file {empty} has no prompts")
    rc, out, err = run(capsys, "--model", ckpt, "--prompts", tmp_path / "nope.txt", "--output", tmp_path / "o.jsonl")
    assert_usage_error(rc, out, err, "nope.txt does not exist")


def test_unwritable_output_paths(ckpt, tmp_path, prompts_file, capsys, monkeypatch):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    cases = {
        tmp_path / "no-such-folder" / "o.jsonl": "folder",
        tmp_path / "a-dir": "is a directory",
        tmp_path / "a-file" / "o.jsonl": "is not a folder",
    }
    for target, needle in cases.items():
        rc, out, err = run(capsys, "--model", ckpt, "--prompts", prompts_file, "--output", target, *ENGINE_ARGS)
        assert_usage_error(rc, out, err, "--output", str(target), needle)
    locked_dir = tmp_path / "locked"
    locked_dir.mkdir()
    real_access = os.access
    # chmod cannot stop root, so the permission check is made to see a read-only folder
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked_dir else real_access(p, mode))
    rc, out, err = run(
        capsys, "--model", ckpt, "--prompts", prompts_file, "--output", locked_dir / "o.jsonl", *ENGINE_ARGS
    )
    assert_usage_error(rc, out, err, "is not writable")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--cuda-graph-config", "{bad json"], "cuda graph config is not valid JSON"),
        (["--cuda-graph-config", '{"decode": {"backend": "piecewise"}}'], "unknown decode.backend 'piecewise'"),
        (["--cuda-graph-config", '{"prefill": {"backend": "eager"}}'], "unknown prefill.backend 'eager'"),
        (["--cuda-graph-config", '{"decode": {"bs": [0, 1, 2]}}'], "decode.bs: '0': buckets must be ≥ 1"),
        (
            ["--cuda-graph-config", '{"prefill": {"num_tokens": [-64]}}'],
            "prefill.num_tokens: '-64': buckets must be ≥ 1",
        ),
        (["--cuda-graph-config", '{"decode": {"max_bs": 0}}'], "decode.max_bs must be positive"),
        (["--cuda-graph-bs-decode", "0,4"], "--cuda-graph-bs-decode"),
        (["--cuda-graph-max-bs-decode", "-3"], "must be positive"),
        (["--page-size", "0"], "must be positive"),
        (["--page-size", "4096", "--max-total-tokens", "2048"], "page size 4096 is larger than max total tokens 2048"),
        (["--top-k", "-1"], "bad sampling option: top_k must be an integer >= 0"),
        (["--top-p", "0"], "bad sampling option: top_p must be in (0, 1]"),
        (["--device", "cuda"] if not torch.cuda.is_available() else ["--device", "tpu"], "device"),
    ],
)
def test_bad_options_are_one_line_exit_2(ckpt, tmp_path, prompts_file, capsys, args, needle):
    # the case's options come last: for a repeated option (--device) argparse keeps the last one
    rc, out, err = run(
        capsys, "--model", ckpt, "--prompts", prompts_file, "--output", tmp_path / "o.jsonl", *ENGINE_ARGS, *args
    )
    assert_usage_error(rc, out, err, needle)


@pytest.mark.parametrize(
    "n,rate,ok", [("2", "1e-9", False), ("1001", "0.01", False), ("1", "1e-9", True), ("1001", "0.02", True)]
)
def test_synthetic_arrivals_spread_past_a_day_are_refused(ckpt, tmp_path, capsys, monkeypatch, n, rate, ok):
    import graphtop.cli.headless as headless
    from graphtop.cli.usage import UsageError

    def stop_at_load(*args):
        raise UsageError("stopped where the model loads")

    monkeypatch.setattr(headless, "_load_engine", stop_at_load)
    rc, out, err = run(
        capsys,
        "--model",
        ckpt,
        "--synthetic",
        n,
        "--synthetic-rate",
        rate,
        "--output",
        tmp_path / "o.jsonl",
        *ENGINE_ARGS,
    )
    if ok:  # within a day: the run goes on to load the model
        assert_usage_error(rc, out, err, "stopped where the model loads")
    else:
        assert_usage_error(rc, out, err, "--synthetic-rate", "at most 24 hours")


@pytest.mark.parametrize(
    "name,value",
    [
        ("GRAPHTOP_FUSED_GEMV", "of"),
        ("GRAPHTOP_FLASHINFER_DECODE", "tritn"),
        ("GRAPHTOP_FLASHINFER_PREFILL_BACKEND", "fa4"),
        ("GRAPHTOP_PDL", "yes"),
    ],
)
def test_bad_tuning_env_knob_is_one_line_exit_2(ckpt, tmp_path, prompts_file, capsys, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    rc, out, err = run(
        capsys, "--model", ckpt, "--prompts", prompts_file, "--output", tmp_path / "o.jsonl", *ENGINE_ARGS
    )
    assert_usage_error(rc, out, err, f"{name}={value!r}: use one of")
    assert not (tmp_path / "o.jsonl").exists()


def test_dashboard_mode_checks_the_model_folder_before_starting(tmp_path, capsys, monkeypatch):
    import graphtop.cli.launch as launch

    def no_dashboard(*args, **kwargs):
        raise AssertionError("the dashboard must not start for a bad --model")

    monkeypatch.setattr(launch, "run_interactive", no_dashboard)
    missing = tmp_path / "nope"
    rc, out, err = run(capsys, "--model", missing)
    assert_usage_error(rc, out, err, f"model folder {missing} does not exist")
    (tmp_path / "file").write_text("x")
    rc, out, err = run(capsys, "--model", tmp_path / "file")
    assert_usage_error(rc, out, err, "is not a folder")
    for extra in (["--synthetic", "3"], ["--output", tmp_path / "o.jsonl"], ["--model", tmp_path]):
        rc, out, err = run(capsys, "--replay", tmp_path / "t.jsonl", *extra)
        assert_usage_error(rc, out, err, "--replay opens a trace")
    rc, out, err = run(capsys, "--model", tmp_path, "--record", tmp_path / "t.jsonl")
    assert_usage_error(rc, out, err, "--record needs a workload")


# --- headless runs ------------------------------------------------------------------------------


def _read_results(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_headless_output_lines_and_malformed_prompt_lines(ckpt, tmp_path, capsys, make_engine):
    prompts = tmp_path / "p.jsonl"
    lines = [
        "hello world",  # 1: plain text
        json.dumps({"prompt": "Once upon a time", "max_new_tokens": 5, "id": "tale"}),  # 2
        '{"prompt": "broken", ',  # 3: malformed JSON
        "",  # 4: blank, skipped
        json.dumps({"prompt": "x", "colour": "red"}),  # 5: unknown field
        json.dumps({"prompt": "y", "temperature": -1}),  # 6: invalid sampling value
        json.dumps({"prompt": 42}),  # 7: prompt not a string
        json.dumps({"prompt": "The quick brown fox", "stop": ["\u0000"], "seed": 1}),  # 8
    ]
    prompts.write_text("\n".join(lines) + "\n")
    out_file = tmp_path / "out.jsonl"
    rc, out, err = run(
        capsys, "--model", ckpt, "--prompts", prompts, "--output", out_file, "--max-new-tokens", 7, *ENGINE_ARGS
    )
    assert rc == 1  # some lines failed; the run itself completed
    errors = err.strip().splitlines()
    assert [e.split(":line ")[1].split(":")[0] for e in errors] == ["3", "5", "6", "7"]
    assert all(e.startswith(f"graphtop: error: {prompts}:line ") for e in errors)
    assert "malformed JSON" in errors[0] and "colour" in errors[1] and "temperature" in errors[2]
    assert "'prompt' must be a string" in errors[3]

    results = _read_results(out_file)
    assert [r["id"] for r in results] == ["line-1", "tale", "line-3", "line-5", "line-6", "line-7", "line-8"]
    good = [results[i] for i in (0, 1, 6)]
    for r in good:
        assert set(r) == RESULT_KEYS and r["finish_reason"] in ("length", "eos")
        assert r["token_ids"] and isinstance(r["text"], str)
    assert len(results[1]["token_ids"]) <= 5 and len(results[0]["token_ids"]) <= 7
    assert [r["prompt"] for r in good] == ["hello world", "Once upon a time", "The quick brown fox"]
    for r in (results[2], results[3], results[4], results[5]):
        assert set(r) == RESULT_KEYS | {"error"} and r["finish_reason"] == "rejected" and r["token_ids"] == []
        assert r["error"].startswith("line ")

    engine = make_engine(ckpt)  # the CLI serves exactly what the API serves
    want = engine.generate(["hello world"], SamplingParams(max_new_tokens=7))[0]
    assert results[0]["token_ids"] == want.token_ids and results[0]["text"] == want.text
    assert "requests 7 (4 failed)" in out


def test_synthetic_workload(ckpt, tmp_path, capsys):
    out_file = tmp_path / "syn.jsonl"
    rc, out, err = run(
        capsys,
        "--model",
        ckpt,
        "--synthetic",
        3,
        "--synthetic-prompt-len",
        "fixed:5",
        "--synthetic-output-len",
        "fixed:4",
        "--output",
        out_file,
        *ENGINE_ARGS,
    )
    assert rc == 0 and err == ""
    results = _read_results(out_file)
    assert [r["id"] for r in results] == ["syn-0", "syn-1", "syn-2"]
    assert all(set(r) == RESULT_KEYS and len(r["token_ids"]) == 4 and r["finish_reason"] == "length" for r in results)
    rc, out, err = run(
        capsys,
        "--model",
        ckpt,
        "--synthetic",
        3,
        "--synthetic-prompt-len",
        "gaussian:1",
        "--output",
        out_file,
        *ENGINE_ARGS,
    )
    assert_usage_error(rc, out, err, "gaussian")


def test_prompts_file_with_byte_order_mark(ckpt, tmp_path, capsys):
    prompts = tmp_path / "bom.jsonl"
    prompts.write_text(
        "\ufeff" + json.dumps({"prompt": "hello", "id": "first", "max_new_tokens": 2}) + "\nbye\n", encoding="utf-8"
    )
    rc, out, err = run(capsys, "--model", ckpt, "--prompts", prompts, "--output", tmp_path / "o.jsonl", *ENGINE_ARGS)
    assert rc == 0 and err == ""
    first, second = _read_results(tmp_path / "o.jsonl")
    assert (first["id"], first["prompt"], len(first["token_ids"])) == ("first", "hello", 2)
    assert second["prompt"] == "bye"


def test_prompt_over_context_limit_is_rejected_while_others_complete(ckpt, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("short one\n" + "word " * 40 + "\nanother short one\n")
    out_file = tmp_path / "out.jsonl"
    rc, out, err = run(
        capsys,
        "--model",
        ckpt,
        "--prompts",
        prompts,
        "--output",
        out_file,
        "--max-new-tokens",
        4,
        "--max-context-len",
        24,
        *ENGINE_ARGS,
    )
    assert rc == 1 and "Traceback" not in err
    short, long_, other = _read_results(out_file)
    assert short["finish_reason"] == other["finish_reason"] == "length"
    assert len(short["token_ids"]) == len(other["token_ids"]) == 4
    assert long_["finish_reason"] == "rejected" and long_["token_ids"] == []
    assert "the context limit is 24" in long_["error"] and "tokens" in long_["error"]
    assert f"line-2: {long_['error']}" in out


def test_a_huge_prompt_line_is_rejected_by_its_bytes_before_tokenizing(ckpt, tmp_path, capsys):
    """A 50 MB line was tokenized for minutes before its rejection for length; its bytes alone say it."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("short one\n" + "once upon a time " * 300_000 + "\n")
    out_file = tmp_path / "out.jsonl"
    rc, out, err = run(
        capsys, "--model", ckpt, "--prompts", prompts, "--output", out_file, "--max-new-tokens", 2, *ENGINE_ARGS
    )
    assert rc == 1 and "Traceback" not in err
    short, huge = _read_results(out_file)
    assert short["finish_reason"] == "length"
    assert huge["finish_reason"] == "rejected" and huge["token_ids"] == []
    assert huge["error"].startswith("prompt has at least ") and huge["error"].endswith("; the context limit is 256")


def test_a_non_utf8_argument_is_recorded_so_the_trace_reads_back(ckpt, tmp_path, capsys):
    """The header held the surrogate-escaped argv; the reader refused the whole trace over it, yet the run
    exited 0 (summary, export, advise and --replay all refused the file)."""
    prompts = Path(os.fsdecode(bytes(tmp_path) + b"/p\xff.txt"))
    prompts.write_text("hello world\n")
    trace_file = tmp_path / "run.jsonl"
    rc, out, err = run(
        capsys, "--model", ckpt, "--prompts", prompts, "--record", trace_file, "--max-new-tokens", 2, *ENGINE_ARGS
    )
    assert rc == 0 and "could not summarize" not in err, err
    trace = read_trace(trace_file)
    assert trace.header.meta["workload"] == f"prompts {tmp_path}/p\\xff.txt"  # the byte, as an escape
    assert f"{tmp_path}/p\\xff.txt" in trace.header.meta["argv"]  # this call's arguments, not pytest's
    assert any(isinstance(e, ev.RequestFinished) for e in trace.events)


def test_record_then_trace_summary_and_perfetto_export(ckpt, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world\nOnce upon a time\nThe quick brown fox jumps over the lazy dog\n")
    trace_file, out_file = tmp_path / "run.trace.jsonl", tmp_path / "out.jsonl"
    rc, out, err = run(
        capsys,
        "--model",
        ckpt,
        "--prompts",
        prompts,
        "--output",
        out_file,
        "--record",
        trace_file,
        "--max-new-tokens",
        6,
        *ENGINE_ARGS,
    )
    assert rc == 0, err
    assert len(_read_results(out_file)) == 3

    trace = read_trace(trace_file)
    assert trace.header.meta["model"] == str(ckpt)
    for line in trace_file.read_text().splitlines():
        ev.validate_event_dict(json.loads(line))
    steps = [e for e in trace.events if isinstance(e, ev.StepEvent)]
    finished = [e for e in trace.events if isinstance(e, ev.RequestFinished)]
    assert steps and len(finished) == 3 and isinstance(trace.events[0], ev.EngineStarted)

    rc, out, err = run(capsys, "trace", "summary", trace_file)
    assert rc == 0 and err == ""
    assert "queued 3  finished 3" in out and "EMULATED" in out and f"{len(steps)}" in out

    perfetto = tmp_path / "run.perfetto.json"
    rc, out, err = run(capsys, "trace", "export", "--perfetto", trace_file, perfetto)
    assert rc == 0 and err == "" and f"wrote {perfetto}" in out
    exported = json.loads(perfetto.read_text())
    slices = [e for e in exported["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "step"]
    assert len(slices) == len(steps)
    assert sorted(e["args"]["step"] for e in slices) == [s.step for s in steps]

    rc, out, err = run(capsys, "trace", "summary", out_file)  # not a trace
    assert_usage_error(rc, out, err, str(out_file))
    rc, out, err = run(capsys, "trace", "export", "--perfetto", trace_file, tmp_path / "missing" / "x.json")
    assert_usage_error(rc, out, err, "OUT", "missing", "does not exist")


def test_headless_serves_while_capturing_unless_asked_to_capture_first(ckpt, tmp_path, capsys, monkeypatch):
    import graphtop.engine.graphs.model_runner as model_runner_mod

    monkeypatch.setattr(model_runner_mod, "RECAPTURE_SLICE_S", 0.0)  # one bucket per step boundary
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world\nOnce upon a time\nThe quick brown fox jumps over the lazy dog\n")
    runs = {}
    for flags in ((), ("--capture-before-serving",)):
        out_file, trace_file = tmp_path / f"out{len(flags)}.jsonl", tmp_path / f"trace{len(flags)}.jsonl"
        rc, out, err = run(
            capsys,
            "--model",
            ckpt,
            "--prompts",
            prompts,
            "--output",
            out_file,
            "--record",
            trace_file,
            "--max-new-tokens",
            12,
            *ENGINE_ARGS,
            *flags,
        )
        assert rc == 0, err
        steps = [e for e in read_trace(trace_file).events if isinstance(e, ev.StepEvent)]
        runs[flags] = ([r["token_ids"] for r in _read_results(out_file)], {s.fallback_reason for s in steps})
    (tokens, reasons), (strict_tokens, strict_reasons) = runs[()], runs[("--capture-before-serving",)]
    assert tokens == strict_tokens and all(len(t) == 12 for t in tokens)
    assert "not_yet_captured" in reasons and None in reasons  # eager until each bucket is live, then graphs
    assert strict_reasons == {None}


# --- the real console script ---------------------------------------------------------------------


def test_console_script_usage_error_is_one_line_without_traceback(tmp_path, prompts_file):
    script = console_script()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    missing = tmp_path / "no-such-model"
    proc = subprocess.run(
        [
            str(script),
            "--model",
            str(missing),
            "--prompts",
            str(prompts_file),
            "--output",
            str(tmp_path / "o.jsonl"),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"graphtop: error: checkpoint folder not found: {missing}"]
    assert proc.stdout == ""
