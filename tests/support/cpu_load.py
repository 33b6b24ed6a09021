"""A bounded background CPU load for the dashboard's tests: ``pytest --cpu-load N`` (or
``GRAPHTOP_TEST_CPU_LOAD=N``) keeps N processes spinning while the tests of tests/tui run.

Why: the dashboard's tests pass on an idle machine and failed once on a loaded one (a timer tick that came
while the app was shutting down). Timing bugs of that kind show only when the UI thread is starved, so CI
can run the folder once more under load. Each burner stops by itself after ``MAX_S`` seconds, or as soon
as the pytest process that started it is gone, so a killed run leaves nothing spinning.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

ENV = "GRAPHTOP_TEST_CPU_LOAD"
MAX_BURNERS = 8
MAX_S = 1800.0
BURN = (
    "import os, sys, time\n"
    "parent, deadline = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])\n"
    "while time.monotonic() < deadline and os.getppid() == parent:\n"
    "    for _ in range(200_000):\n"
    "        pass\n"
)


def burners_asked(option: Optional[int]) -> int:
    """How many burners: the pytest option, else the environment variable, else none (at most 8)."""
    count = option if option is not None else int(os.environ.get(ENV, "0") or 0)
    return max(0, min(MAX_BURNERS, count))


def start_burners(count: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-c", BURN, str(os.getpid()), str(MAX_S)], stdin=subprocess.DEVNULL)
        for _ in range(count)
    ]


def stop_burners(burners: list[subprocess.Popen]) -> None:
    for proc in burners:
        proc.kill()
    for proc in burners:
        proc.wait(10)
