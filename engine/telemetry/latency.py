"""The latency rules that live metrics and offline reports share, in the live package so that both can
import it (the offline trace tools import the live telemetry, never the other way round)."""

from __future__ import annotations

from typing import Optional


def mean_itl_ms(ttft_ms: Optional[float], latency_ms: float, output_tokens: int) -> Optional[float]:
    """A finished request's inter-token latency: the mean time between its output tokens after the
    first, ``(latency - TTFT) / (tokens - 1)``. None without a TTFT, with fewer than 2 tokens, or when
    the latency is shorter than the TTFT (clocks that disagree). One rule for /metrics and the report."""
    if ttft_ms is None or output_tokens < 2 or latency_ms < ttft_ms:
        return None
    return (latency_ms - ttft_ms) / (output_tokens - 1)
