"""Attention through FlashInfer's paged kernels (``flashinfer-python`` 0.7.x), same contract as torch-native.

The pool's per-layer ``[num_pages, page_size, num_kv_heads, head_dim]`` tensors are FlashInfer's NHD
layout as they are, so the kernels read the pool directly through CSR page metadata: ``indptr``
(cumulative page counts), ``indices`` (the pages, concatenated) and ``last_page_len``.

- K/V write: ``index_copy_`` of the step's K/V into the flat slot view at ``meta.out_cache_loc``
  (capturable; padded graph rows carry the dummy slot 0, so they only ever write the dummy page).
- Eager decode: one ``BatchDecodeWithPagedKVCacheWrapper`` planned in ``prepare`` per step.
- Graph decode: one ``use_cuda_graph=True`` decode wrapper per bucket, created in ``prepare_capture``
  over fixed device buffers (per-bucket views of buffers shared by every bucket: a replay always
  follows its own ``plan``, and replays never overlap). ``plan`` runs on the host outside the graph
  (dummy metadata at capture, the live batch at each replay); the graph holds only ``run``.
- Prefill / extend (eager, and inside breakable-prefill breaks): one
  ``BatchPrefillWithPagedKVCacheWrapper`` (causal, bottom-right aligned, so cached prefixes work).

Sliding windows and logit soft caps are plan arguments: the wrappers come in a ``WrapperGroup``, one per
distinct window among the layers, each layer running its own (flashinfer_groups.py); the Triton decode
kernel takes each layer's window as an argument and has no soft cap (a model with one decodes on
FlashInfer's kernels alone).

Planning facts of the 0.7.2 source this relies on: ``plan`` copies ``indptr`` / ``last_page_len``
to the host (``.to("cpu")``) for its scheduler, so they are passed as CPU int32 tensors (a device
tensor there would be a device→host sync). The page-id list may be either; the graph path passes it
already on the device, because a graph-mode ``plan`` copies a *host* ``indices`` with
``non_blocking=False`` (a stream sync per step). Every wrapper shares one float workspace.

``flashinfer`` is imported lazily (in the constructor): importing this module never needs it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, ClassVar, Iterator, Optional

import torch

from graphtop.models.kernels import fused as tk
from graphtop.models.kernels.decode_attention import HAVE_TRITON, PagedDecode
from graphtop.models.kernels.qkv_input import QKVInput

from ..batch import ForwardBatch, ForwardMode
from ..graphs.buffers import BufferSlot
from ..graphs.upload import Upload
from ..kv_pool import DUMMY_PAGE, KVPool
from .base import AttentionBackend, AttentionBackendError, AttentionShape
from .decode_policy import CUDA_CORE_DECODE_GROUPS, EVERY_SIZE, triton_rows_for
from .flashinfer_groups import FlashInferMeta, LayerGroups, WrapperGroup, store_kv
from .flashinfer_support import FlashInferUnsupported, kv_cache_problem
from .page_lists import host_ints, page_lists
from .triton_decode import TritonDecodeWrapper

WORKSPACE_BYTES = 256 * 1024 * 1024  # float workspace (split-KV partials), shared by every wrapper


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"
    supports_decode_graph: ClassVar[bool] = True

    problem = staticmethod(kv_cache_problem)  # the support check, for callers holding the class

    def __init__(
        self,
        pool: KVPool,
        shape: AttentionShape,
        device: torch.device,
        *,
        prefill_backend: str = "fa2",
        decode_kernel: str = "auto",
        pdl: str = "auto",
        decode_tensor_cores: Optional[bool] = None,
        workspace_bytes: int = WORKSPACE_BYTES,
    ):
        """``prefill_backend``, ``decode_kernel`` and ``pdl`` are the engine's ``KernelConfig`` values
        (checked there)."""
        super().__init__(pool, shape, device)
        self._options = dict(
            prefill_backend=prefill_backend,
            decode_kernel=decode_kernel,
            pdl=pdl,
            decode_tensor_cores=decode_tensor_cores,
            workspace_bytes=workspace_bytes,
        )
        device = torch.device(device)
        if device.type != "cuda":
            raise FlashInferUnsupported(f"flashinfer needs a CUDA device, got {device}")
        dtype = pool.layout.dtype
        problem = self.problem(dtype, shape.head_dim, pool.page_size)
        if problem is not None:
            raise FlashInferUnsupported(problem)
        if shape.num_heads % shape.num_kv_heads:
            raise FlashInferUnsupported(
                f"num_heads {shape.num_heads} is not a multiple of num_kv_heads {shape.num_kv_heads}"
            )
        import flashinfer  # lazy: select.py imports this module only when flashinfer imports

        self._fi = flashinfer
        self.version = str(getattr(flashinfer, "__version__", "?"))
        self.device = device
        self.dtype = dtype
        self.prefill_backend = prefill_backend
        group = shape.num_heads // shape.num_kv_heads
        self._staged: Optional[torch.cuda.Event] = None  # see _staging
        kernel = decode_kernel
        self._triton: Optional[PagedDecode] = None
        self._stage: Optional[torch.Tensor] = None  # pinned staging for the Triton decode's page lists
        if kernel == "triton" and not HAVE_TRITON:
            raise AttentionBackendError("decode kernel triton: triton is not installed")
        if kernel == "triton" and shape.softcap is not None:
            raise AttentionBackendError(
                "decode kernel triton: the Triton decode kernel has no attention logit soft cap, which this model has"
            )
        self._groups = LayerGroups(shape)
        #: decode batches of at most this many rows take the Triton kernel
        self.triton_max_rows = triton_rows_for(kernel, group) if HAVE_TRITON and shape.softcap is None else 0
        if self.triton_max_rows:
            self._triton = PagedDecode(
                shape.num_heads,
                shape.num_kv_heads,
                shape.head_dim,
                pool.page_size,
                shape.scale,
                256,
                device,
                pdl=tk.use_pdl(device, 0, pdl),
            )
        if decode_tensor_cores is None and kernel not in ("auto", "flashinfer", "triton"):
            decode_tensor_cores = kernel != "cuda-core"
        self.decode_tensor_cores = (
            group not in CUDA_CORE_DECODE_GROUPS if decode_tensor_cores is None else bool(decode_tensor_cores)
        )
        self.decode_split_kv = not (self.decode_tensor_cores and kernel == "tensor-core-nosplit")
        hkv, d = shape.num_kv_heads, shape.head_dim
        self._views_of: Optional[list] = None  # the pool.k_cache list the cached views were made from
        self._ensure_views()
        # Positional arguments after the page metadata, shared by every plan() call.
        self._dims = (shape.num_heads, hkv, d, pool.page_size)
        self._decode_kw = dict(pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype, sm_scale=shape.scale)
        if not self.decode_split_kv:
            self._decode_kw["disable_split_kv"] = True
        self._prefill_kw = dict(causal=True, sm_scale=shape.scale, q_data_type=dtype, kv_data_type=dtype)
        if shape.softcap is not None:
            self._decode_kw["logits_soft_cap"] = self._prefill_kw["logits_soft_cap"] = shape.softcap

        # FlashInfer wants the float workspace zeroed before first use.
        self._workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=device)
        self._decode_wrapper = WrapperGroup(
            lambda: flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_tensor_cores=self.decode_tensor_cores, backend="fa2"
            ),
            self._groups,
        )
        self._prefill_wrapper = WrapperGroup(
            lambda: flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self._workspace, "NHD", backend=self.prefill_backend
            ),
            self._groups,
        )
        self._graph_wrappers: dict[int, Any] = {}
        self._graph_bufs: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None

    def clone(self) -> "FlashInferBackend":
        return FlashInferBackend(self.pool, self.shape, self.device, **self._options)  # type: ignore[arg-type]

    def _ensure_views(self) -> None:
        """Per-layer views, cached (views cost ~1 µs each, per layer, per step); rebuilt whenever the
        pool's per-layer lists are replaced (e.g. ``KVPool.release``)."""
        if self.pool.k_cache is self._views_of:
            return
        pool, hkv, d = self.pool, self.shape.num_kv_heads, self.shape.head_dim
        self._kv = list(zip(pool.k_cache, pool.v_cache))  # NHD 4-D per layer, what run() reads
        self._k_flat = [t.view(-1, hkv, d) for t in pool.k_cache]  # [slots, hkv, d], what we write
        self._v_flat = [t.view(-1, hkv, d) for t in pool.v_cache]
        self._views_of = pool.k_cache

    def release(self) -> None:
        """Drop every device buffer this backend holds (cached pool views, wrappers, workspace), so a
        released pool's memory can really go back; the backend is unusable afterwards."""
        self._kv, self._k_flat, self._v_flat, self._views_of = [], [], [], None
        self._graph_wrappers = {}
        self._graph_bufs = None
        self._decode_wrapper = self._prefill_wrapper = None
        self._workspace = None
        self.meta = None

    def describe(self) -> str:
        extra = ", tensor-core decode" if self.decode_tensor_cores else ""
        extra += "" if self.decode_split_kv else " without split-KV"
        if self.triton_max_rows >= EVERY_SIZE:
            extra += "; triton decode"
        elif self.triton_max_rows:
            extra += f"; triton decode up to {self.triton_max_rows} rows"
        return f"flashinfer {self.version} ({self.prefill_backend}{extra})"

    def _use_triton(self, rows: int) -> bool:
        return rows <= self.triton_max_rows

    # --- page metadata ---------------------------------------------------------------------------
    def _loc(self, out_cache_loc: list[int]) -> torch.Tensor:
        return host_ints(out_cache_loc, "q", torch.int64).to(self.device, non_blocking=True)

    @contextmanager
    def _staging(self) -> Iterator[None]:
        """Around every write of metadata through a reused pinned host buffer (``plan()``'s own, or
        the Triton decode's ``_stage``): safe when the host prepares a step before the last one ran.

        Those buffers are copied to the device asynchronously. When the host prepares step N+1 while
        step N is in flight (the overlap schedule; a prefill chunk that samples no row, which ends its
        step without waiting for the device), N's copy may still be queued, so wait for it first (it
        is the first thing N does on the GPU), then mark when this copy has run. Unguarded, N's
        kernels would read N+1's schedule: wrong attention, or an illegal memory access.
        """
        if self._staged is not None:
            self._staged.synchronize()
        yield
        self._staged = torch.cuda.Event()
        self._staged.record()

    def _load_triton(self, wrapper: TritonDecodeWrapper, indptr: Any, indices: Any, last: Any) -> None:
        """``wrapper.load`` through the backend's one pinned staging buffer."""
        with self._staging():
            need = len(indptr) + len(last) + len(indices)
            if self._stage is None or self._stage.numel() < need:
                self._stage = torch.empty(max(need, 4096), dtype=torch.int32, pin_memory=True)
            wrapper.load(indptr, indices, last, self._stage)

    def _plan(self, wrapper: WrapperGroup, *args: Any, **kw: Any) -> None:
        """``wrapper.plan`` (each of its windows' wrappers), safe while earlier steps still run (see
        ``_staging``); every plan goes here."""
        with self._staging():
            wrapper.plan(*args, **kw)

    # --- eager path ------------------------------------------------------------------------------
    def prepare(self, batch: ForwardBatch) -> None:
        i32 = torch.int32
        indptr, indices, last = page_lists(batch.req_pages, batch.seq_lens, self.pool.page_size)
        loc = self._loc(batch.out_cache_loc)
        if batch.mode is ForwardMode.DECODE and self._use_triton(batch.batch_size):
            dev = self.device
            w = TritonDecodeWrapper(
                self._triton,
                host_ints(indptr, "i", i32).to(dev, non_blocking=True),
                host_ints(indices, "i", i32).to(dev, non_blocking=True),
                host_ints(last, "i", i32).to(dev, non_blocking=True),
                windows=self._groups.windows,
            )
            self.meta = FlashInferMeta(loc, w, decode=True)
            return
        if batch.mode is ForwardMode.DECODE:
            w = self._decode_wrapper
            self._plan(
                w,
                host_ints(indptr, "i", i32),
                host_ints(indices, "i", i32),
                host_ints(last, "i", i32),
                *self._dims,
                **self._decode_kw,
            )
            self.meta = FlashInferMeta(loc, w, decode=True)
            return
        qo = [0]
        acc = 0
        for e in batch.extend_lens:
            acc += e
            qo.append(acc)
        w = self._prefill_wrapper
        # through _plan like every plan: a prefill chunk that samples no row ends its step unsynchronised
        self._plan(
            w,
            host_ints(qo, "i", i32),
            host_ints(indptr, "i", i32),
            host_ints(indices, "i", i32),
            host_ints(last, "i", i32),
            *self._dims,
            **self._prefill_kw,
        )
        self.meta = FlashInferMeta(loc, w, decode=False, num_tokens=batch.num_tokens)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        m: FlashInferMeta = self.meta
        self._ensure_views()
        kf, vf = self._k_flat[layer_id], self._v_flat[layer_id]
        if m.decode:
            store_kv(k, v, kf, vf, m.out_cache_loc)
            return m.wrapper.run(q.contiguous(), self._kv[layer_id], layer_id)
        n = m.num_tokens
        if k.shape[0] != n:
            k, v = k[:n], v[:n]
        store_kv(k, v, kf, vf, m.out_cache_loc)
        q = q.contiguous()
        if q.shape[0] == n:
            return m.wrapper.run(q, self._kv[layer_id], layer_id)
        out = torch.zeros_like(q)  # padded rows (breakable-prefill buckets) stay zero
        m.wrapper.run(q[:n], self._kv[layer_id], layer_id, out=out[:n])
        return out

    def forward_qkv(self, x: QKVInput, layer_id: int) -> Optional[torch.Tensor]:
        """Decode on the Triton kernel straight from the fused projection (norm, RoPE, K/V store and
        attention in one launch); None where this step does not decode on it."""
        m: FlashInferMeta = self.meta
        if not (m.decode and isinstance(m.wrapper, TritonDecodeWrapper)):
            return None
        self._ensure_views()
        return m.wrapper.run_qkv(x, self._kv[layer_id], layer_id)

    # --- decode graphs ---------------------------------------------------------------------------
    def init_graph_state(self, max_bs: int, max_pages_per_req: int) -> None:
        # FlashInfer walks only each row's own pages, so graphs cover the whole context.
        self.graph_max_pages = max_pages_per_req
        # Real rows own distinct pages (at most the pool's), padded rows one dummy page each.
        fill_pages = self.pool.pages_for(self.seq_len_fill_value())
        cap = min(max_bs * max(max_pages_per_req, fill_pages), self.pool.num_pages - 1 + max_bs * fill_pages)
        dev, i32 = self.device, torch.int32
        self._graph_bufs = (
            torch.zeros(max_bs + 1, dtype=i32, device=dev),  # indptr
            torch.full((max(cap, max_bs),), DUMMY_PAGE, dtype=i32, device=dev),  # indices
            torch.ones(max_bs, dtype=i32, device=dev),  # last_page_len
        )
        self._graph_max_bs = max_bs
        self._graph_wrappers = {}

    def graph_buffer_slots(self) -> list[BufferSlot]:
        return [
            self.out_cache_loc_slot(),
        ]

    def bind_graph_meta(self, registry: Any, bucket: int, width: int = 0) -> None:
        # one graph per bucket (graph_widths): the page lists are as long as the batch needs
        self.meta = FlashInferMeta(
            registry.view("out_cache_loc", bucket), self._graph_wrappers.get(bucket), decode=True
        )

    def _graph_wrapper(self, bucket: int) -> Any:
        w = self._graph_wrappers.get(bucket)
        if w is None:
            if self._graph_bufs is None:
                raise RuntimeError("init_graph_state must run before decode graphs are captured")
            if bucket > self._graph_max_bs:
                raise ValueError(f"decode bucket {bucket} is over the graph buffers' maximum {self._graph_max_bs}")
            indptr, indices, last = self._graph_bufs
            if self._use_triton(bucket):
                w = TritonDecodeWrapper(
                    self._triton,
                    indptr[: bucket + 1],
                    indices,
                    last[:bucket],
                    splits=self._triton.splits_for(bucket),
                    windows=self._groups.windows,
                )
                self._graph_wrappers[bucket] = w
                return w
            w = WrapperGroup(  # each window's wrapper over the same page-list buffers (its plan fills them alike)
                lambda: self._fi.BatchDecodeWithPagedKVCacheWrapper(
                    self._workspace,
                    "NHD",
                    use_cuda_graph=True,
                    use_tensor_cores=self.decode_tensor_cores,
                    paged_kv_indptr_buffer=indptr[: bucket + 1],
                    paged_kv_indices_buffer=indices,
                    paged_kv_last_page_len_buffer=last[:bucket],
                    backend="fa2",
                ),
                self._groups,
            )
            self._graph_wrappers[bucket] = w
        return w

    def _pad_rows(self) -> tuple[int, int]:
        """(pages, last_page_len) of one padded row: ``seq_len_fill_value`` tokens in the dummy page."""
        fill = self.seq_len_fill_value()
        pages = self.pool.pages_for(fill)
        return pages, fill - (pages - 1) * self.pool.page_size

    def prepare_capture(self, bucket: int) -> None:
        """Plan the bucket's graph wrapper for dummy rows (each: the dummy page, fill-value tokens)."""
        w = self._graph_wrapper(bucket)
        pages, last = self._pad_rows()
        i32 = torch.int32
        if isinstance(w, TritonDecodeWrapper):
            self._load_triton(
                w, list(range(0, bucket * pages + 1, pages)), [DUMMY_PAGE] * (bucket * pages), [last] * bucket
            )
        else:
            self._plan(
                w,
                torch.arange(0, bucket * pages + 1, pages, dtype=i32),
                torch.full((bucket * pages,), DUMMY_PAGE, dtype=i32, device=self.device),
                torch.full((bucket,), last, dtype=i32),
                *self._dims,
                **self._decode_kw,
            )
        if isinstance(self.meta, FlashInferMeta) and self.meta.decode:
            self.meta.wrapper = w

    def prepare_replay(self, batch: ForwardBatch, bucket: int, uploads: Optional[list[Upload]] = None) -> None:
        """Re-plan the bucket's wrapper for the live batch; rows past ``batch_size`` are dummy rows.
        The Triton kernel's page lists join ``uploads`` when given (FlashInfer's ``plan`` copies its
        own)."""
        w = self._graph_wrappers.get(bucket)
        if w is None:
            raise RuntimeError(f"no FlashInfer decode wrapper for bucket {bucket}: it was never captured")
        indptr, indices, last = page_lists(batch.req_pages, batch.seq_lens, self.pool.page_size)
        pad = bucket - batch.batch_size
        if pad > 0:
            pages, pad_last = self._pad_rows()
            total = indptr[-1]
            indptr.extend(range(total + pages, total + pages * pad + 1, pages))
            indices.extend([DUMMY_PAGE] * (pages * pad))
            last.extend([pad_last] * pad)
        if len(indices) > self._graph_bufs[1].numel():
            raise ValueError(
                f"decode batch needs {len(indices)} page ids; the graph page buffer holds {self._graph_bufs[1].numel()}"
            )
        i32 = torch.int32
        if isinstance(w, TritonDecodeWrapper) and uploads is not None:
            uploads.extend(
                w.uploads(host_ints(indptr, "i", i32), host_ints(indices, "i", i32), host_ints(last, "i", i32))
            )
        elif isinstance(w, TritonDecodeWrapper):
            self._load_triton(w, indptr, indices, last)
        else:
            self._plan(
                w,
                host_ints(indptr, "i", i32),
                host_ints(indices, "i", i32).to(self.device, non_blocking=True),  # device: non-blocking copy in plan
                host_ints(last, "i", i32),
                *self._dims,
                **self._decode_kw,
            )
        if isinstance(self.meta, FlashInferMeta) and self.meta.decode:
            self.meta.wrapper = w
