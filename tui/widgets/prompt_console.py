"""Prompt console: type a prompt, watch it stream, keep several in flight at once.

Streaming is polled (``handle.new_text()``) on the dashboard's UI timer rather than pushed from
the engine thread, for the same reason the events are: the engine must never wait on the UI.

The whole conversation stays on screen to scroll back through, one block per request, bounded: the
last ``KEEP`` requests, each up to ``request_view.MAX_CHARS`` of text, with a note of what was let
go. The view follows new text only while it is scrolled to the bottom (Textual's anchor), so reading
an earlier answer is not interrupted by a stream; page up/down scroll it from the prompt.

While the console has the focus, every printable key is the prompt's: one typed with the focus on the
conversation or the chat checkbox goes into the prompt rather than on to the app's single-key
shortcuts (a space would pause the live view, a q quit).
"""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.widgets import Checkbox, Input, Static

from ..sessions.base import SamplingSettings, StreamHandle
from .history_input import HistoryInput
from .panel import drawable
from .request_view import RequestView
from .sampling_row import SamplingRow, describe

KEEP = 50
"""Requests kept on screen; older finished ones are removed (bounded like every history)."""


class PromptConsole(Vertical):
    """Settings row, streamed outputs, and the prompt input at the bottom."""

    BINDINGS = [
        Binding(
            "pageup",
            "page_outputs(-1)",
            "Older",
            show=False,
            id="console.page_up",
            tooltip="Scroll the conversation back a page",
        ),
        Binding(
            "pagedown",
            "page_outputs(1)",
            "Newer",
            show=False,
            id="console.page_down",
            tooltip="Scroll the conversation forward a page (at the bottom it follows new text)",
        ),
    ]

    class PromptSubmitted(Message):
        """The user asked to run ``prompt``; the app owns the session and submits it."""

        def __init__(self, prompt: str, settings: SamplingSettings, chat: bool) -> None:
            super().__init__()
            self.prompt = prompt
            self.settings = settings
            self.chat = chat

    def __init__(self, *, blink: bool = True, id: str | None = None) -> None:
        super().__init__(id=id, classes="panel")
        self.border_title = "prompt console"
        self._blink = blink
        self._in_flight: list[RequestView] = []
        """Views still streaming; polled every tick without walking the DOM (``query``)."""
        self._shown: list[RequestView] = []
        """Every view on screen, oldest first (a removal takes effect later: ``query`` would count it again)."""
        self.removed = 0
        """Finished requests let go to keep the console bounded."""

    def compose(self) -> ComposeResult:
        yield SamplingRow(blink=self._blink, id="sampling")
        with VerticalScroll(id="outputs"):
            yield Static(id="outputs-note")
        # back to the prompt ("/", or a key typed on the conversation), the draft stays: typing adds to it
        prompt = HistoryInput(
            placeholder="type a prompt — enter sends · ↑/↓ history · escape for the shortcuts",
            id="prompt",
            select_on_focus=False,
        )
        prompt.cursor_blink = self._blink
        yield prompt

    def on_mount(self) -> None:
        self.query_one("#outputs-note").display = False
        self.query_one("#outputs", VerticalScroll).anchor()

    def action_page_outputs(self, direction: int) -> None:
        outputs = self.query_one("#outputs", VerticalScroll)
        if direction < 0:
            outputs.scroll_page_up(animate=False)
        else:
            outputs.scroll_page_down(animate=False)

    @property
    def streaming(self) -> int:
        """Requests still streaming."""
        return len(self._in_flight)

    @property
    def views(self) -> list[RequestView]:
        return list(self.query(RequestView))

    @property
    def prompt_input(self) -> HistoryInput:
        return self.query_one("#prompt", HistoryInput)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "prompt":
            return
        event.stop()
        self.send_prompt()

    def send_prompt(self) -> None:
        """Send what the prompt holds (nothing when it is blank); the settings row must parse."""
        prompt = self.prompt_input
        text = prompt.value.strip()
        if not text:
            return
        try:
            settings = self.query_one(SamplingRow).settings()
        except ValueError as exc:
            self.app.notify(str(exc), title="not sent", severity="error")
            return
        prompt.remember(text)
        prompt.value = ""
        self.post_message(self.PromptSubmitted(text, settings, self.query_one(SamplingRow).chat))

    def type_text(self, text: str) -> None:
        """Type ``text`` into the prompt at its cursor (keys held while the dashboard started)."""
        self.prompt_input.insert_text_at_cursor(text)

    def delete_left(self) -> None:
        self.prompt_input.action_delete_left()

    def on_key(self, event: events.Key) -> None:
        """A printable key from a focused part of the console that takes no text (the conversation,
        the chat checkbox) goes into the prompt, not on to the app's shortcuts. Space and enter on
        the checkbox still toggle it (its own binding)."""
        focused = self.screen.focused
        if not event.is_printable or event.character is None or isinstance(focused, Input):
            return
        if isinstance(focused, Checkbox) and event.key == "space":
            return
        event.stop()
        event.prevent_default()
        self.screen.set_focus(self.prompt_input)
        self.type_text(event.character)

    def add_request(self, handle: StreamHandle, prompt: str, settings: SamplingSettings) -> RequestView:
        """Show a new in-flight request (called by the app after submitting it)."""
        outputs = self.query_one("#outputs", VerticalScroll)
        view = RequestView(handle, prompt, describe(settings))
        outputs.mount(view)
        self._in_flight.append(view)
        self._shown.append(view)
        self._trim()
        return view

    def _trim(self) -> None:
        """Let the oldest finished requests go past ``KEEP``: when one is added, and when one finishes
        (with many in flight, the console held more than ``KEEP`` until the next prompt was sent)."""
        views = self._shown
        if len(views) <= KEEP:
            return
        gone = {id(v) for v in [v for v in views if v.done][: len(views) - KEEP]}
        for old in views:
            if id(old) in gone:
                old.remove()
                self.removed += 1
        self._shown = [v for v in views if id(v) not in gone]
        if self.removed:
            note = self.query_one("#outputs-note", Static)
            note.display = True
            note.update(
                Content.from_markup(
                    "[$text-muted]$n earlier request(s) let go: the console keeps the last $k[/]",
                    n=f"{self.removed:,}",
                    k=str(KEEP),
                )
            )

    def poll(self) -> int:
        """Pull streamed text into every in-flight view; returns how many changed.

        Called on every UI tick: with nothing in flight it is one truth test.
        """
        if not self._in_flight or not drawable(self):
            return 0
        changed = 0
        for view in self._in_flight:
            if not view.done and view.poll():
                changed += 1
        still = [v for v in self._in_flight if not v.done]
        if len(still) < len(self._in_flight):
            self._trim()
        self._in_flight = still
        return changed

    def set_chat_available(self, available: bool) -> None:
        if drawable(self):  # the engine's ready message may come while the app shuts down
            self.query_one(SamplingRow).set_chat_available(available)
