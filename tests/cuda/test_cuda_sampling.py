"""GPU tests (``-m cuda``) of the sampler's extras under real CUDA graphs: log-probabilities of generated and
prompt tokens equal transformers' fp32 log-softmax; a processed row (penalties, bias, logprobs) decodes in
the graph batch beside plain rows without changing their tokens; neutral values keep the overlap schedule."""

from __future__ import annotations

import pytest
import torch

from graphtop.engine.config import EngineConfig
from graphtop.engine.engine import Engine
from graphtop.engine.graphs.config import GraphConfig
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry.bus import EventBus

TOL = 1e-3
"""fp32 on the GPU against transformers' fp32 on the CPU: summation order and kernels differ."""


def _engine(ckpt, dtype: str, **kw) -> Engine:
    cfg = EngineConfig(
        device="cuda",
        dtype=dtype,
        attention_backend="torch",
        max_context_len=1024,
        max_total_tokens=32 * 1024,
        chunked_prefill_size=64,
        graphs=GraphConfig(decode_bs=[1, 2, 4, 8], prefill_num_tokens=[16, 32, 64]),
        capture_before_serving=True,
        **kw,
    )
    return Engine(ckpt, cfg, EventBus())


def test_logprobs_equal_transformers_under_cuda_graphs(tmp_path) -> None:
    from support.tiny_models import build_tiny_checkpoint
    from transformers import AutoModelForCausalLM

    folder = build_tiny_checkpoint(tmp_path, "llama")
    engine = Engine.from_pretrained(
        folder,
        config=EngineConfig(
            device="cuda",
            dtype="float32",
            attention_backend="torch",
            max_total_tokens=8192,
            chunked_prefill_size=64,
            graphs=GraphConfig(decode_bs=[1, 2, 4], prefill_num_tokens=[16, 32, 64]),
            capture_before_serving=True,
        ),
    )
    prompt = list(range(20, 120))  # two prefill chunks
    h = engine.submit(prompt, SamplingParams(max_new_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2))
    engine.run_until_idle()
    engine.close()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([prompt + h.token_ids])).logits[0], dim=-1)
    for j, e in enumerate(h.prompt_logprobs):
        assert e.token == prompt[j + 1] and abs(e.logprob - ref[j, e.token].item()) < TOL
        assert [t for t, _ in e.top][:1] == ref[j].topk(1).indices.tolist()
    for j, e in enumerate(h.logprobs):
        row = ref[len(prompt) - 1 + j]
        assert abs(e.logprob - row[e.token].item()) < TOL and e.token == row.argmax().item()
        assert max(abs(v - w) for (_, v), w in zip(e.top, row.topk(3).values.tolist())) < TOL


@pytest.fixture(scope="module")
def qwen3_shape():
    from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint

    return random_checkpoint(hf_config_for("qwen3-0.6b"), device="cuda", dtype=torch.bfloat16)


def _batch(engine: Engine, last: SamplingParams) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 5000, (40,), generator=g).tolist() for _ in range(4)]
    plain = SamplingParams(max_new_tokens=16, ignore_eos=True)
    handles = [engine.submit(p, plain) for p in prompts[:3]] + [engine.submit(prompts[3], last)]
    engine.run_until_idle()
    return [h.token_ids for h in handles]


def test_processed_rows_decode_in_graphs_beside_plain_rows(qwen3_shape) -> None:
    engine = _engine(qwen3_shape, "bfloat16")
    plain = SamplingParams(max_new_tokens=16, ignore_eos=True)
    steps = engine.bus.subscribe("steps", types=["step"])
    want = _batch(engine, plain)
    chained = engine.loop.overlapped_steps
    assert chained > 0
    neutral = plain.replace(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, logit_bias={})
    assert _batch(engine, neutral) == want and engine.loop.overlapped_steps > chained
    for special in (
        plain.replace(logit_bias={777: 100.0}),
        plain.replace(repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.5, logprobs=2),
        plain.replace(temperature=0.8, top_k=20, min_p=0.05, seed=3),
    ):
        before = engine.loop.overlapped_steps
        got = _batch(engine, special)
        assert got[:3] == want[:3]  # the plain rows' tokens do not depend on their neighbour's processing
        assert engine.loop.overlapped_steps == before  # a processed row needs the sampler every step
        if special.logit_bias:
            assert got[3] == [777] * 16
        if special.repetition_penalty != 1.0:
            assert got[3] != want[3]
    decode = [e.path for e in steps.drain() if e.phase == "decode"]
    assert decode and set(decode) == {"graph"}  # every decode step replayed a graph
    engine.close()
