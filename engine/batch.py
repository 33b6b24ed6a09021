"""The host-side description of one forward step, produced by the scheduler.

Plain Python lists: the runner decides how they reach the device (exact-size tensors for eager,
copies into fixed-address static buffers for a graph).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from .request import Request


class ForwardMode(str, enum.Enum):
    DECODE = "decode"
    PREFILL = "prefill"


@dataclass
class ForwardBatch:
    mode: ForwardMode
    requests: list[Request]
    input_ids: list[int]
    positions: list[int]
    out_cache_loc: list[int]  # KV slot of every new token
    seq_lens: list[int]  # per request: context length after this step
    extend_lens: list[int]  # per request: new tokens this step (1 in decode)
    prefix_lens: list[int]  # per request: tokens already in the KV pool
    req_pages: list[Sequence[int]]  # per request: pages covering its context (the request's int32 array)
    page_size: int
    sample_rows: list[int] = field(default_factory=list)  # token rows whose logits are sampled
    sample_requests: list[Request] = field(default_factory=list)
    # Prompt log-probabilities (``SamplingParams.prompt_logprobs``): the rows whose logits score the next
    # prompt token, that token, and per request (in row order) how many rows are its own. Empty for every
    # request that did not ask, so a step computes the lm_head of its sampled rows only.
    prompt_rows: list[int] = field(default_factory=list)
    prompt_targets: list[int] = field(default_factory=list)
    prompt_requests: list[tuple[Request, int]] = field(default_factory=list)
    # Overlap schedule: this decode step's input ids are still on the device (the previous step's
    # sampled tokens, one per row); ``input_ids`` then holds placeholders. A torch.Tensor or None.
    input_ids_device: Optional[Any] = None

    @property
    def logit_rows(self) -> list[int]:
        """The rows whose logits a step computes: the sampled ones, then the prompt-scoring ones."""
        return self.sample_rows + self.prompt_rows if self.prompt_rows else self.sample_rows

    @property
    def batch_size(self) -> int:
        return len(self.requests)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def max_pages(self) -> int:
        """Pages of the longest context this step reads (from ``seq_lens``: the requests' page arrays
        are live and may already have grown for the next step)."""
        return -(-max(self.seq_lens, default=0) // self.page_size)
