"""Online parity checks: one graph step in N re-run eagerly on the same inputs, off the critical path.

Why: a graph that reads a stale buffer, a wrong pad or a value baked in at capture computes
plausible-looking wrong logits, and nothing else in the engine notices. Re-running the step through
the eager path (same model, a second instance of the same attention backend, the same input ids,
positions and KV context) and comparing the logits says whether the graph still computes what the
model computes. Every check is a ``parity_check`` event; a relative error over the tolerance is a
mismatch.

Off the critical path: the step loop only snapshots, right after the step's forward, the graph's
logits and (under the overlap schedule) the step's input ids, still on the device, into buffers the
graphs do not own, and records an event after those copies. A worker thread runs the eager forward
on its own CUDA stream, which waits for that event (never the other way round), compares there, and
waits only for its own work. A check that falls due while another runs is skipped and counted; the
step loop's thread publishes the results, so events keep flowing one way with their step numbers.

Why a check cannot change what the requests get:

* KV writes: the eager forward stores the step's K/V too, but into scratch pages reserved from the
  pool (its capacity shrinks by them while checks are on), never into slots later steps read: each
  request's pages from its first new token on are swapped for scratch pages, and a first page that
  already holds earlier tokens is copied into its scratch page first. Outputs are the same, token for
  token, with checks on or off.
* KV reads: the context stays valid while the requests hold their pages. The scheduler gives a request
  a new page array when it frees its pages (finished, cancelled, preempted); after its own work has
  completed the worker compares only the rows of requests that still have the array they had (a
  reuse of freed pages is always launched after they were freed, and a request's rows read only its
  own pages). A check left with no such row is dropped as inconclusive (``discarded``).
* Attention metadata: the re-run plans on its own attention instance (``AttentionBackend.clone``).
* Capture: no check starts while a recapture is pending, and the engine waits for a running check
  before it captures (capturing forbids CUDA work from other threads).

The worker shares the GIL with the step loop, and its eager forward is mostly Python (every kernel
launched one by one). While checks are on, the interpreter's switch interval is at most
``SWITCH_INTERVAL_S``: the step loop re-takes the GIL many times a step (each torch call releases it),
and each time it may wait up to that interval for the worker; at CPython's default 5 ms, or even at
0.2 ms, those waits add up to more than a small graph decode step (``bench/parity_cost.py`` measures
this directly: a re-run replaced by pure Python slows the steps it overlaps as much as the real one).
On a GPU the worker also paces itself, one layer per device wait of the step loop
(``parity/pacing.py``), so its Python runs while the step loop has nothing to do.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch

from .. import switch_interval
from ..attention.base import AttentionBackend
from ..batch import ForwardBatch
from ..graphs.runners.base import StepOutput
from ..graphs.runners.eager import EagerRunner
from ..kv_pool import KVPool
from ..telemetry import events as ev
from ..telemetry.value_limits import MAX_FLOAT
from .pacing import DeviceWaits, Paced
from .scratch import pages_needed, scratch_batch

PublishFn = Callable[[ev.Event], None]

SWITCH_INTERVAL_S = 0.00005

DEFAULT_TOLERANCE = {torch.float32: 1e-3, torch.float16: 0.1, torch.bfloat16: 0.1}
"""Relative error (per row: max |graph - eager| / max |eager|) above which a check is a mismatch. Two
correct paths differ by rounding (other kernels, other batch shapes); a broken graph is off by O(1)."""


@dataclass
class _Check:
    """One check: what the step loop snapshotted, then what the worker found."""

    batch: ForwardBatch
    out: StepOutput  # identifies the step when it is delivered (and numbered)
    logits: torch.Tensor  # the graph's logits, copied out of the graph's buffers
    ids: Optional[torch.Tensor]  # the step's input ids when they were on the device (overlap schedule)
    ready: Optional[torch.cuda.Event]  # recorded after the copies, on the step's stream
    t0: float
    step_no: Optional[int] = None
    missed: int = 0  # other steps delivered while this one's number was still unknown
    stats: Optional[list[float]] = None  # max abs, max rel, argmax agreement, top-5 overlap
    rows: int = 0  # rows compared
    error: Optional[str] = None
    check_ms: float = 0.0
    finished: threading.Event = field(default_factory=threading.Event)


class ParityChecker:
    """Owned by the engine; the step loop calls ``after_forward``, ``delivered`` and ``poll``, all on
    its thread; the worker only runs checks and marks them finished."""

    def __init__(
        self,
        model: torch.nn.Module,
        attention: AttentionBackend,
        pool: KVPool,
        device: torch.device,
        publish: PublishFn,
        *,
        scratch_pages: int,
        tolerance: Optional[float] = None,
    ) -> None:
        """``scratch_pages``: how many pages to reserve while checks are on (the largest step checked)."""
        self.model = model
        self.attention = attention
        self.pool = pool
        self.device = device
        self.publish = publish
        self.scratch_need = scratch_pages
        dtype = next(model.parameters()).dtype
        self.tolerance = tolerance if tolerance is not None else DEFAULT_TOLERANCE.get(dtype, 0.1)
        self.every = 0
        self.checks = 0  # published, so far
        self.mismatches = 0
        self.worst_rel_err = 0.0
        self.skipped = 0
        self.discarded = 0
        self._graph_steps = 0
        self._scratch: list[int] = []
        self._running: Optional[_Check] = None  # the worker's (at most one)
        self._finished: list[_Check] = []  # done, waiting to be published in step order
        self._eager: Optional[EagerRunner] = None
        self._stream: Optional[torch.cuda.Stream] = None
        self._logits_buf: Optional[torch.Tensor] = None
        self._ids_buf: Optional[torch.Tensor] = None
        self._queue: "queue.SimpleQueue[Optional[_Check]]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._switch_ask: Optional[int] = None  # engine/switch_interval.py, while checks are on
        self._pacing = device.type == "cuda"  # a CPU forward has no device wait to fill
        self._layers = len(getattr(getattr(model, "model", None), "layers", ()))
        self._device_waits = DeviceWaits(enabled=False)
        self._worker_ident: Optional[int] = None

    # --- switching on and off (step loop's thread, between steps) ----------------------------------
    def set_every(self, n: int, keep_tokens: int = 0) -> Optional[str]:
        """Check one graph step in ``n`` (0: off). Returns why it cannot, or None.

        ``keep_tokens``: the most KV tokens a request already accepted needs to go on (its context and
        one more). The scratch pages come out of the pool's capacity, and a request admitted against
        the whole capacity that no longer fits would be preempted and readmitted forever, so checks
        that would leave less are refused until it finishes."""
        if n < 0:
            return f"parity-every must be >= 0, got {n}"
        if n and not self._scratch:
            need = min(self.scratch_need, self.pool.capacity_pages // 8 or 1)
            if self.pool.free_pages < need:
                return f"parity checks need {need} free KV pages for scratch; {self.pool.free_pages} are free"
            left = self.pool.capacity_tokens - need * self.pool.page_size
            if keep_tokens > left:
                return (
                    f"parity checks need {need} KV pages for scratch, which would leave the pool {left} "
                    f"tokens, fewer than a request in flight needs ({keep_tokens}); turn them on once it "
                    "has finished"
                )
            self._scratch = self.pool.reserve(need)
            if self._eager is None:
                self._eager = EagerRunner(self.model, self.attention.clone(), self.device)
                if self.device.type == "cuda":
                    self._stream = torch.cuda.Stream(self.device)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="graphtop-parity", daemon=True)
                self._thread.start()
                self._worker_ident = self._thread.ident
            if self._worker_ident is not None:
                Paced.attach(getattr(self.model, "model", None), self._worker_ident, self._device_waits)
            if self._switch_ask is None:
                self._switch_ask = switch_interval.at_most(SWITCH_INTERVAL_S)
        if not n and self._scratch:
            self.wait_idle()
            Paced.detach(self._worker_ident)
            self.pool.unreserve(self._scratch)
            self._scratch = []
            self._restore_switch_interval()
        self.every, self._graph_steps = n, 0
        self._device_waits.enabled = self.paces
        return None

    def _restore_switch_interval(self) -> None:
        switch_interval.release(self._switch_ask)
        self._switch_ask = None

    @property
    def pacing(self) -> bool:
        """Whether the re-run may take one layer per device wait of the step loop (``parity/pacing.py``):
        on by default on a GPU; off, its Python competes with the step loop's freely. It paces only
        when checks are rarer than one per ``layers`` steps: a paced check spans about that many
        steps, and a user who asks for more checks gets them, at their cost."""
        return self._pacing

    @pacing.setter
    def pacing(self, on: bool) -> None:
        self._pacing = on
        self._device_waits.enabled = self.paces

    @property
    def paces(self) -> bool:
        """Pacing applies now (see ``pacing``)."""
        return self._pacing and self.every > self._layers

    @property
    def busy(self) -> bool:
        """A check is running (its snapshot buffers are in use)."""
        self._collect()
        return self._running is not None

    def wait_idle(self) -> None:
        """Wait for a running check (a recapture must not overlap one) and publish what can be."""
        job = self._running
        if job is not None:
            job.finished.wait()
        self.poll()

    def close(self) -> None:
        self.wait_idle()
        Paced.detach(self._worker_ident)
        self._finished.clear()
        self._restore_switch_interval()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(10.0)
            self._thread = None

    # --- the step loop's hooks -------------------------------------------------------------------
    def while_device_busy(self, wait: Callable[[], Any]) -> Any:
        """Run ``wait`` (the step loop blocking on the device) with the window open in which a running
        check's re-run proceeds; returns what ``wait`` returns."""
        if self._running is None or not self._device_waits.enabled:
            return wait()
        return self._device_waits.during(wait)

    def after_forward(self, batch: ForwardBatch, out: StepOutput, allowed: bool = True) -> None:
        """Right after a step's forward: start a check if one is due (graph steps with sampled rows)."""
        if not self.every or out.path != "graph" or not batch.sample_rows:
            return
        self._graph_steps += 1
        if self._graph_steps % self.every:
            return
        if self.busy:  # counted; the running check's event carries the count
            self.skipped += 1
            return
        if not allowed or pages_needed(batch) > len(self._scratch):
            self.skipped += 1
            self._not_run(None, "capture_pending" if not allowed else "too_large")
            return
        with torch.inference_mode():
            logits = self._snapshot_logits(out.logits)
            ids = None
            if batch.input_ids_device is not None:
                ids = self._snapshot_ids(batch.input_ids_device)
            ready = None
            if self.device.type == "cuda":
                ready = torch.cuda.Event()
                ready.record()
        self._running = _Check(batch, out, logits, ids, ready, time.perf_counter())
        self._queue.put(self._running)

    def delivered(self, out: StepOutput, step_no: int) -> None:
        """A step got its number: a checked one, or another (a checked step still unnumbered after two
        others will never be delivered, e.g. the engine failed it)."""
        if self._running is None and not self._finished:
            return
        for job in (self._running, *self._finished):
            if job is None or job.step_no is not None:
                continue
            if job.out is out:
                job.step_no = step_no
            else:
                job.missed += 1
        self.poll()

    def poll(self) -> None:
        """Publish finished checks, in order, once their steps have numbers (step loop's thread)."""
        self._collect()
        while self._finished:
            job = self._finished[0]
            if job.step_no is None and job.missed < 2:
                return  # finished before its step was delivered
            self._finished.pop(0)
            self._publish(job)

    def _collect(self) -> None:
        job = self._running
        if job is not None and job.finished.is_set():
            self._running = None
            self._finished.append(job)

    def _publish(self, job: _Check) -> None:
        if job.error is not None:
            self.publish(ev.ErrorEvent(message=f"parity check failed: {job.error}", where="parity"))
            return
        if job.step_no is None or job.stats is None:
            self.discarded += 1
            self._not_run(job.step_no, "discarded")
            return
        max_abs, max_rel, argmax_agree, top5 = job.stats
        mismatch = not max_rel <= self.tolerance
        self.checks += 1
        self.mismatches += int(mismatch)
        self.worst_rel_err = max(self.worst_rel_err, max_rel)
        b = job.batch
        self.publish(
            ev.ParityCheck(
                step=job.step_no,
                phase=b.mode.value,
                batch_size=b.batch_size,
                num_tokens=b.num_tokens,
                bucket=job.out.bucket,
                rows=job.rows,
                max_abs_err=max_abs,
                max_rel_err=max_rel,
                argmax_agree=argmax_agree,
                top5_overlap=top5,
                tolerance=self.tolerance,
                mismatch=mismatch,
                check_ms=round(job.check_ms, 3),
                every=self.every,
                skipped=self.skipped,
                discarded=self.discarded,
            )
        )

    def _not_run(self, step: Optional[int], reason: str) -> None:
        self.publish(
            ev.ParityNotRun(step=step, reason=reason, skipped=self.skipped, discarded=self.discarded, every=self.every)
        )

    # --- snapshot buffers (the graphs never own them) --------------------------------------------
    def _snapshot_logits(self, logits: torch.Tensor) -> torch.Tensor:
        rows, vocab = logits.shape
        buf = self._logits_buf
        if buf is None or buf.shape[0] < rows or buf.shape[1] != vocab or buf.dtype != logits.dtype:
            buf = self._logits_buf = torch.empty(rows, vocab, dtype=logits.dtype, device=logits.device)
        view = buf[:rows]
        view.copy_(logits)
        return view

    def _snapshot_ids(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[0]
        buf = self._ids_buf
        if buf is None or buf.shape[0] < n:
            buf = self._ids_buf = torch.empty(max(n, 256), dtype=ids.dtype, device=ids.device)
        view = buf[:n]
        view.copy_(ids)
        return view

    # --- the worker thread ---------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._check(job)
            except Exception as e:  # a failed check is reported, never takes the engine down
                job.error = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            job.check_ms = (time.perf_counter() - job.t0) * 1e3
            job.finished.set()

    @contextlib.contextmanager
    def _on_own_stream(self, ready: Optional[torch.cuda.Event]) -> Iterator[None]:
        if self._stream is None:
            yield
            return
        with torch.cuda.stream(self._stream):
            if ready is not None:
                self._stream.wait_event(ready)
            yield

    def _check(self, job: _Check) -> None:
        assert self._eager is not None
        with torch.inference_mode(), self._on_own_stream(job.ready):
            batch, src, dst = scratch_batch(job.batch, self._scratch, self.pool.page_size, job.ids)
            self.pool.copy_pages(src, dst)
            eager = self._eager.run(batch).logits
            per_row = compare_rows(job.logits, eager).cpu().tolist()  # waits for this stream only
        b = job.batch
        held = {id(r): r.pages is p for r, p in zip(b.requests, b.req_pages)}
        valid = [row for row, r in zip(per_row, b.sample_requests or b.requests) if held[id(r)]]
        if valid:
            job.stats, job.rows = summarize_rows(valid), len(valid)


def compare_rows(graph: torch.Tensor, eager: torch.Tensor) -> torch.Tensor:
    """Per row, on the logits' device: [max |graph - eager|, that over max |eager| (relative), argmax
    agrees (1/0), share of eager's top 5 in the graph's top 5]. A non-finite difference is the worst
    error there is, and every error is capped at the largest number a trace holds (``MAX_FLOAT``): the
    check's event is recorded, and one ``inf`` (or a number past the cap) made the whole trace unreadable."""
    worst = MAX_FLOAT
    g, e = graph.float(), eager.float()
    diff = (g - e).abs()
    diff = torch.where(torch.isfinite(diff), diff, torch.full_like(diff, worst))
    row = diff.amax(dim=1).clamp_max(worst)
    scale = e.abs().amax(dim=1)
    rel = row / scale.clamp_min(1e-12)
    # a non-finite logit on either side is the worst relative error too (inf / inf read as none)
    rel = torch.where((row >= worst) | ~torch.isfinite(scale) | ~torch.isfinite(rel), worst, rel).clamp_max(worst)
    k = min(5, g.shape[1])
    top_g, top_e = g.topk(k, dim=1).indices, e.topk(k, dim=1).indices
    overlap = (top_e[:, :, None] == top_g[:, None, :]).any(dim=2).float().mean(dim=1)
    agree = (g.argmax(dim=1) == e.argmax(dim=1)).float()
    return torch.stack([row, rel, agree, overlap], dim=1)


def summarize_rows(rows: list[list[float]]) -> list[float]:
    """A check's numbers from its rows: worst errors, mean agreement and overlap."""
    n = len(rows)
    return [max(r[0] for r in rows), max(r[1] for r in rows), sum(r[2] for r in rows) / n, sum(r[3] for r in rows) / n]
