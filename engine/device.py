"""Which device and dtype the engine runs on, checked before anything is loaded."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class EngineError(RuntimeError):
    """A problem the user can fix (bad device, backend unavailable, …); the message is one line."""


def resolve_device(name: str) -> torch.device:
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
