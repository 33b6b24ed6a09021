"""Viewers at idle priority (``cli.priority``): every thread of the process, threads started later and the
session group are lowered; ``normal`` leaves the process alone; the flags take only the two values."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.cli_support import assert_usage_error, run

from graphtop.cli.priority import apply, policy_of
from graphtop.cli.web_tabs import TabCommand

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")

CHILD = textwrap.dedent(
    """
    import sys, threading
    from graphtop.cli.priority import apply
    threading.Thread(target=threading.Event().wait, daemon=True).start()  # a thread from before
    done = apply(sys.argv[1], own_session=sys.argv[2] == "own")
    threading.Thread(target=threading.Event().wait, daemon=True).start()  # and one from after
    print(done.policy, done.session_group, flush=True)
    sys.stdin.read()
    """
)


def _watch(priority: str, session: str) -> tuple[str, list[str], subprocess.Popen]:
    """A child that applied ``priority``: what it said, its threads' policies, and the process (running)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, priority, session], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    said = proc.stdout.readline().strip()
    threads = sorted(os.listdir(f"/proc/{proc.pid}/task"))
    return said, [policy_of(int(tid)) for tid in threads], proc


def _finish(proc: subprocess.Popen) -> None:
    proc.communicate("", timeout=10)


def test_idle_lowers_every_thread_and_an_own_session_group() -> None:
    said, policies, proc = _watch("idle", "own")
    try:
        assert said == "SCHED_IDLE True"
        assert len(policies) == 3 and set(policies) == {"SCHED_IDLE"}, policies
        assert os.getsid(proc.pid) == proc.pid  # a session of its own...
        group = Path(f"/proc/{proc.pid}/autogroup")
        if group.exists():  # ...whose group the kernel now weighs at the lowest nice
            assert group.read_text().strip().endswith("nice 19"), group.read_text()
    finally:
        _finish(proc)


def test_idle_in_the_callers_session_leaves_its_group_alone() -> None:
    said, policies, proc = _watch("idle", "same")
    try:
        assert said == "SCHED_IDLE False" and set(policies) == {"SCHED_IDLE"}
        assert os.getsid(proc.pid) == os.getsid(0)
        mine, its = Path("/proc/self/autogroup"), Path(f"/proc/{proc.pid}/autogroup")
        if mine.exists():
            assert its.read_text() == mine.read_text()  # the shared group keeps its nice
    finally:
        _finish(proc)


def test_normal_leaves_the_process_as_it_was() -> None:
    said, policies, proc = _watch("normal", "own")
    try:
        assert said == "unchanged False" and set(policies) == {policy_of(os.getpid())}
        assert os.getsid(proc.pid) == os.getsid(0)
    finally:
        _finish(proc)


def test_a_priority_that_is_neither_is_refused() -> None:
    with pytest.raises(ValueError, match="use one of idle, normal"):
        apply("low")


def test_the_flags_take_idle_or_normal(capsys) -> None:
    assert_usage_error(*run(capsys, "attach", "--priority", "low"), "--priority", "'low'")
    assert_usage_error(*run(capsys, "web", "--priority", "high"), "--priority", "'high'")


def test_a_tab_runs_at_the_dashboards_priority() -> None:
    assert "--priority idle" in TabCommand("ipc:///x.sock", "t").shell()  # the default
    assert "--priority normal" in TabCommand("ipc:///x.sock", "t", priority="normal").shell()


FAILS = textwrap.dedent(
    """
    import os, sys
    from graphtop.cli.entry import main
    code = main([sys.argv[1], "/no/such.sock"])
    print(code, os.sched_getscheduler(0) == os.SCHED_IDLE, flush=True)
    """
)


@pytest.mark.parametrize("command", ["attach", "web"])
def test_a_command_that_fails_before_it_serves_leaves_its_caller_as_it_was(command: str, tmp_path: Path) -> None:
    """A priority once lowered cannot be raised again without privilege: an in-process caller (a test, a
    script) of a command that fails must not be left at idle."""
    env = {**os.environ, "GRAPHTOP_RUNTIME_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", FAILS, command], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr


def test_the_environment_sets_the_default_and_a_bad_value_is_one_line(capsys, monkeypatch) -> None:
    """``GRAPHTOP_VIEWER_PRIORITY`` is ``--priority``'s default, a tab's of ``serve --dashboard`` too; a
    flag still wins; anything but idle or normal is a one-line usage error."""
    from graphtop.cli.entry import build_attach_parser as attach_parser
    from graphtop.cli.priority import ENV, default_priority
    from graphtop.cli.web_start import make_dashboard

    monkeypatch.delenv(ENV, raising=False)
    assert default_priority() == "idle"
    monkeypatch.setenv(ENV, "normal")
    assert default_priority() == "normal"
    assert attach_parser().parse_args([]).priority == "normal"
    assert attach_parser().parse_args(["--priority", "idle"]).priority == "idle"
    dashboard = make_dashboard(
        "ipc:///x.sock", "t", host="127.0.0.1", port=0, key=None, label="m", max_tabs=1, max_queued=None
    )
    try:
        assert "--priority normal" in dashboard.command.shell()  # serve --dashboard passes no priority
    finally:
        dashboard.close()
    monkeypatch.setenv(ENV, "low")
    assert_usage_error(*run(capsys, "attach"), ENV, "'low'")
    assert_usage_error(*run(capsys, "web"), ENV, "'low'")
