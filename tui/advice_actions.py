"""Live bucket advice in the dashboard: re-advised while traffic flows, previewed and applied with one key.

A mixin of :class:`~graphtop.tui.app.GraphtopApp`, for any live engine (in-process, ``graphtop serve``
attached, headless attached). Every ``ADVICE_EVERY_S`` the steps seen so far (the last ``WINDOW`` of
each phase: a sliding window, so a drift in the mix shows) are advised on a worker thread with the
engine's own rules (``engine.graphs.live_advice.propose``: the earlier steps choose, the latest
judge). When a phase's held-out step cost drops by at least ``THRESHOLD``, the status line says
"advice ready: decode −x %, ... step cost, +y MiB graphs"; ``a`` opens the bucket editor with the
advice filled in, its what-if beside the lists in use, and enter recaptures live, requests kept, as
any edit does.
"""

from __future__ import annotations

from typing import Any, Optional

from graphtop.engine.graphs.live_advice import DEFAULT_THRESHOLD, DEFAULT_WINDOW, Proposal, propose

from .graph_actions import GraphActions, editor_lists

ADVICE_EVERY_S = 10.0
"""How often the dashboard re-advises: the advice costs a fraction of a second of a worker thread."""
THRESHOLD = DEFAULT_THRESHOLD
WINDOW = DEFAULT_WINDOW
PHASES = ("decode", "prefill")


class AdviceActions(GraphActions):
    """The live advice: computed on a timer, shown in the status line, applied through the editor."""

    live_proposal: Optional[Proposal] = None

    def start_live_advice(self) -> None:
        """Re-advise on a timer while a live engine is behind the dashboard (a replay has no engine)."""
        if self.session.kind == "live":
            self.set_interval(ADVICE_EVERY_S, self._advise_in_background, name="graphtop-advice")

    def _advice_inputs(self) -> Optional[dict[str, Any]]:
        """What ``propose`` needs, copied on the UI thread (the state is the UI thread's)."""
        state = self.state
        if state.info is None or state.recapture_pending is not None:
            return None
        by_phase: dict[str, list] = {ph: [] for ph in PHASES}
        for s in reversed(state.steps):  # the latest WINDOW of each phase, then back in order
            phase = "prefill" if s.phase != "decode" else "decode"
            if len(by_phase[phase]) < WINDOW:
                by_phase[phase].append(s)
        decode, prefill, recapturing = editor_lists(state, self.session.buckets())
        if recapturing:
            return None
        current = {ph: lst for ph, lst in (("decode", decode), ("prefill", prefill)) if not state.graphs_disabled(ph)}
        return dict(
            steps={ph: list(reversed(v)) for ph, v in by_phase.items()},
            current=current,
            costs=tuple(state.bucket_costs()),
            max_padding_waste=state.prefill_padding_cap(),
            max_bucket={ph: state.graph_max_bucket(ph) for ph in PHASES},
            page_size=state.kv.page_size if state.kv is not None else None,
            threshold=THRESHOLD,
        )

    def _advise_in_background(self) -> None:
        inputs = self._advice_inputs()
        if inputs is None:
            return

        def work() -> None:
            proposal = propose(**inputs)
            self.call_from_thread(self.show_live_advice, proposal)

        self.run_worker(work, thread=True, exclusive=True, group="live-advice", exit_on_error=False)

    def refresh_live_advice(self) -> Optional[Proposal]:
        """Advise now, on this thread (the timer does it on a worker); the proposal, if any."""
        inputs = self._advice_inputs()
        self.show_live_advice(propose(**inputs) if inputs is not None else None)
        return self.live_proposal

    def show_live_advice(self, proposal: Optional[Proposal]) -> None:
        self.live_proposal = proposal
        self.state.live_advice = proposal.headline() if proposal is not None else ""
        self.render_status(force=True)

    def action_advice(self) -> None:
        """Open the bucket editor on the live advice; enter recaptures with it."""
        proposal = self.live_proposal
        if proposal is None:
            self.notify(
                f"no advice ready: no phase's held-out step cost drops by {100 * THRESHOLD:.0f} % yet "
                f"(re-advised every {ADVICE_EVERY_S:.0f} s)",
                title="bucket advisor",
            )
            return
        self.open_bucket_editor(
            proposed={ph: b for ph in PHASES if (b := proposal.buckets(ph)) is not None},
            note=proposal.headline() + " — enter recaptures, requests keep streaming",
        )
