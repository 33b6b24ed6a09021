"""Engine log records for viewers: a logging handler that queues (level, message) pairs.

A process serving telemetry may have no terminal to write to (``graphtop --model``: the dashboard
child owns it), and a viewer in another process should see the engine's warnings anyway. The
handler only appends to bounded deques (``emit`` runs on whatever thread logged); the endpoint's
publisher thread sends them on, and a viewer attaching later gets the recent ones in its Welcome.
"""

from __future__ import annotations

import logging
from collections import deque


class LogForwarder(logging.Handler):
    def __init__(
        self, level: int = logging.WARNING, *, pending: int = 200, recent: int = 20, logger: str = "graphtop"
    ) -> None:
        super().__init__(level)
        self._pending: deque[tuple[int, str]] = deque(maxlen=pending)
        self._recent: deque[tuple[int, str]] = deque(maxlen=recent)
        self._logger = logging.getLogger(logger)

    def install(self) -> None:
        self._logger.addHandler(self)
        if self._logger.getEffectiveLevel() > self.level:
            self._logger.setLevel(self.level)

    def uninstall(self) -> None:
        self._logger.removeHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("graphtop.telemetry"):
            return  # the endpoint's own notices reach viewers as error events already
        try:
            item = (record.levelno, record.getMessage())
        except Exception:  # pragma: no cover - a bad format string must not break the caller
            return
        self._pending.append(item)
        self._recent.append(item)

    def drain(self) -> list[tuple[int, str]]:
        out = []
        while self._pending:
            out.append(self._pending.popleft())
        return out

    def recent(self) -> list[tuple[int, str]]:
        return list(self._recent)
