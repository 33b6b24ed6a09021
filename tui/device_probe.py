"""Samples GPU (NVML) and host (psutil) health for the device panel.

Runs in a thread worker at ~1 Hz: NVML calls can take milliseconds and must never stall the UI.
A machine without an NVIDIA driver is a normal state (CPU runs, CI, laptops), so a missing NVML
becomes a calm note, never an exception.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    memory_used: int
    memory_total: int
    utilization_pct: Optional[float]
    power_w: Optional[float]
    power_limit_w: Optional[float]
    temperature_c: Optional[float]


@dataclass(frozen=True)
class DeviceSample:
    gpus: tuple[GpuSample, ...]
    gpu_note: Optional[str]  # why there are no GPUs, e.g. "no NVIDIA GPU"
    cpu_pct: float
    cpu_count: int
    ram_used: int
    ram_total: int
    process_rss: int


class DeviceProbe:
    """Owns the NVML session; ``sample`` is safe to call repeatedly from one thread."""

    def __init__(self) -> None:
        self._nvml = None
        self.note: Optional[str] = None
        try:
            import pynvml  # from nvidia-ml-py

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as exc:  # NVML missing / no driver / no device: all the same to us
            name = type(exc).__name__
            self.note = "no NVIDIA GPU" + ("" if "NotFound" in name or "Library" in name else f" ({name})")
        try:
            import psutil

            self._psutil = psutil
            self._proc = psutil.Process(os.getpid())
            psutil.cpu_percent(interval=None)  # prime: the first reading is always 0
        except Exception:  # pragma: no cover - psutil is a dependency
            self._psutil = None
            self._proc = None

    def _gpus(self) -> tuple[GpuSample, ...]:
        nv = self._nvml
        if nv is None:
            return ()
        out = []
        try:
            count = nv.nvmlDeviceGetCount()
        except Exception:
            return ()
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                name = nv.nvmlDeviceGetName(h)
                name = name.decode() if isinstance(name, bytes) else str(name)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
            except Exception:
                continue
            util = power = limit = temp = None
            try:
                util = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:
                pass
            try:
                power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
                limit = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
            except Exception:
                pass
            try:
                temp = float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
            except Exception:
                pass
            out.append(GpuSample(i, name, int(mem.used), int(mem.total), util, power, limit, temp))
        return tuple(out)

    def sample(self) -> DeviceSample:
        ps = self._psutil
        gpus = self._gpus()
        note = self.note if not gpus else None
        if ps is None:  # pragma: no cover
            return DeviceSample(gpus, note, 0.0, os.cpu_count() or 1, 0, 0, 0)
        vm = ps.virtual_memory()
        rss = self._proc.memory_info().rss if self._proc is not None else 0
        return DeviceSample(
            gpus,
            note or (None if gpus else "no NVIDIA GPU"),
            float(ps.cpu_percent(interval=None)),
            os.cpu_count() or 1,
            int(vm.total - vm.available),
            int(vm.total),
            int(rss),
        )

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None
