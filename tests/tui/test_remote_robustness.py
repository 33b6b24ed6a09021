"""An attached viewer against frames a real engine never sends, and ``graphtop attach`` at endpoints
that are no engine.

A real endpoint numbers its events 0, 1, 2… (``first_seq``) and only counts ``bus_dropped`` up; one
bogus ``Events`` frame must not poison the viewer's loss accounting (a huge ``dropped``, or every later
event sliced away as already seen), while real gaps, of any size, are still counted exactly. Attach
errors are one line with the real reason (exit 2, no traceback).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable

import pytest
import zmq

from graphtop.cli.entry import main
from graphtop.engine.telemetry import protocol as p
from graphtop.engine.telemetry.events import EngineStarted, StepEvent
from graphtop.engine.telemetry.gate import Gate, GateConfig
from graphtop.tui.app import GraphtopApp
from graphtop.tui.sessions.event_stream import MAX_SEQ_JUMP
from graphtop.tui.sessions.fake import boot_events
from graphtop.tui.sessions.remote import AttachError, RemoteSession
from graphtop.tui.testing import FIXED_DEVICE, screen_text, wait_until

HUGE = 2**63 - 1


def frame(message: Any) -> Any:
    """``message`` as the viewer decodes it off the wire."""
    return p.server_decoder.decode(p.encoder.encode(message))


def steps(*numbers: int) -> list[tuple[str, Any]]:
    return p.event_pairs(
        [
            StepEvent(step=n, phase="decode", batch_size=1, num_tokens=1, bucket=1, path="graph", replay_ms=1.0, ts=1.0)
            for n in numbers
        ]
    )


def welcomed(next_seq: int = 0, bus_dropped: int = 0) -> RemoteSession:
    session = RemoteSession("ipc:///nowhere", "t")
    session._handle(frame(p.Welcome(p.PROTOCOL_VERSION, 1, "x", 0.0, p.EngineStatus(), next_seq, bus_dropped, [])))
    return session


def feed(session: RemoteSession, *frames: p.Events) -> list[int]:
    """Hand ``frames`` to the viewer; the step numbers it queued for the dashboard."""
    for f in frames:
        session._handle(frame(f))
    return [ev.step for ev in session.drain()]


# -- loss accounting -------------------------------------------------------------------------------


@pytest.mark.parametrize("first_seq, bus_dropped", [(HUGE, HUGE), (HUGE, 0), (0, HUGE), (MAX_SEQ_JUMP + 11, 0)])
def test_one_bogus_frame_does_not_poison_the_stream(first_seq: int, bus_dropped: int) -> None:
    session = welcomed(next_seq=10)
    shown = feed(
        session,
        p.Events(first_seq, bus_dropped, steps(500)),
        p.Events(10, 0, steps(1, 2)),
        p.Events(12, 0, steps(3)),
        p.Events(13, 0, []),
    )
    assert shown == [1, 2, 3] and session.dropped == 0  # was 18446744073709551614 and nothing shown
    assert len(session.drain_logs()) == 1  # said once


def test_negative_counters_are_a_protocol_error_said_once() -> None:
    session = welcomed(next_seq=0)
    shown = feed(session, p.Events(-5, -7, steps(9)), p.Events(0, -1, []), p.Events(0, 0, steps(1)))
    assert shown == [1] and session.dropped == 0  # was -7
    logs = session.drain_logs()
    assert len(logs) == 1 and "negative counters" in logs[0][1]


def test_real_gaps_and_endpoint_losses_are_counted_exactly() -> None:
    session = welcomed(next_seq=100, bus_dropped=40)
    shown = feed(
        session,
        p.Events(100, 40, steps(1, 2)),
        p.Events(107, 43, steps(3)),  # 5 missed, 3 lost
        p.Events(108, 43, []),
        p.Events(110, 43, []),
    )  # the heartbeat says 2 more were missed
    assert shown == [1, 2, 3] and (session.gaps, session.dropped) == (7, 10)
    assert session.drain_logs() == []  # nothing malformed


def test_a_real_jump_past_the_limit_is_believed_once_the_stream_continues_from_it() -> None:
    session = welcomed(next_seq=0)
    jump = MAX_SEQ_JUMP * 3
    assert feed(session, p.Events(0, 0, steps(1)), p.Events(1 + jump, 0, steps(2))) == [1]  # held
    assert feed(session, p.Events(2 + jump, 0, steps(3))) == [2, 3]
    assert session.gaps == jump and session.dropped == jump


def test_a_stream_that_restarts_its_numbers_is_followed() -> None:
    session = welcomed(next_seq=5000, bus_dropped=30)
    shown = feed(session, p.Events(5000, 30, steps(1)), p.Events(0, 0, steps(2)), p.Events(1, 0, steps(3)))
    assert shown == [1, 2, 3]
    assert session.dropped == 0  # the new numbering adds no loss, and the count never goes negative


class ScriptedEndpoint:
    """A ROUTER that answers ``Hello`` with a Welcome, a snapshot and scripted frames (no engine)."""

    def __init__(
        self,
        address: str,
        frames: Iterable[Any] = (),
        next_seq: int = 0,
        protocol: int = p.PROTOCOL_VERSION,
        greeting: Any = None,
        pid: int | None = None,
        gated: bool = True,
    ) -> None:
        """``greeting``: a message sent in answer to Hello instead of the Welcome and snapshot; ``pid``: the
        engine process the Welcome names (this one by default); ``gated``: the token is checked in the
        handshake (else ZeroMQ's NULL mechanism, as endpoints of protocol 1 had)."""
        self.pid = os.getpid() if pid is None else pid
        self.address = address
        self.frames = list(frames)
        self.next_seq = next_seq
        self.protocol = protocol
        self.greeting = greeting
        self.gated = gated
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(5)

    def _run(self) -> None:
        ctx = zmq.Context()
        gate = Gate(ctx, GateConfig(token="t"))  # the viewers here give the token "t" in the handshake
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.gated:
            gate.secure(sock)
        sock.bind(self.address)
        self._ready.set()
        status = p.EngineStatus(ready=True, model="scripted", device="cpu", max_running=8, kv_capacity_tokens=1024)
        try:
            while not self._stop.is_set():
                gate.serve()
                if not sock.poll(20):
                    continue
                identity, *parts = sock.recv_multipart()
                payload = b"".join(parts)
                if isinstance(p.client_decoder.decode(payload), p.Hello) and self.greeting is not None:
                    sock.send_multipart([identity, p.encoder.encode(self.greeting)])
                elif isinstance(p.client_decoder.decode(payload), p.Hello):
                    sock.send_multipart(
                        [
                            identity,
                            p.encoder.encode(
                                p.Welcome(
                                    self.protocol, self.pid, "scripted", time.time(), status, self.next_seq, 0, []
                                )
                            ),
                        ]
                    )
                    sock.send_multipart([identity, p.encoder.encode(p.Snapshot(p.event_pairs(boot_events()), True))])
                    for f in self.frames:
                        sock.send_multipart([identity, p.encoder.encode(f)])
        finally:
            gate.close()
            sock.close()
            ctx.term()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


async def test_dashboard_attached_to_an_endpoint_that_sends_bogus_frames(tmp_path: Path) -> None:
    endpoint = ScriptedEndpoint(
        f"ipc://{tmp_path}/e.sock",
        [
            p.Events(HUGE, HUGE, []),  # the viewer's dropped became 18,446,744,073,709,551,614
            p.Events(-5, -7, []),
            p.Events(0, 0, steps(1, 2, 3)),  # then sliced away as "already seen"
            p.Events(3, 0, []),
        ],
    )
    session = RemoteSession(endpoint.address, "t", label="scripted")
    try:
        session.connect()
        app = GraphtopApp(session, poll_device=False, device_sample=FIXED_DEVICE, animate=False, tick_hz=20)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.state.total_steps == 3, timeout=10)
            await pilot.pause(0.2)
            text = screen_text(app)
            assert session.dropped == 0 and "dropped events" not in text
            assert isinstance(app.state.info, EngineStarted)
    finally:
        session.shutdown()
        endpoint.close()


def _dead_pid() -> int:
    import subprocess

    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("engine", ["killed", "silent"])
async def test_an_engine_killed_or_silent_is_said_lastingly(tmp_path: Path, monkeypatch, engine: str) -> None:
    """SIGKILLed, an engine sends no Closing: a toast said "no word" for a while, then the frozen panels passed
    for a live engine. Its pid (same host) now ends the session; a quiet live one keeps a status badge."""
    import graphtop.tui.sessions.remote as remote

    monkeypatch.setattr(remote, "STALE_AFTER_S", 0.5)  # the scripted endpoint sends no heartbeat
    endpoint = ScriptedEndpoint(f"ipc://{tmp_path}/e.sock", pid=_dead_pid() if engine == "killed" else None)
    session = RemoteSession(endpoint.address, "t", label="scripted")
    try:
        session.connect()
        app = GraphtopApp(session, poll_device=False, device_sample=FIXED_DEVICE, animate=False, tick_hz=20)
        async with app.run_test(size=(160, 48)) as pilot:
            if engine == "killed":
                await wait_until(pilot, lambda: session.ended is not None, timeout=10)
                assert session.ended == f"the engine (pid {endpoint.pid}) exited without closing its endpoint"
                app.clear_notifications()  # the toast goes; the word stays
                await pilot.pause(0.3)
                assert "ENGINE GONE" in screen_text(app) and session.silent_for is None
            else:
                await wait_until(pilot, lambda: "NO WORD FOR" in screen_text(app), timeout=10)
                assert session.ended is None and session.silent_for > 0.5
    finally:
        session.shutdown()
        endpoint.close()


def test_a_remote_engine_only_goes_silent() -> None:
    """Over TCP the pid names a process on another host: it is never taken as gone."""
    session = RemoteSession("tcp://192.0.2.1:5555", "t")
    session._handle(frame(p.Welcome(p.PROTOCOL_VERSION, _dead_pid(), "x", time.time(), p.EngineStatus(), 0, 0, [])))
    session._last_message -= 60
    session._check_liveness(time.monotonic())
    assert session.ended is None and session.silent_for > 59


def test_a_malformed_welcome_refuses_the_attach(tmp_path: Path) -> None:
    endpoint = ScriptedEndpoint(f"ipc://{tmp_path}/e.sock", next_seq=-1)
    try:
        with pytest.raises(AttachError, match="malformed Welcome .next_seq -1"):
            RemoteSession(endpoint.address, "t", connect_timeout=5).connect()
    finally:
        endpoint.close()


# -- graphtop attach at endpoints that are no engine -----------------------------------------------


@pytest.fixture
def runtime(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path_factory.mktemp("rt")
    monkeypatch.setenv("GRAPHTOP_RUNTIME_DIR", str(folder))
    return folder


def attach_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``graphtop attach ARGV`` failed as a usage error: exit 2, one line, no traceback; that line."""
    rc = main(["attach", *argv])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", (rc, out, err)
    assert err.count("\n") == 1 and err.startswith("graphtop: error:") and "Traceback" not in err, err
    return err


def test_attach_names_the_real_reason(capsys, runtime: Path, tmp_path: Path) -> None:
    regular = tmp_path / "notes.txt"
    regular.write_text("x")
    assert "the endpoint is empty" in attach_error(capsys, "")  # was: the current folder, asking for --token
    assert "ipc:// names no socket" in attach_error(capsys, "ipc://", "--token", "t")  # was "refused ...: None"
    for name in (str(tmp_path), f"ipc://{tmp_path}"):
        assert f"{name} is not an engine socket (it is a directory)" in attach_error(capsys, name)
    for name in (str(regular), f"ipc://{regular}"):
        assert f"{name} is not an engine socket (it is a regular file)" in attach_error(capsys, name, "--token", "t")
    assert "no running graphtop engine at ipc:///no/such.sock" in attach_error(capsys, "ipc:///no/such.sock")


def test_a_connect_error_is_the_reason_given() -> None:
    endpoint = "ipc:///tmp/" + "x" * 200  # a Unix socket path holds about 107 bytes: ZeroMQ refuses to connect
    with pytest.raises(AttachError) as info:
        RemoteSession(endpoint, "t", connect_timeout=5).connect()
    message = str(info.value)
    assert message == f"connection to {endpoint} failed: File name too long", message
    assert "None" not in message and "\n" not in message


def test_an_endpoint_without_the_handshake_token_check_is_named_at_once(tmp_path: Path) -> None:
    """An endpoint of protocol 1 takes no token in its handshake: the handshake fails, and the viewer says
    so in one line instead of waiting out its connect timeout in silence."""
    endpoint = ScriptedEndpoint(f"ipc://{tmp_path}/e.sock", gated=False)
    started = time.monotonic()
    try:
        with pytest.raises(AttachError, match="another graphtop version") as info:
            RemoteSession(endpoint.address, "t", connect_timeout=20).connect()
        assert "\n" not in str(info.value) and time.monotonic() - started < 10
    finally:
        endpoint.close()


def test_a_welcome_of_another_protocol_version_refuses_the_attach(tmp_path: Path) -> None:
    """A Welcome of a newer protocol was taken as ours: its messages would then be read by this version's rules."""
    endpoint = ScriptedEndpoint(f"ipc://{tmp_path}/e.sock", protocol=p.PROTOCOL_VERSION + 1)
    try:
        with pytest.raises(AttachError) as info:
            RemoteSession(endpoint.address, "t", connect_timeout=5).connect()
        message = str(info.value)
        assert f"protocol {p.PROTOCOL_VERSION + 1}" in message and f"this viewer's {p.PROTOCOL_VERSION}" in message
        assert "\n" not in message
    finally:
        endpoint.close()


def test_a_closing_before_the_welcome_is_reported_at_once(tmp_path: Path) -> None:
    """The viewer waited out its whole connect timeout (10 s), then said no engine had answered."""
    endpoint = ScriptedEndpoint(f"ipc://{tmp_path}/e.sock", greeting=p.Closing("the engine is shutting down"))
    try:
        began = time.monotonic()
        with pytest.raises(AttachError, match="closing: the engine is shutting down"):
            RemoteSession(endpoint.address, "t", connect_timeout=10).connect()
        assert time.monotonic() - began < 5
    finally:
        endpoint.close()


# -- submits the endpoint refuses ------------------------------------------------------------------


def test_a_prompt_over_the_message_limit_is_refused_before_it_is_sent() -> None:
    """The endpoint refuses a message over ``MAX_MESSAGE_BYTES``; the viewer said nothing and the
    request's view stayed "streaming…" forever. Now it is refused here, one line, nothing sent."""
    from graphtop.tui.sessions.base import SamplingSettings

    session = welcomed()
    with pytest.raises(ValueError, match="1 MiB") as refused:
        session._submit_now("x" * p.MAX_MESSAGE_BYTES, SamplingSettings(), False)
    assert "\n" not in str(refused.value)
    assert session._outbox.empty() and not session._handles
    assert session._submit_now("x" * 1000, SamplingSettings(), False).sent_bytes > 1000  # a normal one goes


def test_a_size_refusal_fails_the_submit_it_answers() -> None:
    """``Refused`` carries no request id; its message size names the submit (an endpoint with a lower
    limit)."""
    from graphtop.tui.sessions.base import SamplingSettings

    session = welcomed()
    small = session._submit_now("hi", SamplingSettings(), False)
    big = session._submit_now("x" * 5000, SamplingSettings(), False)
    session._handle(frame(p.Refused(f"message of {big.sent_bytes} bytes is over the 4096-byte limit", big.sent_bytes)))
    assert big.finished and big.finish_reason == "rejected" and "4096-byte limit" in (big.error or "")
    assert not small.finished and big.request_id not in session._handles
    session._handle(frame(p.Refused("wrong token")))  # any other refusal fails nothing
    assert not small.finished
