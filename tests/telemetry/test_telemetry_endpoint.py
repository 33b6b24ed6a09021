"""The telemetry endpoint without a model: snapshot + live stream, refusals, drops, runtime folder.

The server runs on a real EventBus fed by scripted events; viewers are real RemoteSessions (or raw
ZeroMQ/Unix sockets playing a hostile client) in this process.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any, Optional

import msgspec
import pytest
import zmq
from support.waiting import wait_for

from graphtop.engine.telemetry import protocol as p
from graphtop.engine.telemetry import wire
from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.events import ErrorEvent, Event, ParityNotRun, StepEvent
from graphtop.engine.telemetry.runtime import EndpointError, list_entries, private_dir
from graphtop.engine.telemetry.server import EndpointConfig, TelemetryServer
from graphtop.tui.sessions.base import SamplingSettings
from graphtop.tui.sessions.fake import boot_events, step_events
from graphtop.tui.sessions.remote import AttachError, RemoteSession
from graphtop.tui.state import DashboardState


@pytest.fixture
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rt")  # a short path: Unix socket paths are limited


@pytest.fixture
def serve(runtime: Path):
    servers: list[TelemetryServer] = []

    def make(bus: Optional[EventBus] = None, **config: Any) -> TelemetryServer:
        server = TelemetryServer(bus or EventBus(), EndpointConfig(runtime_dir=runtime, label="fake", **config))
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.close()


class FakeHandle:
    def __init__(self, chunks: list[str]) -> None:
        self.chunks = list(chunks)
        self.finished = False
        self.finish_reason: Any = None
        self.error: Optional[str] = None

    def new_text(self) -> str:
        if not self.chunks:
            return ""
        chunk = self.chunks.pop(0)
        if not self.chunks:
            self.finished, self.finish_reason = True, "length"
        return chunk


class FakeLink:
    """An engine as the endpoint sees it: records the commands."""

    def __init__(self) -> None:
        self.submitted: list[tuple[str, str, p.Sampling, bool]] = []
        self.cancelled: list[str] = []
        self.recaptures: list[tuple[Any, Any]] = []

    def status(self) -> p.EngineStatus:
        return p.EngineStatus(ready=True, model="fake", device="cpu", chat=True, max_running=8, kv_capacity_tokens=4096)

    def state_events(self) -> list[Event]:
        return []

    def submit(self, request_id: str, prompt: str, sampling: p.Sampling, chat: bool) -> FakeHandle:
        if sampling.top_p <= 0:
            raise ValueError("top_p must be in (0, 1]")
        self.submitted.append((request_id, prompt, sampling, chat))
        return FakeHandle(["hello ", "from ", "the engine"])

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    def recapture(self, decode_bs: Any, prefill_num_tokens: Any) -> None:
        if decode_bs == []:
            raise ValueError("decode bucket list is empty")
        self.recaptures.append((decode_bs, prefill_num_tokens))


def viewer(server: TelemetryServer, **kwargs: Any) -> RemoteSession:
    session = RemoteSession(server.endpoint, server.token, **kwargs)
    session.connect()
    assert session.snapshot_done.wait(10)
    return session


def drain_until(session: RemoteSession, n: int, timeout: float = 10.0, *, types: tuple[str, ...] = ()) -> list[Event]:
    """Drain until ``n`` events (of ``types``, when given) arrived; returns those events."""
    out: list[Event] = []

    def more() -> bool:
        out.extend(e for e in session.drain() if not types or e.type in types)
        return len(out) >= n

    wait_for(more, timeout, f"{n} events")
    return out


class RawClient:
    """A client speaking raw frames: it can send what no real viewer would. With ``token`` it passes the
    endpoint's handshake (a hostile viewer that holds the token); without, it never does."""

    def __init__(self, endpoint: str, token: Optional[str] = None) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if token is not None:
            self.sock.setsockopt(zmq.PLAIN_USERNAME, b"raw")
            self.sock.setsockopt_string(zmq.PLAIN_PASSWORD, token)
        self.sock.connect(endpoint)

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def recv(self, timeout: float = 5.0) -> Any:
        assert self.sock.poll(int(timeout * 1000)), "no reply"
        return p.server_decoder.decode(self.sock.recv())

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


# -- snapshot and stream ---------------------------------------------------------------------------


def test_viewer_attaching_mid_run_gets_a_snapshot_then_the_live_stream(serve) -> None:
    bus = EventBus()
    server = serve(bus)
    before = boot_events() + step_events(60)
    for ev in before:
        bus.publish(ev)
    wait_for(lambda: server.keeper.next_seq == len(before), what="the endpoint to fold the history")
    session = viewer(server)
    snapshot = drain_until(session, 1)
    wait_for(lambda: bool(snapshot.extend(session.drain())) or len(snapshot) >= server.keeper.retained)

    # The snapshot alone rebuilds what a viewer watching since the start shows.
    seen, full = DashboardState(), DashboardState()
    seen.apply_all(snapshot)
    full.apply_all(before)
    assert seen.info == full.info and seen.ledger == full.ledger and seen.kv == full.kv
    assert {k: (c.planned, c.captured) for k, c in seen.capture.items()} == {
        k: (c.planned, c.captured) for k, c in full.capture.items()
    }
    assert list(seen.steps) == list(full.steps)

    after = step_events(30, start_step=61)
    for ev in after:
        bus.publish(ev)
    live = drain_until(session, len(after))
    assert live == after
    assert session.dropped == 0
    session.shutdown()
    wait_for(lambda: not server.viewers, what="the viewer to detach")


def test_snapshot_is_bounded_and_keeps_open_requests(serve) -> None:
    from graphtop.engine.telemetry.events import RequestFinished, RequestQueued

    bus = EventBus()
    server = serve(bus, recent_steps=100)
    for ev in boot_events() + step_events(1000):
        bus.publish(ev)
    bus.publish(RequestQueued(request_id="open", prompt_tokens=3))
    bus.publish(RequestQueued(request_id="done", prompt_tokens=3))
    bus.publish(RequestFinished(request_id="done"))
    wait_for(lambda: server.keeper.open_requests == 1, what="folding")
    snapshot = server.keeper.snapshot()
    steps = [e for e in snapshot if e.type == "step"]
    assert len(steps) == 100 and steps[-1].step == 1000  # type: ignore[attr-defined]
    assert [e.request_id for e in snapshot if e.type == "request_queued"] == ["open"]  # type: ignore[attr-defined]
    assert [e.ts for e in snapshot] == sorted(e.ts for e in snapshot)  # stream order


def test_several_viewers_at_once(serve) -> None:
    bus = EventBus()
    server = serve(bus)
    sessions = [viewer(server) for _ in range(3)]
    for ev in step_events(50):
        bus.publish(ev)
    for s in sessions:
        assert [e.step for e in drain_until(s, 50) if e.type == "step"] == list(range(1, 51))  # type: ignore[attr-defined]
        s.shutdown()


def test_a_stuck_viewer_loses_batches_counted_never_blocking_the_publisher(serve) -> None:
    bus = EventBus()
    server = serve(bus, send_hwm=2)
    stuck = RawClient(server.endpoint, server.token)
    stuck.sock.setsockopt(zmq.RCVHWM, 1)
    stuck.send(p.encoder.encode(p.Hello(p.PROTOCOL_VERSION, server.token)))
    wait_for(lambda: len(server.viewers) == 1, what="the stuck viewer to attach")
    reader = viewer(server)
    stuck_state = next(v for v in server.viewers.values() if v.name == "")
    n = 0
    while stuck_state.dropped_events == 0 and n < 200_000:
        for _ in range(2000):
            n += 1
            bus.publish(StepEvent(step=n))
        time.sleep(0.03)
    assert stuck_state.dropped_events > 0  # counted, and the publisher went on
    got: list[Event] = []
    wait_for(lambda: bool(got.extend(reader.drain())) or len(got) + reader.dropped >= n, 30, "the reader")
    # the reading viewer saw everything or says what it missed: with send_hwm=2 it misses some too, and
    # counts them exactly
    assert len(got) + reader.dropped == n
    stuck.close()
    reader.shutdown()


def test_gaps_in_the_stream_are_counted_as_dropped(serve) -> None:
    server = serve()
    session = RemoteSession(server.endpoint, server.token)
    session.connect()
    session._handle(p.server_decoder.decode(p.encoder.encode(p.Events(session.stream.expected_seq + 5, 0, []))))
    assert session.gaps == 5 and session.dropped == 5
    session._handle(p.server_decoder.decode(p.encoder.encode(p.Events(session.stream.expected_seq, 7, []))))
    assert session.dropped == 12  # the endpoint's own queue losses count too
    session.shutdown()


# -- commands ----------------------------------------------------------------------------------


class PendingLink(FakeLink):
    """An engine whose requests never finish (they stay in flight until cancelled)."""

    def submit(self, *args: Any) -> FakeHandle:
        super().submit(*args)
        return FakeHandle([])


def test_prompt_streams_back_to_the_viewer_that_sent_it(serve) -> None:
    server = serve()
    link = FakeLink()
    server.attach_engine(link)
    session = viewer(server)
    wait_for(lambda: session.can_submit, what="ready status")
    assert session.chat_available and session.limits().max_running == 8
    handle = session.submit("hi", SamplingSettings(max_new_tokens=7, temperature=0.5, seed=3), True)
    assert handle.wait(10)
    assert handle.text == "hello from the engine" and handle.finish_reason == "length" and handle.error is None
    rid, prompt, sampling, chat = link.submitted[0]
    assert (rid, prompt, chat) == ("v1/" + handle.request_id, "hi", True)  # the viewer's own namespace
    assert (sampling.max_new_tokens, sampling.temperature, sampling.seed) == (7, 0.5, 3)

    bad = session.submit("x", SamplingSettings(top_p=0.0), False)  # the engine's own validation answers
    assert bad.wait(10) and bad.finish_reason == "rejected" and "top_p" in (bad.error or "")
    session.shutdown()


def test_a_prompt_longer_than_a_frame_arrives_whole(serve) -> None:
    """The endpoint reads frames of at most 64 KiB (``wire``); a longer prompt goes in several and is
    joined, up to the 1 MiB message limit."""
    server = serve()
    link = FakeLink()
    server.attach_engine(link)
    session = viewer(server)
    wait_for(lambda: session.can_submit, what="ready status")
    prompt = "".join(f"{i:07d}é" for i in range(100_000))  # 800 KB of text, 900 KB as UTF-8
    assert wire.FRAME_BYTES * 10 < len(p.encoder.encode(p.Submit("r", prompt))) <= p.MAX_MESSAGE_BYTES
    handle = session.submit(prompt, SamplingSettings(), False)
    assert handle.wait(10) and handle.error is None
    assert link.submitted[0][1] == prompt
    session.shutdown()


def test_recapture_cancel_and_export_commands(serve, tmp_path: Path) -> None:
    bus = EventBus()
    server = serve(bus)
    link = FakeLink()
    server.attach_engine(link)
    for ev in boot_events():
        bus.publish(ev)
    session = viewer(server)
    session.recapture([1, 2, 4], None)
    wait_for(lambda: link.recaptures == [([1, 2, 4], None)], what="the recapture")
    session.recapture([], None)
    wait_for(lambda: any("decode bucket list is empty" in m for _, m in session.drain_logs()), what="refusal")

    out = tmp_path / "engine.jsonl"
    assert "events" in session.export_trace_on_engine(str(out))
    from graphtop.engine.trace_tools.trace import read_trace

    assert {e.type for e in read_trace(out).events} >= {"engine_started", "capture_finished", "memory_ledger"}
    with pytest.raises(RuntimeError, match="exists"):
        session.export_trace_on_engine(str(out))
    with pytest.raises(RuntimeError, match="absolute"):
        session.export_trace_on_engine("relative.jsonl")

    other = viewer(server)
    other.cancel("not-mine")
    handle = session.submit("hi", SamplingSettings(), False)
    wait_for(lambda: server.refused >= 1, what="the foreign cancel to be refused")
    assert link.cancelled == []
    wait_for(
        lambda: any("which this viewer did not submit" in m for _, m in other.drain_logs()),
        what="the refusal to reach the viewer that sent it",
    )
    handle.wait(10)
    session.shutdown()
    other.shutdown()


def test_commands_before_the_engine_is_loaded_are_answered_not_lost(serve) -> None:
    server = serve()
    raw = RawClient(server.endpoint, server.token)
    raw.send(p.encoder.encode(p.Hello(p.PROTOCOL_VERSION, server.token)))
    welcome = raw.recv()
    assert isinstance(welcome, p.Welcome) and not welcome.status.ready
    raw.send(p.encoder.encode(p.Submit("r1", "hi")))
    while not isinstance(msg := raw.recv(), p.Tokens):
        pass
    assert msg.finished and msg.error == "the engine is still loading"
    server.engine_failed("CheckpointError: no config.json")
    while not isinstance(msg := raw.recv(), p.Status):
        pass
    assert msg.status.failed == "CheckpointError: no config.json"
    raw.close()


def test_detaching_cancels_the_viewers_own_prompts(serve) -> None:
    server = serve()

    link = PendingLink()
    server.attach_engine(link)
    session = viewer(server)
    handle = session.submit("hi", SamplingSettings(), False)
    wait_for(lambda: bool(link.submitted), what="submit")
    session.shutdown()
    wait_for(lambda: link.cancelled == ["v1/" + handle.request_id], what="the cancel on detach")


def test_a_viewer_cannot_claim_or_cancel_requests_that_are_not_its_own(serve) -> None:
    """Viewer names live in a namespace per viewer: naming another's id (read from the event stream) or
    one of the engine's next ``req-N`` ids neither takes it over nor lets a cancel reach it."""
    server = serve()

    link = PendingLink()
    server.attach_engine(link)
    first, second = viewer(server), viewer(server)
    mine = first.submit("hi", SamplingSettings(), False)
    wait_for(lambda: len(link.submitted) == 1, what="the first viewer's submit")
    engine_id = link.submitted[0][0]
    assert engine_id == "v1/" + mine.request_id
    # a hostile viewer names the first one's ids, as the events show them
    raw = RawClient(server.endpoint, server.token)
    raw.send(p.encoder.encode(p.Hello(p.PROTOCOL_VERSION, server.token)))
    assert isinstance(raw.recv(), p.Welcome)
    for rid in (engine_id, mine.request_id, "req-7"):
        raw.send(p.encoder.encode(p.Submit(rid, "x")))
        raw.send(p.encoder.encode(p.Cancel(rid)))
    wait_for(lambda: len(link.submitted) == 4, what="the hostile submits")
    assert [rid for rid, *_ in link.submitted[1:]] == [f"v2/{engine_id}", f"v2/{mine.request_id}", "v2/req-7"]
    assert engine_id not in link.cancelled
    second.shutdown()
    first.shutdown()
    wait_for(lambda: engine_id in link.cancelled, what="the owner's detach to cancel its own")


def test_one_viewer_cannot_queue_without_bound(serve) -> None:
    from graphtop.engine.telemetry.endpoint_commands import MAX_VIEWER_REQUESTS

    server = serve()

    link = PendingLink()
    server.attach_engine(link)
    session = viewer(server)
    handles = [session.submit("x", SamplingSettings(), False) for _ in range(MAX_VIEWER_REQUESTS + 3)]
    wait_for(lambda: sum(h.finished for h in handles) == 3, what="the requests over the cap to be rejected")
    over = [h for h in handles if h.finished]
    assert all(h.finish_reason == "rejected" and "requests in flight" in (h.error or "") for h in over)
    assert len(link.submitted) == MAX_VIEWER_REQUESTS
    session.shutdown()


# -- refusals ----------------------------------------------------------------------------------


def test_wrong_token_garbage_and_oversize_are_refused_and_logged_engine_unaffected(serve, caplog) -> None:
    bus = EventBus()
    server = serve(bus, refusals_per_s=100.0)
    watch = bus.subscribe("watch", types=["error"])
    good = viewer(server)

    with pytest.raises(AttachError, match="wrong token"):
        RemoteSession(server.endpoint, "not-the-token").connect()
    raw = RawClient(server.endpoint, server.token)
    cases = [
        ((b"\x00garbage\xff",), "malformed message"),
        ((p.encoder.encode({"type": "Submit"}),), "malformed message"),
        ((p.encoder.encode(p.Hello(99, server.token)),), "protocol 99"),
        ((p.encoder.encode(p.Submit("r", "x")),), "has not attached"),
        (tuple(wire.frames(b"x" * (p.MAX_MESSAGE_BYTES + 1))), "byte limit"),
    ]
    for frames, reason in cases:
        raw.send(*frames)
        msg = raw.recv()
        assert isinstance(msg, p.Refused) and reason in msg.reason, (reason, msg)
        # only a size refusal carries the refused message's size (a viewer matches it to its submit)
        assert msg.message_bytes == (sum(map(len, frames)) if reason == "byte limit" else None)
    # a message in several frames is read as one (a long prompt travels so)
    submit = p.encoder.encode(p.Submit("r", "x"))
    raw.send(submit[:3], submit[3:])
    assert "has not attached" in raw.recv().reason
    raw.close()

    # a frame over the frame limit, even from a client that holds the token: ZeroMQ drops the connection
    # without buffering it
    huge = RawClient(server.endpoint, server.token)
    huge.send(b"x" * (wire.FRAME_BYTES + 1))
    # a non-ZeroMQ client writing junk at the socket: the handshake fails, nothing reaches the server
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(server.endpoint[len("ipc://") :])
        s.sendall(os.urandom(4096))
    huge.close()

    refusals = [e for e in watch.drain() if isinstance(e, ErrorEvent) and e.where == "telemetry endpoint"]
    assert len(refusals) >= len(cases) + 1  # + the wrong token
    assert any("refused a client" in r.getMessage() for r in caplog.records)
    # the endpoint still serves the good viewer
    bus.publish(StepEvent(step=1))
    assert drain_until(good, 1, types=("step",))
    assert server._thread.is_alive()
    good.shutdown()


def test_refusals_are_rate_limited(serve) -> None:
    bus = EventBus()
    server = serve(bus, refusals_per_s=2.0)
    watch = bus.subscribe("watch", types=["error"])
    raw = RawClient(server.endpoint, server.token)
    for _ in range(50):
        raw.send(b"junk")
    wait_for(lambda: server.refused == 50, what="50 refusals")
    assert len(watch.drain()) <= 3  # a flood of junk cannot flood the trace
    raw.close()


# -- where endpoints live ------------------------------------------------------------------------


def test_runtime_folder_is_private_and_entries_are_0600(serve, runtime: Path) -> None:
    server = serve()
    assert stat.S_IMODE(os.stat(runtime).st_mode) == 0o700
    entry_file = runtime / f"{os.getpid()}-{server._stem.split('-')[1]}.json"
    assert stat.S_IMODE(os.stat(entry_file).st_mode) == 0o600
    sock = Path(server.endpoint[len("ipc://") :])
    assert sock.parent == runtime and stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    [entry] = list_entries(runtime)
    assert (entry.pid, entry.endpoint, entry.token, entry.model) == (os.getpid(), server.endpoint, server.token, "fake")
    server.close()
    assert list_entries(runtime) == [] and not sock.exists() and not entry_file.exists()


def test_a_too_open_default_folder_is_closed_a_given_one_and_a_foreign_one_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the default folder, which graphtop names and creates itself, is closed to 0700; a folder the
    user gave (``$GRAPHTOP_RUNTIME_DIR``, ``runtime_dir=``) was chmod-ed silently, and is now refused."""
    lax = tmp_path / "lax"
    lax.mkdir(mode=0o777)
    os.chmod(lax, 0o777)
    monkeypatch.setenv("GRAPHTOP_RUNTIME_DIR", str(lax))
    for given in (lax, None):
        with pytest.raises(EndpointError, match=rf"runtime folder {lax} is open to other users \(mode 0777\)"):
            private_dir(given)
    assert stat.S_IMODE(os.stat(lax).st_mode) == 0o777
    monkeypatch.delenv("GRAPHTOP_RUNTIME_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    default = tmp_path / "graphtop"
    default.mkdir(mode=0o755)
    os.chmod(default, 0o755)
    assert private_dir() == default and stat.S_IMODE(os.stat(default).st_mode) == 0o700
    link = tmp_path / "link"
    link.symlink_to(lax)
    with pytest.raises(EndpointError, match="symlink"):
        private_dir(link)
    if os.geteuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir()
        os.chown(foreign, 65534, 65534)
        with pytest.raises(EndpointError, match="another user"):
            private_dir(foreign)


def test_stale_entries_of_dead_engines_are_pruned(runtime: Path) -> None:
    import json
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    private_dir(runtime)
    (runtime / f"{pid}-0.json").write_text(
        json.dumps(dict(pid=pid, endpoint="ipc://x", token="t", model="m", device="d", started=0.0))
    )
    assert list_entries(runtime) == []
    assert not (runtime / f"{pid}-0.json").exists()


def _entry_for(runtime: Path, pid: int, started: float) -> Path:
    import json

    path = runtime / f"{pid}-0.json"
    path.write_text(json.dumps(dict(pid=pid, endpoint="ipc://x", token="t", model="m", device="d", started=started)))
    return path


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="zombies are told apart through /proc")
def test_entries_of_a_zombie_or_a_reused_pid_are_stale(runtime: Path) -> None:
    """``kill(pid, 0)`` succeeds on a zombie and on whatever process got the pid later: ``ps`` listed
    both as attachable engines."""
    import subprocess
    import sys
    import time

    private_dir(runtime)
    child = subprocess.Popen([sys.executable, "-c", "pass"])  # exits; not reaped until wait() below
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child never became a zombie"
            time.sleep(0.02)
        zombie = _entry_for(runtime, child.pid, time.time())
        assert list_entries(runtime) == [] and not zombie.exists()
    finally:
        child.wait()
    reused = _entry_for(runtime, os.getpid(), 1.0)  # this process started long after the entry's time
    assert list_entries(runtime) == [] and not reused.exists()
    _entry_for(runtime, os.getpid(), time.time())
    assert [e.pid for e in list_entries(runtime)] == [os.getpid()]
    from graphtop.engine.telemetry.pid_check import process_alive

    assert process_alive(os.getpid(), 1.0, proc=str(runtime / "no-proc"))  # no /proc: kill(pid, 0) decides


def test_socket_path_too_long_is_a_one_line_error(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    with pytest.raises(EndpointError, match="too long"):
        TelemetryServer(EventBus(), EndpointConfig(runtime_dir=deep))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a viewer as another user")
def test_a_viewer_of_another_user_cannot_connect(serve) -> None:
    import subprocess
    import sys

    server = serve()
    code = (
        "import os, sys, zmq\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "path = sys.argv[1][len('ipc://'):]\n"
        "try:\n"
        "    os.stat(path)\n"
        "except PermissionError:\n"
        "    print('denied'); sys.exit(0)\n"
        "print('reachable'); sys.exit(1)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, server.endpoint], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "denied", proc.stdout + proc.stderr
    # and through ZeroMQ itself: the connect never completes, so no Hello is ever answered
    code = (
        "import os, sys\n"
        "from graphtop.tui.sessions.remote import RemoteSession, AttachError\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "try:\n"
        "    RemoteSession(sys.argv[1], sys.argv[2], connect_timeout=2).connect()\n"
        "except AttachError as e:\n"
        "    print('refused:', e); sys.exit(0)\n"
        "print('attached'); sys.exit(1)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, server.endpoint, server.token], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout.startswith("refused"), proc.stdout + proc.stderr


def test_tcp_endpoint_needs_the_token(serve) -> None:
    bus = EventBus()
    server = serve(bus, address="tcp://127.0.0.1:*")
    assert server.endpoint.startswith("tcp://127.0.0.1:")
    with pytest.raises(AttachError, match="wrong token"):
        RemoteSession(server.endpoint, "").connect()
    session = viewer(server)
    bus.publish(StepEvent(step=1))
    assert drain_until(session, 1, types=("step",))
    session.shutdown()


def test_bad_address_is_a_one_line_error(runtime: Path) -> None:
    with pytest.raises(EndpointError, match="use ipc"):
        TelemetryServer(EventBus(), EndpointConfig(address="udp://x", runtime_dir=runtime))
    with pytest.raises(EndpointError, match="cannot serve telemetry"):
        TelemetryServer(EventBus(), EndpointConfig(address="tcp://256.0.0.1:1", runtime_dir=runtime))
    for port in ("99999", "-1", "0", "65536", "abc", ""):  # ZeroMQ would wrap the first two around
        with pytest.raises(EndpointError, match="the port must be 1-65535"):
            TelemetryServer(EventBus(), EndpointConfig(address=f"tcp://127.0.0.1:{port}", runtime_dir=runtime))


def test_protocol_messages_round_trip() -> None:
    step = StepEvent(step=3, phase="decode", bucket=4, replay_ms=0.5)
    not_run = ParityNotRun(step=None, reason="too_large", skipped=2, discarded=0, every=8)  # a step-less event
    msg = p.server_decoder.decode(p.encoder.encode(p.Events(10, 2, p.event_pairs([step, not_run]))))
    events, bad = p.decode_events(msg.events)
    assert events == [step, not_run] and bad == 0
    assert p.decode_events([("no_such_type", msgspec.Raw(b"\x80"))]) == ([], 1)
    assert p.decode_events([("step", msgspec.Raw(p.encoder.encode({"step": "x"})))]) == ([], 1)
    for m in (
        p.Hello(1, "t", "n"),
        p.Submit("r", "x", p.Sampling(max_new_tokens=3, temperature=0.5, top_p=0.9, top_k=4, seed=1), True),
        p.Cancel("r"),
        p.Recapture(1, [1, 2], None),
        p.ExportTrace(2, "/x"),
        p.Ping(),
        p.Bye(),
    ):
        assert p.client_decoder.decode(p.encoder.encode(m)) == m


def test_a_refusal_quoting_the_client_is_one_printable_line(serve, caplog) -> None:
    import msgspec

    bus = EventBus()
    server = serve(bus, refusals_per_s=100.0)
    sub = bus.subscribe("test")
    seen: list = []
    raw = RawClient(server.endpoint, server.token)
    raw.send(msgspec.msgpack.encode({"type": "x'\nCRITICAL graphtop: engine compromised\x1b[31m\n"}))
    refused = raw.recv()
    assert isinstance(refused, p.Refused)
    assert "\n" not in refused.reason and "\x1b" not in refused.reason and "compromised\u241b[31m" in refused.reason
    wait_for(lambda: seen.extend(sub.drain()) or any(e.type == "error" for e in seen), what="the refusal's error event")
    assert all("\n" not in e.message for e in seen if e.type == "error")
    assert all("\n" not in r.getMessage() for r in caplog.records)


def test_an_export_path_ending_in_a_slash_is_refused_not_written_as_a_file(serve, tmp_path: Path) -> None:
    server = serve()
    server.attach_engine(FakeLink())
    session = viewer(server)
    with pytest.raises(RuntimeError, match="names a folder"):
        session.export_trace_on_engine(f"{tmp_path}/newdir/")
    assert not (tmp_path / "newdir").exists()
    with pytest.raises(RuntimeError) as info:
        session.export_trace_on_engine(f"{tmp_path}/no\nsuch/x.jsonl")
    assert "\n" not in str(info.value)
    session.shutdown()


class GatedLink(FakeLink):
    """An engine whose submit blocks (as tokenizing a long prompt does) until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def submit(self, *args: Any) -> FakeHandle:
        self.gate.wait(10)
        super().submit(*args)
        return FakeHandle([])  # stays in flight


def test_a_slow_submit_does_not_pause_the_stream_and_a_cancel_before_it_lands_is_kept(serve) -> None:
    """Engine.submit tokenizes in its caller's thread: on the endpoint's worker, not the publisher, so
    every viewer's events keep flowing meanwhile; a cancel sent before the engine had the request is
    sent once it has it."""
    from graphtop.engine.telemetry.events import ErrorEvent

    bus = EventBus()
    server = serve(bus)
    link = GatedLink()
    server.attach_engine(link)
    session, watcher = viewer(server), viewer(server)
    handle = session.submit("a long prompt", SamplingSettings(), False)
    session.cancel(handle.request_id)
    time.sleep(0.3)  # the submit now blocks the worker
    bus.publish(ErrorEvent(message="while the worker is busy", where="test"))
    wait_for(
        lambda: any(getattr(e, "message", "") == "while the worker is busy" for e in watcher.drain()),
        timeout=2.0,
        what="the stream to go on while a submit is being tokenized",
    )
    assert link.submitted == [] and link.cancelled == []
    link.gate.set()
    wait_for(lambda: link.cancelled == ["v1/" + handle.request_id], what="the early cancel to reach the engine")
    session.shutdown()
    watcher.shutdown()


def test_exports_wait_on_the_worker_and_one_viewer_may_queue_only_a_few(serve, tmp_path: Path) -> None:
    from graphtop.engine.telemetry.endpoint_commands import MAX_VIEWER_EXPORTS

    server = serve()
    link = GatedLink()
    server.attach_engine(link)
    raw = RawClient(server.endpoint, server.token)
    raw.send(p.encoder.encode(p.Hello(p.PROTOCOL_VERSION, server.token)))
    assert isinstance(raw.recv(), p.Welcome)
    raw.send(p.encoder.encode(p.Submit("r1", "x")))  # holds the worker until the gate opens
    for cid in range(MAX_VIEWER_EXPORTS + 1):
        raw.send(p.encoder.encode(p.ExportTrace(cid, str(tmp_path / f"e{cid}.jsonl"))))
    results: dict[int, p.Result] = {}

    def collect() -> bool:
        while raw.sock.poll(50):
            msg = p.server_decoder.decode(raw.sock.recv())
            if isinstance(msg, p.Result):
                results[msg.cid] = msg
        return len(results) == MAX_VIEWER_EXPORTS + 1 or (not link.gate.is_set() and MAX_VIEWER_EXPORTS in results)

    wait_for(collect, what="the export over the limit to be refused at once")
    assert not results[MAX_VIEWER_EXPORTS].ok and "still being written" in results[MAX_VIEWER_EXPORTS].message
    assert len(results) == 1  # the others wait for the worker
    link.gate.set()
    wait_for(collect, what="the queued exports' answers")
    assert all(results[cid].ok for cid in range(MAX_VIEWER_EXPORTS))
    assert sorted(f.name for f in tmp_path.iterdir()) == [f"e{cid}.jsonl" for cid in range(MAX_VIEWER_EXPORTS)]
    raw.close()


def test_the_publisher_hands_the_gil_over_between_chunks(serve, monkeypatch) -> None:
    """A backlog is folded and encoded a chunk at a time, with the GIL handed over between two chunks:
    the engine's thread never waits on more than one chunk of the publisher's work."""
    from graphtop.engine.telemetry import server as server_module

    bus = EventBus()
    server = serve(bus)
    server._stop.set()  # its thread stops: this test drives the publishing itself
    server._thread.join(10)
    folded: list[int] = []
    monkeypatch.setattr(server_module, "let_the_engine_run", lambda: folded.append(server.keeper.next_seq))
    n = 3 * p.EVENTS_PER_MESSAGE + 1
    for i in range(n):
        bus.publish(StepEvent(step=i))
    server._publish()
    assert server.keeper.next_seq == n
    assert folded == [p.EVENTS_PER_MESSAGE * k for k in (1, 2, 3)]
