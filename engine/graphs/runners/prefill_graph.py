"""Prefill through breakable graphs, bucketed by token count.

Everything but attention is replayed from segments; attention runs eagerly between them on the live
batch's metadata (``eager_on_graph``). The lm_head runs eagerly on the sampled rows only (most
prefill rows are never sampled), and on the rows that score prompt tokens for a request that asked for
its prompt's log-probabilities. A bucket whose padding would waste more than the cap is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...batch import ForwardBatch, ForwardMode
from ...kv_pool import DUMMY_PAGE
from ..backend import GraphBackend, ShapeKey
from ..breakable import eager_on_graph
from ..bucket_policy import BucketDecision
from ..buffers import BridgeBuffers
from .base import StepOutput
from .bucketed import BucketedGraphRunner, PublishFn

if TYPE_CHECKING:  # annotations only: the caller hands the runner its attention backend
    from ...attention.base import AttentionBackend


class PrefillGraphRunner(BucketedGraphRunner):
    phase = "prefill"

    def __init__(
        self,
        model: torch.nn.Module,
        attention: AttentionBackend,
        backend: GraphBackend,
        device: torch.device,
        max_tokens: int,
        max_padding_waste: float,
        publish: PublishFn,
    ):
        self.model = model
        self.attention = attention
        super().__init__(backend, device, publish, max_tokens, max_padding_waste)
        spec = model.spec
        dtype = next(model.parameters()).dtype

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        hq, hkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.bridges = BridgeBuffers(
            inputs=[zeros(max_tokens, hq, d), zeros(max_tokens, hkv, d), zeros(max_tokens, hkv, d)],
            output=zeros(max_tokens, hq, d),
        )
        self.hidden_out = zeros(max_tokens, spec.hidden_size)
        self.attn_call = eager_on_graph(attention.forward)
        backend.bind(self.registry, self.bridges)

    @torch.inference_mode()
    def _forward(self, n: int) -> torch.Tensor:
        ids, pos = self.token_inputs(n)
        hidden = self.model(ids, pos, self.attn_call)
        out = self.hidden_out[:n]
        out.copy_(hidden)
        return out

    def _dummy_batch(self, n: int) -> ForwardBatch:
        """One request of ``n`` tokens living entirely in the dummy page: capture touches no real KV."""
        pages = [DUMMY_PAGE] * (-(-n // self.attention.pool.page_size))
        return ForwardBatch(
            mode=ForwardMode.PREFILL,
            requests=[],
            input_ids=[0] * n,
            positions=list(range(n)),
            out_cache_loc=[DUMMY_PAGE * self.attention.pool.page_size] * n,
            seq_lens=[n],
            extend_lens=[n],
            prefix_lens=[0],
            req_pages=[pages],
            page_size=self.attention.pool.page_size,
        )

    def _prepare_capture(self, key: ShapeKey) -> None:
        self.registry.reset()
        self.attention.prepare(self._dummy_batch(key.size))

    def decide(self, batch: ForwardBatch) -> BucketDecision:
        return self.policy.decide(batch.num_tokens)

    @torch.inference_mode()
    def run(self, batch: ForwardBatch, decision: BucketDecision) -> StepOutput:
        bucket = decision.bucket
        assert bucket is not None, "run takes a graph decision"
        self.registry.fill(batch, bucket)
        self.attention.prepare(batch)  # live metadata, read by the eager breaks at replay
        hidden, timing = self.backend.replay(ShapeKey("prefill", bucket))
        rows = torch.tensor(batch.logit_rows, dtype=torch.int64).to(self.device, non_blocking=True)
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        return StepOutput.of_rows(logits, batch, path="graph", bucket=bucket, padded=decision.padded, timing=timing)
