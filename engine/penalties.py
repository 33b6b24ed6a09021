"""What the sampler does to a row's logits before it picks a token: the logit bias, the min_tokens mask,
and the repetition, presence and frequency penalties, in vLLM's order and with its formulas.

Only rows whose ``SamplingParams.processed`` is true come here (the neutral values change nothing, so
their rows keep the fast path: the decode graph's own argmax and the overlap schedule). The rows are
processed together: each kind of input (bias entries, masked ids, output and prompt token ids) is one
flat list of (row, token id) pairs built on the host, moved in one host-to-device copy with the others,
and applied by one ``index_put_``; no per-row tensor op and no ``.item()``.

- logit bias: ``x[t] += bias`` (OpenAI's ``logit_bias``, -100 to 100);
- min_tokens: until a request has that many tokens, the tokens that would end it (its stop token ids, and
  the end-of-sequence ids unless it ignores them) are -inf;
- repetition penalty (HF / vLLM): a token seen in the prompt or the output so far has its logit divided
  by the penalty when positive and multiplied by it when negative;
- frequency and presence penalties (OpenAI): ``x[t] -= frequency * count(t) + presence * (count(t) > 0)``
  over the output so far.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch

from .request import Request


def _prompt_vocab(req: Request) -> list[int]:
    """The prompt's distinct token ids, made once per request (the repetition penalty reads them every step)."""
    if req.prompt_vocab is None:
        req.prompt_vocab = sorted(set(req.prompt_ids))
    return req.prompt_vocab


def process_rows(x: torch.Tensor, requests: Sequence[Request], eos_ids: frozenset[int]) -> torch.Tensor:
    """``x`` [n, vocab] float32, row ``i`` the logits of ``requests[i]`` (a fresh tensor: it is changed in
    place); returns the processed logits."""
    n, vocab = x.shape
    bias_rows: list[int] = []
    bias_ids: list[int] = []
    biases: list[float] = []
    mask_rows: list[int] = []
    mask_ids: list[int] = []
    out_rows: list[int] = []
    out_ids: list[int] = []
    seen_rows: list[int] = []
    seen_ids: list[int] = []
    table: list[float] = []  # per row: repetition, frequency, presence
    penalised = repeated = False
    for i, req in enumerate(requests):
        p = req.params
        if p.logit_bias:
            bias_rows.extend(itertools.repeat(i, len(p.logit_bias)))
            bias_ids.extend(t for t, _ in p.logit_bias)
            biases.extend(b for _, b in p.logit_bias)
        if p.min_tokens and len(req.output_ids) < p.min_tokens:
            ends = set(p.stop_token_ids) if p.ignore_eos else eos_ids.union(p.stop_token_ids)
            mask_rows.extend(itertools.repeat(i, len(ends)))
            mask_ids.extend(ends)
        table += (p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
        if p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
            penalised = True
            out_rows.extend(itertools.repeat(i, len(req.output_ids)))
            out_ids.extend(req.output_ids)
            if p.repetition_penalty != 1.0:
                repeated = True
                vocab_ids = _prompt_vocab(req)
                seen_rows.extend(itertools.repeat(i, len(vocab_ids)))
                seen_ids.extend(vocab_ids)
    dev = x.device
    parts = [bias_rows, bias_ids, mask_rows, mask_ids, out_rows, out_ids, seen_rows, seen_ids]
    ints = _upload(list(itertools.chain.from_iterable(parts)), torch.int64, dev)
    rb, ib, rm, im, ro, io, rs, is_ = torch.split(ints, [len(part) for part in parts])
    floats = _upload(biases + table, torch.float32, dev)
    if biases:
        x.index_put_((rb, ib), floats[: len(biases)], accumulate=True)
    if mask_ids:
        x.index_put_((rm, im), torch.tensor(-math.inf, device=dev))
    if not penalised:
        return x
    pen = floats[len(biases) :].view(n, 3)
    counts = torch.zeros(n, vocab, dtype=torch.float32, device=dev)
    # a token still in flight under the overlap schedule stands as -1: it counts for nothing
    real = (io >= 0).float()
    counts.index_put_((ro, io.clamp(min=0)), real, accumulate=True)
    generated = counts > 0
    if repeated:
        seen = generated.clone()
        seen.index_put_((rs, is_), torch.tensor(True, device=dev))
        rep = pen[:, 0:1]
        x = x * torch.where(seen, torch.where(x > 0, 1.0 / rep, rep), torch.ones((), device=dev))
    return x - pen[:, 1:2] * counts - pen[:, 2:3] * generated.float()


def _upload(values: list[Any], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One non-blocking host-to-device copy (a blocking one would wait for the step's forward)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)
