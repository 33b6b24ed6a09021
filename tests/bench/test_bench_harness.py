"""bench/harness.py: the floor's arithmetic on tiny models of both embedding kinds, the engines' settings,
interleaved rounds, and the output helpers every benchmark reports through."""

from __future__ import annotations

import argparse

import harness
import pytest
import torch

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
)


def tiny_model(shape: str):
    return harness.random_ckpt(shape, device="cpu", dtype=torch.float32, **TINY).model


def weight_count(qk_norm: bool, tied: bool) -> int:
    """Parameters of a TINY decoder, from its config alone."""
    h, i, heads, kv, hd, vocab = (
        TINY[k]
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
        )
    )
    attention = h * (heads + 2 * kv) * hd + heads * hd * h + (2 * hd if qk_norm else 0)
    layer = attention + 3 * h * i + 2 * h
    return vocab * h * (1 if tied else 2) + TINY["num_hidden_layers"] * layer + h


KV_PER_TOKEN = 2 * TINY["num_hidden_layers"] * TINY["num_key_value_heads"] * TINY["head_dim"] * 4  # fp32


def test_a_tied_embedding_counts_whole_and_every_context_token_reads_its_kv():
    model = tiny_model("qwen3-0.6b")
    assert model.spec.tie_word_embeddings
    assert harness.kv_bytes_per_token(model.spec, 4) == KV_PER_TOKEN
    weights = 4 * weight_count(qk_norm=True, tied=True)
    assert harness.decode_bytes(model, [10, 20]) == weights + 30 * KV_PER_TOKEN
    assert harness.decode_bytes(model, [30]) == harness.decode_bytes(model, [10, 20])  # rows cost nothing apart


def test_an_untied_embedding_counts_one_row_a_request():
    model = tiny_model("llama-3.1-8b")
    assert not model.spec.tie_word_embeddings
    row = 4 * TINY["hidden_size"]
    everything_but_embed = 4 * (weight_count(qk_norm=False, tied=False) - TINY["vocab_size"] * TINY["hidden_size"])
    assert harness.decode_bytes(model, [10, 20]) == everything_but_embed + 2 * row + 30 * KV_PER_TOKEN
    assert harness.decode_bytes(model, [10, 20, 0]) - harness.decode_bytes(model, [10, 20]) == row


def test_the_floor_is_the_bytes_over_the_bandwidth_in_ms():
    model = tiny_model("llama-3.1-8b")
    contexts = [100, 200, 300]
    assert harness.floor_ms(model, contexts, 1e9) == pytest.approx(harness.decode_bytes(model, contexts) / 1e6)
    assert harness.floor_ms(model, contexts, 2e9) == pytest.approx(harness.floor_ms(model, contexts, 1e9) / 2)


def test_engine_config_sizes_the_pool_for_every_row_and_turns_graphs_off_on_request():
    cfg = harness.engine_config(device="cpu", max_running=4, longest_context=1000)
    assert cfg.max_total_tokens == 4 * 1008 + 4096 and cfg.dtype == "float32" and cfg.capture_before_serving
    assert harness.engine_config(device="cpu", max_running=4).max_total_tokens == 4 * 400 + 4096  # at least 400
    assert harness.engine_config(device="cuda").dtype == "bfloat16"
    eager = harness.engine_config(device="cpu", graphs=False).graphs
    assert (eager.decode_backend, eager.prefill_backend) == ("disabled", "disabled")
    decode_only = harness.engine_config(device="cpu", prefill_graphs=False, decode_bs=[8]).graphs
    assert (decode_only.decode_backend, decode_only.prefill_backend, decode_only.decode_bs) == ("full", "disabled", [8])
    assert harness.engine_config(device="cpu", page_size=4).page_size == 4  # an override wins


def test_a_context_past_the_benchmark_is_refused_in_one_line(capsys):
    ap = argparse.ArgumentParser(prog="bench")
    harness.refuse_past_context(ap, harness.MAX_CONTEXT - 2, "a run")  # the last that fits
    with pytest.raises(SystemExit) as exit_:
        harness.refuse_past_context(ap, harness.MAX_CONTEXT, "a run")
    assert exit_.value.code == 2
    assert f"a run reach {harness.MAX_CONTEXT} tokens" in capsys.readouterr().err


@pytest.mark.parametrize("abba,order", [(False, "ababab"), (True, "abbaab")])
def test_interleaved_rounds_take_turns(abba, order):
    calls: list[str] = []
    seen: list[int] = []

    def contestant(name: str, figure: float):
        return lambda: calls.append(name) or figure

    figures = harness.interleaved(
        {"a": contestant("a", 1.0), "b": contestant("b", 2.0)},
        3,
        abba=abba,
        on_round=lambda r, f: seen.append(len(f["b"])),
    )
    assert "".join(calls) == order
    assert figures == {"a": [1.0] * 3, "b": [2.0] * 3}
    assert seen == [1, 2, 3]
    assert harness.medians({"x": [3.0, 1.0, 2.0]}) == {"x": 2.0}


def test_events_overhead_times_both_sides_and_leaves_the_engine_idle(tiny_ckpt, make_engine):
    eng = make_engine(tiny_ckpt("llama"))
    result = harness.events_overhead(eng, 2, 3, 2, lambda: None)
    assert result["ratio"] == pytest.approx(result["on_ms"] / result["off_ms"])
    assert result["on_ms"] > 0 and result["off_ms"] > 0
    assert eng.pool.used_pages == 0 and not eng.scheduler.running


def test_output_helpers(tmp_path):
    assert harness.comma_ints("1,,8, 64") == [1, 8, 64] and harness.comma_ints("") == []
    assert (harness.fmt(None), harness.fmt(1.23456), harness.fmt(2.5, ".1f")) == ("–", "1.235", "2.5")
    assert (harness.ratio(3.0, 2.0), harness.ratio(None, 2.0), harness.ratio(1.0, 0)) == ("1.50×", "–", "–")
    assert harness.md_table(["a", "b"], [[1, "x"]]).splitlines() == ["| a | b |", "|---|---|", "| 1 | x |"]
    assert harness.percentile([], 50) is None and harness.percentile([7.0], 99) == 7.0
    assert (harness.percentile([4, 1, 3, 2], 50), harness.percentile(range(101), 99)) == (2.5, 99)
    path = harness.write_json(tmp_path / "new", "r.json", {"k": [1]})
    assert path == tmp_path / "new" / "r.json" and path.read_text().startswith("{")
