"""The dashboard mode refuses an impossible device or backend before any UI opens (one line, exit 2)."""

from __future__ import annotations

import pytest
import torch

from graphtop.cli.entry import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "cuda"], "torch sees no CUDA device"),
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--device", "cpu:1"], "unknown device 'cpu:1': the host is one device, cpu (or cpu:0)"),
        (["--device", "cpu", "--attention-backend", "flashinfer"], "flashinfer needs a CUDA device"),
    ],
)
def test_interactive_mode_rejects_impossible_device_or_backend(argv, message, capsys, monkeypatch):
    import graphtop.cli.launch as launch

    monkeypatch.setattr(launch, "run_interactive", lambda *a, **k: pytest.fail("the dashboard must not open"))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("graphtop: error:") and message in err


def test_cpu_0_is_the_host_device() -> None:
    """``--device cpu:0`` reached safetensors as is and was reported as a corrupt weights file."""
    from graphtop.engine.device import resolve_device

    assert str(resolve_device("cpu:0")) == "cpu" and str(resolve_device("cpu")) == "cpu"
