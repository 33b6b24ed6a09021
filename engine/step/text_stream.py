"""A request's streamed text: each token's stable text, less a tail that may be the start of a stop string.

Streamed text must always be a prefix of the final text, so a tail that may begin a stop string is held
back until the string either completes (and is cut off) or cannot match any more.

Why a class of its own: every step runs this for every request, so its work must not grow with the
output. A stop string that completes with this token ends inside the newest text, so it is looked for in
the new text plus the last ``len(longest stop) - 1`` characters before it, never in the whole text;
what is held back is a suffix of that same window, and what goes out is a delta the handle appends.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .detokenizer import IncrementalDetokenizer


class TextStream:
    """``hidden``: tokens whose text never shows (the end-of-sequence and stop tokens that end the request,
    unless their text is asked for); ``min_tokens``: stop strings count only from that many tokens on;
    ``include_stop``: the text ends after the stop string instead of before it."""

    def __init__(
        self,
        detok: IncrementalDetokenizer,
        stops: Sequence[str] = (),
        *,
        hidden: frozenset[int] = frozenset(),
        min_tokens: int = 0,
        include_stop: bool = False,
    ) -> None:
        self.detok = detok
        self.stops = tuple(stops)
        self.hidden = hidden
        self.min_tokens = min_tokens
        self.include_stop = include_stop
        self.stopped = False  # a stop string ended the text
        self._pushed = 0
        self._keep = max((len(s) for s in self.stops), default=1) - 1  # a tail shorter than any stop
        self._tail = ""  # the text's last ``_keep`` characters
        self._length = 0  # characters of stable text so far
        self._shown = 0  # characters of it streamed so far

    def push(self, token_id: int) -> tuple[str, bool]:
        """Add a token: (the text to stream now, whether a stop string completed). After a stop the text
        streamed ends where the stop string starts (or ends, ``include_stop``); nothing should be pushed
        after it."""
        self._pushed += 1
        if token_id in self.hidden:
            return "", False
        delta = self.detok.push(token_id)
        if not self.stops:
            self._length += len(delta)
            self._shown = self._length
            return delta, False
        window = self._tail + delta
        base = self._length - len(self._tail)  # where ``window`` starts in the text
        self._length += len(delta)
        found = self._find(window) if self._pushed >= self.min_tokens else None
        if found is not None:
            end = base + found
        else:
            end = self._length - stop_prefix_len(window, self.stops)
        out = window[self._shown - base : end - base] if end > self._shown else ""
        self._shown = max(self._shown, end)
        self._tail = window[-self._keep :] if self._keep else ""
        self.stopped = found is not None
        return out, self.stopped

    def _find(self, window: str) -> Optional[int]:
        """Where the text ends for the first stop string that completes in the window's new part (one
        that lies in the tail alone was seen before, or counted for nothing before ``min_tokens``)."""
        ends = []
        for s in self.stops:
            i = window.find(s, max(0, len(self._tail) - len(s) + 1))
            if i >= 0:
                ends.append((i, i + len(s)))
        if not ends:
            return None
        start, stop = min(ends)
        return stop if self.include_stop else start


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
