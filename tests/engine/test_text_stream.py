"""A request's text path does work per token that does not grow with its output: the detokenizer's
window stays short whatever the tokens decode to, stop strings are looked for in a window of the newest
text, and the handle appends pieces. Checked by what each step touches, not by timing."""

from __future__ import annotations

import random
from typing import Any

import pytest
from support.tiny_models import shared_tokenizer

from graphtop.engine.request import RequestHandle
from graphtop.engine.step import text_stream
from graphtop.engine.step.detokenizer import MAX_PENDING, IncrementalDetokenizer
from graphtop.engine.step.text_stream import TextStream, cut_at_stop


class CountingTokenizer:
    """Decodes every id through ``table`` (an id missing from it decodes to nothing) and records how many
    ids each decode was given."""

    def __init__(self, table: dict[int, str]) -> None:
        self.table = table
        self.sizes: list[int] = []

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        self.sizes.append(len(ids))
        return "".join(self.table.get(i, "") for i in ids)


@pytest.mark.parametrize("decoded", ["", "\ufffd"], ids=["nothing", "replacement"])
def test_detokenizer_window_stays_short_when_tokens_never_settle(decoded):
    """A random-weight model repeating an id the tokenizer does not know (or half a character) for
    thousands of tokens: each decode still sees a bounded window, not the whole output."""
    tok = CountingTokenizer({7: decoded, 8: "x"})
    detok = IncrementalDetokenizer(tok)
    for i in range(3000):
        detok.push(8 if i % 1000 == 999 else 7)
    assert max(tok.sizes) <= 2 * MAX_PENDING  # the last stable run as prefix, then the pending tokens
    assert len(detok.ids) == 3000 and detok.text.count("x") == 3


def test_detokenizer_text_is_the_full_decode():
    """Ordinary text comes out whole, as pieces that join to one decode of every id."""
    tok = shared_tokenizer()
    ids = tok.encode("Streaming text, one token at a time: naïve café, 東京, emoji 🙂 and plain words.")
    detok = IncrementalDetokenizer(tok)
    streamed = "".join(detok.push(i) for i in ids) + detok.flush()
    assert streamed == detok.text == tok.decode(ids, skip_special_tokens=True)


class Deltas:
    """Stands in for the detokenizer: each push gives the next of ``deltas``."""

    def __init__(self, deltas: list[str]) -> None:
        self._deltas = iter(deltas)

    def push(self, token_id: int) -> str:
        return next(self._deltas)


def reference(deltas: list[str], stops: tuple[str, ...]) -> list[tuple[str, bool]]:
    """What each push should stream, computed on the whole text every time (the quadratic way)."""
    out, shown, text = [], 0, ""
    for d in deltas:
        text += d
        stopped = any(s in text for s in stops)
        visible = cut_at_stop(text, stops) if stopped else text[: len(text) - text_stream.stop_prefix_len(text, stops)]
        out.append((visible[shown:], stopped))
        shown = max(shown, len(visible))
        if stopped:
            break
    return out


@pytest.mark.parametrize("seed", range(40))
def test_text_stream_matches_the_whole_text_rules(seed):
    """Held-back tails and cuts are those of the whole-text rules, for stops spanning several deltas."""
    rng = random.Random(seed)
    deltas = ["".join(rng.choice("abc") for _ in range(rng.randrange(0, 4))) for _ in range(60)]
    stops = tuple("".join(rng.choice("abc") for _ in range(rng.randrange(1, 6))) for _ in range(rng.randrange(1, 3)))
    stream = TextStream(Deltas(deltas), stops)  # type: ignore[arg-type]
    got = []
    for i, _ in enumerate(reference(deltas, stops)):
        got.append(stream.push(i))
    assert got == reference(deltas, stops)


def test_text_stream_looks_at_a_window_not_the_text(monkeypatch):
    """The stop search and the held-back tail read the newest delta plus a stop's length, however long
    the text has grown."""
    seen: list[int] = []
    real = text_stream.stop_prefix_len
    monkeypatch.setattr(text_stream, "stop_prefix_len", lambda text, stops: seen.append(len(text)) or real(text, stops))
    stream = TextStream(Deltas(["word "] * 5000), (" the end",))  # type: ignore[arg-type]
    out = "".join(stream.push(i)[0] for i in range(5000))
    assert out == "word " * 4999 + "word"  # the trailing space may start " the end": held back
    assert max(seen) <= len("word ") + len(" the end") - 1


def test_handle_appends_pieces_and_new_text_returns_what_was_added():
    class Owner:
        background_running = True

        def refuse_inside_step(self, what: str) -> None:
            pass

    handle = RequestHandle("r", Owner(), "p", [1])  # type: ignore[arg-type]
    for i in range(1000):
        handle._push(i, f"{i},")
    assert len(handle._pieces) == 1000  # appended, never joined on the step thread
    assert handle.new_text() == "".join(f"{i}," for i in range(1000))
    handle._push(1000, "tail")
    assert handle.text.endswith("999,tail") and handle.new_text() == "tail"
    assert len(handle._pieces) <= 2  # a read joins them once
    streamed = len(handle.text)
    final = "f" * (streamed + 10)
    handle._set_text(final)  # the final decode: new_text goes on from the characters it returned
    assert handle.text == final and handle.new_text() == "f" * 10 and handle.new_text() == ""
