"""Prompt console: type a prompt, watch it stream, keep several in flight at once.

Streaming is polled (``handle.new_text()``) on the dashboard's UI timer rather than pushed from
the engine thread, for the same reason the events are: the engine must never wait on the UI.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Input

from .history_input import HistoryInput
from .request_view import RequestView
from .sampling_row import SamplingRow
from .session import SamplingSettings, StreamHandle

KEEP = 24
"""Finished requests kept on screen; older ones are removed (bounded like every history)."""


class PromptConsole(Vertical):
    """Settings row, streamed outputs, and the prompt input at the bottom."""

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

    def compose(self) -> ComposeResult:
        yield SamplingRow(blink=self._blink, id="sampling")
        yield VerticalScroll(id="outputs")
        prompt = HistoryInput(placeholder="prompt — enter sends, ↑/↓ history, escape leaves", id="prompt")
        prompt.cursor_blink = self._blink
        yield prompt

    @property
    def streaming(self) -> int:
        """Requests still streaming."""
        return len(self._in_flight)

    @property
    def views(self) -> list[RequestView]:
        return list(self.query(RequestView))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "prompt":
            return
        event.stop()
        text = event.value.strip()
        if not text:
            return
        try:
            settings = self.query_one(SamplingRow).settings()
        except ValueError as exc:
            self.app.notify(str(exc), title="not sent", severity="error")
            return
        prompt = self.query_one("#prompt", HistoryInput)
        prompt.remember(text)
        prompt.value = ""
        self.post_message(self.PromptSubmitted(text, settings, self.query_one(SamplingRow).chat))

    def add_request(self, handle: StreamHandle, prompt: str, settings: SamplingSettings) -> RequestView:
        """Show a new in-flight request (called by the app after submitting it)."""
        outputs = self.query_one("#outputs", VerticalScroll)
        view = RequestView(handle, prompt, settings.describe())
        outputs.mount(view)
        self._in_flight.append(view)
        done = [v for v in self.views if v.done]
        for old in done[: max(len(self.views) - KEEP, 0)]:
            old.remove()
        outputs.scroll_end(animate=False)
        return view

    def poll(self) -> int:
        """Pull streamed text into every in-flight view; returns how many changed.

        Called on every UI tick: with nothing in flight it is one truth test.
        """
        if not self._in_flight:
            return 0
        changed = 0
        for view in self._in_flight:
            if not view.done and view.poll():
                changed += 1
        self._in_flight = [v for v in self._in_flight if not v.done]
        if changed:
            self.query_one("#outputs", VerticalScroll).scroll_end(animate=False)
        return changed

    def set_chat_available(self, available: bool) -> None:
        self.query_one(SamplingRow).set_chat_available(available)
