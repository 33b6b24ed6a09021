"""What each thing on the dashboard means and what to do about it: one home for the explanations.

Panels use these as tooltips (the row under the mouse), the help screen lists all of them, and the
tests check that every fallback reason the engine can write has one. Pure (no textual import), so the
texts can be read and tested without a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphtop.engine.trace_tools.ledger_words import FREE_ON_CPU, free_applies

__all__ = ["Explanation", "FALLBACK_REASONS", "LEDGER_ROWS", "STATUS_ITEMS", "explain_fallback", "explain_ledger_row"]


@dataclass(frozen=True)
class Explanation:
    """A one-line meaning and a one-line remedy."""

    meaning: str
    action: str

    def line(self, name: str) -> str:
        """``name: meaning — action``: the form tooltips and the help screen show."""
        return f"{name}: {self.meaning} — {self.action}"


FALLBACK_REASONS: dict[str, Explanation] = {
    "phase_disabled": Explanation(
        "graphs for this phase are off (config, --disable-cuda-graph, or downgraded at start)",
        "turn them on with --cuda-graph-backend-decode/-prefill, or read the config-downgrade notice",
    ),
    "no_cuda_graphs": Explanation(
        "this device cannot capture CUDA graphs and emulation is off",
        "run on a CUDA GPU, or drop --no-graph-emulation to emulate graphs",
    ),
    "exceeds_max_bucket": Explanation(
        "the decode batch has more requests than the largest decode bucket",
        "add a larger decode bucket (b; ctrl+o advises) or lower --max-running-requests",
    ),
    "prefill_tokens_over_max_bucket": Explanation(
        "the prefill step has more tokens than the largest prefill bucket",
        "add a larger prefill bucket (b) or lower --chunked-prefill-size",
    ),
    "prefill_padding_over_cap": Explanation(
        "padding up to the next prefill bucket would waste more than the padding cap allows",
        "add a bucket near these sizes (b; ctrl+o advises) or raise --cuda-graph-max-padding-waste",
    ),
    "context_exceeds_graph": Explanation(
        "a request's context is longer than the decode graph's page table",
        "raise --max-context-len (graphs are sized from it) or send shorter requests",
    ),
    "capture_failed": Explanation(
        "the bucket this step needs failed to capture (e.g. out of memory) and was dropped",
        "see why in the capture panel (c); free memory, then recapture",
    ),
    "recapture_in_progress": Explanation(
        "graphs are being recaptured and this step's new bucket is not captured yet",
        "nothing: it ends when the recapture finishes (capture panel)",
    ),
    "not_yet_captured": Explanation(
        "the engine serves while its first capture runs and this step's bucket is not captured yet",
        "nothing: the bucket serves as soon as it is captured",
    ),
    "kernels_compiling": Explanation(
        "this step's bucket is not captured yet: its kernels compile in worker processes first",
        "nothing: a cold kernel cache fills once; later starts load it from graphtop's cache folder",
    ),
    "no_graphs_captured": Explanation(
        "graphs are on for this phase but no bucket survived the limits and capture failures",
        "check the bucket list against the limits, and the capture panel",
    ),
}
"""Every ``FallbackReason`` value (engine/graphs/fallback.py) with its meaning and remedy."""

UNKNOWN_REASON = Explanation(
    "a reason this graphtop does not know (an older or hand-made trace)", "see the engine that wrote it"
)

LEDGER_ROWS: dict[str, Explanation] = {
    "weights": Explanation("the model's parameters on the device", "fixed by the model and dtype (--dtype)"),
    "experts": Explanation(
        "of the weights, the mixture of experts' expert weights (a rank's share under --tp); shown for MoE models",
        "fixed by the model and dtype; --tp splits every expert's features across the ranks",
    ),
    "KV pool": Explanation(
        "cache pages for the tokens of running requests",
        "more pool, more tokens in flight: --mem-fraction-static (CUDA), --kv-budget-mb (CPU)",
    ),
    "decode graphs": Explanation(
        "memory the captured decode graphs hold",
        "fewer or smaller decode buckets free it (b, c shows each bucket's cost)",
    ),
    "prefill graphs": Explanation(
        "memory the captured prefill graphs hold",
        "fewer or smaller prefill buckets free it (b, c shows each bucket's cost)",
    ),
    "reserve": Explanation(
        "activations and workspaces kept free for eager steps and sampling",
        "sized by the engine from the largest step; smaller chunks need less",
    ),
    "free": Explanation(
        "device memory nobody holds: headroom", "spend it on the KV pool (--mem-fraction-static) or more graph buckets"
    ),
}
"""The memory ledger's rows, as the panel names them ("experts" only for a mixture-of-experts model)."""

CPU_FREE = Explanation(
    f"{FREE_ON_CPU}: host memory has no device limit to be free of",
    "nothing to tune; the KV pool is sized by --kv-budget-mb",
)

STATUS_ITEMS: tuple[tuple[str, str], ...] = (
    ("model", "the checkpoint served (demo: random weights)"),
    ("device · dtype", "where it runs and in which precision"),
    ("attn", "the attention backend"),
    ("graphs", "the graph backend per phase (decode, prefill); eager when graphs are off"),
    ("graph hits", "share of steps that replayed a CUDA graph instead of running eagerly"),
    ("dropped", "events the dashboard could not keep up with (panels may lag; traces are complete)"),
    ("EMULATED", "graphs are emulated: their replay times are not real CUDA-graph numbers"),
)
"""What the status line shows, left to right."""


def explain_fallback(reason: str) -> Explanation:
    return FALLBACK_REASONS.get(reason, UNKNOWN_REASON)


def explain_ledger_row(row: str, *, device: str = "cuda") -> Explanation:
    if row == "free" and not free_applies(device):
        return CPU_FREE
    return LEDGER_ROWS[row]
