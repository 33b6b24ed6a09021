"""Fused CUDA kernels (Triton) for the decoder's small ops: RMSNorm, add+RMSNorm, q/k-norm+RoPE, KV store, SiLU·mul.

Why: a decode step of a small model is dominated by kernel count, not bytes. The plain-torch ops
spend ~7 kernels per RMSNorm and ~12 per RoPE; inside a CUDA graph each kernel still costs a few
microseconds, so a 28-layer model pays milliseconds for work worth tens of microseconds. These
kernels do each op in one launch and keep HF's rounding points (normalise in fp32, cast, then
scale; residual adds in the activation dtype), so bf16 results stay within an ulp of the torch path.

Only used on CUDA for bf16/fp16; fp32 and CPU keep the exact torch ops (parity tests rely on them).
"""

from __future__ import annotations

import torch

try:  # triton ships with CUDA builds of torch; CPU builds have none
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the install
    HAVE_TRITON = False


def available(device: torch.device, dtype: torch.dtype) -> bool:
    return HAVE_TRITON and device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)


#: "auto" launches a kernel with PDL when it streams at most this many weight bytes
PDL_AUTO_MAX_BYTES = 128 << 20
SILU_MUL_PDL = True
"""Whether the SiLU·mul kernel between a cuBLAS gate|up and a PDL-launched skinny down projection
launches with PDL itself (layers/activation.py; bench/ab_decode.py's silu_pdl=off measures it without)."""
_pdl: dict[int, bool] = {}


def sm_count(device: torch.device) -> int:
    """The device's SM count, which launches size their grids by (work per SM); an H100/H200's 132 off
    CUDA, so a launch planned on the CPU (the Triton interpreter, tests) splits work as it would there."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for a launcher's grid on the host: ``triton.cdiv`` is a constexpr function there, whose
    wrapper costs microseconds a call (bench/eager_launch_bench.py)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (n >= 1), as ``triton.next_power_of_2`` computes it, without its
    constexpr-function wrapper."""
    return 1 << (n - 1).bit_length()


def use_pdl(device: torch.device, weight_bytes: int = 0, policy: str = "auto") -> bool:
    """Whether a decode-path kernel (fused GEMV, Triton decode attention) launches with programmatic
    dependent launch: it may start while its predecessor drains, stream its weights (which no kernel
    writes) and only then wait for the predecessor's output (``griddepcontrol.wait``). That hides the
    launch gap and the memory-pipeline ramp, which is most of a short kernel. Needs Hopper or newer.

    ``policy`` (the engine's ``KernelConfig.pdl``, checked there): "on" for every such kernel, "off"
    for none, "auto" for kernels of at most ``PDL_AUTO_MAX_BYTES`` of weights: in bench/ab_decode.py
    (variants pdl_max=...) PDL sped up every projection of the 8B shape but its gate|up, whose long
    multi-wave GEMV ran slower with it (docs/benchmarks.md)."""
    if policy == "off" or not HAVE_TRITON or device.type != "cuda":
        return False
    if policy == "auto" and weight_bytes > PDL_AUTO_MAX_BYTES:
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _pdl:
        _pdl[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return _pdl[index]


if HAVE_TRITON:
    from .launch import fast

    @triton.jit
    def rms_scale(x, rstd, w, dt):
        """HF's RMSNorm rounding for fp32 ``x``: normalise, round to the activation dtype ``dt``, scale
        by ``w``, round again; returned in fp32. Shared by the q/k-norm of both decode paths."""
        return (w * (x * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)

    @triton.jit
    def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, x_stride_t, x_stride_h, n_h, out_stride, D, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < D
        x_row = x_ptr + (row // n_h) * x_stride_t + (row % n_h) * x_stride_h
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
        y = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * out_stride + cols, (w * y).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _add_rmsnorm_kernel(
        x_ptr,
        res_ptr,
        w_ptr,
        out_ptr,
        x_stride,
        res_stride,
        out_stride,
        D,
        eps,
        BLOCK: tl.constexpr,
        USE_PDL: tl.constexpr,
    ):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < D
        if USE_PDL:  # everything it reads but the weight comes from the kernels before
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0)
        s = (r.to(tl.float32) + x.to(tl.float32)).to(res_ptr.dtype.element_ty)  # HF: residual + x in dtype
        tl.store(res_ptr + row * res_stride + cols, s, mask=mask)
        sf = s.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(sf * sf, axis=0) / D + eps)
        y = (sf * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * out_stride + cols, (w * y).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _qk_norm_rope_kernel(
        q_ptr,
        k_ptr,
        qo_ptr,
        qw_ptr,
        kw_ptr,
        pos_ptr,
        cache_ptr,
        q_stride_t,
        q_stride_h,
        k_stride_t,
        k_stride_h,
        n_qh,
        n_kh,
        eps,
        HALF: tl.constexpr,
        BLOCK_H: tl.constexpr,
        HAS_NORM: tl.constexpr,
    ):
        """Per token: (optional) per-head RMSNorm of q and k, then NeoX RoPE. q goes to a contiguous
        output (attention kernels want it so), k is rewritten in place (it only goes to the cache)."""
        t = tl.program_id(0)
        pos = tl.load(pos_ptr + t)
        d = tl.arange(0, HALF)
        c = tl.load(cache_ptr + pos * (2 * HALF) + d)
        s = tl.load(cache_ptr + pos * (2 * HALF) + HALF + d)
        h = tl.arange(0, BLOCK_H)
        # queries
        qm = h[:, None] < n_qh
        qp = q_ptr + t * q_stride_t + h[:, None] * q_stride_h + d[None, :]
        x1 = tl.load(qp, mask=qm, other=0.0)
        x2 = tl.load(qp + HALF, mask=qm, other=0.0)
        dt = x1.dtype
        cf = c.to(dt).to(tl.float32)[None, :]
        sf = s.to(dt).to(tl.float32)[None, :]
        a = x1.to(tl.float32)
        b = x2.to(tl.float32)
        if HAS_NORM:
            rstd = tl.rsqrt((tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)) / (2 * HALF) + eps)[:, None]
            w1 = tl.load(qw_ptr + d).to(tl.float32)[None, :]
            w2 = tl.load(qw_ptr + HALF + d).to(tl.float32)[None, :]
            a = rms_scale(a, rstd, w1, dt)
            b = rms_scale(b, rstd, w2, dt)
        qo = qo_ptr + t * (n_qh * 2 * HALF) + h[:, None] * (2 * HALF) + d[None, :]
        tl.store(qo, (a * cf - b * sf).to(dt), mask=qm)
        tl.store(qo + HALF, (b * cf + a * sf).to(dt), mask=qm)
        # keys
        km = h[:, None] < n_kh
        kp = k_ptr + t * k_stride_t + h[:, None] * k_stride_h + d[None, :]
        a = tl.load(kp, mask=km, other=0.0).to(tl.float32)
        b = tl.load(kp + HALF, mask=km, other=0.0).to(tl.float32)
        if HAS_NORM:
            rstd = tl.rsqrt((tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)) / (2 * HALF) + eps)[:, None]
            w1 = tl.load(kw_ptr + d).to(tl.float32)[None, :]
            w2 = tl.load(kw_ptr + HALF + d).to(tl.float32)[None, :]
            a = rms_scale(a, rstd, w1, dt)
            b = rms_scale(b, rstd, w2, dt)
        tl.store(kp, (a * cf - b * sf).to(dt), mask=km)
        tl.store(kp + HALF, (b * cf + a * sf).to(dt), mask=km)

    @triton.jit
    def _store_kv_kernel(
        k_ptr,
        v_ptr,
        kc_ptr,
        vc_ptr,
        loc_ptr,
        k_stride_t,
        k_stride_h,
        v_stride_t,
        v_stride_h,
        n_kh,
        D: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        t = tl.program_id(0)
        slot = tl.load(loc_ptr + t).to(tl.int64)
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, D)
        m = h[:, None] < n_kh
        dst = slot * (n_kh * D) + h[:, None] * D + d[None, :]
        k = tl.load(k_ptr + t * k_stride_t + h[:, None] * k_stride_h + d[None, :], mask=m)
        v = tl.load(v_ptr + t * v_stride_t + h[:, None] * v_stride_h + d[None, :], mask=m)
        tl.store(kc_ptr + dst, k, mask=m)
        tl.store(vc_ptr + dst, v, mask=m)

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, x_stride, out_stride, N_COLS, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        row = tl.program_id(0)
        blk = tl.program_id(1)
        cols = blk * BLOCK + tl.arange(0, BLOCK)
        mask = cols < N_COLS
        if USE_PDL:  # its input comes from the kernel before; the next may start streaming its weights
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        g = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
        u = tl.load(x_ptr + row * x_stride + N_COLS + cols, mask=mask, other=0.0)
        gf = g.to(tl.float32)
        act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)  # HF: silu in dtype, then mul
        tl.store(out_ptr + row * out_stride + cols, (act * u.to(tl.float32)).to(g.dtype), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of x [T, D] or [T, H, D] (strided rows allowed); contiguous out."""
    x3 = x if x.dim() == 3 else x.unsqueeze(1)
    T, H, D = x3.shape
    out = torch.empty((T, H, D), dtype=x.dtype, device=x.device)
    fast(_rmsnorm_kernel)[(T * H,)](
        x3,
        weight,
        out,
        x3.stride(0),
        x3.stride(1),
        H,
        D,
        D,
        eps,
        BLOCK=next_pow2(D),
        num_warps=4 if D <= 2048 else 8,
    )
    return out.view(x.shape)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool = False
) -> torch.Tensor:
    """``residual += x`` (in place, in the activation dtype), return RMSNorm(residual).

    ``pdl``: launch with programmatic dependent launch and let the next kernel launch at once, so a
    PDL-launched projection after it streams its first weight tile while the norm runs."""
    out = torch.empty_like(residual)
    D = residual.shape[-1]
    fast(_add_rmsnorm_kernel)[(residual.shape[0],)](
        x,
        residual,
        weight,
        out,
        x.stride(0),
        residual.stride(0),
        out.stride(0),
        D,
        eps,
        BLOCK=next_pow2(D),
        USE_PDL=pdl,
        num_warps=4 if D <= 2048 else 8,
        launch_pdl=pdl,
    )
    return out


def silu_and_mul(x: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """x [N, 2I] (gate | up) -> silu(gate) * up [N, I].

    ``pdl``: launch with programmatic dependent launch and let the next kernel launch at once, so a
    PDL-launched down projection after it requests its first weight tiles while this runs."""
    n, two_i = x.shape
    cols = two_i // 2
    out = torch.empty((n, cols), dtype=x.dtype, device=x.device)
    block = 1024
    fast(_silu_mul_kernel)[(n, cdiv(cols, block))](
        x, out, x.stride(0), out.stride(0), cols, BLOCK=block, USE_PDL=pdl, launch_pdl=pdl
    )
    return out


def qk_norm_rope(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """One launch for Qwen3's q/k norm (when weights are given) and RoPE. Returns a contiguous q;
    k (a strided view is fine) is updated in place."""
    T, n_qh, D = q.shape
    n_kh = k.shape[1]
    q_out = torch.empty((T, n_qh, D), dtype=q.dtype, device=q.device)
    has_norm = q_weight is not None
    fast(_qk_norm_rope_kernel)[(T,)](
        q,
        k,
        q_out,
        q_weight if has_norm else q,
        k_weight if has_norm else k,
        positions,
        cos_sin_cache,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        n_qh,
        n_kh,
        eps,
        HALF=D // 2,
        BLOCK_H=next_pow2(max(n_qh, n_kh)),
        HAS_NORM=has_norm,
        num_warps=4,
    )
    return q_out


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor) -> None:
    """k/v [T, Hkv, D] (strided rows allowed) -> the flat caches [slots, Hkv, D] at ``loc`` (one launch)."""
    T, n_kh, D = k.shape
    if T == 0:
        return
    fast(_store_kv_kernel)[(T,)](
        k,
        v,
        k_cache,
        v_cache,
        loc,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        n_kh,
        D=D,
        BLOCK_H=next_pow2(n_kh),
        num_warps=4,
    )
