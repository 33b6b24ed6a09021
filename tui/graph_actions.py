"""The dashboard's graph actions: the bucket editor and recapture, parity checks, the cost table.

A mixin of :class:`~graphtop.tui.app.GraphtopApp`. During a recapture the engine's own lists are the
ones being captured (empty, or partly captured), so the editor opens on the lists the recapture is
capturing, and says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .app_actions import AppActions
from .screens.bucket_editor import BucketChoice, BucketEditorScreen
from .screens.capture_table import CaptureTableScreen

if TYPE_CHECKING:
    from .state import DashboardState


def editor_lists(
    state: "DashboardState", live: tuple[Optional[list[int]], Optional[list[int]]]
) -> tuple[list[int], list[int], bool]:
    """(decode, prefill, recapturing): the lists the bucket editor starts from.

    A phase being recaptured (requested, or its latest capture pass unfinished) starts from the list
    that recapture captures; any other phase from the engine's list (``live``, None when the session
    cannot say), else from its last capture pass.
    """
    pending = state.recapture_pending
    asked = {
        "decode": pending.decode_bs if pending else None,
        "prefill": pending.prefill_num_tokens if pending else None,
    }
    out: list[list[int]] = []
    recapturing = pending is not None
    for phase, engine_list in zip(("decode", "prefill"), live):
        cap = state.capture.get(phase)
        if cap is not None and cap.finished is None:
            out.append(sorted(cap.planned))
            recapturing = True
        elif asked[phase] is not None:
            out.append(sorted(asked[phase] or ()))
        elif engine_list:
            out.append(list(engine_list))
        else:
            out.append(state.current_buckets(phase))
    return out[0], out[1], recapturing


class GraphActions(AppActions):
    """Buckets, recapture, parity and the per-bucket cost table."""

    PARITY_EVERY = 64
    """The palette switches parity checks on at this rate: off the critical path, one in 64 costs
    little (bench/parity_bench.py) and still checks every bucket in use within seconds."""

    def action_capture_table(self) -> None:
        self.push_screen(CaptureTableScreen(self.state))

    def _can_recapture(self) -> bool:
        if self.session.kind != "live":
            self.notify("a replayed trace cannot recapture", severity="warning")
            return False
        if not self.session.can_submit:
            self.notify("the engine is still loading", severity="warning")
            return False
        return True

    def action_buckets(self) -> None:
        self.open_bucket_editor()

    def open_bucket_editor(self, proposed: Optional[dict[str, list[int]]] = None, note: str = "") -> None:
        """The bucket editor on the lists in use; ``proposed`` fills its fields with other lists (the
        live advice), the what-if then shows them beside the lists in use."""
        if not self._can_recapture():
            return
        decode, prefill, recapturing = editor_lists(self.state, self.session.buckets())
        if recapturing:
            note = "a recapture is under way: these are the lists it captures"
            proposed = None
        limits = self.session.limits()
        kv = self.state.kv
        self.push_screen(
            BucketEditorScreen(
                decode,
                prefill,
                history=self.state.whatif_inputs(),
                max_running=limits.max_running or (kv.max_running if kv else None),
                kv_capacity=limits.kv_capacity_tokens or (kv.capacity_tokens if kv else None),
                max_buckets={ph: self.state.graph_max_bucket(ph) for ph in ("decode", "prefill")},
                disabled=[ph for ph in ("decode", "prefill") if self.state.graphs_disabled(ph)],
                blink=self.animate,
                note=note,
                proposed=proposed,
            ),
            callback=self._buckets_chosen,
        )

    def _buckets_chosen(self, choice: Optional[BucketChoice]) -> None:
        if choice is None:
            return
        if choice.decode_bs is None and choice.prefill_num_tokens is None:
            self.notify("buckets unchanged — nothing to recapture")
            return
        self._recapture(choice.decode_bs, choice.prefill_num_tokens)

    def action_recapture_same(self) -> None:
        if self._can_recapture():
            decode, prefill, _ = editor_lists(self.state, self.session.buckets())
            off = self.state.graphs_disabled  # a phase without graphs is left out, not sent as []
            self._recapture(None if off("decode") else decode, None if off("prefill") else prefill)

    def _recapture(self, decode: Optional[list[int]], prefill: Optional[list[int]]) -> None:
        try:
            self.session.recapture(decode, prefill)
        except Exception as exc:
            self.notify(str(exc), title="recapture refused", severity="error")
            return
        self.notify("runs at the next step boundary; requests keep streaming", title="recapture requested")

    def action_toggle_parity(self) -> None:
        """Switch graph-vs-eager parity checks on (one graph step in ``PARITY_EVERY``) or off."""
        session = self.live_session
        if session is None or not session.can_submit or self.live_state is None:
            self.notify("parity checks need a live engine", severity="warning")
            return
        every = 0 if session.parity_every else self.PARITY_EVERY
        try:
            session.set_parity_every(every)
        except Exception as exc:
            self.notify(str(exc), title="parity checks refused", severity="error")
            return
        self.live_state.set_parity_setting(every)
        self.notify(f"one graph step in {every} re-run eagerly and compared" if every else "off", title="parity checks")
        self.render_all(force=True)
