"""The dashboard in a real terminal: the installed ``graphtop`` script under tmux.

Pilot tests (test_tui_app.py) drive the app in-process; this one goes through everything they
skip: the console script, the demo model build + load + capture on CPU, a real pty with real key
escape sequences, and the process exit status after ``q``; at 200x50 (everything on screen) and at
80x24 (one view at a time, the view bar, the palette and a dialog). It polls ``tmux capture-pane -p`` for
what the dashboard draws, with a bound on every wait, and always kills its private tmux server.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

WIDTH, HEIGHT = 200, 50
SMALL = (80, 24)  # the smallest size the dashboard is made for: one view at a time
STARTUP_TIMEOUT = 240.0  # demo model build + load + capture: ~30 s on a 2-core CPU box
STREAM_TIMEOUT = 120.0  # 128 greedy tokens of the demo model on CPU
RECAPTURE_TIMEOUT = 120.0
EXIT_TIMEOUT = 60.0
RUN_TIMEOUT = 600.0  # a headless --synthetic 1000 run on the tiny model (~30 s alone)
PROMPT = "hello-graphtop"  # no q/b/c/space: were the focus not in the prompt, the keys must not quit, open or pause
TYPING = "esc Shortcuts"
"""The footer while the prompt has the focus (it does from the first frame): the shortcuts are letters."""

# a finished phase in the capture panel: "decode  ████████████████ 36/36 3.86s 0 B ✓"
DONE_RE = r"{phase}\s+[█░]+ (\d+)/\1 .*✓"


def graphtop_command() -> str:
    """The console script of the Python running the tests (not whatever is first on PATH)."""
    script = Path(sys.executable).parent / "graphtop"
    if script.exists():
        return shlex.quote(str(script))
    found = shutil.which("graphtop")
    if found:
        return shlex.quote(found)
    return f"{shlex.quote(sys.executable)} -m graphtop.cli.entry"


class Tmux:
    """A private tmux server (``-L``) with one detached session running a command."""

    def __init__(self, env: dict[str, str]) -> None:
        self.socket = f"graphtop-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.env = env
        self.last = ""
        self.socket_path: Optional[Path] = None

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=check,
        )

    def start(self, command: str, width: int, height: int) -> None:
        self.tmux("new-session", "-d", "-s", "gt", "-x", str(width), "-y", str(height), command)
        path = self.tmux("display-message", "-p", "#{socket_path}", check=False).stdout.strip()
        self.socket_path = Path(path) if path else None
        # no lag after Escape (tmux would otherwise hold it 500 ms waiting for a sequence)
        self.tmux("set-option", "-s", "escape-time", "10", check=False)

    def screen(self) -> str:
        proc = self.tmux("capture-pane", "-p", "-t", "gt", check=False)
        if proc.returncode == 0:
            self.last = proc.stdout
        return self.last

    def keys(self, *keys: str, literal: bool = False) -> None:
        self.tmux("send-keys", "-t", "gt", *(("-l",) if literal else ()), *keys)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env, capture_output=True, timeout=30)
        if self.socket_path is not None and self.socket.rsplit("-", 1)[-1] in self.socket_path.name:
            self.socket_path.unlink(missing_ok=True)  # kill-server leaves the socket file behind


def wait_for(
    term: Tmux,
    what: str,
    predicate: Callable[[str], bool],
    timeout: float,
    *,
    fail: Optional[Callable[[str], Optional[str]]] = None,
    interval: float = 0.25,
) -> str:
    """Poll the pane until ``predicate(screen)``; fail early when ``fail(screen)`` says why."""
    deadline = time.monotonic() + timeout
    while True:
        screen = term.screen()
        if predicate(screen):
            return screen
        if fail is not None:
            why = fail(screen)
            if why:
                pytest.fail(f"{why} (while waiting for {what})\n--- screen ---\n{screen}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n--- screen ---\n{screen}")
        time.sleep(interval)


def engine_failed(screen: str) -> Optional[str]:
    if "engine failed" in screen:
        return "the engine failed to start"
    if "Traceback (most recent call last)" in screen:
        return "a traceback is on screen"
    return None


def recapture_failed(screen: str) -> Optional[str]:
    if "recapture failed" in screen or "recapture refused" in screen or "last recapture failed" in screen:
        return "the recapture failed"
    return engine_failed(screen)


def exit_status(term: Tmux, exit_file: Path, what: str) -> str:
    """The ``EXIT=N`` line the pane's shell writes once the command exits (after ``q``)."""
    deadline = time.monotonic() + EXIT_TIMEOUT
    while not exit_file.exists() or not exit_file.read_text().strip():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not exit within {EXIT_TIMEOUT:.0f}s of q\n--- screen ---\n{term.screen()}")
        time.sleep(0.2)
    return exit_file.read_text().strip()


def footer(screen: str) -> str:
    lines = [line for line in screen.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def console_lines(screen: str) -> list[str]:
    """The prompt console's rows between its top border and the prompt input, borders stripped."""
    rows: list[str] = []
    inside = False
    for line in screen.splitlines():
        if "─ prompt console ─" in line:
            inside = True
        elif inside:
            if "▊▔" in line:
                break
            rows.append(line.strip().strip("│").rstrip())
    return rows


def request_state(screen: str, prompt: str) -> tuple[bool, bool, Optional[str]]:
    """(finished, streamed text on screen, header line) for the request of ``prompt``.

    The completion may start with newlines (the demo model's output is random) and push the
    request's header out of the console's small scroll view; then "finished" comes from the
    engine panels instead: steps were run and nothing is running any more.
    """
    rows = console_lines(screen)
    at = next((i for i, r in enumerate(rows) if re.search(rf"#\S+ {re.escape(prompt)} ", r)), None)
    header = None
    body = [r for r in rows if r.strip() and "top-p" not in r]
    if at is not None:  # the header may wrap: its state then ends up on the next row
        # (where it wraps depends on the request id's width: the break comes before or after a "·")
        wrapped = at + 1 < len(rows) and (rows[at].rstrip().endswith("·") or rows[at + 1].lstrip().startswith("·"))
        header = " ".join(rows[at : at + 2]) if wrapped else rows[at]
        body = [r for i, r in enumerate(rows) if r.strip() and "top-p" not in r and not at <= i <= at + wrapped]
        finished = "done (" in header or "error:" in header
    else:
        stepped = re.search(r"\d+\s+(decode|prefill)\s+\d+\s+\d+", screen) is not None
        finished = stepped and "running 0/" in screen and "streaming…" not in screen
    return finished, bool(body), header


def start_graphtop(tmp_path: Path, width: int = WIDTH, height: int = HEIGHT) -> tuple[Tmux, Path]:
    """``graphtop`` on the demo model (built into a fresh cache folder) in a private tmux server at
    ``width`` x ``height``."""
    exit_file = tmp_path / "exit-status"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
    env.update(
        GRAPHTOP_CACHE_DIR=str(tmp_path / "cache"),
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        TERM="xterm-256color",
    )
    inner = f"cd {shlex.quote(str(tmp_path))} && {graphtop_command()}; echo EXIT=$? > {shlex.quote(str(exit_file))}"
    term = Tmux(env)
    term.start(f"sh -c {shlex.quote(inner)}", width, height)
    return term, exit_file


def quit_with_status_0(term: Tmux, exit_file: Path) -> None:
    """``q`` with the shortcuts active (escape first when the prompt has the focus), exit status 0."""
    if TYPING in footer(term.screen()):
        term.keys("Escape")
        wait_for(term, "the input to lose focus", lambda s: "b Buckets" in footer(s), 15)
    term.keys("q")
    deadline = time.monotonic() + EXIT_TIMEOUT
    while not exit_file.exists() or not exit_file.read_text().strip():
        if time.monotonic() > deadline:
            pytest.fail(f"graphtop did not exit within {EXIT_TIMEOUT:.0f}s of q\n--- screen ---\n{term.screen()}")
        time.sleep(0.2)
    assert exit_file.read_text().strip() == "EXIT=0", f"{exit_file.read_text()!r}\n--- last screen ---\n{term.last}"


def type_prompt(term: Tmux, prompt: str) -> None:
    """Type into the prompt and press enter: at once while it has the focus (the footer then says
    escape gives the shortcuts), after "/" otherwise ("/" moves the focus before the next key is read,
    so the prompt can follow in the same burst)."""
    if TYPING not in footer(term.screen()):
        wait_for(term, "the footer's shortcuts", lambda s: "b Buckets" in footer(s), 15, interval=0.05)
        term.keys("/")
    term.keys(prompt, literal=True)
    wait_for(term, "the typed prompt in the input", lambda s: prompt in s, 15, interval=0.05)
    term.keys("Enter")


def test_prompt_typed_half_a_second_after_start_is_answered(tmp_path: Path) -> None:
    """The first thing a new user does: start graphtop and type at once, "/" and a prompt and enter,
    before the dashboard has drawn its first frame. Every key reaches the prompt (none reaches the
    shortcuts: the space must not pause the live view), the "/" is taken as the prompt key, and the
    prompt is answered. The demo model's note toast stands clear of the prompt and goes away."""
    term, exit_file = start_graphtop(tmp_path, *SMALL)
    try:
        time.sleep(0.5)
        term.keys(f"/{PROMPT} again", literal=True)  # "again": a space, which the shortcuts read as pause
        term.keys("Enter")

        def paused(screen: str) -> Optional[str]:
            lines = screen.splitlines()
            return "the live view was paused" if lines and "PAUSED" in lines[0] else engine_failed(screen)

        prompt = f"{PROMPT} again"
        screen = wait_for(
            term,
            "the prompt to be answered",
            lambda s: request_state(s, prompt)[0],
            STARTUP_TIMEOUT + STREAM_TIMEOUT,
            fail=paused,
        )
        _, streamed, header = request_state(screen, prompt)
        assert streamed, f"no streamed text in the prompt console\n{screen}"
        assert header is not None and f"/{PROMPT}" not in header and "error:" not in header, header
        assert TYPING in footer(screen)  # the prompt still has the focus, for the next one
        if "gibberish by design" in screen:  # the demo note, still up: clear of the prompt, and it goes
            assert "type a prompt" in screen or "▊" in screen.splitlines()[-3], screen
            wait_for(term, "the demo note toast to go", lambda s: "gibberish by design" not in s, 30)
        quit_with_status_0(term, exit_file)
    finally:
        term.kill()


def test_dashboard_in_real_terminal(tmp_path: Path) -> None:
    t0 = time.monotonic()
    term, exit_file = start_graphtop(tmp_path)
    try:
        # 1. model built and loaded, both phases captured (a ✓ on each phase line)
        screen = wait_for(
            term,
            "graph capture to finish",
            lambda s: (
                bool(re.search(DONE_RE.format(phase="decode"), s))
                and bool(re.search(DONE_RE.format(phase="prefill"), s))
                and "loading" not in s
            ),
            STARTUP_TIMEOUT,
            fail=engine_failed,
        )
        assert "graphtop" in screen.splitlines()[0]  # the status line
        assert TYPING in footer(screen)  # the prompt has the focus from the first frame
        startup = time.monotonic() - t0

        # 2. escape leaves the prompt; help opens on "?" and closes on escape
        term.keys("Escape")
        wait_for(term, "the shortcuts in the footer", lambda s: "b Buckets" in footer(s), 15)
        term.keys("?")
        wait_for(term, "the help screen", lambda s: "graphtop help" in s, 15)
        term.keys("Escape")
        wait_for(term, "the help screen to close", lambda s: "graphtop help" not in s, 15)

        # 3. space pauses the live view, space again resumes it
        term.keys("Space")
        wait_for(term, "the PAUSED badge", lambda s: "PAUSED" in s.splitlines()[0], 15)
        term.keys("Space")
        wait_for(term, "the PAUSED badge to go", lambda s: "PAUSED" not in s.splitlines()[0], 15)

        # 4. a prompt: "/" goes back to the input, type, enter; the completion streams until done
        type_prompt(term, PROMPT)
        wait_for(
            term, "the request to show up", lambda s: PROMPT in "\n".join(console_lines(s)), 30, fail=engine_failed
        )
        screen = wait_for(
            term,
            "the request to finish streaming",
            lambda s: request_state(s, PROMPT)[0],
            STREAM_TIMEOUT,
            fail=engine_failed,
        )
        _, streamed, header = request_state(screen, PROMPT)
        assert streamed, f"no streamed text in the prompt console\n{screen}"
        assert header is None or "error:" not in header, header

        # 5. escape leaves the input: single-key shortcuts are back in the footer
        term.keys("Escape")
        wait_for(term, "the input to lose focus", lambda s: "b Buckets" in footer(s), 15)

        # 6. bucket editor: new decode list, confirm with ctrl+s, recapture finishes
        term.keys("b")
        wait_for(term, "the bucket editor", lambda s: "graph buckets" in s and "decode batch sizes" in s, 15)
        term.keys("End", "C-u")  # clear the decode field (focused on open)
        wait_for(term, "the decode field to be cleared", lambda s: "✗ empty" in s, 15)
        term.keys("1,2,4", literal=True)
        wait_for(term, "the decode list to validate", lambda s: "✓ 3 buckets: 1,2,4" in s, 15)
        term.keys("C-s")
        wait_for(
            term,
            "the recapture to finish",
            lambda s: bool(re.search(r"decode\s+[█░]+ 3/3 .*✓", s)) and "last recapture ok" in s,
            RECAPTURE_TIMEOUT,
            fail=recapture_failed,
        )
        screen = term.screen()
        if "graph buckets" in screen:  # confirm dismisses the editor; close it if it did not
            term.keys("Escape")
            wait_for(term, "the bucket editor to close", lambda s: "graph buckets" not in s, 15)

        # 7. q quits, exit status 0
        quit_with_status_0(term, exit_file)
        print(f"startup {startup:.1f}s, total {time.monotonic() - t0:.1f}s")
    finally:
        term.kill()


def test_attach_to_a_headless_run_in_real_terminal(tmp_path: Path, tiny_ckpt) -> None:
    """``graphtop attach`` on ``--synthetic 1000 --telemetry``: live steps on screen, ``q`` detaches with
    exit 0, and the run finishes with the output of a run that nobody watched."""
    from graphtop.engine.telemetry.runtime import list_entries

    runtime = tmp_path / "rt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
    env.update(
        GRAPHTOP_RUNTIME_DIR=str(runtime),
        GRAPHTOP_CACHE_DIR=str(tmp_path / "cache"),
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        TERM="xterm-256color",
        OMP_NUM_THREADS="1",
    )  # two runs at once: no
    # OpenMP spinning against each other on a small machine
    run = [
        *shlex.split(graphtop_command()),
        "--model",
        str(tiny_ckpt("qwen3")),
        "--device",
        "cpu",
        "--max-total-tokens",
        "2048",
        "--max-running-requests",
        "4",
        "--chunked-prefill-size",
        "64",
        "--synthetic",
        "1000",
        "--synthetic-prompt-len",
        "fixed:8",
        "--synthetic-output-len",
        "fixed:40",
    ]
    unwatched = subprocess.Popen(
        [*run, "--output", str(tmp_path / "unwatched.jsonl")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    watched = subprocess.Popen(
        [*run, "--telemetry", "--output", str(tmp_path / "watched.jsonl")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    exit_file = tmp_path / "exit-status"
    term = Tmux(env)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not list_entries(runtime):
            assert watched.poll() is None, watched.communicate()[1]
            assert time.monotonic() < deadline, "the headless run never served telemetry"
            time.sleep(0.2)
        inner = f"{graphtop_command()} attach; echo EXIT=$? > {shlex.quote(str(exit_file))}"
        term.start(f"sh -c {shlex.quote(inner)}", WIDTH, HEIGHT)

        def top_step(screen: str) -> int:
            rows = re.findall(r"│\s+(\d+)\s+(?:decode|prefill)\s+\d+\s+\d+", screen)
            return max(map(int, rows)) if rows else 0

        first = top_step(wait_for(term, "steps in the steps panel", top_step, STARTUP_TIMEOUT, fail=engine_failed))
        assert "^q Detach" in footer(term.screen())
        wait_for(term, "newer steps (a live stream)", lambda s: top_step(s) > first, 60, fail=engine_failed)
        assert watched.poll() is None, "the run should still be going while we watch"
        term.keys("Escape")  # out of the prompt: q is a key again
        wait_for(term, "the shortcuts in the footer", lambda s: "c Costs" in footer(s), 15)
        term.keys("q")
        assert exit_status(term, exit_file, "graphtop attach") == "EXIT=0", f"--- last screen ---\n{term.last}"
        assert watched.wait(RUN_TIMEOUT) == 0, watched.communicate()[1]  # the run goes on without its viewer
        assert unwatched.wait(RUN_TIMEOUT) == 0, unwatched.communicate()[1]
    finally:
        term.kill()
        for proc in (watched, unwatched):
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    watched_out = (tmp_path / "watched.jsonl").read_text().splitlines()
    assert len(watched_out) == 1000
    assert watched_out == (tmp_path / "unwatched.jsonl").read_text().splitlines()


STEP_ROW = re.compile(r"\d+\s+(decode|prefill|dec|pre)\s+\d+")
"""A row of the steps table, full (decode/prefill) or compact (dec/pre)."""


def view_bar(screen: str) -> str:
    lines = screen.splitlines()
    return lines[1] if len(lines) > 1 else ""


def test_compact_dashboard_in_real_terminal_80x24(tmp_path: Path) -> None:
    """At 80x24 one view shows at a time: the view bar says what the others hold, 1-4 switch, the
    prompt, the palette, a dialog and the bucket editor all work, and q quits."""
    term, exit_file = start_graphtop(tmp_path, *SMALL)
    try:
        # 1. loaded and captured: the hidden capture view's headline turns to a check mark
        screen = wait_for(
            term,
            "graph capture to finish (view bar: 3 capture ✓)",
            lambda s: "3 capture ✓" in view_bar(s),
            STARTUP_TIMEOUT,
            fail=engine_failed,
        )
        assert "graphtop" in screen.splitlines()[0] and "graph hits" in screen.splitlines()[0]
        for tab in ("1 steps", "2 memory KV", "4 prompts"):
            assert tab in view_bar(screen), view_bar(screen)

        # 2. the first view is the prompt, with the focus in it; a prompt streams to the end (watched
        # from the steps view, whose bar says how many requests are still streaming)
        assert TYPING in footer(screen) and "─ prompt console ─" in screen
        type_prompt(term, PROMPT)
        wait_for(
            term, "the request to show up", lambda s: PROMPT in "\n".join(console_lines(s)), 30, fail=engine_failed
        )
        term.keys("Escape")
        wait_for(term, "the input to lose focus", lambda s: "b Buckets" in footer(s), 15)
        term.keys("1")
        wait_for(
            term,
            "the request to finish streaming (view bar: 4 prompts, nothing streaming)",
            lambda s: "streaming" not in view_bar(s) and STEP_ROW.search(s) is not None,
            STREAM_TIMEOUT,
            fail=engine_failed,
        )
        term.keys("4")
        screen = wait_for(term, "the prompts view", lambda s: "─ prompt console ─" in s, 15)
        assert any(r.strip() for r in console_lines(screen)[1:]), f"no streamed text in the prompt console\n{screen}"
        term.keys("1")

        # 3. views: 2 memory (ledger + KV pool), 1 steps (the compact table)
        wait_for(term, "the steps view", lambda s: "─ steps ─" in s, 15)
        term.keys("2")
        wait_for(term, "the memory view", lambda s: "─ memory ledger ─" in s and "─ KV pool ─" in s and "free" in s, 15)
        term.keys("1")
        wait_for(term, "the steps view", lambda s: STEP_ROW.search(s) is not None, 15)

        # 4. the palette finds Export trace; its dialog takes typing and Enter at once
        target = tmp_path / "from-the-palette.jsonl"
        term.keys("C-p")
        wait_for(term, "the command palette", lambda s: "Search for commands" in s, 15)
        term.keys("export trace", literal=True)
        wait_for(term, "the Export trace command", lambda s: "Export trace" in s, 15)
        term.keys("Enter")
        wait_for(term, "the export dialog", lambda s: "Export trace (JSONL)" in s and "escape cancels" in s, 15)
        # The dialog can show before its input has focus, and keys sent then are lost: clear the
        # suggested name until the input has taken it (focus is there), then type, and press Enter
        # only once the path shows.
        deadline = time.monotonic() + 15
        while "graphtop-" in term.screen() and time.monotonic() < deadline:
            term.keys("C-u")
            time.sleep(0.25)
        term.keys(str(target), literal=True)
        wait_for(term, "the typed path", lambda s: "palette.jsonl" in s, 15)
        term.keys("Enter")
        deadline = time.monotonic() + 30
        while not target.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert target.exists() and target.stat().st_size > 0, term.screen()

        # 5. the bucket editor fits and recaptures
        term.keys("b")
        wait_for(term, "the bucket editor", lambda s: "graph buckets" in s and "decode batch sizes" in s, 15)
        term.keys("End", "C-u")
        wait_for(term, "the decode field to be cleared", lambda s: "✗ empty" in s, 15)
        term.keys("1,2,4", literal=True)
        wait_for(term, "the decode list to validate", lambda s: "✓ 3 buckets: 1,2,4" in s, 15)
        term.keys("C-s")
        wait_for(term, "the editor to close", lambda s: "graph buckets" not in s, 15)
        term.keys("3")  # the capture view (its left half: an engine notice may cover the right for a while)
        wait_for(
            term,
            "the recapture to finish",
            lambda s: "last recapture ok" in s and re.search(r"decode\s+[█░]+ 3/3", s) is not None,
            RECAPTURE_TIMEOUT,
            fail=recapture_failed,
        )

        # 6. q quits, exit status 0
        quit_with_status_0(term, exit_file)
    finally:
        term.kill()
