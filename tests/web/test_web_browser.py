"""The dashboard in a real browser: ``graphtop serve --dashboard`` on CPU, driven by Playwright in the
system's Chromium. A tab loads and shows live steps; a prompt typed in it runs on the engine; two tabs
see the same engine; a missing or wrong token gets 401 and no dashboard. Once with the demo model and,
where it has been fetched, once with SmolLM2. Screenshots: tests/artifacts/web/ (the test prints where).

Skipped, with the reason, where playwright or Chromium is missing (.ci/run installs both).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

import pytest
from support.browser import Tab, chromium_path, why_no_browser

from graphtop.cli.priority import ENV as PRIORITY_ENV

pytestmark = [pytest.mark.slow, pytest.mark.skipif(why_no_browser() is not None, reason=why_no_browser() or "")]

KEY = "browser-test-key"
FINISHED = "graphtop:requests_finished_total"
START_S = 180.0
STEP_S = 120.0
DOC_IMAGE = Path(__file__).resolve().parents[2] / "docs" / "images" / "web-dashboard.png"
SHOT_ENV = "GRAPHTOP_WRITE_DOC_SCREENSHOT"
"""Set to 1 to refresh the docs' picture of the dashboard (docs/web.md) from the demo run."""


def _smollm2() -> Path:
    import importlib.util

    from support.paths import SCRIPTS

    if os.environ.get("GRAPHTOP_SMOLLM2_GGUF"):
        return Path(os.environ["GRAPHTOP_SMOLLM2_GGUF"]).expanduser()
    spec = importlib.util.spec_from_file_location("fetch_smollm2", SCRIPTS / "fetch_smollm2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.gguf_path()


class Served:
    """A ``graphtop serve --dashboard`` process: its API and dashboard URLs, its stderr so far."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.web = self._wait_for(r"dashboard for browsers at (\S+)")
        self.api = self._wait_for(r"serving \S+ at (\S+)/v1")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def _wait_for(self, pattern: str) -> str:
        end = time.monotonic() + START_S
        while time.monotonic() < end:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m.group(1)
            assert self.proc.poll() is None, "".join(self.lines)
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} from graphtop serve: {''.join(self.lines)}")

    def metric(self, name: str) -> float:
        """The sum of a counter's samples on /metrics."""
        body = urllib.request.urlopen(f"{self.api}/metrics", timeout=10).read().decode()
        return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", body, re.M))

    def wait_finished(self, count: float) -> None:
        """Until the engine has finished ``count`` requests in all."""
        end = time.monotonic() + STEP_S
        while self.metric(FINISHED) < count:
            assert time.monotonic() < end, f"the engine did not finish request {count:g} within {STEP_S:g}s"
            time.sleep(0.2)

    def steps(self) -> int:
        return int(self.metric("graphtop:cuda_graph_passes_total"))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _serve(model: Path, root: Path, priority: Optional[str] = "normal") -> Served:
    """``graphtop serve --dashboard`` of ``model``. Its tabs run at ``priority`` (None: the default, idle):
    normal for the tests of what a tab does, which then pass beside any CPU load, where an idle tab would
    get no CPU at all (``test_a_tab_runs_at_idle_priority_by_default`` checks the default)."""
    runtime = root / "rt"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "GRAPHTOP_RUNTIME_DIR": str(runtime), "GRAPHTOP_API_KEY": KEY, "OMP_NUM_THREADS": "1"}
    env.pop(PRIORITY_ENV, None)
    if priority is not None:
        env[PRIORITY_ENV] = priority
    argv = [sys.executable, "-m", "graphtop.cli.entry", "serve", str(model), "--port", "0"]
    argv += ["--dashboard", "127.0.0.1:0", "--dashboard-max-tabs", "2", "--disable-log-requests"]
    argv += ["--cuda-graph-bs-decode", "1,2,4", "--cuda-graph-num-tokens-prefill", "16,32,64"]
    return Served(argv, env)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The demo model behind the API and the dashboard, shared by the module's tests."""
    from graphtop.models.synthetic.demo import DEMO_DIRNAME, ensure_demo_model

    root = tmp_path_factory.mktemp("web")
    ensure_demo_model(root / "cache")
    s = _serve(root / "cache" / DEMO_DIRNAME, root)
    yield s
    s.stop()


@pytest.fixture
def smollm2_served(tmp_path: Path) -> Iterator[Served]:
    """SmolLM2-135M-Instruct (GGUF), where scripts/fetch_smollm2.py has fetched it."""
    model = _smollm2()
    if not model.is_file():
        pytest.skip(f"SmolLM2 not fetched ({model}); run scripts/fetch_smollm2.py")
    s = _serve(model, tmp_path)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield b
        b.close()


def _tab(browser, size=(1600, 1000)) -> Tab:
    return Tab(browser.new_page(viewport={"width": size[0], "height": size[1]}))


def _url(served: Served, token: str = KEY) -> str:
    return f"{served.web}?token={token}"


def _tab_processes(root: int) -> list[int]:
    """The pids of the ``graphtop attach --browser-tab`` processes under ``root``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"attach" in argv and b"--browser-tab" in argv:
            found.append(pid)
    return found


def _step_row(step: int) -> re.Pattern[str]:
    return re.compile(rf"(?<!\d){step}\s+(?:decode|prefill)\s")


@pytest.mark.parametrize("model", ["demo", "smollm2"])
def test_a_tab_shows_live_steps_and_runs_a_prompt_typed_in_it(browser, model: str, request) -> None:
    served: Served = request.getfixturevalue("served" if model == "demo" else "smollm2_served")
    tab = _tab(browser)
    try:
        response = tab.open(_url(served))
        assert response.status == 200
        tab.wait_for(lambda t: "graph capture" in t and "prompt console" in t, START_S, "the dashboard")
        before, finished = served.steps(), served.metric(FINISHED)
        tab.type_prompt("hello from a browser")
        served.wait_finished(finished + 1)  # the engine ran it
        tab.wait_for(lambda t: "hello from a browser" in t, 30, "the prompt in its console")
        after = served.steps()
        assert after > before
        tab.wait_for(lambda t: _step_row(after).search(t) is not None, 30, f"step {after}")  # live steps
        shot = tab.screenshot(f"dashboard-{model}")
        if model == "demo" and os.environ.get(SHOT_ENV) == "1":
            DOC_IMAGE.parent.mkdir(exist_ok=True)
            DOC_IMAGE.write_bytes(shot.read_bytes())
        assert tab.console_errors == []
    finally:
        tab.page.close()


def test_a_tab_runs_at_idle_priority_by_default(browser, tmp_path: Path) -> None:
    """A tab's process yields the CPU to the engine (cli/priority.py), in a session of its own whose group
    is lowered too. Checked on the process, not on the page: an idle tab beside a CPU load may draw late."""
    from graphtop.models.synthetic.demo import DEMO_DIRNAME, ensure_demo_model

    ensure_demo_model(tmp_path / "cache")
    served = _serve(tmp_path / "cache" / DEMO_DIRNAME, tmp_path, priority=None)
    tab = _tab(browser, (800, 600))
    try:
        assert tab.open(_url(served)).status == 200
        deadline = time.monotonic() + START_S
        tabs: list[int] = []
        while time.monotonic() < deadline:
            tabs = [pid for pid in _tab_processes(served.proc.pid) if os.sched_getscheduler(pid) == os.SCHED_IDLE]
            if tabs:
                break
            time.sleep(0.2)
        assert len(tabs) == 1, "no tab process at SCHED_IDLE"
        pid = tabs[0]
        assert os.getsid(pid) == pid
        group = Path(f"/proc/{pid}/autogroup")
        assert not group.exists() or group.read_text().strip().endswith("nice 19")
    finally:
        tab.page.close()
        served.stop()


def test_two_tabs_see_the_same_engine(browser, served: Served) -> None:
    a, b = _tab(browser, (1400, 900)), _tab(browser, (1400, 900))
    try:
        for tab in (a, b):
            assert tab.open(_url(served)).status == 200
            tab.wait_for(lambda t: "graph capture" in t, START_S, "the dashboard")
        assert len(_tab_processes(served.proc.pid)) == 2
        finished = served.metric(FINISHED)
        a.type_prompt("two tabs")
        served.wait_finished(finished + 1)
        last = served.steps()
        for tab in (a, b):  # the same engine's latest step in both, though only a typed the prompt
            tab.wait_for(lambda t: _step_row(last).search(t) is not None, 30, f"step {last}")
        assert "two tabs" not in b.text()  # a prompt's text streams to its own tab only
        third = _tab(browser)
        try:
            full = third.open(_url(served))  # --dashboard-max-tabs 2
            assert full.status == 503 and "the dashboard is full" in third.page.content()
        finally:
            third.page.close()
        b.screenshot("second-tab")
    finally:
        a.page.close()
        b.page.close()


def test_a_missing_or_wrong_token_gets_401_and_no_dashboard(browser, served: Served) -> None:
    tab = _tab(browser, (800, 600))
    try:
        for url in (served.web, _url(served, "wrong-key")):
            response = tab.open(url)
            assert response.status == 401
            assert "needs its token" in tab.page.content()
            tab.page.wait_for_timeout(300)
            assert tab.frames == []  # no websocket, no dashboard process
        tab.screenshot("token-needed")
    finally:
        tab.page.close()
