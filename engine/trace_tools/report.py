"""``graphtop trace summary``'s text: a ``TraceSummary`` (see ``summary``) as a plain-text report.

Only layout lives here; every number comes from ``summary`` and the counting rules in ``stats``.
"""

from __future__ import annotations

from typing import Optional

from ..telemetry.plain_text import one_line
from .ledger_words import FREE_ON_CPU, free_applies
from .stats import Percentiles
from .summary import TraceSummary

__all__ = ["format_summary"]


def _bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # unreachable


def _ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.3f}"


def _pct(x: Optional[float]) -> str:
    return f"{100.0 * (x or 0.0):.1f}%"


def _bar(value: int, peak: int, width: int, ascii_only: bool) -> str:
    if peak <= 0 or width <= 0:
        return ""
    n = round(width * value / peak)
    if value > 0:
        n = max(n, 1)
    return ("#" if ascii_only else "\u2588") * n


def _percentile_row(label: str, p: Percentiles) -> str:
    return f"  {label:<24}{p.count:>8}  {_ms(p.p50):>9}  {_ms(p.p90):>9}  {_ms(p.p99):>9}  {_ms(p.max):>9}"


def format_summary(summary: TraceSummary, *, width: int = 30, ascii_only: bool = False) -> str:
    """Human-readable report (plain text, no colour) for the terminal or a log."""
    s = summary
    out: list[str] = []
    title = "graphtop trace summary" + (f": {s.path}" if s.path else "")
    out.append(title)
    if s.engine is not None:
        e = s.engine
        out.append(
            f"  model {e.model or '?'} ({e.architecture or '?'}) on {e.device_name or e.device or '?'}"
            f" dtype {e.dtype or '?'}, attention {e.attention_backend or '?'},"
            f" graphs decode={e.decode_graph_backend or '-'} prefill={e.prefill_graph_backend or '-'}"
        )
        if e.attention_backend_note:  # how the engine set itself up: backend choice, kernels, schedule
            out.append(f"  setup: {e.attention_backend_note}")
    if s.emulated:
        out.append("  EMULATED run: graph replays were emulated, timings are not real CUDA-graph timings")
    if s.truncated_tail:
        out.append("  note: the last trace line was incomplete and skipped (writer killed?)")
    if s.missing_steps:
        out.append(f"  note: step numbers missing from the trace: {s.missing_steps} (events dropped?)")
    out.append(f"  {s.events} events over {s.wall_s:.2f} s")

    out.append("")
    out.append("Requests")
    reasons = ", ".join(f"{k} {v}" for k, v in s.finish_reasons.items())
    out.append(
        f"  queued {s.requests_queued}  finished {s.requests_finished}"
        + (f" ({reasons})" if reasons else "")
        + (f"  errors {s.request_errors}" if s.request_errors else "")
    )
    out.append(f"  prompt tokens {s.prompt_tokens}  output tokens {s.output_tokens}")
    window = f"serving {s.serving_s:.2f} s" if s.serving_s else f"wall {s.wall_s:.2f} s"
    out.append(f"  throughput {s.tokens_per_s:.1f} output tok/s ({window})")

    out.append("")
    out.append("Steps")
    out.append(f"  {'phase':<10}{'steps':>8}{'graph':>8}{'eager':>8}{'hit rate':>10}{'waste':>9}")
    for ph in s.phases.values():
        out.append(
            f"  {ph.phase:<10}{ph.steps:>8}{ph.graph_steps:>8}{ph.eager_steps:>8}"
            f"{_pct(ph.hit_rate):>10}{_pct(ph.padding_waste):>9}"
        )
    out.append(
        f"  {'total':<10}{s.steps:>8}{s.graph_steps:>8}{s.steps - s.graph_steps:>8}"
        f"{_pct(s.hit_rate):>10}{_pct(s.padding_waste):>9}"
    )
    out.append(
        f"  padding waste overall {_pct(s.padding_waste)}"
        f" ({s.padded_tokens} padded of {s.bucket_tokens} bucket tokens, graph steps)"
    )

    if any(ph.buckets for ph in s.phases.values()):
        out.append("")
        out.append("Bucket hits (graph steps)")
        for ph in s.phases.values():
            if not ph.buckets:
                continue
            peak = max(b.count for b in ph.buckets.values())
            for b in ph.buckets.values():
                out.append(
                    f"  {ph.phase:<8}{b.bucket:>7} {_bar(b.count, peak, width, ascii_only):<{width}}"
                    f" {b.count:>7}  padded {b.padded_tokens:>7}  mean waste {_pct(b.mean_waste):>6}"
                )

    if s.fallbacks:
        out.append("")
        out.append("Fallbacks (eager steps by reason)")
        total = sum(c for _, c in s.fallbacks)
        for i, (reason, count) in enumerate(s.fallbacks, 1):
            out.append(f"  {i:>2}. {reason:<32}{count:>8}  {_pct(count / total):>6}")

    out.append("")
    out.append(f"Timing (ms){'':<14}{'count':>9}  {'p50':>9}  {'p90':>9}  {'p99':>9}  {'max':>9}")
    out.append(_percentile_row("replay (graph steps)", s.replay_ms))
    for ph in s.phases.values():
        if ph.replay_ms.count and len(s.phases) > 1:
            out.append(_percentile_row(f"  replay {ph.phase}", ph.replay_ms))
    out.append(_percentile_row("host (all steps)", s.host_ms))
    for ph in s.phases.values():
        if ph.host_ms.count and len(s.phases) > 1:
            out.append(_percentile_row(f"  host {ph.phase}", ph.host_ms))
    if s.ttft_ms.count:
        out.append(_percentile_row("TTFT", s.ttft_ms))
    if s.latency_ms.count:
        out.append(_percentile_row("request latency", s.latency_ms))

    if s.captures:
        out.append("")
        out.append("Capture ledger")
        for c in s.captures:
            state = "" if c.finished else "  (unfinished)"
            if c.finished and c.ok is False:
                state = f"  FAILED: {c.failure_reason or 'unknown'}"
            planned = f"/{len(c.planned)}" if c.planned else ""
            out.append(
                f"  {c.phase:<8}{c.reason:<10} captured {len(c.captured)}{planned}"
                f"  failed {len(c.failed)}  {c.seconds:.2f} s  {_bytes(c.memory_bytes)}"
                + (f"  [{c.backend}]" if c.backend else "")
                + state
            )
            for bucket, why in c.failed.items():
                out.append(f"      bucket {bucket}: {why or 'no reason given'}")
    if s.recaptures:
        out.append(f"  recaptures {s.recaptures} ({s.recapture_failures} failed)")

    if s.memory is not None:
        m = s.memory
        out.append("")
        out.append(f"Memory ledger ({m.device or 'device'})")
        for label, value in (
            ("total", m.total),
            ("weights", m.weights),
            *((("  of them experts", m.experts),) if m.experts else ()),
            ("kv pool", m.kv_pool),
            ("decode graphs", m.decode_graphs),
            ("prefill graphs", m.prefill_graphs),
            ("activation reserve", m.activation_reserve),
        ):
            out.append(f"  {label:<20}{_bytes(value):>12}")
        free = _bytes(m.free) if free_applies(m.device) else FREE_ON_CPU  # the dashboard's words
        out.append(f"  {'free':<20}{free:>12}")
    if s.kv_capacity_tokens:
        out.append(
            f"  KV pool peak {s.kv_peak_used_tokens}/{s.kv_capacity_tokens} tokens"
            f" ({_pct(s.kv_peak_used_tokens / s.kv_capacity_tokens)})"
        )

    if s.parity.checks:
        p = s.parity
        out.append("")
        verdict = f"{p.mismatches} MISMATCH(ES)" if p.mismatches else "all agree"
        out.append(f"Parity checks (graph step vs its eager re-run, one graph step in {p.every}): {verdict}")
        out.append(f"  checks {p.checks}  mismatches {p.mismatches}  skipped {p.skipped}  discarded {p.discarded}")
        out.append(
            f"  worst relative error {p.worst_rel_err:.3g} (tolerance {p.tolerance:g})"
            f"  worst abs error {p.worst_abs_err:.3g}"
        )
        out.append(
            f"  lowest argmax agreement {_pct(p.min_argmax_agree)}  lowest top-5 overlap {_pct(p.min_top5_overlap)}"
        )
    elif s.parity.skipped or s.parity.discarded:
        p = s.parity
        out.append("")
        out.append(
            f"Parity checks (one graph step in {p.every}): none compared  skipped {p.skipped}  discarded {p.discarded}"
        )

    if s.ranks:
        out.append("")
        out.append(f"Tensor parallel ({len(s.ranks)} ranks)")
        for r in s.ranks.values():
            caps = "  ".join(
                f"{phase} {len(c.captured)}/{c.total or len(c.costs)}"
                + (f" failed {sorted(c.failed)}" if c.failed else "")
                for phase, c in r.captures.items()
            )
            mem = f"  weights {_bytes(r.memory.weights)}  kv {_bytes(r.memory.kv_pool)}" if r.memory else ""
            out.append(f"  rank {r.rank}  {caps or 'no captures'}  replay p50 {_ms(r.replay_ms.p50)} ms{mem}")

    if s.downgrades:
        out.append("")
        out.append("Config downgrades")
        for d in s.downgrades:
            out.append(f"  {d.key}: {d.old!r} -> {d.new!r} ({d.reason})")
    if s.errors:
        out.append("")
        out.append(f"Errors ({len(s.errors)})")
        for err in s.errors[:10]:
            out.append(f"  {'FATAL ' if err.fatal else ''}{err.where}: {err.message}")
        if len(s.errors) > 10:
            out.append(f"  ... {len(s.errors) - 10} more")
    # names, reasons and messages come from the trace: a control character or line break in one must not
    # restyle the terminal or forge report lines
    return "\n".join(one_line(line) for line in out) + "\n"
