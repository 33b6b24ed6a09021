"""Long decode runs: how much of a step's wall time the device waits for the host, and what a viewer costs.

Why: a graph replay is only as fast as the host that launches it. Whatever the host does per step that
grows with the context, or comes in bursts, shows over thousands of steps and not in a short benchmark.
A live engine decodes ``--steps`` steps at each batch size (greedy, detokenized, as a headless synthetic
run); per batch size the script reports

- host-bound share = (decode wall − Σ graph replay time) ÷ decode wall, with the replay time each step
  event carries (CUDA events on a GPU; the emulated replay's own time on the CPU, where it is the whole
  forward), over every decode step;
- the step gap (wall time from one delivered step to the next), p50 and p99, and the host-bound share
  of each tenth of the run (what grows with the context shows there);
- attached ÷ headless throughput: the run is cut into ``--rounds`` rounds in ABBA order, headless (no
  telemetry endpoint) and attached (the endpoint serving a real viewer in another process, as
  ``graphtop attach`` would), all on the same requests so their context grows alike.

    python3 bench/long_run_bench.py --shape qwen3-0.6b --device cuda --bs 1,64 --steps 12000,3000

A CPU smoke run (the shape shrunk to harness's ``TINY_SHAPE``, decode graphs emulated):

    python3 bench/long_run_bench.py --device cpu --bs 1,4 --steps 400 --rounds 2

What watches the attached rounds is ``--viewer-kind``: a viewer as ``graphtop attach`` is (``attach``), a
browser tab on ``graphtop web`` (``browser``), or nobody (``endpoint``: the endpoint served with no viewer,
the engine's own share of the cost). Viewers run at ``--viewer-priority`` (idle: as ``graphtop web`` and
``graphtop attach`` run by default), and the CPU seconds their processes take in the attached rounds are
reported beside the engine's own, per decode step.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Optional

import proc_tree
import torch
from harness import (
    PROMPT_LEN,
    TINY_SHAPE,
    comma_ints,
    fmt,
    log,
    make_engine,
    md_table,
    prefill_all,
    random_ckpt,
    release_cuda,
    sync_for,
    write_json,
)

from graphtop.cli.endpoint import TOKEN_ENV
from graphtop.cli.priority import PRIORITIES, apply
from graphtop.engine.gc_freeze import frozen_heap
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry.server import EndpointConfig, TelemetryServer

VIEWER_DRAIN_S = 0.05  # how often the viewer drains its events (the dashboard's refresh timer)
TAB_START_S = 600.0  # how long a browser tab may take to load (its processes run at idle priority)


@dataclass
class Mode:
    """What the rounds of one mode (headless or attached) measured."""

    wall_s: float = 0.0
    replay_s: float = 0.0
    tokens: int = 0
    gaps_ms: list[float] = field(default_factory=list)
    round_tok_s: list[float] = field(default_factory=list)
    steps: int = 0
    engine_cpu_s: float = 0.0  # CPU seconds of the engine's process (all its threads)
    viewer_cpu_s: float = 0.0  # CPU seconds of the viewer's processes
    viewer_roles: dict[str, float] = field(default_factory=dict)  # the same, by process (proc_tree.role)
    publisher_cpu_s: float = 0.0  # CPU seconds of the endpoint's publisher thread (in the engine's process)

    def per_step_ms(self, cpu_s: float) -> Optional[float]:
        return cpu_s / self.steps * 1e3 if self.steps else None

    @property
    def host_share(self) -> Optional[float]:
        return (self.wall_s - self.replay_s) / self.wall_s if self.wall_s else None

    def gap(self, q: float) -> Optional[float]:
        return statistics.quantiles(self.gaps_ms, n=100)[round(q * 100) - 1] if len(self.gaps_ms) > 1 else None


class Endpoint:
    """The telemetry endpoint on the engine's bus, with nobody attached: what serving costs the engine."""

    def __init__(self, engine: Any, priority: str) -> None:
        self.server = TelemetryServer(engine.bus, EndpointConfig(label="long-run bench"))
        self.procs: list[subprocess.Popen] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def close(self) -> None:
        for proc in reversed(self.procs):  # the tab first, then the server it was served by
            try:
                if self._own_session(proc):  # graphtop web's session: its shell and graphtop web
                    os.killpg(proc.pid, signal.SIGTERM)
                else:
                    proc.terminate()
                proc.wait(10)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                proc.kill()
        self.server.close()

    @staticmethod
    def _own_session(proc: subprocess.Popen) -> bool:
        try:
            return os.getsid(proc.pid) == proc.pid
        except OSError:
            return False


class Viewer(Endpoint):
    """The endpoint and a viewer attached to it from another process, as ``graphtop attach`` is (without
    drawing: it drains the events at a dashboard's pace)."""

    def __init__(self, engine: Any, priority: str) -> None:
        super().__init__(engine, priority)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--viewer-priority", priority, "--viewer", self.server.endpoint],
            env={**os.environ, TOKEN_ENV: self.server.token},  # a token may start with "-": not an argument
            stdout=subprocess.PIPE,
        )
        self.procs.append(self.proc)
        line = self.proc.stdout.readline() if self.proc.stdout else b""  # "attached" once the snapshot is in
        if not line.startswith(b"attached"):
            self.close()
            raise RuntimeError("the viewer did not attach")


class BrowserViewer(Endpoint):
    """The same endpoint, watched by a browser tab instead: ``graphtop web`` serves the dashboard (its tab's
    ``graphtop attach`` process is one more process), and a headless Chromium (Playwright, the system's
    executable) renders it, in a process of its own, until the round ends.

    ``graphtop web`` runs in a session of its own that it does not lead, as it does when started from a
    terminal (the session's shell leads it): the kernel's autogroup then weighs it as a terminal of its own
    against the engine's session. The Chromium stands for the user's browser, which on a real deployment is
    on another machine: once the page draws, it runs at ``priority`` too."""

    def __init__(self, engine: Any, priority: str) -> None:
        super().__init__(engine, priority)
        web_argv = [
            sys.executable,
            "-c",
            "from graphtop.cli.entry import main; main()",
            "web",
            self.server.endpoint,
            "--port",
            "0",
            "--priority",
            priority,
        ]
        web = subprocess.Popen(
            ["sh", "-c", f"{subprocess.list2cmdline(web_argv)}; :"],  # "; :" keeps the shell as the session's head
            env={**os.environ, TOKEN_ENV: self.server.token},
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.procs.append(web)
        url = ""
        while web.stderr is not None and not url:
            line = web.stderr.readline().decode()
            if not line:
                break
            if "dashboard for browsers at " in line:
                url = line.split("dashboard for browsers at ")[1].split()[0]
        if not url:
            self.close()
            raise RuntimeError("graphtop web did not start")
        tab = subprocess.Popen(
            [sys.executable, __file__, "--viewer-priority", priority, "--browser-tab", url], stdout=subprocess.PIPE
        )
        self.procs.append(tab)
        line = tab.stdout.readline() if tab.stdout else b""  # "attached" once the tab shows the dashboard
        if not line.startswith(b"attached"):
            self.close()
            raise RuntimeError("the browser tab did not show the dashboard")


VIEWERS = {"endpoint": Endpoint, "attach": Viewer, "browser": BrowserViewer}


def browser_tab_main(url: str, priority: str) -> int:
    """The browser process: a headless Chromium with a tab on ``url``, kept open (and drawing) until
    terminated. Playwright loads the page over Chromium's DevTools port and checks that the dashboard draws,
    then lets go (its driver would otherwise relay every websocket frame to this process); the Chromium
    goes on alone, in a session of its own, at ``priority`` from then on: it stands for a browser on
    another machine, which takes no CPU from the engine's."""
    import re
    import shutil
    import tempfile

    from playwright.sync_api import sync_playwright

    executable = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if executable is None:
        raise SystemExit("no Chromium here (chromium, chromium-browser or google-chrome)")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with tempfile.TemporaryDirectory() as profile:
        argv = [executable, "--headless", "--no-sandbox", "--remote-debugging-port=0", f"--user-data-dir={profile}"]
        chrome = subprocess.Popen(
            [*argv, "about:blank"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True
        )
        try:
            devtools = ""
            for line in chrome.stderr or []:
                found = re.search(r"DevTools listening on (ws://\S+)", line)
                if found:
                    devtools = found.group(1)
                    break
            if not devtools:
                raise SystemExit("Chromium did not start")
            threading.Thread(target=(chrome.stderr or []).read, daemon=True).start()  # keep its pipe drained
            with sync_playwright() as pw:
                browser = pw.chromium.connect_over_cdp(devtools)
                context = browser.contexts[0]  # Chromium's own: it outlives Playwright's connection
                page = context.pages[0] if context.pages else context.new_page()
                frames: list[int] = []
                page.on("websocket", lambda ws: ws.on("framereceived", lambda _: frames.append(1)))
                page.goto(url, timeout=TAB_START_S * 1e3)  # the tab's app starts at its priority: slowly, if busy
                while len(frames) < 20 and not stop.is_set():  # the dashboard is drawing
                    page.wait_for_timeout(100)
                browser.close()  # disconnects; the tab stays open in Chromium
            if priority == "idle":
                proc_tree.lower([chrome.pid])
            print("attached", flush=True)
            stop.wait()
        finally:
            chrome.terminate()
            try:
                chrome.wait(10)
            except subprocess.TimeoutExpired:
                chrome.kill()
    return 0


def viewer_main(endpoint: str, priority: str) -> int:
    """The viewer process: attach as ``graphtop attach`` does (at its priority), then drain the events at a
    dashboard's pace."""
    from graphtop.tui.sessions.remote import RemoteSession

    apply(priority)
    session = RemoteSession(endpoint, os.environ[TOKEN_ENV], connect_timeout=30)
    session.connect()
    session.snapshot_done.wait(30)
    print("attached", flush=True)
    while session.ended is None:
        session.drain()
        time.sleep(VIEWER_DRAIN_S)
    return 0


def build(args: argparse.Namespace, bs: int, steps: int) -> Any:
    cuda = args.device.startswith("cuda")
    overrides = {} if cuda else TINY_SHAPE
    ckpt = random_ckpt(args.shape, device=args.device, dtype=torch.bfloat16 if cuda else torch.float32, **overrides)
    context = args.prompt_len + steps + 16
    eng = make_engine(
        ckpt,
        args.attention if cuda else "torch",
        device=args.device,
        max_running=bs,
        decode_bs=[bs],
        prefill_graphs=False,
        max_context=context + 8,
        longest_context=context,
        chunked_prefill_size=max(1024, args.prompt_len),
    )
    return eng


def start(eng: Any, bs: int, prompt_len: int, steps: int) -> list:
    """``bs`` greedy, detokenized requests past their prefill, with room for ``steps`` more tokens."""
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(max_new_tokens=steps + 8, ignore_eos=True)  # detokenized, as a synthetic run
    vocab = eng.spec.vocab_size
    handles = [
        eng.submit(torch.randint(10, vocab - 10, (prompt_len,), generator=g).tolist(), params) for _ in range(bs)
    ]
    prefill_all(eng, handles)
    return handles


def run_round(
    eng: Any, steps: int, sync: Any, mode: Mode, tenths: list[list[float]], done: int, total: int, viewer: Any
) -> None:
    """``steps`` decode steps; the replay times come from the step events of the bench's own subscription
    (drained after the round: the step thread does nothing for the bench)."""
    sub = eng.bus.subscribe("long-run bench", maxsize=steps + 64, types=["step"])
    ends = []
    pids = viewer.pids if viewer is not None else []
    publisher = viewer.server._thread.native_id if viewer is not None else None
    sync()
    viewers_before = proc_tree.cpu_by_pid(pids)
    publisher_before = proc_tree.thread_cpu_s(publisher) if publisher else 0.0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()
        ends.append(time.perf_counter())
    sync()
    wall = time.perf_counter() - t0
    mode.engine_cpu_s += time.process_time() - cpu0
    mode.publisher_cpu_s += proc_tree.thread_cpu_s(publisher) - publisher_before if publisher else 0.0
    viewers_after = proc_tree.cpu_by_pid(pids)
    mode.viewer_cpu_s += proc_tree.cpu_taken(viewers_before, viewers_after)
    for role, cpu_s in proc_tree.cpu_by_role(viewers_before, viewers_after).items():
        mode.viewer_roles[role] = mode.viewer_roles.get(role, 0.0) + cpu_s
    mode.steps += steps
    eng.bus.unsubscribe(sub)
    replays = [e.replay_ms or 0.0 for e in sub.drain() if e.phase == "decode"]
    assert sub.dropped == 0 and len(replays) >= steps - 2, "step events lost: the replay sum would be short"
    gaps = [(b - a) * 1e3 for a, b in zip([t0, *ends], ends)]
    mode.wall_s += wall
    mode.replay_s += sum(replays) / 1e3
    mode.gaps_ms += gaps
    mode.tokens += steps * len(eng.scheduler.running)
    mode.round_tok_s.append(steps * len(eng.scheduler.running) / wall)
    for i, (gap, replay) in enumerate(zip(gaps, replays)):
        tenths[min(9, (done + i) * 10 // total)] += [gap, replay]


def measure(args: argparse.Namespace, bs: int, steps: int) -> dict:
    eng = build(args, bs, steps)
    sync = sync_for(args.device)
    handles = start(eng, bs, args.prompt_len, steps)
    modes = {"headless": Mode(), "attached": Mode()}
    tenths: list[list[float]] = [[] for _ in range(10)]  # per tenth of the run: gap, replay, gap, replay, ...
    per_round = steps // args.rounds
    for r in range(args.rounds):
        name = ["headless", "attached", "attached", "headless"][r % 4]  # ABBA
        viewer = VIEWERS[args.viewer_kind](eng, args.viewer_priority) if name == "attached" else None
        try:
            with frozen_heap() if args.gc_freeze else nullcontext():  # as the graphtop command serves
                run_round(eng, per_round, sync, modes[name], tenths, r * per_round, per_round * args.rounds, viewer)
        finally:
            if viewer is not None:
                viewer.close()
        log(f"  bs {bs} round {r + 1}/{args.rounds} {name}: {modes[name].round_tok_s[-1]:.0f} tok/s")
    for h in handles:
        eng.cancel(h.request_id)
    eng.run_until_idle()
    eng.close()
    release_cuda()
    both = Mode()
    for m in modes.values():
        both.wall_s += m.wall_s
        both.replay_s += m.replay_s
        both.gaps_ms += m.gaps_ms
    head, att = modes["headless"], modes["attached"]
    shares = [(sum(t[0::2]) - sum(t[1::2])) / sum(t[0::2]) if t else None for t in tenths]
    return dict(
        bs=bs,
        steps=per_round * args.rounds,
        host_share=both.host_share,
        host_share_headless=head.host_share,
        host_share_attached=att.host_share,
        gap_p50_ms=both.gap(0.5),
        gap_p99_ms=both.gap(0.99),
        gap_p99_headless_ms=head.gap(0.99),
        gap_p99_attached_ms=att.gap(0.99),
        attached_over_headless=(att.tokens / att.wall_s) / (head.tokens / head.wall_s) if att.wall_s else None,
        round_tok_s={"headless": head.round_tok_s, "attached": att.round_tok_s},
        engine_cpu_ms_per_step_headless=head.per_step_ms(head.engine_cpu_s),
        engine_cpu_ms_per_step_attached=att.per_step_ms(att.engine_cpu_s),
        viewer_cpu_ms_per_step=att.per_step_ms(att.viewer_cpu_s),
        publisher_cpu_ms_per_step=att.per_step_ms(att.publisher_cpu_s),
        viewer_cores=att.viewer_cpu_s / att.wall_s if att.wall_s else None,
        viewer_cpu_ms_per_step_by_process={k: att.per_step_ms(v) for k, v in att.viewer_roles.items()},
        host_share_by_tenth=shares,
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--attention", default="auto", help="the attention backend on CUDA (torch on the CPU)")
    ap.add_argument("--bs", default="1,64", help="batch sizes, comma-separated")
    ap.add_argument("--steps", default="12000,3000", help="decode steps per batch size (one value: for all)")
    ap.add_argument("--rounds", type=int, default=4, help="ABBA rounds of headless and attached steps")
    ap.add_argument("--prompt-len", type=int, default=PROMPT_LEN)
    ap.add_argument("--json", help="write the results to this JSON file too")
    ap.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="serve without freezing the loaded heap (the graphtop command freezes it: engine/gc_freeze.py)",
    )
    ap.add_argument(
        "--viewer-kind",
        choices=sorted(VIEWERS),
        default="attach",
        help="what watches the attached rounds: a viewer as graphtop attach is, a browser tab on graphtop web "
        "(headless Chromium through Playwright), or nobody (the endpoint alone)",
    )
    ap.add_argument(
        "--viewer-priority",
        choices=PRIORITIES,
        default="idle",
        help="the viewer's CPU priority: graphtop web and graphtop attach run at idle unless told otherwise",
    )
    ap.add_argument("--viewer", metavar="ENDPOINT", help=argparse.SUPPRESS)
    ap.add_argument("--browser-tab", metavar="URL", help=argparse.SUPPRESS)
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.viewer:
        return viewer_main(args.viewer, args.viewer_priority)
    if args.browser_tab:
        return browser_tab_main(args.browser_tab, args.viewer_priority)
    sizes, steps = comma_ints(args.bs), comma_ints(args.steps)
    if len(steps) == 1:
        steps *= len(sizes)
    if len(steps) != len(sizes) or args.rounds < 2 or min(steps) < args.rounds * 2:
        ap.error("--steps needs one value or one per batch size, each >= 2 per round, and --rounds >= 2")
    if not args.device.startswith("cuda"):
        torch.set_num_threads(1)
    results = []
    for bs, n in zip(sizes, steps):
        log(f"bs {bs}: {n} decode steps on {args.shape} ({args.device}), {args.rounds} rounds ABBA")
        results.append(measure(args, bs, n))
    rows = [
        [
            r["bs"],
            r["steps"],
            fmt(r["host_share"]),
            fmt(r["host_share_headless"]),
            fmt(r["host_share_attached"]),
            fmt(r["gap_p50_ms"]),
            fmt(r["gap_p99_ms"]),
            fmt(r["gap_p99_attached_ms"]),
            fmt(r["attached_over_headless"]),
        ]
        for r in results
    ]
    header = [
        "bs",
        "steps",
        "host-bound",
        "headless",
        "attached",
        "gap p50 ms",
        "gap p99 ms",
        "p99 attached",
        "att÷head",
    ]
    log(md_table(header, rows))
    for r in results:
        log(
            f"bs {r['bs']} host-bound share by tenth of the run: "
            + " ".join(fmt(s, ".2f") for s in r["host_share_by_tenth"])
        )
        log(
            f"bs {r['bs']} CPU per decode step: engine {fmt(r['engine_cpu_ms_per_step_headless'])} ms headless, "
            f"{fmt(r['engine_cpu_ms_per_step_attached'])} ms attached (its endpoint's publisher thread "
            f"{fmt(r['publisher_cpu_ms_per_step'])} ms); {args.viewer_kind} viewer at "
            f"{args.viewer_priority} priority {fmt(r['viewer_cpu_ms_per_step'])} ms "
            f"({fmt(r['viewer_cores'], '.2f')} of a core): "
            + ", ".join(f"{k} {fmt(v)}" for k, v in sorted(r["viewer_cpu_ms_per_step_by_process"].items()))
        )
        log(
            f"bs {r['bs']} tok/s by round: "
            + json.dumps({k: [round(x) for x in v] for k, v in r["round_tok_s"].items()})
        )
    if args.json:
        write_json(".", args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
