"""Crash-safe batch output: --output keeps each result on disk as its request finishes, so a run killed
with kill -9 keeps every finished result, and --resume runs only the rest; a finished run's OUT holds
every result in request order. OUT written as before otherwise: an older one stays until this run has a
result, and a resume refuses an OUT that is not this prompts file's."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from support.cli_support import ENGINE_ARGS, assert_usage_error, console_script, run

pytestmark = pytest.mark.usefixtures("torch_one_thread", "private_cache_dir")

# One request at a time: every request decodes alone, so its greedy tokens do not depend on which others
# shared its steps, and a resumed run's results can be compared with an uninterrupted run's exactly.
BATCH = [*ENGINE_ARGS, "--max-running-requests", "1", "--max-new-tokens", "16", "--disable-cuda-graph"]


@pytest.fixture(scope="module")
def ckpt(tiny_ckpt):
    return tiny_ckpt("llama")


def _prompts(tmp_path, n):
    path = tmp_path / "p.txt"
    path.write_text("".join(f"request {i}: once upon a time\n" for i in range(1, n + 1)))
    return path


def _complete_lines(path):
    """The results of OUT, each a whole line (a kill may cut only the last one short)."""
    data = Path(path).read_bytes()
    return [json.loads(line) for line in data.split(b"\n")[:-1]]


def test_a_run_killed_with_sigkill_keeps_every_finished_result_and_resume_completes_it(ckpt, tmp_path, capsys):
    prompts = _prompts(tmp_path, 200)
    out_file = tmp_path / "out.jsonl"
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [str(console_script()), "--model", str(ckpt), "--prompts", str(prompts), "--output", str(out_file), *BATCH],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        deadline = time.monotonic() + 240
        while not (out_file.exists() and out_file.read_bytes().count(b"\n") >= 50):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.01)
        proc.kill()  # SIGKILL: no clean-up of any kind runs
        proc.wait(60)
    finally:
        proc.kill()
        proc.stderr.close()
    survived = _complete_lines(out_file)
    assert 50 <= len(survived) < 200  # every result written before the kill is there, whole
    assert all(r["finish_reason"] == "length" and len(r["token_ids"]) == 16 for r in survived)

    rc, out, err = run(capsys, "--model", ckpt, "--prompts", prompts, "--output", out_file, "--resume", *BATCH)
    assert rc == 0, err
    assert out.startswith(f"requests {200 - len(survived)} (0 failed)")  # only the rest ran
    assert f"resumed: {len(survived)} results were already in {out_file}" in out
    resumed = _complete_lines(out_file)
    assert [r["id"] for r in resumed] == [f"line-{i}" for i in range(1, 201)]  # request order at the end
    assert [r for r in resumed if r["id"] in {s["id"] for s in survived}] == sorted(
        survived, key=lambda r: int(r["id"].split("-")[1])
    )  # the killed run's results, as they were

    rc, _, err = run(capsys, "--model", ckpt, "--prompts", prompts, "--output", tmp_path / "whole.jsonl", *BATCH)
    assert rc == 0, err
    whole = _complete_lines(tmp_path / "whole.jsonl")
    assert [(r["id"], r["text"], r["token_ids"]) for r in resumed] == [
        (r["id"], r["text"], r["token_ids"]) for r in whole
    ]


def _result(rid, prompt, reason="length"):
    return {"id": rid, "prompt": prompt, "text": " x", "token_ids": [5], "finish_reason": reason}


def test_resume_drops_a_cut_line_and_redoes_cancelled_requests(ckpt, tmp_path, capsys):
    prompts = _prompts(tmp_path, 4)
    out_file = tmp_path / "out.jsonl"
    kept = _result("line-2", "request 2: once upon a time")
    out_file.write_text(
        json.dumps(kept)
        + "\n"
        + json.dumps(_result("line-3", "request 3: once upon a time", "cancelled"))
        + '\n{"id": "line-1", "pro'
    )
    rc, out, err = run(capsys, "--model", ckpt, "--prompts", prompts, "--output", out_file, "--resume", *BATCH)
    assert rc == 0, err
    results = _complete_lines(out_file)
    assert [r["id"] for r in results] == ["line-1", "line-2", "line-3", "line-4"]
    assert results[1] == kept  # kept as it was, not run again
    assert results[2]["finish_reason"] == "length" and len(results[2]["token_ids"]) == 16
    assert out.startswith("requests 3 (0 failed)")


def test_an_interrupted_resume_says_what_out_holds(ckpt, tmp_path, capsys, monkeypatch):
    import signal

    from graphtop.engine.step.loop import StepLoop

    prompts = _prompts(tmp_path, 3)
    out_file = tmp_path / "out.jsonl"
    kept = _result("line-2", "request 2: once upon a time")
    out_file.write_text(json.dumps(kept) + "\n")
    real_step = StepLoop.step

    def step(self):  # Ctrl-C at the first step: nothing of this run has finished
        os.kill(os.getpid(), signal.SIGINT)
        return real_step(self)

    monkeypatch.setattr(StepLoop, "step", step)
    rc, _, err = run(capsys, "--model", ckpt, "--prompts", prompts, "--output", out_file, "--resume", *BATCH)
    assert rc == 130
    assert err.splitlines() == [
        f"graphtop: interrupted: 1 of 3 results written to {out_file} (1 of them by an "
        "earlier run; --resume finishes it)"
    ]
    assert _complete_lines(out_file) == [kept]


def test_resume_without_an_output_yet_runs_everything(ckpt, tmp_path, capsys):
    prompts = _prompts(tmp_path, 2)
    rc, out, err = run(
        capsys, "--model", ckpt, "--prompts", prompts, "--output", tmp_path / "o.jsonl", "--resume", *BATCH
    )
    assert rc == 0, err
    assert [r["id"] for r in _complete_lines(tmp_path / "o.jsonl")] == ["line-1", "line-2"]


@pytest.mark.parametrize(
    "content,needle",
    [
        (json.dumps(_result("elsewhere", "hello")) + "\n", "has id 'elsewhere', which no line of"),
        (json.dumps(_result("line-1", "another prompt")) + "\n", "has another prompt than line 1 of"),
        ((json.dumps(_result("line-1", "request 1: once upon a time")) + "\n") * 2, "two results for id 'line-1'"),
        (
            "not json at all\n" + json.dumps(_result("line-1", "request 1: once upon a time")) + "\n",
            "line 1 of {out} is not a graphtop result (not JSON)",
        ),
        ('{"id": "line-1"}\n', "is not a graphtop result (no 'text' and 'token_ids')"),
    ],
)
def test_resume_refuses_an_output_of_other_prompts(ckpt, tmp_path, capsys, content, needle):
    prompts = _prompts(tmp_path, 2)
    out_file = tmp_path / "out.jsonl"
    out_file.write_text(content)
    rc, out, err = run(capsys, "--model", ckpt, "--prompts", prompts, "--output", out_file, "--resume", *BATCH)
    assert_usage_error(rc, out, err, "--resume", needle.format(out=out_file))
    assert out_file.read_text() == content  # refused before anything was written


def test_resume_needs_a_prompts_run_with_a_regular_output(ckpt, tmp_path, capsys):
    rc, out, err = run(
        capsys, "--model", ckpt, "--synthetic", "2", "--output", tmp_path / "o.jsonl", "--resume", *BATCH
    )
    assert_usage_error(rc, out, err, "--resume finishes a --prompts FILE --output OUT.jsonl run")
    rc, out, err = run(
        capsys, "--model", ckpt, "--prompts", _prompts(tmp_path, 1), "--output", os.devnull, "--resume", *BATCH
    )
    assert_usage_error(
        rc, out, err, f"--resume reads back and appends to --output {os.devnull}", "must be a regular file"
    )


def test_results_are_on_disk_while_the_run_goes_on(ckpt, tmp_path, capsys, monkeypatch):
    """Each result is in OUT when the next step runs (it was written only at the end of the run)."""
    from graphtop.engine.step.loop import StepLoop

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"id": i, "prompt": "hello", "max_new_tokens": n}) for i, n in [("short", 1), ("long", 8)])
        + "\n"
    )
    out_file = tmp_path / "out.jsonl"
    out_file.write_text("an older run's results\n")
    seen = []
    real_step = StepLoop.step

    def step(self):
        seen.append(out_file.read_text())
        return real_step(self)

    monkeypatch.setattr(StepLoop, "step", step)
    rc, _, err = run(
        capsys,
        "--model",
        ckpt,
        "--prompts",
        prompts,
        "--output",
        out_file,
        "--max-running-requests",
        "1",
        *ENGINE_ARGS,
        "--disable-cuda-graph",
    )
    assert rc == 0, err
    assert seen[0] == "an older run's results\n"  # until a result is written, the older file stays
    during = [[json.loads(line)["id"] for line in s.splitlines()] for s in seen if s.startswith("{")]
    assert ["short"] in during  # "short" on disk while "long" was still decoding
    assert [r["id"] for r in _complete_lines(out_file)] == ["short", "long"]
