"""Keys typed before the prompt can take them: held, then typed into it once it has the focus.

Why: a user who starts typing as soon as ``graphtop`` starts types before the dashboard's first
frame, or while its screen is still being built. With nothing focused, Textual hands those keys to the
app's single-key bindings: a space paused the live view and the prompt was lost. The app holds the
text keys instead (``GraphtopApp.on_event``) until the prompt has the focus, then types them into it.

A terminal still in line mode (before the dashboard switched it to raw keys) sends Enter as ctrl+j,
so both send the prompt. A leading "/" is the dashboard's key for the prompt, not text: it is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol

SEND_KEYS = frozenset({"enter", "ctrl+j"})
"""Keys that send the prompt (ctrl+j: Enter typed while the terminal was still in line mode)."""
EDIT_KEYS = frozenset({"backspace"})


class PromptTarget(Protocol):
    """What the held keys are typed into (``PromptConsole``)."""

    def type_text(self, text: str) -> None: ...
    def delete_left(self) -> None: ...
    def send_prompt(self) -> None: ...


@dataclass
class EarlyKeys:
    """The text keys typed so far, in order, as (key, character)."""

    keys: list[tuple[str, Optional[str]]] = field(default_factory=list)

    def hold(self, key: str, character: Optional[str]) -> bool:
        """Keep a key for the prompt; False for one that is no text (escape, ctrl+q, arrows), which
        the app handles as usual."""
        printable = character is not None and character.isprintable()
        if not (printable or key in SEND_KEYS or key in EDIT_KEYS):
            return False
        self.keys.append((key, character))
        return True

    def type_into(self, target: PromptTarget) -> None:
        """Type the held keys into ``target``, in order; Enter sends what is typed so far."""
        keys = self.keys
        if keys and keys[0][1] == "/":
            keys = keys[1:]
        for key, character in keys:
            if key in SEND_KEYS:
                target.send_prompt()
            elif key in EDIT_KEYS:
                target.delete_left()
            elif character is not None:
                target.type_text(character)
        self.keys = []
