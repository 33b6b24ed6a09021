"""``--output OUT.jsonl``: each result on disk the moment its request finishes, the whole file in request
order once the run is over.

A run killed with ``kill -9`` (or the OOM killer) keeps every result that had finished: each is written
with one unbuffered ``write`` as it finishes, so it sits in the operating system's cache, not in this
process, before the next step runs. The file is written under ``safe_write``'s rules: it is staged beside
OUT and renamed over it when the first result is written (a run that finishes nothing, or fails to load,
leaves an older OUT as it was), a link is never followed, and a device or FIFO (``/dev/stdout``) is
written straight through. A run that ends normally rewrites OUT atomically with every result in request
order (the order of the prompts file); until then, and in a killed or interrupted run's file, the lines
are in completion order. ``--resume`` appends to an existing OUT instead (``cli/resume.py``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

from graphtop.engine.telemetry.plain_text import json_escaped
from graphtop.engine.telemetry.safe_write import OutputPathError, StagedFile, open_staged, write_atomic

_LINE_BREAKS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}
"""Characters str.splitlines (and some editors) break at that json.dumps leaves raw: escaped, so one
result is one line for every reader."""


def result_line(result: dict) -> bytes:
    """One output line, safe to show on a terminal (``cat OUT.jsonl``, ``--output /dev/stdout``): what a
    terminal acts on (C1 and bidi controls; ``json`` escapes C0) and text that is not valid Unicode (a lone
    surrogate) are written as ``\\u`` escapes: the same values, nothing lost."""
    return (json_escaped(json.dumps(result, ensure_ascii=False)).translate(_LINE_BREAKS) + "\n").encode("utf-8")


def _reason(exc: Exception) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@dataclass
class ResultsFile:
    """OUT, open for the run. ``kept``: with --resume, the results already in OUT (appended to, never
    staged); ``written`` counts this run's results on disk."""

    path: str
    resume: bool = False
    written: int = 0
    error: Optional[str] = None  # the first write that failed; the run goes on, OUT is retried at the end
    _stage: Optional[StagedFile] = field(default=None, repr=False)
    _fd: Optional[int] = field(default=None, repr=False)
    _own: Optional[tuple[int, int]] = field(default=None, repr=False)
    _regular: bool = field(default=True, repr=False)

    def open(self) -> "ResultsFile":
        """Staged beside OUT (or OUT itself for --resume); before the model loads, so a path that cannot be
        written costs no load time."""
        try:
            if self.resume and os.path.isfile(self.path) and not os.path.islink(self.path):
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0))
            else:
                self._stage = open_staged(self.path, "--output")
                self._fd = self._stage.file.fileno()
                self._regular = self._stage.staged is not None
            st = os.fstat(self._fd)
            self._own = (st.st_dev, st.st_ino)
        except BaseException:  # an interrupt (SIGTERM while opening) leaves no staged file behind
            self.finish(None)
            raise
        return self

    @property
    def published(self) -> bool:
        """Whether OUT is this run's file (or, for a device, written to)."""
        return self._stage is None or self._stage.staged is None

    def add(self, result: dict) -> None:
        """Write one finished result now. A failure is kept (reported at the end), never raised: the run's
        other results still finish, and are written at the end if OUT can be written by then."""
        if self.error is not None or self._fd is None:
            return
        try:
            if not self.published:
                self._stage.publish()  # type: ignore[union-attr]
            _write_all(self._fd, result_line(result))
            self.written += 1
        except (OSError, OutputPathError) as exc:
            self.error = _reason(exc)

    def finish(self, ordered: Optional[list[dict]]) -> Optional[str]:
        """Close OUT. ``ordered``: the run ended normally, and these are all of OUT's results in request
        order, written over it atomically (a regular file only). None: interrupted, OUT keeps what was
        written. Returns the one-line reason OUT is not all there, or None."""
        fd, self._fd = self._fd, None
        if fd is None:
            if self._stage is not None and self._stage.staged is not None:  # opened part-way, then interrupted
                self._stage.discard()
            return None
        if self._stage is not None and self._stage.staged is not None:
            self._stage.discard()  # nothing written (or the rename refused): an older OUT stays as it was
        elif self._stage is not None:
            self._stage.file.close()
        else:
            os.close(fd)
        if ordered is not None and self._regular:
            self._rewrite(ordered)
        return f"cannot write {self.path}: {self.error}" if self.error else None

    def _rewrite(self, ordered: list[dict]) -> None:
        moved = self._moved() if self.published else None
        if moved:
            self.error = moved
            return
        data = b"".join(result_line(r) for r in ordered)
        try:
            write_atomic(self.path, lambda f: f.write(data), "--output")
            self.error = None  # a write that failed mid-run (a disk full for a while) is made good here
        except (OSError, OutputPathError) as exc:
            self.error = _reason(exc)

    def _moved(self) -> Optional[str]:
        """None while OUT names the file this run wrote; else why the ordered rewrite must not go there."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return "it was moved or removed while the run wrote it"
        if (st.st_dev, st.st_ino) != self._own:
            return (
                "another file replaced it while the run wrote it (a second run writing the same path?); "
                "it is left as it is"
            )
        return None
