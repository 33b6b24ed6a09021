"""The size a step is bucketed by, and which phase's list it is looked up in: one rule for the runners'
policy, the advisor, live advice, the live fold of the event stream and the offline trace tools (in the
live telemetry package, which every one of them may import)."""

from __future__ import annotations

DECODE = "decode"
PREFILL = "prefill"


def step_phase(phase: str) -> str:
    """Which bucket list a step of ``phase`` is looked up in (anything but decode uses prefill's)."""
    return DECODE if phase == DECODE else PREFILL


def step_key(phase: str, batch_size: int, num_tokens: int) -> int:
    """The size a step is bucketed by: requests for decode, tokens otherwise."""
    return batch_size if step_phase(phase) == DECODE else num_tokens
