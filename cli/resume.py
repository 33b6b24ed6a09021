"""``--resume``: finish a batch run that was killed, from the results its OUT.jsonl already holds.

The results in OUT are matched to the prompts file's lines by request id. A result is kept when its
request ended (eos, length, stop, or rejected by the engine); a line cut off by the kill, a cancelled
request and the result of a line the prompts file itself rejects (re-made at once) are dropped, and OUT
is rewritten without them before the run appends to it. Everything else is refused in one line, before
the model loads: OUT is not a regular file, a line of OUT is not a result, an id that no line of the
prompts file has, a prompt that differs from its line's (another prompts file), two results for one id.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from typing import Any, Optional

from .prompts_file import PromptLine
from .usage import UsageError

DONE = ("eos", "length", "stop", "rejected")
"""Finish reasons of a request that ended: its result is kept. A cancelled one (a run that failed) is redone."""


@dataclass
class Resumed:
    """What OUT already holds for the prompts file."""

    kept: dict[str, dict]  # request id -> its result in OUT
    dropped: int = 0  # lines of OUT to remove before appending (OUT is rewritten with the kept ones first)

    def to_serve(self, lines: list[PromptLine]) -> list[PromptLine]:
        """The lines still to run: every line without a kept result (a rejected line is re-made at once)."""
        return [pl for pl in lines if pl.error or pl.request_id not in self.kept]

    def merged(self, lines: list[PromptLine], served: list[PromptLine], results: list[dict]) -> list[dict]:
        """All of OUT's results in the prompts file's order: kept ones and this run's."""
        new = {pl.line: r for pl, r in zip(served, results)}
        return [
            new[pl.line] if pl.line in new else self.kept[pl.request_id]
            for pl in lines
            if pl.line in new or pl.request_id in self.kept
        ]


def _is_result(obj: Any) -> Optional[str]:
    """Why ``obj`` is not a result line graphtop writes (None: it is one)."""
    if not isinstance(obj, dict):
        return "not a JSON object"
    if not isinstance(obj.get("id"), str):
        return "no string 'id'"
    if not isinstance(obj.get("token_ids"), list) or not isinstance(obj.get("text"), str):
        return "no 'text' and 'token_ids'"
    if not isinstance(obj.get("finish_reason"), str):
        return "no 'finish_reason'"
    return None


def read_resume(path: str, prompts: str, lines: list[PromptLine]) -> Resumed:
    """OUT's results for ``lines`` (nothing when OUT does not exist yet), or a UsageError in one line."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Resumed({})
    except OSError as exc:
        raise UsageError(f"--resume: cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"--resume reads back and appends to --output {path}: it must be a regular file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UsageError(f"--resume: cannot read {path}: {exc.strerror or exc}") from None
    raw = data.split(b"\n")
    cut = raw.pop()  # after the last newline: empty, or a line the kill cut short
    by_id = {pl.request_id: pl for pl in lines}
    servable = {pl.request_id for pl in lines if not pl.error}
    kept: dict[str, dict] = {}
    first: dict[str, int] = {}
    dropped = 1 if cut.strip() else 0
    for n, line in enumerate(raw, 1):
        if not line.strip():
            dropped += 1
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            raise UsageError(f"--resume: line {n} of {path} is not a graphtop result (not JSON)") from None
        why = _is_result(obj)
        if why:
            raise UsageError(f"--resume: line {n} of {path} is not a graphtop result ({why})")
        rid = obj["id"]
        pl = by_id.get(rid)
        if pl is None:
            raise UsageError(
                f"--resume: line {n} of {path} has id {rid!r}, which no line of {prompts} has: "
                "not a result of this prompts file"
            )
        if rid not in servable or obj["finish_reason"] not in DONE:
            dropped += 1  # re-made (a rejected line) or redone (a cancelled request)
            continue
        if pl.messages is None and obj.get("prompt") is not None and obj["prompt"] != pl.prompt:
            raise UsageError(
                f"--resume: line {n} of {path} (id {rid!r}) has another prompt than line {pl.line} "
                f"of {prompts}: not a result of this prompts file"
            )
        if rid in kept:
            raise UsageError(f"--resume: {path} has two results for id {rid!r} (lines {first[rid]} and {n})")
        kept[rid], first[rid] = obj, n
    return Resumed(kept, dropped)


def drop_unkept(path: str, resumed: Resumed) -> None:
    """Rewrite OUT with only its kept results (atomically) when it holds lines to drop, so the lines the
    run appends are never preceded by a cut-off line or a stale result for the same id."""
    from graphtop.engine.telemetry.safe_write import OutputPathError, write_atomic

    from .results_file import result_line

    if not resumed.dropped:
        return
    data = b"".join(result_line(r) for r in resumed.kept.values())
    try:
        write_atomic(path, lambda f: f.write(data), "--output")
    except (OSError, OutputPathError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(f"--resume: cannot rewrite {path}: {reason}") from None
