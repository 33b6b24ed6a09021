"""What a loaded weight tensor must be: stored as floating point, and finite after conversion.

Both checks guard against checkpoints that load without a word and then serve nonsense: an integer
tensor copied into a float parameter is converted value by value (an ``I16`` embedding becomes small
integers), and a NaN or infinity anywhere makes every request end at once with empty text.

The finiteness check is one extra read of every weight. ``FiniteChecks`` runs it on a helper thread
(one intra-op thread) while the loading thread copies the next tensors, so on a host it overlaps the
copy instead of adding to it. Tensors already on a GPU are checked together once loading is done: one
multi-tensor reduction (a few kernel launches for all of them, one synchronisation), since a kernel
launch and a wait per tensor would cost more than reading the weights.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Optional

import torch

from ..errors import CheckpointError

FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
"""safetensors dtype names whose values are weights as they are stored."""


def check_float_dtype(name: str, stored: str, file: Path) -> None:
    """Refuse a tensor that copying into a float parameter would misread: an integer tensor converts value by
    value, and an 8-bit (or narrower) float is a quantized weight whose scale lives in another tensor
    (``*.weight_scale_inv``), so copied alone it serves a wrong model without a word. Any float name outside
    FLOAT_DTYPES is such a narrow one (``F8_E4M3``, ``F6_E2M3``, ``F4``); a prefix test would also catch ``F64``."""
    if stored in FLOAT_DTYPES:
        return
    if stored.startswith("F"):
        raise CheckpointError(
            f"tensor '{name}' is stored as {stored}, a quantized format graphtop cannot serve in {file}"
        )
    raise CheckpointError(
        f"tensor '{name}' is stored as {stored}, not floating point: refusing to convert it into weights in {file}"
    )


@torch.no_grad()
def check_finite(name: str, tensor: torch.Tensor, file: Path) -> None:
    """Refuse a tensor holding NaN or infinity.

    One vectorised pass that allocates nothing: min and max propagate NaN and are infinite exactly when
    an infinity is there (a sum could also overflow, and a float32 sum of bf16 is an order of magnitude
    slower on a CPU). Only a failing tensor is counted element-wise, for the message.
    """
    if tensor.numel() == 0 or bool(torch.isfinite(torch.stack(torch.aminmax(tensor))).all()):
        return
    bad = int((~torch.isfinite(tensor)).sum())
    raise CheckpointError(f"tensor '{name}' holds {bad:,} non-finite values (NaN or infinity) in {file}")


_EXACT_WIDENING = {
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float64),
    (torch.bfloat16, torch.float64),
    (torch.float32, torch.float64),
}


def tensor_to_check(source: torch.Tensor, loaded: torch.Tensor) -> torch.Tensor:
    """On a host, the smaller of the two when that is exact: a widening conversion (bf16 -> float32)
    creates no NaN or infinity, so the stored tensor (half the bytes) decides; any other conversion can
    overflow (float32 -> float16, or rounding up to infinity), so the loaded tensor is checked. On a
    device always the loaded tensor: device checks wait until the end of the load, and holding every
    read-in source tensor until then would cost their memory."""
    if loaded.device.type != "cpu":
        return loaded
    return source if (source.dtype, loaded.dtype) in _EXACT_WIDENING else loaded


@torch.no_grad()
def check_finite_on_device(named: list[tuple[str, torch.Tensor, Path]]) -> None:
    """``check_finite`` for many device tensors at once: the L1 norm of each (multi-tensor kernels) is
    finite exactly when the tensor is, unless a sum of finite values overflows, which is then told
    apart by the exact check of each tensor (the slow path, taken only when something is off)."""
    by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for _, t, _ in named:
        if t.numel():
            by_dtype.setdefault((t.dtype, t.device), []).append(t)
    if not by_dtype:
        return
    flags = [torch.isfinite(torch.stack(torch._foreach_norm(ts, 1))).all() for ts in by_dtype.values()]
    if bool(torch.stack(flags).all()):
        return
    for name, t, file in named:
        check_finite(name, t, file)


def _one_thread() -> None:
    torch.set_num_threads(1)  # per thread (OpenMP): the loading thread keeps its own count


class FiniteChecks:
    """``check_finite`` for each submitted tensor: host tensors on a helper thread, device tensors all
    at once on exit (``check_finite_on_device``); ``__exit__`` waits for all of them and raises the
    first CheckpointError (after the load's own error, if it had one)."""

    MAX_PENDING = 8  # a checked source tensor stays alive until checked: bounded extra memory

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="graphtop-finite-check", initializer=_one_thread)
        self._pending: list[Future[None]] = []
        self._on_device: list[tuple[str, torch.Tensor, Path]] = []  # loaded weights: alive anyway

    def submit(self, name: str, tensor: torch.Tensor, file: Path) -> None:
        if tensor.device.type != "cpu":
            self._on_device.append((name, tensor, file))
            return
        for done in [f for f in self._pending if f.done()]:  # fail early once a check has failed
            done.result()
            self._pending.remove(done)
        while len(self._pending) >= self.MAX_PENDING:
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(check_finite, name, tensor, file))

    def __enter__(self) -> "FiniteChecks":
        return self

    def __exit__(self, kind: Optional[type], error: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        try:
            if kind is None:
                for future in self._pending:
                    future.result()
                check_finite_on_device(self._on_device)
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
