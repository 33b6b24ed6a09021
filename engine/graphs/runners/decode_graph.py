"""Decode through full graphs, bucketed by request count.

Per step: ``decide`` picks the smallest captured bucket ≥ batch size (the bucket policy), and ``run``
replays that bucket: the attention backend plans on the host, the live batch and the backend's page
lists go into the static buffers in one upload (padded rows point at the dummy KV slot), the graph
replays, and logits and greedy tokens are sliced to the real rows. A backend whose graph reads a
fixed-width page table has each bucket captured at several widths (``AttentionBackend.graph_widths``);
a step replays the narrowest that holds its longest row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from graphtop.models.kernels.argmax import argmax_rows, host_ring_supported

from ...batch import ForwardBatch
from ..backend import GraphBackend, ShapeKey
from ..bucket_policy import BucketDecision, pick_graph_width
from ..fallback import FallbackReason
from ..upload import Upload
from .base import StepOutput
from .bucketed import BucketedGraphRunner, PublishFn

if TYPE_CHECKING:  # annotations only: the caller hands the runner its attention backend
    from ...attention.base import AttentionBackend

HOST_RING = 4
"""Host token rows a decode runner's graphs write in turn: a row is read back (engine/step/overlap.py) within
two steps of its replay, at most two steps being in flight, so four never overwrite an unread one.
0: no ring, the tokens are copied to the host after the replay (bench/ab_decode.py's readback=copy)."""


class DecodeGraphRunner(BucketedGraphRunner):
    phase = "decode"

    def __init__(
        self,
        model: torch.nn.Module,
        attention: AttentionBackend,
        backend: GraphBackend,
        device: torch.device,
        max_bs: int,
        max_pages: int,
        publish: PublishFn,
    ):
        self.model = model
        self.attention = attention
        super().__init__(backend, device, publish, max_bs)
        attention.init_graph_state(max_bs, max_pages)
        for slot in attention.graph_buffer_slots():
            self.registry.declare(slot)
        self.max_pages = getattr(attention, "graph_max_pages", max_pages)
        self.widths = attention.graph_widths()
        vocab = model.spec.vocab_size
        # the lm_head writes straight into it, in the model's dtype (``compute_logits``)
        self.logits_out = torch.zeros(max_bs, vocab, dtype=model.lm_head.weight.dtype, device=device)
        # each row's greedy token, taken inside the graph: no sampling launches between two replays
        self.tokens_out = torch.zeros(max_bs, dtype=torch.int64, device=device)
        # ... and written by the graph into pinned host memory too, a ring row per replay picked by a
        # device scalar uploaded with the step: no device-to-host copy between two replays
        self.host_ring: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self._ring_rows = HOST_RING
        if self._ring_rows and device.type == "cuda" and host_ring_supported(self.logits_out):
            self.host_ring = (
                torch.zeros(self._ring_rows, max_bs, dtype=torch.int64, pin_memory=True),
                torch.zeros(1, dtype=torch.int32, device=device),
            )
        # each ring row's index as the slot scalar's upload source, made once instead of every step
        self._ring_slots = [torch.tensor([i], dtype=torch.int32) for i in range(self._ring_rows)]
        self._ring_turn = 0
        backend.bind(self.registry)

    @torch.inference_mode()
    def _forward(self, bs: int) -> torch.Tensor:
        ids, pos = self.token_inputs(bs)
        self.attention.prepare_in_graph()
        logits = self.model.decode_logits(ids, pos, self.attention, out=self.logits_out[:bs])
        argmax_rows(logits, out=self.tokens_out[:bs], host_ring=self.host_ring, pdl=self.model.logits_pdl)
        return logits

    def graph_keys(self, size: int) -> list[ShapeKey]:
        return [ShapeKey(self.phase, size, w) for w in self.widths]

    def _meta_width(self, graph_width: int, live_pages: int) -> int:
        """Columns the attention metadata spans: the graph's, unless the backend re-runs the function
        at replay (emulated graphs), where the live batch's suffice (its masked tail is pure waste)."""
        live = self.backend.live_width(live_pages)
        return graph_width if live is None else max(1, live)

    def _prepare_capture(self, key: ShapeKey) -> None:
        self.registry.reset()
        self.attention.bind_graph_meta(self.registry, key.size, self._meta_width(key.width, 1))
        self.attention.prepare_capture(key.size)

    def decide(self, batch: ForwardBatch) -> BucketDecision:
        decision = self.policy.decide(batch.batch_size)
        if decision.graph and batch.max_pages > self.max_pages:
            return BucketDecision(reason=FallbackReason.CONTEXT_EXCEEDS_GRAPH)
        return decision

    @torch.inference_mode()
    def run(self, batch: ForwardBatch, decision: BucketDecision) -> StepOutput:
        bs = batch.batch_size
        bucket = decision.bucket
        assert bucket is not None, "run takes a graph decision"
        width = pick_graph_width(self.widths, batch.max_pages)
        self.attention.bind_graph_meta(self.registry, bucket, self._meta_width(width, batch.max_pages))
        uploads: list[Upload] = []
        tokens_host = None
        if self.host_ring is not None:
            ring, slot = self.host_ring
            tokens_host = ring[self._ring_turn, :bs]
            uploads.append(Upload(slot, self._ring_slots[self._ring_turn]))
            self._ring_turn = (self._ring_turn + 1) % self._ring_rows
        self.attention.prepare_replay(batch, bucket, uploads)
        # overlap schedule: the ids are the previous step's tokens, still on the device
        ids = None if batch.input_ids_device is None else {"input_ids": batch.input_ids_device}
        self.registry.fill(batch, bucket, extra=uploads, device_sources=ids)
        if ids is not None:  # the previous tokens' buffer is rewritten by this replay: point at what it read
            batch.input_ids_device = self.registry.view("input_ids", bs)
        logits, timing = self.backend.replay(ShapeKey(self.phase, bucket, width))
        return StepOutput(
            logits=logits[:bs],
            path="graph",
            bucket=bucket,
            padded=decision.padded,
            timing=timing,
            tokens=self.tokens_out[:bs],
            tokens_host=tokens_host,
        )
