"""Where the skinny GEMM is used: its measured configs tile their shapes, row classes, and which
projections a decoder layer hands it; and how a layer launches its one-row fused GEMVs (CPU: the
policy, not the kernels; those are in tests/cuda/test_cuda_skinny.py and tests/cuda/test_cuda_kernels.py)."""

from __future__ import annotations

import pytest
import torch
from support.fused_layers import fused_layer
from torch import nn

from graphtop.engine.kernel_config import KernelConfig, resolve_kernel_config
from graphtop.models.decoder import DecoderLayer
from graphtop.models.kernels import skinny as ts
from graphtop.models.kernels import skinny_tuning as st
from graphtop.models.registry import spec_from_hf_config
from graphtop.models.synthetic.random_model import SHAPES, hf_config_for


def test_every_tuned_config_tiles_its_shape() -> None:
    for (n, k, cls, silu), cfg in st.TUNED.items():
        assert cls in st.ROW_CLASSES
        assert st.config_ok(n, k, cfg, silu), ((n, k, cls, silu), cfg)


def test_tuned_shapes_are_the_measured_models_projections() -> None:
    """Every entry is a real projection of a benchmark shape (a typo'd key would silently never match)."""
    shapes = set()
    for name in ("qwen3-0.6b", "llama-3.1-8b"):
        c = SHAPES[name]
        h, i = c["hidden_size"], c["intermediate_size"]
        hd = c.get("head_dim") or h // c["num_attention_heads"]
        q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
        # gate|up: with SiLU·mul fused, or plain (the SiLU·mul kernel after it)
        shapes |= {(q + 2 * kv, h, False), (h, q, False), (2 * i, h, True), (2 * i, h, False), (h, i, False)}
        if not c.get("tie_word_embeddings", False):  # an untied lm_head takes the final norm folded in
            shapes.add((c["vocab_size"], h, False))
    assert {(n, k, silu) for n, k, _, silu in st.TUNED} <= shapes


def test_row_classes() -> None:
    assert [st.row_class(m) for m in (0, 1, 2, 16, 17, 64, 65, 128, 129, 256, 257)] == [
        None,
        None,
        16,
        16,
        64,
        64,
        128,
        128,
        256,
        256,
        None,
    ]
    assert st.configs_for(4096, 1024) == {16: st.TUNED[(4096, 1024, 16, False)], 64: st.TUNED[(4096, 1024, 64, False)]}
    assert st.configs_for(6144, 1024, silu=True) == {16: st.TUNED[(6144, 1024, 16, True)]}
    assert st.configs_for(123, 456) == {}


def test_config_ok_rejects_partial_tiles() -> None:
    assert st.config_ok(1024, 2048, (32, 128, 4, 4, 3))
    assert not st.config_ok(1000, 2048, (32, 128, 1, 4, 3))  # N not whole slabs
    assert not st.config_ok(1024, 2048, (32, 256, 16, 4, 3))  # a split shorter than one K tile
    assert not st.config_ok(1024, 2000, (32, 128, 1, 4, 3))


def test_a_layer_hands_the_skinny_gemm_only_its_measured_plain_projections() -> None:
    layer = fused_layer("qwen3-0.6b")
    layer.set_skinny(True, "auto")
    qkv, o, gate_up, down = layer.kernels.skinny
    assert set(qkv) == {16, 64} and set(o) == {16, 64} and set(gate_up) == {16} and set(down) == {16, 64}
    # at 64 rows gate|up runs the plain skinny GEMM, the SiLU·mul kernel after it
    assert layer.kernels.skinny_gate_up_plain == {64: st.TUNED[(6144, 1024, 64, False)]}
    layer.set_skinny(False, "auto")
    assert layer.kernels.skinny == ({}, {}, {}, {}) and layer.kernels.skinny_gate_up_plain == {}
    # a shape nobody measured keeps cuBLAS everywhere
    other = fused_layer("qwen3-0.6b", hidden_size=512)
    other.set_skinny(True, "auto")
    assert other.kernels.skinny == ({}, {}, {}, {})


def test_a_plain_gate_up_config_yields_to_a_fused_one(monkeypatch) -> None:
    monkeypatch.setitem(st.TUNED, (6144, 1024, 16, False), (64, 128, 1, 4, 4))
    layer = fused_layer("qwen3-0.6b")
    layer.set_skinny(True, "auto")
    assert 16 in layer.kernels.skinny[2] and 16 not in layer.kernels.skinny_gate_up_plain


def test_the_silu_mul_kernel_launches_with_pdl_when_the_skinny_gemm_does(monkeypatch) -> None:
    from graphtop.models.kernels import fused as tk

    layer = fused_layer("qwen3-0.6b")
    monkeypatch.setattr(tk, "use_pdl", lambda device, weight_bytes=0, policy="auto": policy != "off")
    layer.set_skinny(True, "auto")
    assert layer.kernels.skinny_pdl and layer.kernels.silu_pdl
    layer.set_skinny(True, "off")
    assert not layer.kernels.skinny_pdl and not layer.kernels.silu_pdl
    monkeypatch.setattr(tk, "SILU_MUL_PDL", False)
    layer.set_skinny(True, "auto")
    assert layer.kernels.skinny_pdl and not layer.kernels.silu_pdl


def test_a_plain_gate_up_gemv_lets_the_pdl_down_projection_start_early(monkeypatch) -> None:
    """PDL "auto" leaves the 8B's gate|up (224 MiB) launched plainly; it then triggers the down
    projection after it, which launches with PDL. Where gate|up has PDL itself (the 0.6B, or "on") it
    triggers anyway, and with PDL off nothing waits to be triggered."""
    from graphtop.models.kernels import fused as tk
    from graphtop.models.kernels import gemv as tg

    def use_pdl(device, weight_bytes=0, policy="auto"):  # what a Hopper device answers
        return policy == "on" or (policy == "auto" and weight_bytes <= tk.PDL_AUTO_MAX_BYTES)

    monkeypatch.setattr(tk, "use_pdl", use_pdl)
    big, small = (fused_layer(shape).to(torch.bfloat16) for shape in ("llama-3.1-8b", "qwen3-0.6b"))
    big.set_pdl("auto")
    assert big.kernels.gemv_pdl == (True, True, False, True) and big.kernels.gate_up_trigger
    small.set_pdl("auto")
    assert all(small.kernels.gemv_pdl) and not small.kernels.gate_up_trigger
    for policy in ("on", "off"):
        big.set_pdl(policy)
        assert not big.kernels.gate_up_trigger
    monkeypatch.setattr(tg, "TRIGGER_NEXT", False)
    big.set_pdl("auto")
    assert not big.kernels.gate_up_trigger


def test_tensor_parallel_shards_and_biased_projections_keep_cublas() -> None:
    class RowShard(nn.Linear):  # stands for a projection whose forward does more than the GEMM
        pass

    layer = fused_layer("qwen3-0.6b")
    w = layer.self_attn.o_proj.weight
    with torch.device("meta"):
        layer.self_attn.o_proj = RowShard(w.shape[1], w.shape[0], bias=False)
        layer.mlp.down_proj = nn.Linear(layer.mlp.down_proj.in_features, layer.mlp.down_proj.out_features, bias=True)
    layer.set_skinny(True, "auto")
    qkv, o, gate_up, down = layer.kernels.skinny
    assert qkv and gate_up and not o and not down
    assert layer.kernels.norms_in_projections == frozenset()  # o and down cannot add into the residual


def test_norms_ride_in_the_projections_where_all_four_take_the_skinny_gemm(monkeypatch) -> None:
    layer = fused_layer("llama-3.1-8b")
    layer.set_skinny(True, "auto")
    assert layer.kernels.norms_in_projections == {16, 64}
    # the 0.6B's gate|up at 64 rows has a plain config (the SiLU·mul kernel after it): it still normalises;
    # at 16 rows the separate norm kernels measured faster
    small = fused_layer("qwen3-0.6b")
    small.set_skinny(True, "auto")
    assert small.kernels.norms_in_projections == {64}
    monkeypatch.setattr(st, "NORMS_APART", frozenset())
    small.set_skinny(True, "auto")
    assert small.kernels.norms_in_projections == {16, 64}
    monkeypatch.delitem(st.TUNED, (4096, 4096, 64, False))  # the 8B's o back on cuBLAS at 64 rows
    layer.set_skinny(True, "auto")
    assert layer.kernels.norms_in_projections == {16}
    monkeypatch.setattr(st, "NORMS_IN_PROJECTIONS", False)
    layer.set_skinny(True, "auto")
    assert layer.kernels.norms_in_projections == frozenset()
    layer.set_skinny(False, "auto")
    assert layer.kernels.norms_in_projections == frozenset()


def test_the_post_attention_norm_runs_apart_only_where_measured_faster(monkeypatch) -> None:
    """st.POST_NORM_APART picks, among the row classes with the norms in the projections, those whose
    post-attention add+RMSNorm stays a kernel of its own: none as shipped (measured slower everywhere)."""
    layer, small = fused_layer("llama-3.1-8b"), fused_layer("qwen3-0.6b")
    for lay in (layer, small):
        lay.set_skinny(True, "auto")
    assert layer.kernels.post_norm_apart == frozenset() and small.kernels.post_norm_apart == frozenset()
    monkeypatch.setattr(st, "POST_NORM_APART", frozenset({(4096, 16), (4096, 64), (1024, 16)}))
    layer.set_skinny(True, "auto")
    small.set_skinny(True, "auto")
    assert layer.kernels.post_norm_apart == {16, 64}
    assert small.kernels.post_norm_apart == frozenset()  # its norms are apart at 16 rows anyway: not in the projections
    monkeypatch.setattr(st, "NORMS_IN_PROJECTIONS", False)
    layer.set_skinny(True, "auto")
    assert layer.kernels.post_norm_apart == frozenset()


def test_the_kernel_config_switch() -> None:
    assert KernelConfig().skinny_gemm == "auto" and not KernelConfig().skinny_packed
    assert resolve_kernel_config(KernelConfig(), {"GRAPHTOP_SKINNY_GEMM": "off"}).skinny_gemm == "off"
    packed = resolve_kernel_config(KernelConfig(), {"GRAPHTOP_SKINNY_GEMM": "packed"})
    assert packed.skinny_packed and packed.skinny_layers
    with pytest.raises(ValueError, match="GRAPHTOP_SKINNY_GEMM='on'"):
        resolve_kernel_config(KernelConfig(), {"GRAPHTOP_SKINNY_GEMM": "on"})


def test_each_thread_gets_its_own_split_workspace() -> None:
    """Concurrent launches (the parity re-run's thread beside the serving thread) must not share the
    partials and tickets a split merge hands between programs; a grown set retires, never frees."""
    import threading

    ws = ts.SkinnyWorkspace()
    dev = torch.device("cpu")
    mine = ws.get(dev, 10, 4)
    assert ws.get(dev, 10, 4)[0] is mine[0] and ws.get(dev, 10, 4)[1] is mine[1]
    other: list = []
    t = threading.Thread(target=lambda: other.append(ws.get(dev, 10, 4)))
    t.start()
    t.join()
    assert other[0][0].data_ptr() != mine[0].data_ptr() and other[0][1].data_ptr() != mine[1].data_ptr()
    grown = ws.get(dev, (1 << 16) + 1, 4)
    assert grown[0].numel() > mine[0].numel() and grown[1] is mine[1]
    assert any(r is mine[0] for r in ws._retired)  # a captured graph may still point at it


def test_folding_the_norm_weights_keeps_what_the_projections_compute() -> None:
    """RMSNorm(x; w) @ W.T == RMSNorm(x; 1) @ (W * w).T (fp32 here; in bf16 the rounding moves from the
    normalised activations to the folded weights), for q|k|v after the input norm and gate|up after the
    post-attention norm; the norms' weights are left at one."""
    import torch.nn.functional as F

    spec = spec_from_hf_config(
        hf_config_for(
            "qwen3-0.6b",
            num_hidden_layers=1,
            hidden_size=64,
            intermediate_size=96,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
        ),
        "<test>",
    )
    torch.manual_seed(0)
    layer = DecoderLayer(spec, 0)
    layer.self_attn.fuse()
    layer.mlp.fuse()
    pairs = (
        (layer.input_layernorm, layer.self_attn.qkv_proj),
        (layer.post_attention_layernorm, layer.mlp.gate_up_proj),
    )
    x = torch.randn(5, 64)
    with torch.no_grad():
        for norm, _ in pairs:
            norm.weight.normal_(1.0, 0.3)
        before = [F.linear(norm(x), proj.weight) for norm, proj in pairs]
        layer.fold_norm_weights()
        after = [F.linear(norm(x), proj.weight) for norm, proj in pairs]
    for norm, _ in pairs:
        assert torch.equal(norm.weight, torch.ones_like(norm.weight))
    for b, a in zip(before, after):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_pack_puts_each_tile_in_one_contiguous_block() -> None:
    """``ts.pack``: tile (slab, K tile) of a [BLOCK_N, BLOCK_K] launch is one block, a slab's tiles in K
    order; with SiLU·mul the gate and up halves each so, the up half after the gate half."""
    n, k, bn, bk = 8, 12, 2, 4
    w = torch.arange(2 * n * k, dtype=torch.float32).reshape(2 * n, k)
    for silu in (False, True):
        p = ts.pack(w, (bn, bk, 1, 4, 4), silu).reshape(-1)
        assert p.shape == w.reshape(-1).shape and set(p.tolist()) == set(w.reshape(-1).tolist())
        half = n if silu else 2 * n
        for part in range(2 if silu else 1):
            for slab in range(half // bn):
                for t in range(k // bk):
                    at = part * half * k + (slab * (k // bk) + t) * bn * bk
                    rows = w[part * half + slab * bn : part * half + (slab + 1) * bn, t * bk : (t + 1) * bk]
                    assert torch.equal(p[at : at + bn * bk], rows.reshape(-1))


def test_packed_copies_only_where_asked_and_measured(monkeypatch) -> None:
    """A layer makes packed copies only with ``packed`` and only at ``st.PACKED``'s (hidden size, row
    class) of split-K configs (the 8B's 64-row class as shipped); asking again without it drops them from
    use but keeps them alive (a graph captured before may still read them), and asking again with it
    reuses them."""
    layer = fused_layer("llama-3.1-8b")  # on the meta device: shapes only
    layer.set_skinny(True, "auto")
    assert layer.kernels.packed == ({}, {}, {}, {})
    layer.set_skinny(True, "auto", packed=True)
    assert [set(d) for d in layer.kernels.packed] == [{64}, {64}, {64}, {64}]
    w = layer.kernels.packed[2][64]
    assert w.shape == layer.mlp.gate_up_proj.weight.shape and w.is_contiguous()
    layer.set_skinny(True, "auto")
    assert layer.kernels.packed == ({}, {}, {}, {}) and any(r is w for r in layer.kernels.packed_copies.values())
    monkeypatch.setattr(st, "PACKED", frozenset({(4096, 16), (4096, 64)}))
    layer.set_skinny(True, "auto", packed=True)
    assert all(16 in d for d in layer.kernels.packed)
    # asked again: the same copy, no new one
    assert layer.kernels.packed[2][64] is w and len(layer.kernels.packed_copies) == 8
    layer.set_skinny(False, "auto", packed=True)
    assert layer.kernels.packed == ({}, {}, {}, {})


def test_only_split_k_launches_at_listed_classes_read_packed_weights(monkeypatch) -> None:
    """``st.packs`` is the one place deciding which launches read a packed copy: a listed (hidden size,
    row class) and a split-K config; a stream-K config (split <= 0) at a listed class is left row-major,
    and a layer whose configs there are stream-K makes no copy."""
    monkeypatch.setattr(st, "PACKED", frozenset({(4096, 64)}))
    split_k, stream_k = (64, 128, 2, 4, 4), (64, 128, 0, 4, 4)
    assert st.packs(4096, 64, split_k) and st.packs(4096, 64, (64, 128, 1, 4, 4))
    assert not st.packs(4096, 64, stream_k) and not st.packs(4096, 64, (64, 128, -2, 4, 4))
    assert not st.packs(4096, 16, split_k) and not st.packs(1024, 64, split_k)
    layer = fused_layer("llama-3.1-8b")
    tuned = {key: (cfg[:2] + (0,) + cfg[3:] if key[2] == 64 else cfg) for key, cfg in st.TUNED.items()}
    monkeypatch.setattr(st, "TUNED", tuned)
    layer.set_skinny(True, "auto", packed=True)
    assert layer.kernels.skinny[2][64][2] == 0 and layer.kernels.packed == ({}, {}, {}, {})


def test_a_row_class_serves_the_rows_above_the_class_before_it() -> None:
    assert [st.class_rows(c) for c in st.ROW_CLASSES] == [(2, 16), (17, 64), (65, 128), (129, 256)]
    assert all(st.row_class(lo) == c == st.row_class(hi) for c in st.ROW_CLASSES for lo, hi in [st.class_rows(c)])


def test_the_model_says_where_packed_copies_are_read_and_what_they_hold(monkeypatch) -> None:
    """``packed_rows`` / ``packed_bytes`` (what the engine's note reports): nothing until asked; asked,
    the listed classes' batch sizes and, as planned, one copy of the layers' projection bytes per class;
    copies kept for earlier graphs still count after the setting is dropped."""
    from graphtop.models.decoder import DecoderForCausalLM

    spec = spec_from_hf_config(hf_config_for("llama-3.1-8b", num_hidden_layers=2), "<test>")
    with torch.device("meta"):
        model = DecoderForCausalLM(spec)
    model.to(torch.bfloat16)
    for layer in model.model.layers:
        layer.self_attn.fuse()
        layer.mlp.fuse()
    monkeypatch.setattr(st, "PACKED", frozenset({(4096, 16), (4096, 64)}))

    def ask(packed: bool) -> None:
        for layer in model.model.layers:
            layer.set_skinny(True, "auto", packed=packed)

    ask(False)
    assert model.packed_rows() == [] and model.packed_bytes() == 0
    ask(True)
    assert model.packed_rows() == [(2, 16), (17, 64)]
    assert model.packed_bytes() == model.packed_copy_bytes() > 0
    ask(False)
    assert model.packed_rows() == [] and model.packed_bytes() == model.packed_copy_bytes()


def test_the_kv_pool_is_planned_around_one_copy_per_packed_row_class(monkeypatch) -> None:
    """``packed_copy_bytes``: the layers' projection bytes once per ``st.PACKED`` row class of the model's
    hidden size, nothing for a shape it does not list (the engine adds it to the weights it plans for)."""
    from graphtop.models.decoder import DecoderForCausalLM

    spec = spec_from_hf_config(hf_config_for("qwen3-0.6b", num_hidden_layers=2), "<test>")
    with torch.device("meta"):
        model = DecoderForCausalLM(spec)
    per_layer = sum(
        p.numel() * 2
        for layer in model.model.layers
        for p in (*layer.self_attn.parameters(), *layer.mlp.parameters())
        if p.dim() == 2
    )
    model.to(torch.bfloat16)
    assert model.packed_copy_bytes() == 0  # the 0.6B is not listed as shipped
    monkeypatch.setattr(st, "PACKED", frozenset({(1024, 64), (1024, 16), (4096, 64)}))
    assert model.packed_copy_bytes() == 2 * per_layer > 0


def test_each_launch_reads_the_packed_copy_only_at_a_packed_row_class(monkeypatch) -> None:
    """``forward_fused`` at a listed row class hands every skinny launch its projection's packed copy with
    ``packed=True``; at another class the row-major weight with ``packed=False`` (the launches recorded,
    not run: the kernels need a GPU)."""
    spec = spec_from_hf_config(
        hf_config_for(
            "qwen3-0.6b",
            num_hidden_layers=1,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
        ),
        "<test>",
    )
    layer = DecoderLayer(spec, 0)
    layer.self_attn.fuse()
    layer.mlp.fuse()
    for cls in (16, 64):  # the tiny shape's projections, as if measured: qkv, o, gate|up (SiLU·mul), down
        for n, k, silu in ((128, 64, False), (64, 64, False), (256, 64, True), (64, 128, False)):
            monkeypatch.setitem(st.TUNED, (n, k, cls, silu), (32, 32, 1, 4, 4))
    monkeypatch.setattr(st, "PACKED", frozenset({(64, 64)}))
    layer.set_skinny(True, "off", packed=True)
    assert layer.kernels.norms_in_projections == {16, 64} and [set(d) for d in layer.kernels.packed] == [{64}] * 4
    launches: list[tuple[torch.Tensor, bool]] = []

    def skinny(x, w, *, config, silu_mul=False, pdl=None, norm=None, out=None, packed=False):
        launches.append((w, packed))
        return torch.zeros(x.shape[0], w.shape[0] // (2 if silu_mul else 1))

    def skinny_add(x, w, residual, *, config, pdl=None, packed=False):
        launches.append((w, packed))
        return torch.zeros(2, 16)

    monkeypatch.setattr(ts, "skinny", skinny)
    monkeypatch.setattr(ts, "skinny_add", skinny_add)
    monkeypatch.setattr(
        layer.self_attn, "attend_fused", lambda qkv, positions, rope, attn: torch.zeros(qkv.shape[0], 64)
    )
    projs = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
    for rows, cls in ((40, 64), (8, 16)):
        launches.clear()
        residual = torch.zeros(rows, 64)
        layer.forward_fused(None, residual, torch.arange(rows), None, None, sumsq=torch.zeros(2, 16))
        assert len(launches) == 4
        for (w, packed), i, proj in zip(launches, range(4), projs):
            if cls == 64:
                assert packed and w is layer.kernels.packed[i][64] and w is not proj.weight
            else:
                assert not packed and w is proj.weight
