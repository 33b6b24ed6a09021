"""The path that always works: exact-size tensors, no padding, attention metadata built per step.

On CUDA a step's GPU time is taken with two CUDA events around it and read after the step's own sync,
never with one of its own: with the graphs' replay times it gives every step's GPU time, so the share
of wall time the GPU waited is measurable while eager steps still run (cold starts, bench/cold_start_bench.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...batch import ForwardBatch, ForwardMode
from .base import Runner, StepOutput

if TYPE_CHECKING:  # annotations only: the caller hands the runner its attention backend
    from ...attention.base import AttentionBackend


class EagerRunner(Runner):
    def __init__(self, model: torch.nn.Module, attention: AttentionBackend, device: torch.device):
        self.model = model
        self.attention = attention
        self.device = device

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> StepOutput:
        if self.device.type != "cuda":
            return self._run(batch)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = self._run(batch)
        end.record()
        out.forward_time = lambda: start.elapsed_time(end)
        return out

    def _run(self, batch: ForwardBatch) -> StepOutput:
        dev = self.device
        if batch.input_ids_device is not None:
            ids = batch.input_ids_device
        else:
            ids = torch.tensor(batch.input_ids, dtype=torch.int64).to(dev, non_blocking=True)
        pos = torch.tensor(batch.positions, dtype=torch.int64).to(dev, non_blocking=True)
        self.attention.prepare(batch)
        if batch.mode is ForwardMode.DECODE:  # every row sampled: the decode graphs' own logits path
            return StepOutput(logits=self.model.decode_logits(ids, pos, self.attention), path="eager")
        rows = torch.tensor(batch.logit_rows, dtype=torch.int64).to(dev, non_blocking=True)
        hidden = self.model(ids, pos, self.attention)
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        return StepOutput.of_rows(logits, batch, path="eager")
