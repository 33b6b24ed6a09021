"""Which device and dtype the engine runs on, checked before anything is loaded."""

from __future__ import annotations

import torch

from .errors import EngineError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """The device ``name`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) means here; EngineError otherwise."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise EngineError(f"unknown device {name!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EngineError("device cuda was asked for, but torch sees no CUDA device here")
    if dev.type not in ("cpu", "cuda"):
        raise EngineError(f"unsupported device {name!r}; use cpu, cuda or cuda:N")
    if dev.type == "cpu":
        # torch takes cpu:N, but there is one host device and safetensors refuses any index: cpu:0 is
        # the host, another index names nothing (it read as a corrupt weights file).
        if dev.index not in (None, 0):
            raise EngineError(f"unknown device {name!r}: the host is one device, cpu (or cpu:0)")
        return torch.device("cpu")
    return dev


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """``name`` (a key of ``DTYPES``), or bf16 on CUDA and fp32 on CPU when None."""
    if name:
        return DTYPES[name]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return "CPU"
