"""Driving the web dashboard in a real Chromium (Playwright), and reading what a tab was sent.

Chromium comes from the OS packages (``apt-get install chromium``; ``$GRAPHTOP_CHROMIUM`` names another
executable), never from Playwright's own download. A tab draws on a canvas (xterm.js), so what it shows
is read from what it was sent: the websocket's frames, the dashboard's terminal output, with the
escape sequences taken out. Screenshots go to ``tests/artifacts/web`` (ignored by git).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "web"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
ESCAPES = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|P[^\x1b]*\x1b\\|[@-Z\\-_])")


def chromium_path() -> Optional[str]:
    """The system Chromium, or None."""
    named = os.environ.get("GRAPHTOP_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def why_no_browser() -> Optional[str]:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; .ci/run does)"
    if chromium_path() is None:
        return "no Chromium executable (apt-get install chromium, or set GRAPHTOP_CHROMIUM); .ci/run installs it"
    return None


class Tab:
    """One browser tab on the dashboard; ``text()`` is everything its terminal was sent so far."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.frames: list[bytes] = []
        self.console_errors: list[str] = []
        page.on("websocket", lambda ws: ws.on("framereceived", self._frame))
        page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None)

    def _frame(self, payload: Any) -> None:
        self.frames.append(payload if isinstance(payload, bytes) else payload.encode("utf-8"))

    def open(self, url: str) -> Any:
        response = self.page.goto(url)
        return response

    def text(self) -> str:
        return ESCAPES.sub(b"", b"".join(self.frames)).decode("utf-8", "replace")

    def wait_for(self, check: Callable[[str], bool], timeout: float, what: str) -> str:
        """The tab's text once ``check`` holds for it; AssertionError naming ``what`` after ``timeout``."""
        end = time.monotonic() + timeout
        while True:
            text = self.text()
            if check(text):
                return text
            if time.monotonic() > end:
                self.screenshot(f"timeout-{re.sub(r'[^a-z0-9]+', '-', what.lower())}")
                raise AssertionError(f"the tab did not show {what} within {timeout:g}s (last: {text[-400:]!r})")
            self.page.wait_for_timeout(100)

    def type_prompt(self, prompt: str) -> None:
        """Type into the dashboard (its prompt has the focus) and press Enter, as a user would."""
        self.page.locator(".xterm-helper-textarea").focus()
        self.page.keyboard.type(prompt, delay=5)
        self.page.keyboard.press("Enter")

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path))
        print(f"screenshot: {path}")
        return path
