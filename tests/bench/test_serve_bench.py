"""bench/serve_bench.py runs end to end on CPU: the same workload through the HTTP API and the Python API,
both reports complete and the two paths make the same tokens."""

from __future__ import annotations

import json

import serve_bench  # noqa: E402  (bench/ is on pytest's pythonpath)


def test_the_serve_benchmark_runs_both_paths_on_cpu(tiny_ckpt, tmp_path, capsys, torch_one_thread) -> None:
    out = tmp_path / "bench.json"
    rc = serve_bench.main(
        [
            "--model",
            str(tiny_ckpt("qwen3")),
            "--device",
            "cpu",
            "--requests",
            "6",
            "--rate",
            "50",
            "--prompt-len",
            "uniform:4:24",
            "--output-len",
            "fixed:5",
            "--warmup",
            "1",
            "--max-running-requests",
            "8",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["http"]["output_tokens"] == data["python_api"]["output_tokens"] == 30
    assert data["http"]["requests"] == data["python_api"]["requests"] == 6
    assert data["ratio"]["tokens_per_s"] > 0
    printed = capsys.readouterr().out
    assert "HTTP ÷ Python API: throughput" in printed and "python-api" in printed


def test_random_weights_stream_a_chunk_a_token_over_http(tmp_path, capsys, torch_one_thread) -> None:
    """--shape serves random weights, whose tokenizer stands in with ids: each token still decodes to text, so
    the HTTP client sees every token arrive (its first arrival is the TTFT) and both paths report."""
    out = tmp_path / "bench.json"
    argv = ["--shape", "tiny", "--device", "cpu", "--requests", "3", "--rate", "0", "--prompt-len", "fixed:8"]
    assert serve_bench.main(argv + ["--output-len", "fixed:4", "--warmup", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["http"]["output_tokens"] == data["python_api"]["output_tokens"] == 12
    assert data["http"]["ttft_p50_ms"] > 0 and data["http"]["itl_p50_ms"] > 0
