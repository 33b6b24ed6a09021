"""The counting rules behind every "is the graph paying off" number: one place, many readers.

The trace report, the dashboard and the bucket editor's what-if all count graph hits and padding the
same way, so a number seen in one can be checked against another:

* graph hit rate = steps that replayed a graph / all steps;
* padding waste = padded tokens / bucket tokens, over graph steps with a bucket (a decode row is one
  token, so decode buckets count rows);
* a step's mean waste = the mean of its per-step ``padding_waste`` (the report's per-bucket column);
* percentiles use linear interpolation between closest ranks (numpy's default);
* parity checks (graph step vs its eager re-run): the engine decides each check's ``mismatch``
  (relative error over its tolerance); the tally keeps the worst errors, the lowest argmax agreement
  and top-5 overlap, and the latest cumulative skipped / discarded counts.

The tallies that apply these rules (``HitTally``, ``BucketTally``, ``ParityTally``) live in
``telemetry.tallies``, where the live fold of the event stream (``telemetry.fold``) counts with them;
they are re-exported here. Pure data and arithmetic: no torch, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

from ..telemetry.latency import mean_itl_ms
from ..telemetry.step_size import step_key, step_phase
from ..telemetry.tallies import BucketTally, HitTally, ParityTally

__all__ = [
    "BucketTally",
    "HitTally",
    "ParityTally",
    "Percentiles",
    "mean_itl_ms",
    "percentile",
    "step_key",
    "step_phase",
]


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100) of an already sorted, non-empty list."""
    if not sorted_values:
        raise ValueError("percentile of empty list")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class Percentiles:
    """Distribution of a timing; all None when there were no samples."""

    count: int = 0
    p50: Optional[float] = None
    p90: Optional[float] = None
    p99: Optional[float] = None
    mean: Optional[float] = None
    max: Optional[float] = None

    @classmethod
    def of(cls, values: Iterable[Optional[float]]) -> "Percentiles":
        vals = sorted(v for v in values if v is not None and math.isfinite(v))
        if not vals:
            return cls()
        return cls(
            count=len(vals),
            p50=percentile(vals, 50),
            p90=percentile(vals, 90),
            p99=percentile(vals, 99),
            mean=sum(vals) / len(vals),
            max=vals[-1],
        )
