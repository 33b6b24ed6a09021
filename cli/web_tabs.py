"""One browser tab of the web dashboard: a ``graphtop attach`` process whose screen goes to the tab.

textual-serve's ``AppService`` runs the process and carries its output to the websocket. Three things
are added here, so that no tab can hold up the server, another tab or the engine:

- **A slow tab is cut off.** Sending to a browser that does not read (a stalled network, a frozen
  laptop) waits at most ``send_timeout_s``; then the tab is closed and its process stopped. While it
  waits, only that tab's process waits: it is an attached viewer, and the engine drops a slow viewer's
  batches instead of waiting for it.
- **A closed tab frees its process.** It is asked to quit, then terminated, then killed, each after
  ``stop_timeout_s``, so a process that hangs does not outlive its tab.
- **A tab yields the CPU to the engine** (``--priority idle``, the default): its process runs at the
  lowest priority, in a session of its own whose group is lowered too (``cli.priority``), so a busy
  engine's host thread is not made to wait for a tab's drawing.
- **The endpoint's token goes through the environment** (never on the command line, which every user of
  the machine can read), as the dashboard child of ``graphtop --model`` gets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import sys
from dataclasses import dataclass
from typing import Awaitable, Callable, Optional

from textual_serve.app_service import AppService
from textual_serve.download_manager import DownloadManager

from .endpoint import TOKEN_ENV

log = logging.getLogger("graphtop.web")

DROPPED_ENV = ("GRAPHTOP_API_KEY",)
"""Variables a tab's process has no use for: the API key stays in the server's process."""


@dataclass(frozen=True)
class TabCommand:
    """What each tab runs: ``graphtop attach ENDPOINT`` with the endpoint's token in the environment, and
    the API's prompt limits (``max_queued``: the API's --max-queued-requests; None: no bound), at
    ``priority``."""

    endpoint: str
    token: str
    max_queued: Optional[int] = None
    theme: Optional[str] = None
    priority: str = "idle"

    def shell(self) -> str:
        argv = [sys.executable, "-m", "graphtop.cli.entry", "attach", self.endpoint, "--browser-tab"]
        argv += ["--priority", self.priority]
        if self.max_queued is not None:
            argv += ["--max-queued-requests", str(self.max_queued)]
        if self.theme:
            argv += ["--theme", self.theme]
        return shlex.join(argv)

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if k not in DROPPED_ENV}
        env[TOKEN_ENV] = self.token
        return env


class TabProcess(AppService):
    """textual-serve's process of one tab, with the bounded send and stop above."""

    def __init__(
        self,
        command: TabCommand,
        *,
        write_bytes: Callable[[bytes], Awaitable[None]],
        write_str: Callable[[str], Awaitable[None]],
        close: Callable[[], Awaitable[None]],
        download_manager: DownloadManager,
        send_timeout_s: float,
        stop_timeout_s: float,
    ) -> None:
        self.send_timeout_s, self.stop_timeout_s = send_timeout_s, stop_timeout_s
        self.too_slow = False

        async def bounded(send: Callable[..., Awaitable[None]], data: object) -> None:
            if self.too_slow:
                return
            try:
                await asyncio.wait_for(send(data), self.send_timeout_s)
            except asyncio.TimeoutError:
                self.too_slow = True
                log.warning("a browser tab took no output for %.0f s: closed", self.send_timeout_s)
                asyncio.get_running_loop().create_task(close())

        super().__init__(
            command.shell(),
            write_bytes=lambda data: bounded(write_bytes, data),
            write_str=lambda data: bounded(write_str, data),
            close=close,
            download_manager=download_manager,
        )
        self._tab = command

    def _build_environment(self, width: int = 80, height: int = 24) -> dict[str, str]:
        return self._tab.environment(super()._build_environment(width, height))

    @property
    def pid(self) -> Optional[int]:
        return None if self._process is None else self._process.pid

    async def stop(self) -> None:
        """Quit the process: asked, then terminated, then killed, each given ``stop_timeout_s``."""
        process, task = self._process, self._task
        if process is None:
            return
        if task is not None and process.returncode is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.send_meta({"type": "quit"}), self.stop_timeout_s)
        for step in ("wait", "terminate", "kill"):
            if process.returncode is not None:
                break
            if step != "wait":
                with contextlib.suppress(ProcessLookupError):
                    getattr(process, step)()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(process.wait(), self.stop_timeout_s)
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            self._task = None
