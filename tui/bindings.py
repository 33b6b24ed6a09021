"""The dashboard's keys: one table, read by the app, the footer and the help screen.

Every binding has an id and a tooltip (the help screen lists them from here, so it never goes
stale). The view keys 1-4 switch what a small terminal shows (``DashboardScreen``); they are not in
the footer because the view bar above the panels names them.

With a live engine the prompt has the focus from the first frame, so typing is a prompt and a
letter is a letter: the single-key shortcuts work once escape has left the input (the footer then
lists them). Ctrl+q quits from anywhere, which is why the footer names it rather than q.
"""

from __future__ import annotations

from textual.binding import Binding

APP_BINDINGS = [
    Binding(
        "ctrl+q",
        "quit",
        "Quit",
        priority=True,
        id="app.quit_ctrl",
        tooltip="Quit graphtop (shuts the engine down), even while typing",
    ),
    Binding(
        "ctrl+q",
        "detach",
        "Detach",
        priority=True,
        id="app.detach_ctrl",
        tooltip="Close this dashboard, even while typing; the engine keeps running (graphtop attach comes back)",
    ),
    Binding("q", "quit", "Quit", show=False, id="app.quit", tooltip="Quit graphtop (shuts the engine down)"),
    Binding(
        "q",
        "detach",
        "Detach",
        show=False,
        id="app.detach",
        tooltip="Close this dashboard; the engine keeps running (graphtop attach comes back)",
    ),
    Binding(
        "question_mark,f1",
        "help",
        "Help",
        id="app.help",
        tooltip="Keys, what each panel shows, every fallback reason and ledger row explained",
    ),
    Binding(
        "space",
        "toggle_pause",
        "Pause",
        id="app.pause",
        tooltip="Freeze the live view (events keep being collected); in a replay, pause playback",
    ),
    Binding(
        "b",
        "buckets",
        "Buckets",
        id="app.buckets",
        tooltip="Edit decode/prefill buckets with a what-if preview, then recapture",
    ),
    Binding(
        "a",
        "advice",
        "Advice",
        id="app.advice",
        tooltip="Open the bucket editor on the live advice (the status line says when one is ready); "
        "enter recaptures with it",
    ),
    Binding("c", "capture_table", "Costs", id="app.capture_table", tooltip="Per-bucket capture time and memory"),
    Binding("slash", "focus_prompt", "Prompt", id="app.focus_prompt", tooltip="Back to the prompt, to type"),
    Binding(
        "escape",
        "leave_input",
        "Shortcuts",
        id="app.leave_input",
        tooltip="Leave the input so the single-key shortcuts work (the prompt has the focus at start)",
    ),
    Binding(
        "1",
        "show_view('steps')",
        "Steps",
        show=False,
        id="view.steps",
        tooltip="Small terminal: show the steps table, hit rate and fallbacks",
    ),
    Binding(
        "2",
        "show_view('memory')",
        "Memory",
        show=False,
        id="view.memory",
        tooltip="Small terminal: show the memory ledger and the KV pool",
    ),
    Binding(
        "3",
        "show_view('capture')",
        "Capture",
        show=False,
        id="view.capture",
        tooltip="Small terminal: show graph capture, parity checks and the device",
    ),
    Binding(
        "4",
        "show_view('prompt')",
        "Prompts",
        show=False,
        id="view.prompt",
        tooltip="Small terminal: show the prompt console",
    ),
    Binding("left", "seek(-5)", "−5s", id="replay.back", tooltip="Replay: seek back 5 seconds"),
    Binding("right", "seek(5)", "+5s", id="replay.forward", tooltip="Replay: seek forward 5 seconds"),
    Binding(
        "shift+left",
        "seek_events(-1)",
        "−1 event",
        show=False,
        id="replay.back_event",
        tooltip="Replay: step one event back (pauses)",
    ),
    Binding(
        "shift+right",
        "seek_events(1)",
        "+1 event",
        show=False,
        id="replay.forward_event",
        tooltip="Replay: step one event forward (pauses)",
    ),
    Binding("home", "seek_to(0)", "Start", show=False, id="replay.start", tooltip="Replay: back to the start"),
    Binding("plus,equals_sign", "speed(1)", "Faster", show=False, id="replay.faster", tooltip="Replay: play faster"),
    Binding("minus", "speed(-1)", "Slower", show=False, id="replay.slower", tooltip="Replay: play slower"),
    Binding(
        "l",
        "back_to_live",
        "Live",
        id="replay.live",
        tooltip="Replay of a trace opened beside a live engine: back to the live engine",
    ),
]

REPLAY_ACTIONS = frozenset({"seek", "seek_events", "seek_to", "speed", "back_to_live"})
"""Only in a replay."""
LIVE_ACTIONS = frozenset({"buckets", "advice", "focus_prompt"})
"""Only with a live engine (a replay has no buckets to edit and no prompt to type)."""
