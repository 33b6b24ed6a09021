"""KernelConfig: typed kernel choices, resolved once; GRAPHTOP_* variables override them in one place."""

from __future__ import annotations

import pytest
from support.paths import REPO as ROOT

from graphtop.engine.config import EngineConfig
from graphtop.engine.kernel_config import CHOICES, ENV, KernelConfig, resolve_kernel_config


def test_defaults_and_config_values_resolve_as_given() -> None:
    assert resolve_kernel_config(KernelConfig(), {}) == KernelConfig("auto", "auto", "fa2", "auto")
    chosen = KernelConfig(fused_gemv="off", decode_kernel="triton", prefill_backend="fa3", pdl="on")
    assert resolve_kernel_config(chosen, {}) == chosen
    assert not chosen.gemv_layers and KernelConfig().gemv_layers
    assert not KernelConfig(skinny_gemm="off").skinny_layers and KernelConfig().skinny_layers


def test_environment_overrides_each_field() -> None:
    env = {"GRAPHTOP_PDL": "off", "GRAPHTOP_FLASHINFER_DECODE": "flashinfer", "UNRELATED": "x"}
    got = resolve_kernel_config(KernelConfig(pdl="on", decode_kernel="triton"), env)
    assert (got.pdl, got.decode_kernel, got.fused_gemv, got.prefill_backend) == ("off", "flashinfer", "auto", "fa2")


@pytest.mark.parametrize("field", sorted(CHOICES))
def test_bad_values_name_their_source(field: str) -> None:
    with pytest.raises(ValueError) as from_env:
        resolve_kernel_config(KernelConfig(), {ENV[field]: "nope"})
    assert str(from_env.value) == f"{ENV[field]}='nope': use one of {', '.join(CHOICES[field])}"
    with pytest.raises(ValueError, match=rf"^kernels\.{field}='nope': use one of "):
        resolve_kernel_config(KernelConfig(**{field: "nope"}), {})


def test_the_fused_mlp_is_taken_where_asked_for_or_measured_faster(monkeypatch) -> None:
    """ "auto" (the default) takes the one-launch MLP only for shapes in ``fused_mlp.MEASURED_WINS``; "on"
    everywhere it can run, "off" nowhere."""
    from graphtop.models.kernels import fused_mlp as tm
    from graphtop.models.layers.linear import one_launch_mlp_for

    assert KernelConfig().fused_mlp == "auto" and not KernelConfig().mlp_fused
    assert resolve_kernel_config(KernelConfig(), {"GRAPHTOP_FUSED_MLP": "on"}).mlp_fused
    assert not resolve_kernel_config(KernelConfig(fused_mlp="on"), {"GRAPHTOP_FUSED_MLP": "off"}).mlp_fused
    with pytest.raises(ValueError) as bad:
        resolve_kernel_config(KernelConfig(), {"GRAPHTOP_FUSED_MLP": "yes"})
    assert str(bad.value) == "GRAPHTOP_FUSED_MLP='yes': use one of auto, off, on"
    assert not one_launch_mlp_for("auto", 1024, 3072)  # nothing measured yet
    monkeypatch.setattr(tm, "MEASURED_WINS", frozenset({(1024, 3072)}))
    assert one_launch_mlp_for("auto", 1024, 3072) and not one_launch_mlp_for("auto", 4096, 14336)
    assert one_launch_mlp_for("on", 4096, 14336) and one_launch_mlp_for(True, 4096, 14336)
    assert not one_launch_mlp_for("off", 1024, 3072) and not one_launch_mlp_for(False, 1024, 3072)


def test_engine_config_validation_checks_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    EngineConfig(kernels=KernelConfig(pdl="on")).validate()
    with pytest.raises(ValueError, match="kernels.pdl='always'"):
        EngineConfig(kernels=KernelConfig(pdl="always")).validate()
    monkeypatch.setenv("GRAPHTOP_FUSED_GEMV", "of")
    with pytest.raises(ValueError, match="GRAPHTOP_FUSED_GEMV='of'"):
        EngineConfig().validate()


def test_kernel_variables_are_read_in_one_module() -> None:
    """The one home: no other source file names a kernel variable (benchmarks pass configs)."""
    names = set(ENV.values())
    hits = []
    for folder in ("engine", "models", "tui", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            if any(name in text for name in names):
                hits.append(str(path.relative_to(ROOT)))
    assert hits == ["engine/kernel_config.py"]


def test_engine_resolves_once_with_overrides(monkeypatch, tiny_ckpt, make_engine) -> None:
    monkeypatch.setenv("GRAPHTOP_PDL", "off")
    kernels = KernelConfig(pdl="on", decode_kernel="triton")
    engine = make_engine(tiny_ckpt("llama"), graphs=False, kernels=kernels)
    assert engine.kernels == KernelConfig(decode_kernel="triton", pdl="off")
    assert engine.config.kernels is kernels  # the caller's config is left as given
    engine.close()
