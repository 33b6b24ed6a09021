"""bench/long_run_bench.py runs end to end on CPU: a headless round and a round with a viewer attached
from another process, and a report whose figures are all there; ``proc_tree`` finds a process's children
and counts their CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import long_run_bench  # noqa: E402  (bench/ is on pytest's pythonpath)
import proc_tree


def test_the_long_run_benchmark_runs_headless_and_attached_on_cpu(tmp_path, capsys, torch_one_thread) -> None:
    out = tmp_path / "long.json"
    argv = ["--device", "cpu", "--bs", "2", "--steps", "40", "--rounds", "2", "--prompt-len", "16", "--json", str(out)]
    assert long_run_bench.main(argv) == 0
    [result] = json.loads(out.read_text())
    assert result["bs"] == 2 and result["steps"] == 40
    for key in ("host_share", "host_share_headless", "host_share_attached"):
        assert 0.0 <= result[key] < 1.0, key  # the emulated replay is part of every step's wall time
    assert result["attached_over_headless"] > 0 and result["gap_p99_ms"] >= result["gap_p50_ms"] > 0
    assert len(result["host_share_by_tenth"]) == 10
    cpu_keys = ("engine_cpu_ms_per_step_headless", "engine_cpu_ms_per_step_attached", "viewer_cpu_ms_per_step")
    for key in (*cpu_keys, "publisher_cpu_ms_per_step"):
        assert result[key] >= 0.0, key  # CPU seconds, counted per process from /proc
    assert set(result["viewer_cpu_ms_per_step_by_process"]) <= {"attach viewer"}  # the viewer's one process
    assert "att÷head" in capsys.readouterr().out


SPINNER = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    print(child.pid, flush=True)
    t = time.process_time()
    while time.process_time() - t < 0.3:  # 0.3 s of CPU, then nothing
        pass
    time.sleep(30)
    """
)


def test_proc_tree_counts_the_cpu_of_a_process_and_its_children() -> None:
    parent = subprocess.Popen([sys.executable, "-c", SPINNER], stdout=subprocess.PIPE, text=True)
    try:
        before = proc_tree.cpu_by_pid([parent.pid])
        child = int(parent.stdout.readline())
        time.sleep(0.8)
        after = proc_tree.cpu_by_pid([parent.pid])
        assert {parent.pid, child} <= set(after) and os.getpid() not in after
        assert after[child].ppid == parent.pid
        assert 0.2 <= proc_tree.cpu_taken(before, after) < 5.0  # the parent's busy loop, counted once
        assert proc_tree.thread_cpu_s(threading.get_native_id()) > 0.0  # this thread has run
    finally:
        for pid in proc_tree.cpu_by_pid([parent.pid]):
            os.kill(pid, signal.SIGKILL)
        parent.wait()
