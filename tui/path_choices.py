"""What a path typed so far could become: the sub-folders and the files of one kind in the folder it
points into, as the Open trace dialog offers them (a list under the field, the first one inline).

Why: "Open trace" asked for a path and offered nothing, so a newcomer had to know the name of a trace
that the dashboard itself (Export trace) or ``--record`` had written a minute before. The newest files
come first: the trace just written is the one most likely wanted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from textual.suggester import Suggester

SCAN_LIMIT = 2000
"""Folder entries looked at per keystroke, at most: a huge folder must not stall the dashboard."""


@dataclass(frozen=True)
class PathChoice:
    """``value``: the text the field takes (the typed folder part kept as typed, ``~`` included);
    ``folder``: it names a folder (its value ends in a slash, and choosing it opens it)."""

    value: str
    folder: bool


def path_choices(text: str, suffix: str, *, limit: int = 8, cwd: Optional[Path] = None) -> list[PathChoice]:
    """Entries of the folder ``text`` points into whose names start with what follows its last slash:
    files ending in ``suffix`` (newest first), then sub-folders (by name); hidden ones only when the
    typed name starts with a dot. Nothing (never an error) for a folder that cannot be read."""
    head, _, prefix = text.rpartition(os.sep)
    typed_folder = head + os.sep if os.sep in text else ""
    try:
        folder = Path(typed_folder or ".").expanduser()
        if not folder.is_absolute():
            folder = (cwd or Path.cwd()) / folder
        files: list[tuple[float, str]] = []
        folders: list[str] = []
        with os.scandir(folder) as entries:
            for n, entry in enumerate(entries):
                if n >= SCAN_LIMIT:
                    break
                name = entry.name
                if not name.startswith(prefix) or (name.startswith(".") and not prefix.startswith(".")):
                    continue
                if entry.is_dir():
                    folders.append(name)
                elif entry.is_file() and name.endswith(suffix):
                    files.append((entry.stat().st_mtime, name))
    except (OSError, RuntimeError, ValueError):  # unreadable, not a folder, an unknown ~user, a NUL
        return []
    files.sort(key=lambda f: (-f[0], f[1]))
    choices = [PathChoice(typed_folder + name, False) for _, name in files]
    choices += [PathChoice(typed_folder + name + os.sep, True) for name in sorted(folders)]
    return choices[:limit]


class PathSuggester(Suggester):
    """The first choice, shown inline after what is typed (→ takes it), as Textual's Input offers."""

    def __init__(self, suffix: str) -> None:
        super().__init__(use_cache=False, case_sensitive=True)
        self.suffix = suffix

    async def get_suggestion(self, value: str) -> Optional[str]:
        choices = path_choices(value, self.suffix, limit=1)
        if not value or not choices or choices[0].value == value:
            return None
        return choices[0].value
