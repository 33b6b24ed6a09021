"""The path that always works: exact-size tensors, no padding, attention metadata built per step."""

from __future__ import annotations

import torch

from ..attention.base import AttentionBackend
from ..batch import ForwardBatch, ForwardMode
from .base import Runner, StepOutput


class EagerRunner(Runner):
    def __init__(self, model: torch.nn.Module, attention: AttentionBackend, device: torch.device):
        self.model = model
        self.attention = attention
        self.device = device

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> StepOutput:
        dev = self.device
        if batch.input_ids_device is not None:
            ids = batch.input_ids_device
        else:
            ids = torch.tensor(batch.input_ids, dtype=torch.int64).to(dev, non_blocking=True)
        pos = torch.tensor(batch.positions, dtype=torch.int64).to(dev, non_blocking=True)
        self.attention.prepare(batch)
        if batch.mode is ForwardMode.DECODE:  # every row sampled: the decode graphs' own logits path
            return StepOutput(logits=self.model.decode_logits(ids, pos, self.attention), path="eager")
        rows = torch.tensor(batch.sample_rows, dtype=torch.int64).to(dev, non_blocking=True)
        hidden = self.model(ids, pos, self.attention)
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        return StepOutput(logits=logits, path="eager")
