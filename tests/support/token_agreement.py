"""Teacher-forced greedy comparison of two engine configurations (used by the ``cuda`` tests).

The reference engine generates greedily; the engine under test is fed the reference's tokens (its
``sample_step`` is swapped for a recorder) and only its own greedy prediction at every position is compared,
so one near-tie flip costs one token, not the rest of the sequence. Random-weight models have bf16
logits whose top two are often within an ulp, so a flip whose reference margin is within ``TIE_ULPS``
bf16 ulps counts as a tie (bounded separately by a strict floor); the logits must also agree.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from graphtop.engine.sampler import Sampled

TIE_ULPS = 3


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _bf16_ulp(x: float) -> float:
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0**-133


class Recorder:
    """Stands in for the step loop's ``sample_step``: records each greedy prediction, its top-8 and the
    logits row; returns the prediction (reference run) or the reference's token (teacher forcing)."""

    def __init__(self, reference: Optional["Recorder"] = None):
        self.reference = reference
        self.preds: dict[str, list[int]] = {}
        self.top: dict[str, list[tuple[list[float], list[int]]]] = {}
        self.rows: dict[str, list[torch.Tensor]] = {}
        self.rel_errs: list[float] = []

    def __call__(self, logits: torch.Tensor, requests: list[Any], *_: Any) -> Sampled:
        logits = logits.float()
        vals, idx = torch.topk(logits, 8, dim=-1)
        vals_l, idx_l = vals.tolist(), idx.tolist()
        out = []
        for i, req in enumerate(requests):
            rid, j = req.request_id, len(req.output_ids)
            pred = idx_l[i][0]
            self.preds.setdefault(rid, []).append(pred)
            self.top.setdefault(rid, []).append((vals_l[i], idx_l[i]))
            if self.reference is None:
                self.rows.setdefault(rid, []).append(logits[i].clone())
                out.append(pred)
            else:
                self.rel_errs.append(_rel(logits[i], self.reference.rows[rid][j]))
                out.append(self.reference.preds[rid][j])
        return Sampled(out)


def agreement(ref: Recorder, got: Recorder) -> tuple[float, float, list[tuple]]:
    """(strict, tie-aware) fraction of positions whose greedy token equals the reference's, and misses."""
    strict = ties = total = 0
    misses = []
    for rid, want in ref.preds.items():
        have = got.preds[rid]
        assert len(have) == len(want), (rid, len(have), len(want))
        for j, (a, b) in enumerate(zip(want, have)):
            total += 1
            if a == b:
                strict += 1
                continue
            vals, idx = ref.top[rid][j]
            gap = vals[0] - vals[idx.index(b)] if b in idx else math.inf
            if gap <= TIE_ULPS * _bf16_ulp(vals[0]):
                ties += 1
            else:
                misses.append((rid, j, a, b, gap))
    return strict / total, (strict + ties) / total, misses


def serve(engine: Any, prompts: list[list[int]], max_new: list[int], recorder: Recorder, monkeypatch) -> None:
    import graphtop.engine.step.loop as engine_mod  # where the step samples
    from graphtop.engine.sampling_params import SamplingParams

    monkeypatch.setattr(engine_mod, "sample_step", recorder)
    engine.overlap_schedule = False  # teacher forcing feeds tokens through sample_step(): the host path
    for i, (p, m) in enumerate(zip(prompts, max_new)):
        engine.submit(p, SamplingParams(max_new_tokens=m, ignore_eos=True, detokenize=False), request_id=f"r{i}")
    engine.run_until_idle()
    assert engine.pool.used_pages == 0


def _assert_agree(ref: Recorder, got: Recorder, what: str, logits_tol: float) -> None:
    strict, tie_aware, misses = agreement(ref, got)
    mean_rel = sum(got.rel_errs) / len(got.rel_errs)
    detail = (
        f"{what}: strict {strict:.4f}, tie-aware {tie_aware:.4f}, logits rel err mean {mean_rel:.3g} "
        f"max {max(got.rel_errs):.3g}, misses (rid, pos, want, got, ref margin) {misses[:8]}"
    )
    print(detail)
    assert tie_aware >= 0.99, detail
    assert strict >= 0.85, detail
    assert mean_rel <= logits_tol, detail
