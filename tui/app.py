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

What goes where on screen is the :class:`~graphtop.tui.screens.dashboard.DashboardScreen`'s business;
the actions live in the mixins (``app_actions``, ``graph_actions``, ``file_actions``).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from textual import events, on, work
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.timer import Timer
from textual.worker import get_current_worker

from graphtop.themes import DEFAULT_THEME, STYLESHEETS

from .advice_actions import AdviceActions
from .bindings import APP_BINDINGS
from .commands import GraphtopCommands
from .device_probe import DeviceProbe, DeviceSample
from .early_keys import EarlyKeys
from .file_actions import FileActions
from .messages import DeviceSampled, EngineFailed, EngineReady
from .safe_text import error_line, printable
from .screens.dashboard import DashboardScreen
from .sessions.base import Session, SessionError
from .state import DashboardState
from .widgets.panel import drawable
from .widgets.prompt_console import PromptConsole

if TYPE_CHECKING:  # the engine package imports torch; the first frame must not wait for it
    from graphtop.engine.telemetry.events import Event


class GraphtopApp(AdviceActions, FileActions):
    """The live (or replayed) graph dashboard."""

    TITLE = "graphtop"
    CSS_PATH = [str(p) for p in STYLESHEETS]
    COMMANDS = FileActions.COMMANDS | {GraphtopCommands}
    AUTO_FOCUS = None  # the prompt takes the focus once the screen is ready (live); dialogs focus their field
    BINDINGS = APP_BINDINGS

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
        self._early_keys: Optional[EarlyKeys] = EarlyKeys() if self.live_session is not None else None
        """Text keys typed before the prompt had the focus (``early_keys``); None once it has."""
        if not animate:
            self.animation_level = "none"

    def get_default_screen(self) -> Screen:
        self.dashboard = DashboardScreen(self.session.label, poll_device=self.poll_device, animate=self.animate)
        return self.dashboard

    # The engine's thread needs the GIL for ~0.3 ms per step; with CPython's default 5 ms switch
    # interval it waits behind every repaint (a GIL convoy) and decode slows several-fold. A short
    # interval while a live engine runs here lets it in within a fraction of a millisecond.
    ENGINE_SWITCH_INTERVAL_S = 0.0002
    _switch_interval: Optional[float] = None

    def on_dashboard_screen_ready(self, _message: DashboardScreen.Ready) -> None:
        """The app's start, once its screen has its panels (the app mounts before its screen)."""
        if self.session.hosts_engine and self._switch_interval is None:
            self._switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(self.ENGINE_SWITCH_INTERVAL_S)
        self.prompt_console = self.dashboard.prompt_console
        self.theme = self._theme_name
        self.theme_changed_signal.subscribe(self, lambda _theme: self.render_all(force=True))
        self.apply_mode()
        self.dashboard.device_panel.show(self.device_sample)
        if self.tick_hz:  # None: the caller pumps (deterministic tests)
            self._set_tick_rate(self.tick_hz)
        self._start_session()
        self.start_live_advice()
        if self.poll_device:
            self._poll_device()
        self.render_all(force=True)
        self._prompt_takes_keys()

    def _prompt_takes_keys(self) -> None:
        """With a live engine the prompt has the focus from the first frame, and the keys typed before
        it could take them are typed into it, in order."""
        early, self._early_keys = self._early_keys, None
        if self.live_session is not None and self.dashboard.focus_prompt() and early is not None:
            early.type_into(self.prompt_console)

    async def on_event(self, event: events.Event) -> None:
        """Text keys are held while the prompt cannot take them yet (``early_keys``)."""
        early = self._early_keys
        if (
            early is not None
            and isinstance(event, events.Key)
            and not event.is_forwarded
            and early.hold(event.key, event.character)
        ):
            return
        await super().on_event(event)

    def _drawing(self) -> bool:
        """Whether the dashboard can be drawn: not before its screen exists, nor once the app is shutting
        down (a tick, a toast's timer or a worker's message can still come then)."""
        dashboard = getattr(self, "dashboard", None)
        return not self._stop.is_set() and dashboard is not None and drawable(dashboard)

    def on_unmount(self) -> None:
        self._stop.set()
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = None

    TOAST_REPAINT_AFTER_S = 0.5
    """How long after a toast's timeout the screen is repainted (``_repaint_after_toast``)."""

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: Optional[float] = None,
        markup: bool = False,
    ) -> None:
        """Every toast shows its text as it is: never as markup, controls as stand-ins; and it goes.

        Toasts carry paths the user typed, engine errors and logs, and a remote engine's words; with
        Textual's default (markup on) ``[/INST]`` crashed the app and ``[@click=app.quit]`` made a
        toast that quit it. Widgets' ``notify`` passes ``markup=True`` through, so it is ignored here.
        """
        super().notify(
            printable(str(message)), title=printable(str(title)), severity=severity, timeout=timeout, markup=False
        )
        shown_for = self.NOTIFICATION_TIMEOUT if timeout is None else timeout
        self.set_timer(shown_for + self.TOAST_REPAINT_AFTER_S, self._repaint_after_toast, name="graphtop-toast")

    def _repaint_after_toast(self) -> None:
        """Repaint the whole screen once a toast has expired.

        Textual (8.2) removes an expired toast but, while a hidden panel's text changes (the compact
        layout's other views, the device panel every second), does not always repaint what the toast
        covered: in a real terminal the toast stayed on screen for minutes, until a key changed the view.
        """
        if self._drawing():
            self.screen.refresh()

    def apply_mode(self) -> None:
        """Live or replay: the replay bar instead of the prompt console, and the keys that apply."""
        self.dashboard.set_replay(self.session.kind == "replay")
        self.dashboard.replay_bar.live_behind = self.live_session is not None
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
        self.dashboard.device_panel.show(message.sample)

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
        if not self._drawing():  # shutting down: widgets may already be gone
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
                self.render_status()
            self.prompt_console.poll()
        return len(events)

    def _check_live_session(self, live: Session) -> None:
        """Engine log records become notifications; an engine that went away is said once."""
        for level, message in live.drain_logs():
            if level >= logging.WARNING:
                self.notify(
                    message, title="engine", severity="error" if level >= logging.ERROR else "warning", timeout=12
                )
        ended = live.ended
        if ended and ended != self._ended_seen:
            self._ended_seen = ended
            if self.exit_when_engine_ends:
                self._stop.set()
                self.exit(1, return_code=1, message=error_line(ended))
                return
            self.notify(f"{ended} — ctrl+q closes the dashboard", title="engine gone", severity="warning", timeout=30)

    def render_all(self, *, force: bool = False, now: Optional[float] = None) -> None:
        """Re-render every panel whose state areas changed (all of them when ``force``); with
        ``now``, only those due by their ``MIN_INTERVAL``."""
        if not self._drawing():
            return
        state = self.state
        dashboard = self.dashboard
        for panel in dashboard.panels:
            panel.update_view(state, force=force, now=now)
        self.render_status(force=force)
        dashboard.update_view_bar(state)
        replay = self.session.replay
        if replay is not None:
            dashboard.replay_bar.update_view(replay)

    def render_status(self, *, force: bool = False) -> None:
        if not self._drawing():
            return
        replay = self.session.replay
        if replay is not None:
            mode = "REPLAY · PAUSED" if replay.paused else "REPLAY"
        else:
            mode = " · ".join(m for m in (self._engine_mode(), "PAUSED" if self.paused else "") if m)
        self.dashboard.status_line.update_view(self.state, mode=mode, dropped=self.session.dropped, force=force)

    def _engine_mode(self) -> str:
        """A lasting word in the status line for a live engine that is gone or silent: the toast about it
        goes away, and the panels' last picture would otherwise pass for a live one."""
        session = self.session
        if session.ended:
            return "ENGINE GONE"
        silent = session.silent_for
        return f"NO WORD FOR {silent:.0f} S" if silent else ""

    def _notify_events(self, events: Iterable[Event]) -> None:
        ev: Any
        for ev in events:
            if ev.type == "error":
                self.notify(
                    ev.message,
                    title=f"engine error in {ev.where or '?'}",
                    severity="error",
                    timeout=30 if ev.fatal else 8,
                )
            elif ev.type == "config_downgrade":
                self.notify(
                    f"{ev.key}: {ev.old} → {ev.new} ({ev.reason})",
                    title="config downgraded",
                    severity="warning",
                    timeout=10,
                )
            elif ev.type == "recapture_finished":
                if ev.ok:
                    self.notify(f"{ev.message or 'done'} in {ev.seconds:.2f}s", title="recapture finished")
                else:
                    self.notify(ev.message or "failed", title="recapture failed", severity="error", timeout=20)

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
