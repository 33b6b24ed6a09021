"""Auto-tune: re-advise the bucket lists on a schedule while the engine serves, and recapture when it pays.

``AutoTuner(engine, AutoTuneConfig(...)).start()`` subscribes to the engine's event bus, folds its steps
into a sliding window of demand (``graphs.live_advice.LiveAdvisor``) and, every ``every_s`` seconds,
asks for a proposal. It applies one only when:

* the advice lowers the held-out step cost of a phase by at least ``threshold`` (the window's earlier
  steps chose the list, its later steps judged it);
* each phase's estimated graph memory stays within ``max_memory`` when one is set;
* at least ``min_interval_s`` have passed since its last recapture, and no capture is under way.

Applying is ``engine.recapture(..., cause="auto_tune")``: the same command the bucket editor sends, so
the recapture runs in slices between steps with requests kept (no step waits for it), the trace gets a
``recapture_requested`` event with the cause and the reason, the metrics count it by cause, and the
log gets a line. Graphs compute what the eager path computes, so the tokens are those of a run without
auto-tune (tested).

The tuner runs on its own daemon thread and talks to the engine only through the bus and the
thread-safe ``recapture``; ``tick`` is the whole decision, callable directly (tests, benchmarks).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .graphs.live_advice import DEFAULT_THRESHOLD, DEFAULT_WINDOW, MIN_STEPS, LiveAdvisor, Proposal

__all__ = ["AutoTuneConfig", "AutoTuner"]

log = logging.getLogger("graphtop.auto_tune")


@dataclass(frozen=True)
class AutoTuneConfig:
    """When auto-tune re-advises and what it takes to apply the advice."""

    every_s: float = 30.0  # re-advise this often
    min_interval_s: float = 300.0  # never recapture more often than this
    threshold: float = DEFAULT_THRESHOLD  # held-out step cost the advice must save, a fraction
    max_memory: Optional[float] = None  # estimated graph memory per phase, bytes; None: unbounded
    window: int = DEFAULT_WINDOW  # steps of each phase the demand window keeps
    min_steps: int = MIN_STEPS  # a phase with fewer steps in the window is not advised

    def __post_init__(self) -> None:
        for name in ("every_s", "min_interval_s"):
            value = getattr(self, name)
            if not value >= 0 or value == float("inf"):
                raise ValueError(f"auto-tune {name} must be a finite number >= 0, got {value}")
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"auto-tune threshold must be in [0, 1), got {self.threshold}")
        if self.max_memory is not None and not self.max_memory >= 0:
            raise ValueError(f"auto-tune max_memory must be >= 0, got {self.max_memory}")
        if self.min_steps < 1:
            raise ValueError(f"auto-tune min_steps must be at least 1, got {self.min_steps}")
        if self.window < 1:
            raise ValueError(f"auto-tune window must be at least 1 step, got {self.window}")


class AutoTuner:
    """Watches an engine's demand and recaptures its graphs when the advice pays (see the module)."""

    POLL_S = 0.25  # how often the thread drains the bus between decisions

    def __init__(self, engine: Any, config: AutoTuneConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.config = config
        self.clock = clock
        self.advisor = LiveAdvisor(config.window)
        self.sub = engine.bus.subscribe("auto_tune", maxsize=100_000)
        # what the engine published before this subscription (its config, the capture ledger), as a
        # viewer attaching late gets it; what follows arrives on the subscription
        self.advisor.apply_all(engine.viewer_link().state_events())
        self.recaptures = 0
        self.last_advice = clock()  # the first decision waits a whole period: the window fills first
        self.last_recapture: Optional[float] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "AutoTuner":
        self._thread = threading.Thread(target=self._run, name="graphtop-auto-tune", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self.engine.bus.unsubscribe(self.sub)

    def _run(self) -> None:
        while not self._stop.wait(self.POLL_S):
            try:
                self.tick()
            except Exception:  # a bad decision must never take the server down: say it, keep serving
                log.exception("auto-tune: re-advising failed; the lists stay as they are")

    def drain(self) -> None:
        """Fold the events published since the last call."""
        self.advisor.apply_all(self.sub.drain())

    def tick(self) -> Optional[Proposal]:
        """One decision: fold new events, and when a period has passed re-advise and apply what pays.
        The applied proposal, else None."""
        self.drain()
        if self.engine.capture_pending:  # the first capture (or a recapture) still runs between steps
            return None
        now = self.clock()
        if now - self.last_advice < self.config.every_s:
            return None
        self.last_advice = now
        if self.last_recapture is not None and now - self.last_recapture < self.config.min_interval_s:
            return None
        proposal = self.advisor.propose(
            threshold=self.config.threshold, max_memory=self.config.max_memory, min_steps=self.config.min_steps
        )
        if proposal is None:
            return None
        self.apply(proposal, now)
        return proposal

    def apply(self, proposal: Proposal, now: float) -> None:
        detail = proposal.headline().removeprefix("advice ready: ")
        decode, prefill = proposal.buckets("decode"), proposal.buckets("prefill")
        try:
            self.engine.recapture(decode, prefill, cause="auto_tune", detail=detail)
        except Exception as e:  # closed meanwhile, or refused: nothing changed
            log.warning("auto-tune: recapture refused: %s", e)
            return
        self.advisor.recapture_pending = True  # until its recapture_finished arrives
        self.last_recapture = now
        self.recaptures += 1
        lists = "; ".join(f"{p.phase} {list(p.current)} -> {list(p.buckets)}" for p in proposal.phases)
        log.info("auto-tune: recapturing %s (%s)", lists, detail)
