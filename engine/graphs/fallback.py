"""Why a step ran eagerly. The value is the string written to traces and shown in the dashboard."""

from __future__ import annotations

import enum


class FallbackReason(str, enum.Enum):
    PHASE_DISABLED = "phase_disabled"
    """Graphs for this phase are turned off by config (or were downgraded off)."""
    NO_CUDA_GRAPHS = "no_cuda_graphs"
    """The device cannot capture graphs and emulation is off (``--no-graph-emulation``)."""
    EXCEEDS_MAX_BUCKET = "exceeds_max_bucket"
    """Decode batch has more requests than the largest captured bucket."""
    PREFILL_TOKENS_OVER_MAX_BUCKET = "prefill_tokens_over_max_bucket"
    """Prefill step has more tokens than the largest captured token bucket."""
    PREFILL_PADDING_OVER_CAP = "prefill_padding_over_cap"
    """Rounding up to the next prefill bucket would waste more than the configured fraction."""
    CONTEXT_EXCEEDS_GRAPH = "context_exceeds_graph"
    """A request's context is longer than the graph's fixed page-table width."""
    CAPTURE_FAILED = "capture_failed"
    """The bucket this batch needs failed to capture (e.g. out of memory) and was dropped."""
    RECAPTURE_IN_PROGRESS = "recapture_in_progress"
    """Graphs are being replaced and this step's new bucket is not captured yet."""
    NOT_YET_CAPTURED = "not_yet_captured"
    """The engine serves while its first capture runs (between steps) and this step's bucket is
    not captured yet; it goes live the moment it is, so later steps of the same request replay it."""
    KERNELS_COMPILING = "kernels_compiling"
    """This step's bucket is not captured yet and its capture waits for its kernels, which compile in
    worker processes (models/kernels/compile_pool.py) so that no step waits for a compiler."""
    NO_GRAPHS_CAPTURED = "no_graphs_captured"
    """The phase is enabled but its bucket list is empty after limits and failures."""
