"""One prompt and its streamed completion, updated in place as tokens arrive."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from ..fmt import short
from ..safe_text import printable
from ..sessions.base import StreamHandle

MAX_CHARS = 20_000
"""Keep only the tail of very long completions: the console is for watching, not archiving."""


class RequestView(Static):
    """Header (id, prompt, status) and the completion text so far."""

    def __init__(self, handle: StreamHandle, prompt: str, settings_text: str) -> None:
        super().__init__(classes="request")
        self.handle = handle
        self.prompt = prompt
        self.settings_text = settings_text
        self.text = ""
        self.trimmed = False
        self.done = False
        self._queued = self._held()

    def _held(self) -> bool:
        """Held by the session until the engine is ready (``prompt_queue.QueuedHandle``)."""
        return bool(getattr(self.handle, "queued", False))

    def on_mount(self) -> None:
        self._redraw()

    def poll(self) -> bool:
        """Pull new text from the handle; True if anything changed."""
        if self.done:
            return False
        try:
            delta = self.handle.new_text()
        except Exception as exc:  # a broken handle must not take the UI down
            delta, self.done = "", True
            self.text += printable(f"\n[error: {exc}]")
        changed = bool(delta)
        if delta:  # made printable once, as it arrives, not at every redraw
            text = self.text + printable(delta)
            self.trimmed = self.trimmed or len(text) > MAX_CHARS
            self.text = text[-MAX_CHARS:]
        if self.handle.finished and not self.done:
            self.done = True
            changed = True
        if self._queued and not self._held():  # sent: the engine's request id and status from now on
            self._queued = False
            changed = True
        if changed:
            self._redraw()
        return changed

    def _redraw(self) -> None:
        h = self.handle
        if self._queued:
            status = Content.from_markup("[$warning]queued — runs once the model is loaded[/]")
        elif not self.done:
            status = Content.from_markup("[$warning]streaming…[/]")
        elif h.error:
            status = Content.from_markup("[$error]error: $e[/]", e=printable(str(h.error)))
        else:
            status = Content.from_markup(
                "[$success]done[/] [$text-muted]($r)[/]",
                r=str(getattr(h.finish_reason, "value", h.finish_reason) or "?"),
            )
        header = Content.from_markup(
            "[b $primary]#$id[/] $p [$text-muted]· $s ·[/] ",
            id=printable(str(h.request_id)),
            p=short(printable(self.prompt), 60),
            s=self.settings_text,
        )
        self.set_class(self.done, "-done")
        cut = (
            Content.from_markup(
                "[$text-muted]… (earlier text let go: $n characters kept per request)[/]\n", n=f"{MAX_CHARS:,}"
            )
            if self.trimmed
            else Content("")
        )
        self.update(Content.assemble(header, status, "\n", cut, self.text or "…"))
