"""graphtop's command-palette provider (ctrl+p): recapture, traces, panels, pause.

Commands are looked up on the app at search time, so ones that do not apply (recapture during a
replay, "back to live" when nothing is live) simply do not show.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterator, Optional, Protocol

from textual.command import DiscoveryHit, Hit, Hits, Provider


class PaletteActions(Protocol):
    """What the palette needs from the app (``GraphtopApp``): the session kind and the actions."""

    session: Any  # has ``kind``: "live" or "replay"
    live_session: Optional[Any]

    def action_buckets(self) -> None: ...
    def action_recapture_same(self) -> None: ...
    def action_export_trace(self) -> None: ...
    def action_open_trace(self) -> None: ...
    def action_back_to_live(self) -> None: ...
    def action_toggle_pause(self) -> None: ...
    def action_capture_table(self) -> None: ...
    def action_toggle_panel(self, name: str) -> None: ...
    def action_toggle_parity(self) -> None: ...


PANEL_NAMES = {
    "capture": "graph capture",
    "ledger": "memory ledger",
    "kv": "KV pool",
    "device": "device",
    "steps": "steps",
    "console": "prompt console",
}


class GraphtopCommands(Provider):
    """Yields the app's graphtop commands; fuzzy-matched by textual's matcher."""

    def _commands(self) -> Iterator[tuple[str, str, Callable[[], object]]]:
        app: PaletteActions = self.app  # type: ignore[assignment]
        live = app.session.kind == "live"
        if live:
            yield (
                "Recapture graphs (edit buckets)",
                "open the bucket editor with its what-if preview",
                app.action_buckets,
            )
            yield (
                "Recapture graphs with the current buckets",
                "re-run capture, e.g. after memory changed",
                app.action_recapture_same,
            )
            yield (
                "Toggle parity checks (graph vs eager)",
                "re-run one graph step in 64 eagerly and compare logits, or stop",
                app.action_toggle_parity,
            )
        yield ("Export trace", "write the events seen so far as a JSONL trace", app.action_export_trace)
        yield ("Open trace", "replay a recorded trace in these panels", app.action_open_trace)
        if app.live_session is not None and not live:
            yield ("Back to the live engine", "leave the replay", app.action_back_to_live)
        yield ("Pause / resume the live view", "freeze the panels (space)", app.action_toggle_pause)
        yield ("Per-bucket capture costs", "time and memory of every captured bucket (c)", app.action_capture_table)
        for key, name in PANEL_NAMES.items():
            yield (f"Toggle panel: {name}", f"show or hide the {name} panel", partial(app.action_toggle_panel, key))

    async def discover(self) -> Hits:
        for title, help_text, callback in self._commands():
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, text=title, help=help_text)
