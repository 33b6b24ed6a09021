"""A request's streamed text: each token's stable text, less a tail that may be the start of a stop string.

Streamed text must always be a prefix of the final text, so a tail that may begin a stop string is held
back until the string either completes (and is cut off) or cannot match any more.

Why a class of its own: every step runs this for every request, so its work must not grow with the
output. A stop string that completes with this token ends inside the newest text, so it is looked for in
the new text plus the last ``len(longest stop) - 1`` characters before it, never in the whole text;
what is held back is a suffix of that same window, and what goes out is a delta the handle appends.
"""

from __future__ import annotations

from typing import Sequence

from .detokenizer import IncrementalDetokenizer


class TextStream:
    def __init__(self, detok: IncrementalDetokenizer, stops: Sequence[str] = ()) -> None:
        self.detok = detok
        self.stops = tuple(stops)
        self._keep = max((len(s) for s in self.stops), default=1) - 1  # a tail shorter than any stop
        self._tail = ""  # the text's last ``_keep`` characters
        self._length = 0  # characters of stable text so far
        self._shown = 0  # characters of it streamed so far

    def push(self, token_id: int) -> tuple[str, bool]:
        """Add a token: (the text to stream now, whether a stop string completed). After a stop the text
        streamed ends where the stop string starts; nothing should be pushed after it."""
        delta = self.detok.push(token_id)
        if not self.stops:
            self._length += len(delta)
            self._shown = self._length
            return delta, False
        window = self._tail + delta
        base = self._length - len(self._tail)  # where ``window`` starts in the text
        self._length += len(delta)
        found = [i for i in (window.find(s) for s in self.stops) if i >= 0]
        end = base + min(found) if found else self._length - stop_prefix_len(window, self.stops)
        out = window[self._shown - base : end - base] if end > self._shown else ""
        self._shown = max(self._shown, end)
        self._tail = window[-self._keep :] if self._keep else ""
        return out, bool(found)


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` up to its first stop string (all of it when there is none)."""
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    return text[:cut] if cut >= 0 else text


def stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``stops``."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
