"""The dashboard's keys: one table, read by the app, the footer and the help screen.

Every binding has an id and a tooltip (the help screen lists them from here, so it never goes
stale). The view keys 1-4 switch what a small terminal shows (``DashboardScreen``); they are not in
the footer because the view bar above the panels names them.
"""

from __future__ import annotations

from textual.binding import Binding

APP_BINDINGS = [
    Binding("q", "quit", "Quit", id="app.quit", tooltip="Quit graphtop (shuts the engine down)"),
    Binding("q", "detach", "Detach", id="app.detach",
            tooltip="Close this dashboard; the engine keeps running (graphtop attach comes back)"),
    Binding("ctrl+q", "close", "Quit", show=False, priority=True, id="app.quit_ctrl",
            tooltip="Quit graphtop (or detach from the engine), even from an input"),
    Binding("question_mark,f1", "help", "Help", id="app.help",
            tooltip="Keys, what each panel shows, every fallback reason and ledger row explained"),
    Binding("space", "toggle_pause", "Pause", id="app.pause",
            tooltip="Freeze the live view (events keep being collected); in a replay, pause playback"),
    Binding("b", "buckets", "Buckets", id="app.buckets",
            tooltip="Edit decode/prefill buckets with a what-if preview, then recapture"),
    Binding("c", "capture_table", "Costs", id="app.capture_table",
            tooltip="Per-bucket capture time and memory"),
    Binding("slash", "focus_prompt", "Prompt", id="app.focus_prompt", tooltip="Type a prompt"),
    Binding("escape", "leave_input", "Leave input", show=False, id="app.leave_input",
            tooltip="Leave the input so single-key shortcuts work again"),
    Binding("1", "show_view('steps')", "Steps", show=False, id="view.steps",
            tooltip="Small terminal: show the steps table, hit rate and fallbacks"),
    Binding("2", "show_view('memory')", "Memory", show=False, id="view.memory",
            tooltip="Small terminal: show the memory ledger and the KV pool"),
    Binding("3", "show_view('capture')", "Capture", show=False, id="view.capture",
            tooltip="Small terminal: show graph capture, parity checks and the device"),
    Binding("4", "show_view('prompt')", "Prompts", show=False, id="view.prompt",
            tooltip="Small terminal: show the prompt console"),
    Binding("left", "seek(-5)", "−5s", id="replay.back", tooltip="Replay: seek back 5 seconds"),
    Binding("right", "seek(5)", "+5s", id="replay.forward", tooltip="Replay: seek forward 5 seconds"),
    Binding("shift+left", "seek_events(-1)", "−1 event", show=False, id="replay.back_event",
            tooltip="Replay: step one event back (pauses)"),
    Binding("shift+right", "seek_events(1)", "+1 event", show=False, id="replay.forward_event",
            tooltip="Replay: step one event forward (pauses)"),
    Binding("home", "seek_to(0)", "Start", show=False, id="replay.start", tooltip="Replay: back to the start"),
    Binding("plus,equals_sign", "speed(1)", "Faster", show=False, id="replay.faster",
            tooltip="Replay: play faster"),
    Binding("minus", "speed(-1)", "Slower", show=False, id="replay.slower", tooltip="Replay: play slower"),
]

REPLAY_ACTIONS = frozenset({"seek", "seek_events", "seek_to", "speed"})
"""Only in a replay."""
LIVE_ACTIONS = frozenset({"buckets", "focus_prompt"})
"""Only with a live engine (a replay has no buckets to edit and no prompt to type)."""
