"""Attention in plain torch: runs on CPU and CUDA, and is the reference every other backend matches.

Decode reads K/V through a page table expanded to slots on the device (``prepare_in_graph``), so the
whole decode step, attention included, is capturable with fixed shapes. Prefill (extend) loops over
requests with a causal mask offset by each request's cached prefix; it always runs eagerly.

A layer with a sliding window masks every key before ``seq_len - window``: in decode by a bias derived on
the device from the step's seq_lens (``prepare_in_graph``, so a graph's replay masks the live batch's
windows, nothing about them fixed at capture), in extend by the mask of each request's rows. A model with
a logit soft cap attends in transformers' eager order (scores, cap, mask, float32 softmax), which SDPA has
no form for.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..batch import ForwardBatch, ForwardMode
from ..graphs.buffers import BufferSlot, PaddingPolicy
from ..kv_pool import DUMMY_PAGE
from .base import AttentionBackend

GRAPH_MAX_CONTEXT = 4096
#: SDPA kernels for CUDA decode: not cuDNN's, which builds an execution plan for every new shape (an
#: eager step's width changes every step), nor flash, which takes no mask
CUDA_DECODE_SDPA = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
#: the narrowest page table a decode graph is captured with; each next one is twice as wide
GRAPH_MIN_CONTEXT = 256


@dataclass
class DecodeMeta:
    out_cache_loc: torch.Tensor  # [bs] int64
    page_table: torch.Tensor  # [bs, P] int64
    seq_lens: torch.Tensor  # [bs] int64
    slot_table: Optional[torch.Tensor] = None  # [bs, P * page_size], derived in prepare_in_graph
    bias: Optional[torch.Tensor] = None  # [bs, 1, 1, P * page_size]: 0 or -inf, derived in prepare_in_graph
    # window -> ``bias`` masking each row's keys before seq_len - window too, derived in prepare_in_graph
    window_bias: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class ExtendMeta:
    out_cache_loc: torch.Tensor  # [T] int64 (real tokens only)
    num_tokens: int
    # per request: (first row, new tokens, prefix length, context slots tensor)
    segments: list[tuple[int, int, int, torch.Tensor]] = field(default_factory=list)
    # (new tokens, prefix length, window or None) -> bool mask [new, prefix + new]; absent: nothing masked
    masks: dict[tuple[int, int, Optional[int]], torch.Tensor] = field(default_factory=dict)


def _causal_mask(extend: int, prefix: int, device: torch.device, window: Optional[int] = None) -> torch.Tensor:
    """Row i (position prefix + i) sees columns up to its own and, within a window, after i - window."""
    rows = torch.arange(extend, device=device)[:, None] + prefix
    cols = torch.arange(prefix + extend, device=device)[None, :]
    mask = cols <= rows
    return mask if window is None else mask & (cols > rows - window)


def _masks_anything(extend: int, prefix: int, window: Optional[int]) -> bool:
    return extend > 1 or (window is not None and prefix + extend > window)


def _additive(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``valid``, -inf elsewhere: an additive mask, built once a step (SDPA would turn a bool mask
    into this in every layer)."""
    return torch.zeros(valid.shape, dtype=dtype, device=valid.device).masked_fill_(~valid, float("-inf"))


def softcapped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], scale: float, cap: float
) -> torch.Tensor:
    """Attention with soft-capped logits in transformers' eager order: q [..., Hq, Tq, D] over k, v
    [..., Hkv, Tk, D] (GQA heads repeated); ``mask``: bool (True: attend) or additive, broadcastable."""
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / cap) * cap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)


class TorchNativeBackend(AttentionBackend):
    name = "torch"

    # --- eager --------------------------------------------------------------------------------
    def prepare(self, batch: ForwardBatch) -> None:
        dev = self.device
        loc = torch.tensor(batch.out_cache_loc, dtype=torch.int64).to(dev, non_blocking=True)
        if batch.mode is ForwardMode.DECODE:
            table = _page_table_source(batch, batch.batch_size)
            seq = torch.tensor(batch.seq_lens, dtype=torch.int64)
            self.meta = DecodeMeta(loc, table.to(dev, non_blocking=True), seq.to(dev, non_blocking=True))
            self.prepare_in_graph()
        else:
            self.meta = self._extend_meta(batch, loc)

    def _extend_meta(self, batch: ForwardBatch, loc: torch.Tensor) -> ExtendMeta:
        meta = ExtendMeta(out_cache_loc=loc, num_tokens=batch.num_tokens)
        row = 0
        ps = self.pool.page_size
        for pages, ext, prefix in zip(batch.req_pages, batch.extend_lens, batch.prefix_lens):
            total = prefix + ext
            page_ids = _long(pages)
            pos = torch.arange(total)
            slots = (page_ids[pos // ps] * ps + pos % ps).to(self.device, non_blocking=True)
            meta.segments.append((row, ext, prefix, slots))
            for window in (None, *self.shape.distinct_windows):
                if (ext, prefix, window) not in meta.masks and _masks_anything(ext, prefix, window):
                    meta.masks[(ext, prefix, window)] = _causal_mask(ext, prefix, self.device, window)
            row += ext
        return meta

    def prepare_in_graph(self) -> None:
        meta = self.meta
        if not isinstance(meta, DecodeMeta):
            return
        ps = self.pool.page_size
        width = meta.page_table.shape[1] * ps
        j = torch.arange(width, device=meta.page_table.device)
        meta.slot_table = meta.page_table[:, j // ps] * ps + (j % ps)
        seq = meta.seq_lens[:, None]
        valid = j[None, :] < seq
        dtype = self.pool.layout.dtype
        meta.bias = _additive(valid, dtype)[:, None, None, :]
        meta.window_bias = {
            w: _additive(valid & (j[None, :] >= seq - w), dtype)[:, None, None, :] for w in self.shape.distinct_windows
        }

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        kc = self.pool.k_cache[layer_id].view(-1, self.shape.num_kv_heads, self.shape.head_dim)
        vc = self.pool.v_cache[layer_id].view(-1, self.shape.num_kv_heads, self.shape.head_dim)
        window = self.shape.window(layer_id)
        if isinstance(self.meta, DecodeMeta):
            return self._decode(q, k, v, kc, vc, window)
        return self._extend(q, k, v, kc, vc, window)

    def _decode(self, q, k, v, kc, vc, window: Optional[int]) -> torch.Tensor:
        m: DecodeMeta = self.meta
        bias = m.bias if window is None else m.window_bias[window]
        kc.index_copy_(0, m.out_cache_loc, k.to(kc.dtype))
        vc.index_copy_(0, m.out_cache_loc, v.to(vc.dtype))
        shape = (*m.slot_table.shape, *kc.shape[1:])  # [bs, W, hkv, d]
        slots = m.slot_table.reshape(-1)  # index_select: ~4x faster than a 2-D advanced index on a CPU
        keys = kc.index_select(0, slots).view(shape).transpose(1, 2).to(q.dtype)  # [bs, hkv, W, d]
        vals = vc.index_select(0, slots).view(shape).transpose(1, 2).to(q.dtype)
        if self.shape.softcap is not None:
            o = softcapped_attention(q.unsqueeze(2), keys, vals, bias.to(q.dtype), self.shape.scale, self.shape.softcap)
            return o.squeeze(2)
        if q.device.type == "cpu":
            # GQA inside SDPA: on a CPU it measured faster than the grouped form below
            o = F.scaled_dot_product_attention(
                q.unsqueeze(2), keys, vals, attn_mask=bias.to(q.dtype), scale=self.shape.scale, enable_gqa=True
            )
            return o.squeeze(2)
        # CUDA: each KV head's group of query heads as its query rows, so a fused kernel (fp32
        # softmax and accumulation) serves GQA without copying K/V per query head
        bs, hq, d = q.shape
        hkv = keys.shape[1]
        qg = q.view(bs, hkv, hq // hkv, d)
        with sdpa_kernel(CUDA_DECODE_SDPA):
            o = F.scaled_dot_product_attention(qg, keys, vals, attn_mask=bias.to(q.dtype), scale=self.shape.scale)
        return o.reshape(bs, hq, d)

    def _extend(self, q, k, v, kc, vc, window: Optional[int]) -> torch.Tensor:
        m: ExtendMeta = self.meta
        n = m.num_tokens
        kc.index_copy_(0, m.out_cache_loc, k[:n].to(kc.dtype))
        vc.index_copy_(0, m.out_cache_loc, v[:n].to(vc.dtype))
        out = torch.zeros_like(q)
        for row, ext, prefix, slots in m.segments:
            qi = q[row : row + ext].transpose(0, 1)  # [hq, ext, d]
            ki = kc[slots].transpose(0, 1).to(q.dtype)  # [hkv, total, d]
            vi = vc[slots].transpose(0, 1).to(q.dtype)
            mask = m.masks.get((ext, prefix, window))
            if self.shape.softcap is not None:
                o = softcapped_attention(qi, ki, vi, mask, self.shape.scale, self.shape.softcap)
            else:
                o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=self.shape.scale, enable_gqa=True)
            out[row : row + ext] = o.transpose(0, 1)
        return out

    # --- decode graphs ------------------------------------------------------------------------
    def init_graph_state(self, max_bs: int, max_pages_per_req: int) -> None:
        # Gathering every slot of a fixed-width page table is O(bs × width) per layer, so the
        # torch-native graph covers contexts up to GRAPH_MAX_CONTEXT; longer ones run eagerly
        # (FallbackReason.CONTEXT_EXCEEDS_GRAPH).
        limit = -(-GRAPH_MAX_CONTEXT // self.pool.page_size)
        self.graph_max_pages = min(max_pages_per_req, limit)

    def graph_widths(self) -> list[int]:
        """Tables of 256, 512, ... tokens up to ``graph_max_pages``: every layer gathers and masks the
        whole table, so a step replays the narrowest that holds its longest row, never reading more
        than twice the columns it needs (one width for all would read 4096 tokens a row at any context:
        slower than the eager step from batch 64 on)."""
        ps, top = self.pool.page_size, self.graph_max_pages
        widths, tokens = [], GRAPH_MIN_CONTEXT
        while -(-tokens // ps) < top:
            widths.append(-(-tokens // ps))
            tokens *= 2
        return sorted(set(widths) | {top}, reverse=True)

    def graph_buffer_slots(self) -> list[BufferSlot]:
        pages = self.graph_max_pages
        fill = self.seq_len_fill_value()
        return [
            self.out_cache_loc_slot(),
            BufferSlot(
                "seq_lens",
                lambda n: (n,),
                torch.int64,
                PaddingPolicy.FILL_SENTINEL,
                pad_value=fill,
                source=lambda b, p: b.seq_lens,
            ),
            BufferSlot(
                "page_table",
                lambda n: (n, pages),
                torch.int64,
                PaddingPolicy.FILL_SENTINEL,
                pad_value=DUMMY_PAGE,
                source=_page_table_source,
            ),
        ]

    def bind_graph_meta(self, registry, bucket: int, width: int = 0) -> None:
        """The graph reads the first ``width`` columns of the static page table (a view: the same
        address for every width)."""
        table = registry.view("page_table", bucket)
        if width:
            table = table[:, :width]
        self.meta = DecodeMeta(registry.view("out_cache_loc", bucket), table, registry.view("seq_lens", bucket))


def _page_table_source(batch: ForwardBatch, padded: int) -> torch.Tensor:
    """Real rows only, each padded with the dummy page to the widest row (masked out by seq_lens).

    Built as one flat ``array`` and viewed as a tensor: a tensor per request cost ~12 µs each, i.e.
    ~3 ms a step at batch 256 on the CPU machine."""
    width = batch.max_pages
    flat = array("i")
    for pages in batch.req_pages:
        flat.extend(pages)
        flat.extend(_DUMMY * (width - len(pages)))
    return _long(flat).view(batch.batch_size, width)


_DUMMY = array("i", [DUMMY_PAGE])


def _long(ids: "array | list[int]") -> torch.Tensor:
    """int64 tensor of page ids; an int32 ``array`` goes through one buffer view and one cast."""
    if isinstance(ids, array):
        if not ids:
            return torch.empty(0, dtype=torch.int64)
        return torch.frombuffer(ids, dtype=torch.int32).to(torch.int64)
    return torch.tensor(ids, dtype=torch.int64)
