"""How the memory ledger's ``free`` row reads when the device is the host's CPU, wherever it is shown.

On a CPU the engine has no device memory limit, so ``MemoryLedger.free`` is 0 by construction: shown
as "0 B" it reads as no headroom at all. The dashboard's ledger and ``graphtop trace summary`` both
say :data:`FREE_ON_CPU` instead, in the same words.
"""

from __future__ import annotations

FREE_ON_CPU = "not applicable on CPU"


def free_applies(device: str) -> bool:
    """Whether a ledger of ``device`` ("cpu", "cuda:0", …) has a meaningful free row."""
    return not device.startswith("cpu")
