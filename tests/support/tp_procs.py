"""Killing a tensor-parallel worker of a CLI run mid-serving (the CPU and the CUDA test share this)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def spawned_workers(pid: int) -> list[int]:
    """Worker ranks of process ``pid``: its children started by multiprocessing's spawn (Linux /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
            except OSError:  # gone meanwhile
                continue
    return found


def kill_worker_mid_run(
    cli_args: list[str], trace: Path, start_timeout: float, end_timeout: float, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run ``graphtop`` with ``cli_args`` (which record to ``trace``), SIGKILL its worker once the trace
    shows a served step, and return (exit status, stdout, stderr); fails if it does not end in time."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphtop.cli.entry", *cli_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + start_timeout
        while '"type":"step"' not in (trace.read_text() if trace.exists() else ""):  # serving has begun
            assert proc.poll() is None, f"the run ended before it served a step: {proc.communicate()[1][-2000:]}"
            assert time.monotonic() < deadline, "no step served in time"
            time.sleep(0.1)
        workers = spawned_workers(proc.pid)
        assert len(workers) == 1, workers
        os.kill(workers[0], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=end_timeout)  # raises on a hang
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, stdout, stderr
