"""Writes the event stream to a JSON-lines trace file from a background thread.

Crash safety: every write hands the OS only whole lines (a batch of complete ``...\\n`` lines in one
``write`` on an unbuffered file), so a SIGKILL can at worst leave a partially written *last* line,
never a damaged line in the middle; ``graphtop.engine.trace_tools.trace.read_trace`` tolerates exactly that.

Failure isolation: the recorder must never take the engine down. The trace path is checked when the
recorder is constructed (so the CLI can exit 2 before loading a model); after that, a failing write
(ENOSPC, EIO, ...) stops recording, is remembered in ``write_error`` and reported by ``close()``,
while the engine keeps running.

One trace per path: a recorder holds a lock on its own file, so a second recorder refuses (before the
run, and again just before its rename) to replace a trace still being written; ``close()`` then checks
the path still names the file it wrote, and reports a trace that was replaced or moved meanwhile as a
write error rather than letting it go silently.
"""

from __future__ import annotations

import errno
import fcntl
import operator
import os
import stat
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional, Union

from .bus import EventBus, Subscription
from .codec import encode_event, encode_lines
from .events import Event, TraceHeader
from .safe_write import OutputPathError, StagedFile, open_staged
from .value_limits import readable_free

__all__ = ["RecorderError", "RecorderResult", "TraceRecorder"]

# Events per write() call at most. Small on purpose: encoding holds the GIL (~1-2 µs per event) and the
# write syscall releases it, so 64 events bound how long the engine thread can wait for the GIL to
# well under a millisecond, while still amortizing syscalls.
FLUSH_INTERVAL_S = 0.025  # a killed run loses at most this much of the trace's tail
_BATCH = 64


_event_type = operator.attrgetter("type")


class RecorderError(Exception):
    """The trace file cannot be opened or its header written; the message is one line."""


@dataclass(frozen=True)
class RecorderResult:
    """What a recording produced; returned by ``TraceRecorder.close``."""

    path: str
    lines_written: int
    bytes_written: int
    dropped: int  # events the bus discarded because the recorder's queue was full
    lost_after_error: int  # events received after a write error and therefore not written
    write_error: Optional[str]
    counts: dict[str, int] = field(default_factory=dict)  # written lines per event type

    @property
    def ok(self) -> bool:
        return self.write_error is None and self.dropped == 0

    @property
    def error_line(self) -> Optional[str]:
        """The write failure as the CLI's one error line, or None: the trace is not all there."""
        if self.write_error is None:
            return None
        lost = f" ({self.lost_after_error} events not written)" if self.lost_after_error else ""
        return cannot_write_trace(self.path, self.write_error + lost)

    def describe(self) -> str:
        """One line for the CLI."""
        line = f"trace {self.path}: {self.lines_written} lines, {self.bytes_written} bytes"
        if self.dropped:
            line += f", {self.dropped} events dropped (queue full)"
        if self.write_error:
            line += f"; WRITE FAILED: {self.write_error} ({self.lost_after_error} events not written)"
        return line


def _describe_oserror(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return f"{name}: {reason}" if name else reason


def cannot_write_trace(path: Union[str, os.PathLike[str]], why: str) -> str:
    """The one wording of a trace that could not be written, for errors raised and reported alike."""
    return f"cannot write trace {path}: {why}"


def _lock_own(file: BinaryIO) -> None:
    """Mark ``file`` as a trace being written: the lock stays with the file across the rename into
    place and goes when it is closed (or the process dies), so a stale lock cannot outlive a run."""
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass  # a file system without locks: close()'s identity check still catches a replaced trace


def _being_recorded(path: Path) -> bool:
    """True when ``path`` is a regular file another recorder still holds its lock on."""
    try:  # never blocks: no FIFO is opened for reading, no link followed
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _open_trace(path: Path) -> StagedFile:
    # Unbuffered: each write() is one syscall carrying only whole lines. Staged beside the target until
    # published, so a run that never starts leaves an older trace at that path untouched; safe_write's
    # rules for links, devices and file modes apply.
    return open_staged(path, "trace")


class TraceRecorder:
    """Subscribes to ``bus`` and writes every event to ``path`` as one JSON line.

    The header line (``TraceHeader`` with ``header_meta``) is written synchronously by the
    constructor, so a path problem surfaces as ``RecorderError`` before the run starts. With
    ``publish=False`` the trace stays in a temporary file beside ``path`` until ``publish()`` (or
    ``close()``), and ``discard()`` drops it: a caller whose run may still fail to start (the CLI,
    while the model loads) then never destroys an older trace at ``path``. ``opener`` exists for
    tests (e.g. a file object that fails with ENOSPC); its file is written in place.
    """

    def __init__(
        self,
        path: Union[str, os.PathLike[str]],
        bus: EventBus,
        header_meta: Optional[dict[str, Any]] = None,
        *,
        maxsize: int = 100_000,
        name: str = "recorder",
        opener: Optional[Callable[[Path], BinaryIO]] = None,
        publish: bool = True,
    ) -> None:
        self.path = Path(path)
        self.bus = bus
        self.lines_written = 0
        self.bytes_written = 0
        self.lost_after_error = 0
        self.write_error: Optional[str] = None
        self.counts: Counter[str] = Counter()
        self._closed = False
        self._result: Optional[RecorderResult] = None

        try:
            self._stage = StagedFile(opener(self.path), self.path, "trace") if opener else _open_trace(self.path)
        except OSError as exc:
            raise self._cannot_write(exc) from None
        except OutputPathError as exc:
            raise RecorderError(f"cannot write {exc}") from None
        self._file = self._stage.file
        self._discarded = False
        # The regular file this recorder writes (None for a device written straight through); a rename
        # keeps its device and inode, which is how close() recognises it at the path.
        self._own: Optional[os.stat_result] = None
        try:
            self._start(header_meta, name, maxsize, publish)
        except BaseException as exc:  # an interrupt too: no staged file outlives a constructor that failed
            subscription = getattr(self, "subscription", None)  # set only once the header is written
            if subscription is not None:
                bus.unsubscribe(subscription)
            self._stage.discard()
            if isinstance(exc, (OSError, OutputPathError)):
                raise self._cannot_write(exc) from None
            raise

    def _start(self, header_meta: Optional[dict[str, Any]], name: str, maxsize: int, publish: bool) -> None:
        """Lock the file as ours, write the header, publish if asked, then start the writer thread."""
        if self._stage.staged is not None:
            self._own = os.fstat(self._file.fileno())
            _lock_own(self._file)
        header = TraceHeader(meta=readable_free(dict(header_meta or {})))  # text the reader takes back
        self._refuse_live_target()
        self._write(encode_event(header), 1)
        if publish:
            self._publish()
        self.counts[header.type] += 1
        # Subscribe only after the header is safely on disk: nothing is queued for a dead file.
        self.subscription: Subscription = self.bus.subscribe(name, maxsize)
        self._thread = threading.Thread(target=self._run, name=f"graphtop-{name}", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        return self.subscription.dropped

    # -- background thread ------------------------------------------------------------------------

    def _run(self) -> None:
        sub = self.subscription
        while True:
            first = sub.get(timeout=0.25)
            if first is None:
                if sub.closed and sub.pending == 0:
                    return
                continue
            batch = [first]
            # While events keep coming, poll: sleep an interval, then write whatever piled up. That is
            # one wake-up and a few writes per interval instead of a GIL hand-off per event, and the
            # engine never pays for waking this thread (publish only signals a consumer blocked in
            # get(), which happens again once a whole interval brought nothing).
            while True:
                if not sub.closed:
                    time.sleep(FLUSH_INTERVAL_S)
                batch.extend(sub.drain())
                if not batch:
                    break
                for i in range(0, len(batch), _BATCH):
                    self._write_events(batch[i : i + _BATCH])
                batch = []

    def _write_events(self, events: list[Event]) -> None:
        if self.write_error is not None:
            self.lost_after_error += len(events)
            return
        try:
            self._write(encode_lines(events), len(events))
        except OSError as exc:
            self.write_error = _describe_oserror(exc)
            self.lost_after_error += len(events) - getattr(exc, "lines_kept", 0)
            # Stop costing the engine anything: no more queueing for a recorder that cannot write.
            self.bus.unsubscribe(self.subscription)
            return
        except Exception as exc:  # never let the thread die silently with the engine still running
            self.write_error = f"{type(exc).__name__}: {exc}"
            self.lost_after_error += len(events)
            self.bus.unsubscribe(self.subscription)
            return
        self.counts.update(map(_event_type, events))

    def _write(self, data: bytes, lines: int) -> None:
        """Write ``data`` completely (looping over short writes) and flush.

        When a write fails part-way through a batch (EFBIG, ENOSPC), the whole lines that did reach the
        file are counted before the error goes on (the CLI said "1 lines" of a trace holding fifty), and
        the ``OSError`` carries ``lines_kept``: the batch's events not lost."""
        view = memoryview(data)
        done = 0
        try:
            while done < len(data):
                n = self._file.write(view[done:])
                if n is None:  # non-blocking raw file with nothing written; treat as an I/O error
                    raise OSError(errno.EAGAIN, "write would block")
                self.bytes_written += n
                done += n
            self._file.flush()
        except OSError as exc:
            exc.lines_kept = data.count(b"\n", 0, done)  # type: ignore[attr-defined]
            self.lines_written += exc.lines_kept  # type: ignore[attr-defined]
            raise
        self.lines_written += lines

    # -- publishing and shutdown -------------------------------------------------------------------

    def publish(self) -> None:
        """Put the trace at its path now (it was staged beside it); idempotent.

        Raises ``RecorderError`` (one line) when the path can no longer take it; the trace is then
        still in its temporary file, which ``close()`` or ``discard()`` deals with.
        """
        try:
            self._publish()
        except (OSError, OutputPathError) as exc:
            raise self._cannot_write(exc) from None

    def _publish(self) -> None:
        if self._stage.staged is None:
            return
        self._refuse_live_target()
        self._stage.publish()

    def _refuse_live_target(self) -> None:
        """Replacing a trace another run is still writing would lose that trace without a word."""
        if self._stage.staged is not None and _being_recorded(self.path):
            raise OutputPathError("another graphtop run is still recording to it")

    def _cannot_write(self, exc: Exception) -> RecorderError:
        return RecorderError(cannot_write_trace(self.path, self._why(exc)))

    @staticmethod
    def _why(exc: Exception) -> str:
        return _describe_oserror(exc) if isinstance(exc, OSError) else str(exc)

    def _still_at_path(self) -> Optional[str]:
        """None while ``path`` names the file this recorder wrote; else why this run's trace is not there."""
        if self._own is None or self._stage.staged is not None:
            return None  # a device written straight through, or never put at the path
        try:
            now = os.lstat(self.path)
        except OSError:
            return "it was moved or removed while recording"
        if (now.st_dev, now.st_ino) != (self._own.st_dev, self._own.st_ino):
            return (
                "another file replaced it while recording (a second run writing the same path?); "
                "this run's trace is lost"
            )
        return None

    def discard(self, timeout: float = 30.0) -> None:
        """Stop recording and drop a trace not yet published: ``path`` keeps what it held before."""
        self._discarded = True
        self.close(timeout)

    def close(self, timeout: float = 30.0) -> RecorderResult:
        """Stop recording: write everything still queued, flush, close the file and publish it (unless
        discarded). Idempotent."""
        if self._result is not None:
            return self._result
        self.bus.unsubscribe(self.subscription)  # no new events; queued ones are still drained
        self._thread.join(timeout)
        if self._thread.is_alive() and self.write_error is None:
            self.write_error = f"recorder thread did not finish within {timeout:g}s"
        try:
            self._file.close()
        except OSError as exc:
            if self.write_error is None:
                self.write_error = _describe_oserror(exc)
        if self._discarded:
            self._stage.discard()
        else:
            try:
                self._publish()
            except (OSError, OutputPathError) as exc:
                if self.write_error is None:
                    self.write_error = self._why(exc)
            if self.write_error is None:
                self.write_error = self._still_at_path()
        self._result = RecorderResult(
            path=str(self.path),
            lines_written=self.lines_written,
            bytes_written=self.bytes_written,
            dropped=self.subscription.dropped,
            lost_after_error=self.lost_after_error,
            write_error=self.write_error,
            counts=dict(self.counts),
        )
        return self._result

    def __enter__(self) -> "TraceRecorder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
