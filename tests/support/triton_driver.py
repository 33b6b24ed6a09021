"""A stand-in for Triton's GPU driver: lets a machine without a GPU run Triton's launch path up to the point
where it compiles, for an H100/H200 target (sm_90). Nothing can launch through it."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


class HopperDriver:
    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


@contextmanager
def hopper_driver() -> Iterator[None]:
    from triton.runtime.driver import driver

    previous = driver._active  # a machine without a GPU has no default driver to reset to
    driver.set_active(HopperDriver())
    try:
        yield
    finally:
        driver._active = previous
