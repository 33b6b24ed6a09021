"""graphtop's dashboard app: wires a Session to the panels.

Data flow, deliberately one-way and pull-based (like memray's live view):

* the session starts in a thread worker (the UI is up and showing load and capture progress the
  whole time; prompts typed meanwhile are held by the session and run once the engine is ready, and
  the engine serves while it captures graphs);
* a UI timer (15 Hz; 4 Hz while the engine is busy) drains the session's bounded subscription —
  never blocking, never ``call_from_thread`` from the engine's hot loop — folds the events into a
  :class:`~graphtop.tui.state.DashboardState`, and re-renders changed panels inside one
  ``batch_update`` so a burst of events costs one repaint — each panel at most at its own rate
  (the steps and KV panels 4 Hz), because the UI shares the GIL with the engine;
* the same timer polls in-flight prompt handles for streamed text;
* the device poller is a second thread worker posting one typed message per second.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.timer import Timer
from textual.widgets import Footer
from textual.worker import get_current_worker

from graphtop.engine.telemetry.trace import write_trace
from graphtop.themes import DEFAULT_THEME, STYLESHEETS

from .bucket_editor import BucketChoice, BucketEditorScreen
from .capture_panel import CapturePanel
from .capture_table import CaptureTableScreen
from .commands import GraphtopCommands
from .device_panel import DevicePanel
from .device_probe import DeviceProbe, DeviceSample
from .help_screen import HelpScreen
from .kv_panel import KVPanel
from .ledger_panel import LedgerPanel
from .messages import DeviceSampled, EngineFailed, EngineReady
from .parity_panel import ParityPanel
from .path_prompt import PathPromptScreen
from .prompt_console import PromptConsole
from .replay_bar import ReplayBar
from .replay_session import ReplaySession
from .session import Session, SessionError
from .state import DashboardState
from .status_line import StatusLine
from .steps_panel import StepsPanel

if TYPE_CHECKING:  # the engine package imports torch; the first frame must not wait for it
    from graphtop.engine.telemetry.events import Event

PANELS = ("capture", "ledger", "kv", "device", "steps", "console")


class GraphtopApp(App[int]):
    """The live (or replayed) graph dashboard."""

    TITLE = "graphtop"
    CSS_PATH = [str(p) for p in STYLESHEETS]
    COMMANDS = App.COMMANDS | {GraphtopCommands}
    AUTO_FOCUS = None  # keys work at once; "/" focuses the prompt
    BINDINGS = [
        Binding("q", "quit", "Quit", id="app.quit", tooltip="Quit graphtop (shuts the engine down)"),
        Binding("q", "detach", "Detach", id="app.detach",
                tooltip="Close this dashboard; the engine keeps running (graphtop attach comes back)"),
        Binding("ctrl+q", "close", "Quit", show=False, priority=True, id="app.quit_ctrl",
                tooltip="Quit graphtop (or detach from the engine), even from an input"),
        Binding("question_mark,f1", "help", "Help", id="app.help", tooltip="Keys and what each panel shows"),
        Binding("space", "toggle_pause", "Pause", id="app.pause",
                tooltip="Freeze the live view (events keep being collected); in a replay, pause playback"),
        Binding("b", "buckets", "Buckets", id="app.buckets",
                tooltip="Edit decode/prefill buckets with a what-if preview, then recapture"),
        Binding("c", "capture_table", "Capture costs", id="app.capture_table",
                tooltip="Per-bucket capture time and memory"),
        Binding("slash", "focus_prompt", "Prompt", id="app.focus_prompt", tooltip="Type a prompt"),
        Binding("escape", "leave_input", "Leave input", show=False, id="app.leave_input",
                tooltip="Leave the input so single-key shortcuts work again"),
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
    LIVE_ACTIONS = frozenset({"buckets"})

    def __init__(
        self,
        session: Session,
        *,
        theme_name: Optional[str] = None,
        tick_hz: Optional[float] = 15.0,
        poll_device: bool = True,
        device_sample: Optional[DeviceSample] = None,
        probe_factory: Callable[[], DeviceProbe] = DeviceProbe,
        device_interval: float = 1.0,
        animate: bool = True,
        max_events_per_tick: int = 20_000,
        notify_events: bool = True,
        exit_when_engine_ends: bool = False,
    ) -> None:
        super().__init__()
        from graphtop.themes.palette import THEMES

        for theme in THEMES:
            self.register_theme(theme)
        self._theme_name = theme_name or DEFAULT_THEME
        if self._theme_name not in self.available_themes:
            raise ValueError(
                f"unknown theme {self._theme_name!r}; choose from {', '.join(sorted(self.available_themes))}"
            )
        self.session: Session = session
        self.state = DashboardState()
        self.live_session: Optional[Session] = session if session.kind == "live" else None
        self.live_state: Optional[DashboardState] = self.state if self.live_session else None
        self.tick_hz = tick_hz
        self.poll_device = poll_device
        self.device_sample = device_sample
        self.probe_factory = probe_factory
        self.device_interval = device_interval
        self.animate = animate
        self.max_events_per_tick = max_events_per_tick
        self.notify_events = notify_events
        self.exit_when_engine_ends = exit_when_engine_ends
        self._ended_seen: Optional[str] = None
        self.paused = False
        self.engine_ready = False
        self.engine_error: Optional[str] = None
        self._stop = threading.Event()
        if not animate:
            self.animation_level = "none"

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield StatusLine(self.session.label, id="status")
        yield ReplayBar(id="replay-bar")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield CapturePanel(self.session.label, id="capture")
                yield LedgerPanel(id="ledger")
                yield KVPanel(id="kv")
                yield ParityPanel(id="parity")
                yield DevicePanel(polling=self.poll_device, id="device")
            yield StepsPanel(id="steps")
        yield PromptConsole(blink=self.animate, id="console")
        yield Footer()

    # The engine's thread needs the GIL for ~0.3 ms per step; with CPython's default 5 ms switch
    # interval it waits behind every repaint (a GIL convoy) and decode slows several-fold. A short
    # interval while a live engine runs here lets it in within a fraction of a millisecond.
    ENGINE_SWITCH_INTERVAL_S = 0.0002
    _switch_interval: Optional[float] = None

    def on_mount(self) -> None:
        if self.session.hosts_engine and self._switch_interval is None:
            self._switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(self.ENGINE_SWITCH_INTERVAL_S)
        # widget references cached once: while a modal is open, queries would search the modal
        self.status_line = self.query_one(StatusLine)
        self.replay_bar = self.query_one(ReplayBar)
        self.prompt_console = self.query_one(PromptConsole)
        self.device_panel = self.query_one(DevicePanel)
        self.panels = [self.query_one(t) for t in (CapturePanel, LedgerPanel, KVPanel, ParityPanel, StepsPanel)]
        self.theme = self._theme_name
        self.theme_changed_signal.subscribe(self, lambda _theme: self.render_all(force=True))
        self._apply_mode()
        self.device_panel.show(self.device_sample)
        if self.tick_hz:  # None: the caller pumps (deterministic tests)
            self._set_tick_rate(self.tick_hz)
        self._start_session()
        if self.poll_device:
            self._poll_device()
        self.render_all(force=True)

    def on_unmount(self) -> None:
        self._stop.set()
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = None

    def _apply_mode(self) -> None:
        replay = self.session.kind == "replay"
        self.screen.set_class(replay, "-replay")
        self.prompt_console.display = not replay
        self.replay_bar.display = replay
        self.refresh_bindings()

    # ------------------------------------------------------------------ workers
    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _start_session(self) -> None:
        """Start the session off the UI thread; the load itself runs in a daemon thread so that
        quitting mid-load does not wait for the model to finish loading."""
        worker = get_current_worker()
        session = self.session
        outcome: dict[str, str] = {}

        def load() -> None:
            try:
                session.start()
            except BaseException as exc:  # report everything, the UI must stay up
                outcome["error"] = str(exc) if isinstance(exc, SessionError) else f"{type(exc).__name__}: {exc}"
                outcome["details"] = traceback.format_exc()

        loader = threading.Thread(target=load, name="graphtop-engine-load", daemon=True)
        loader.start()
        while loader.is_alive():
            loader.join(0.1)
            if worker.is_cancelled:
                return
        if "error" in outcome:
            self.post_message(EngineFailed(outcome["error"], outcome["details"]))
        else:
            self.post_message(EngineReady())

    @work(thread=True, exclusive=True, group="device", exit_on_error=False)
    def _poll_device(self) -> None:
        """Sample NVML/psutil at ~1 Hz; NVML calls may take ms and must stay off the UI thread."""
        probe = self.probe_factory()
        worker = get_current_worker()
        try:
            while not self._stop.is_set() and not worker.is_cancelled:
                self.post_message(DeviceSampled(probe.sample()))
                self._stop.wait(self.device_interval)
        finally:
            probe.close()

    def on_engine_ready(self, _message: EngineReady) -> None:
        self.engine_ready = True
        if self.live_session is not None:
            self.prompt_console.set_chat_available(self.live_session.chat_available)
            if self.live_state is not None and self.live_session.parity_every:
                self.live_state.set_parity_setting(self.live_session.parity_every)
        self.render_all(force=True)

    def on_engine_failed(self, message: EngineFailed) -> None:
        self.engine_error = message.error
        state = self.live_state or self.state
        state.failed = message.error
        state.revs["info"] += 1
        self.notify(message.error, title="engine failed to start", severity="error", timeout=30)
        self.render_all(force=True)

    def on_device_sampled(self, message: DeviceSampled) -> None:
        self.device_panel.show(message.sample)

    # ------------------------------------------------------------------ the pump
    BUSY_EVENTS_PER_S = 200.0
    """Above this event rate the engine is serving hard and the tick drops to ``busy_hz``."""
    busy_hz: float = 4.0
    _tick_timer: Optional[Timer] = None
    _tick_rate: Optional[float] = None

    def _set_tick_rate(self, hz: float) -> None:
        """(Re)start the UI timer at ``hz``; a no-op when it already runs at that rate."""
        if hz == self._tick_rate:
            return
        if self._tick_timer is not None:
            self._tick_timer.stop()
        self._tick_rate = hz
        self._tick_timer = self.set_interval(1 / hz, self._tick, name="graphtop-pump")

    def _tick(self) -> None:
        """The UI timer's body: a throttled pump and an adaptive tick rate.

        Every tick of the UI thread is GIL time the engine thread waits for. While the engine is
        busy (events pour in) the panels are throttled to a few Hz anyway, so the timer drops to
        ``busy_hz``; when it calms down it returns to ``tick_hz`` for snappy streaming and capture
        progress. Keys and typing are handled by Textual's message loop, not this timer, so they
        stay immediate either way.
        """
        n = self.pump(now=time.monotonic())
        if self.tick_hz and self._tick_rate:
            rate = n * self._tick_rate
            if rate > self.BUSY_EVENTS_PER_S and self.busy_hz < self.tick_hz:
                self._set_tick_rate(self.busy_hz)
            elif rate < self.BUSY_EVENTS_PER_S / 4:  # hysteresis: do not flap around the threshold
                self._set_tick_rate(self.tick_hz)

    def pump(self, *, now: Optional[float] = None) -> int:
        """Drain → fold → render. Public so tests can step it exactly.

        ``now`` (the timer passes ``time.monotonic()``) lets each panel skip a render that is not
        due yet (``Panel.MIN_INTERVAL``); without it every changed panel renders at once.
        """
        if self._stop.is_set():  # shutting down: widgets may already be gone
            return 0
        session = self.session
        replay = session.replay
        if replay is not None and replay.take_reset():
            self.state = DashboardState()
        events = session.drain(self.max_events_per_tick)
        self.state.apply_all(events)
        if self.live_session is not None and self.live_session is not session and self.live_state is not None:
            self.live_state.apply_all(self.live_session.drain(self.max_events_per_tick))
        if session.kind == "live" and self.notify_events:
            self._notify_events(events)
        if self.live_session is not None:
            self._check_live_session(self.live_session)
        with self.batch_update():
            if not self.paused or replay is not None:
                self.render_all(now=now)
            else:
                self._render_status()
            self.prompt_console.poll()
        return len(events)

    def _check_live_session(self, live: Session) -> None:
        """Engine log records become notifications; an engine that went away is said once."""
        for level, message in live.drain_logs():
            if level >= logging.WARNING:
                self.notify(message, title="engine", severity="error" if level >= logging.ERROR else "warning",
                            timeout=12)
        ended = live.ended
        if ended and ended != self._ended_seen:
            self._ended_seen = ended
            if self.exit_when_engine_ends:
                self._stop.set()
                self.exit(1, return_code=1, message=f"graphtop: {ended}")
                return
            self.notify(f"{ended} — q closes the dashboard", title="engine gone", severity="warning", timeout=30)

    def render_all(self, *, force: bool = False, now: Optional[float] = None) -> None:
        """Re-render every panel whose state areas changed (all of them when ``force``); with
        ``now``, only those due by their ``MIN_INTERVAL``."""
        state = self.state
        for panel in self.panels:
            panel.update_view(state, force=force, now=now)
        self._render_status(force=force)
        replay = self.session.replay
        if replay is not None:
            self.replay_bar.update_view(replay)

    def _render_status(self, *, force: bool = False) -> None:
        replay = self.session.replay
        if replay is not None:
            mode = "REPLAY · PAUSED" if replay.paused else "REPLAY"
        else:
            mode = "PAUSED" if self.paused else ""
        self.status_line.update_view(self.state, mode=mode, dropped=self.session.dropped, force=force)

    def _notify_events(self, events: Iterable[Event]) -> None:
        ev: Any
        for ev in events:
            if ev.type == "error":
                self.notify(ev.message, title=f"engine error in {ev.where or '?'}",
                            severity="error", timeout=30 if ev.fatal else 8)
            elif ev.type == "config_downgrade":
                self.notify(f"{ev.key}: {ev.old} → {ev.new} ({ev.reason})", title="config downgraded",
                            severity="warning", timeout=10)
            elif ev.type == "recapture_finished":
                if ev.ok:
                    self.notify(f"{ev.message or 'done'} in {ev.seconds:.2f}s", title="recapture finished")
                else:
                    self.notify(ev.message or "failed", title="recapture failed", severity="error", timeout=20)

    # ------------------------------------------------------------------ actions
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Replay keys only in a replay; bucket editing only with a live engine; ``q`` is labelled
        Detach when the engine keeps running without this dashboard."""
        replay = self.session.kind == "replay"
        if action in ("quit", "detach"):
            detaches = self.live_session is not None and self.live_session.detaches
            return (action == "detach") == detaches
        if action in self.REPLAY_ACTIONS:
            return replay
        if action in self.LIVE_ACTIONS:
            return not replay
        return True

    async def action_quit(self) -> None:
        self._stop.set()
        self.exit(0)

    async def action_detach(self) -> None:
        await self.action_quit()

    async def action_close(self) -> None:
        await self.action_quit()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_toggle_pause(self) -> None:
        replay = self.session.replay
        if replay is not None:
            replay.toggle_pause()
        else:
            self.paused = not self.paused
            if not self.paused:
                self.render_all(force=True)
        self._render_status(force=True)

    def action_focus_prompt(self) -> None:
        console = self.prompt_console
        if console.display:
            self.prompt_console.query_one("#prompt").focus()

    def action_leave_input(self) -> None:
        self.screen.set_focus(None)

    def action_capture_table(self) -> None:
        self.push_screen(CaptureTableScreen(self.state))

    def action_toggle_panel(self, name: str) -> None:
        if name not in PANELS:
            return
        widget = self.screen_stack[0].query_one(f"#{name}")
        widget.display = not widget.display

    def _current_buckets(self) -> tuple[list[int], list[int]]:
        dec, pre = self.session.buckets()
        return (
            dec if dec is not None else self.state.current_buckets("decode"),
            pre if pre is not None else self.state.current_buckets("prefill"),
        )

    def _can_recapture(self) -> bool:
        if self.session.kind != "live":
            self.notify("a replayed trace cannot recapture", severity="warning")
            return False
        if not self.session.can_submit:
            self.notify("the engine is still loading", severity="warning")
            return False
        return True

    def action_buckets(self) -> None:
        if not self._can_recapture():
            return
        decode, prefill = self._current_buckets()
        limits = self.session.limits()
        kv = self.state.kv
        self.push_screen(
            BucketEditorScreen(
                decode, prefill, history=self.state.whatif_inputs(),
                max_running=limits.max_running or (kv.max_running if kv else None),
                kv_capacity=limits.kv_capacity_tokens or (kv.capacity_tokens if kv else None),
                max_buckets={ph: self.state.graph_max_bucket(ph) for ph in ("decode", "prefill")},
                blink=self.animate,
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
            decode, prefill = self._current_buckets()
            self._recapture(decode, prefill)

    def _recapture(self, decode: Optional[list[int]], prefill: Optional[list[int]]) -> None:
        try:
            self.session.recapture(decode, prefill)
        except Exception as exc:
            self.notify(str(exc), title="recapture refused", severity="error")
            return
        self.notify("runs at the next step boundary; requests keep streaming", title="recapture requested")

    PARITY_EVERY = 64
    """The palette switches parity checks on at this rate: off the critical path, one in 64 costs
    little (bench/parity_bench.py) and still checks every bucket in use within seconds."""

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
        self.notify(f"one graph step in {every} re-run eagerly and compared" if every else "off",
                    title="parity checks")
        self.render_all(force=True)

    def action_export_trace(self) -> None:
        default = f"graphtop-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
        self.push_screen(
            PathPromptScreen("export trace to", default, f"{len(self.state.recorded):,} events in memory"),
            callback=self._export_to,
        )

    def _export_to(self, path: Optional[str]) -> None:
        if path:
            self._export_worker(path, list(self.state.recorded))

    @work(thread=True, group="export", exit_on_error=False)
    def _export_worker(self, path: str, events: list[Event]) -> None:
        """Writing a large trace takes a while; do it off the UI thread and report once."""
        from graphtop.engine.telemetry.safe_write import OutputPathError

        source = self.session.label if self.session.kind == "replay" else None
        try:
            n = write_trace(path, events, meta={"source": "graphtop tui", "label": self.session.label},
                            source=source)
        except OSError as exc:
            self.call_from_thread(self.notify, f"{path}: {exc.strerror or exc}", title="export failed",
                                  severity="error")
        except OutputPathError as exc:
            self.call_from_thread(self.notify, str(exc), title="export failed", severity="error")
        else:
            self.call_from_thread(self.notify, f"{n:,} events → {path}", title="trace exported")

    def action_open_trace(self) -> None:
        self.push_screen(PathPromptScreen("open trace", "", "a .jsonl trace written by graphtop"),
                         callback=self.open_trace)

    def open_trace(self, path: Optional[str]) -> None:
        """Switch the panels to a replay of ``path`` (the live engine keeps running)."""
        if not path:
            return
        from graphtop.engine.telemetry.trace import TraceError

        try:
            replay = ReplaySession.from_path(str(Path(path).expanduser()))
        except TraceError as exc:
            self.notify(str(exc), title="cannot open trace", severity="error")
            return
        self.switch_session(replay)

    def switch_session(self, session: Session) -> None:
        """Show ``session`` in the panels; the live session (if any) keeps being drained."""
        self.session = session
        if session is self.live_session and self.live_state is not None:
            self.state = self.live_state
        else:
            self.state = DashboardState()
            session.start()
        self._apply_mode()
        self.render_all(force=True)

    def action_back_to_live(self) -> None:
        if self.live_session is not None:
            self.switch_session(self.live_session)

    def action_seek(self, seconds: float) -> None:
        replay = self.session.replay
        if replay is not None:
            replay.seek(seconds)
            self.pump()

    def action_seek_to(self, position: float) -> None:
        replay = self.session.replay
        if replay is not None:
            replay.seek_to(position)
            self.pump()

    def action_seek_events(self, n: int) -> None:
        replay = self.session.replay
        if replay is not None:
            replay.seek_events(n)
            self.pump()

    def action_speed(self, direction: int) -> None:
        replay = self.session.replay
        if replay is not None:
            replay.change_speed(direction)
            self.replay_bar.update_view(replay)

    # ------------------------------------------------------------------ prompts
    @on(PromptConsole.PromptSubmitted)
    def _submit_prompt(self, message: PromptConsole.PromptSubmitted) -> None:
        session = self.live_session
        if session is None:
            self.notify("a replayed trace takes no prompts", severity="warning")
            return
        try:  # held by the session while the model loads; it applies the chat template if there is one
            handle = session.submit(message.prompt, message.settings, message.chat)
        except Exception as exc:
            self.notify(str(exc), title="prompt refused", severity="error")
            return
        self.prompt_console.add_request(handle, message.prompt, message.settings)
