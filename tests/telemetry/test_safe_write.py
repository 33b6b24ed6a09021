"""safe_write: outputs never destroy inputs, links, device nodes, file modes or an older file."""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path

import pytest

from graphtop.engine.telemetry.safe_write import (
    OutputPathError,
    check_distinct,
    check_output,
    open_staged,
    write_atomic,
)


def _write(data: bytes):
    return lambda f: f.write(data)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_new_file_gets_the_usual_mode_and_no_temp_is_left(tmp_path):
    target = tmp_path / "out.jsonl"
    write_atomic(target, _write(b"new\n"))
    assert target.read_bytes() == b"new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_umask()
    assert os.listdir(tmp_path) == ["out.jsonl"]


def test_existing_file_keeps_its_mode(tmp_path):
    target = tmp_path / "out.jsonl"
    target.write_text("old\n")
    target.chmod(0o640)
    write_atomic(target, _write(b"new\n"))
    assert target.read_bytes() == b"new\n" and stat.S_IMODE(target.stat().st_mode) == 0o640


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "out.jsonl"
    target.write_text("old\n")

    def fail(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_atomic(target, fail)
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["out.jsonl"]


def test_symlink_to_a_regular_file_is_refused_and_left_alone(tmp_path):
    real = tmp_path / "real.jsonl"
    real.write_text("precious\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    with pytest.raises(OutputPathError, match="symbolic link") as info:
        write_atomic(link, _write(b"x"))
    assert "\n" not in str(info.value)
    assert link.is_symlink() and real.read_text() == "precious\n"
    with pytest.raises(OutputPathError, match="symbolic link"):
        open_staged(link)
    assert real.read_text() == "precious\n"


def test_dangling_symlink_is_refused(tmp_path):
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "missing")
    with pytest.raises(OutputPathError, match="link to nothing"):
        check_output(link, "--output")
    assert link.is_symlink() and not (tmp_path / "missing").exists()


def test_device_node_is_written_through_not_replaced(tmp_path):
    write_atomic(os.devnull, _write(b"discarded\n"))
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    link = tmp_path / "null-link"
    link.symlink_to(os.devnull)  # like /dev/stdout -> /proc/self/fd/1
    assert check_output(link, "--output").streams
    write_atomic(link, _write(b"discarded\n"))
    assert link.is_symlink()
    staged = open_staged(link)
    assert staged.staged is None  # a device is written in place
    with staged.file as f:
        f.write(b"line\n")
    staged.publish()
    assert link.is_symlink() and stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_atomic(fifo, _write(b"through the pipe\n"))
    reader.join(10)
    assert got == [b"through the pipe\n"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_unix_socket_is_refused_up_front_also_through_a_link(tmp_path, monkeypatch):
    """A socket passed the up-front check as a stream and failed only when the run's output was written."""
    import socket

    monkeypatch.chdir(tmp_path)  # a short relative path: sun_path is ~108 bytes
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind("s.sock")
        (tmp_path / "link").symlink_to(tmp_path / "s.sock")
        for path in ("s.sock", tmp_path / "link"):
            with pytest.raises(OutputPathError, match=r"--output .* is a Unix socket, which cannot be opened"):
                check_output(path, "--output", probe=True)
            with pytest.raises(OutputPathError, match="Unix socket"):
                write_atomic(path, _write(b"x"), "--output")
    finally:
        server.close()
    assert stat.S_ISSOCK(os.lstat(tmp_path / "s.sock").st_mode)  # left as it was


def test_staged_stream_replaces_the_target_only_when_published_and_keeps_the_mode(tmp_path):
    target = tmp_path / "trace.jsonl"
    target.write_text("an older, longer trace\n")
    target.chmod(0o600)
    staged = open_staged(target)
    staged.file.write(b"{}\n")
    assert target.read_text() == "an older, longer trace\n"  # not yet
    staged.publish()
    staged.file.write(b"[]\n")  # the open file now writes at the target's path
    assert target.read_bytes() == b"{}\n[]\n" and stat.S_IMODE(target.stat().st_mode) == 0o600
    staged.discard()  # after publishing: closes, keeps the file
    assert target.read_bytes() == b"{}\n[]\n" and sorted(os.listdir(tmp_path)) == ["trace.jsonl"]


def test_discarded_staged_stream_leaves_the_older_file_and_no_temporary(tmp_path):
    target = tmp_path / "trace.jsonl"
    target.write_text("precious\n")
    staged = open_staged(target)
    staged.file.write(b"{}\n")
    staged.discard()
    assert target.read_text() == "precious\n" and sorted(os.listdir(tmp_path)) == ["trace.jsonl"]
    new = open_staged(tmp_path / "new.jsonl")
    new.discard()
    assert not (tmp_path / "new.jsonl").exists()


@pytest.mark.parametrize("case", ["dir", "no-parent", "parent-is-file"])
def test_unusable_paths_are_one_line_errors(tmp_path, case):
    (tmp_path / "f").write_text("x")
    path = {"dir": tmp_path, "no-parent": tmp_path / "nope" / "o", "parent-is-file": tmp_path / "f" / "o"}[case]
    with pytest.raises(OutputPathError) as info:
        check_output(path, "--output")
    assert str(info.value).startswith(f"--output {path}") and "\n" not in str(info.value)


def test_distinct_refuses_every_name_of_the_same_file(tmp_path, monkeypatch):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hi\n")
    (tmp_path / "alias").symlink_to(prompts)
    os.link(prompts, tmp_path / "hard")
    monkeypatch.chdir(tmp_path)
    for name in (prompts, "prompts.txt", "./prompts.txt", tmp_path / "alias", tmp_path / "hard"):
        with pytest.raises(OutputPathError, match="same file as --prompts"):
            check_distinct([("--output", name)], [("--prompts", prompts)])
    with pytest.raises(OutputPathError, match="name the same file"):
        check_distinct([("--output", "new.jsonl"), ("--record", tmp_path / "new.jsonl")])
    check_distinct([("--output", "a.jsonl"), ("--record", "b.jsonl"), ("x", None)], [("--prompts", prompts)])
    assert not Path("new.jsonl").exists()


def test_probe_finds_a_folder_where_no_file_can_be_created(tmp_path, monkeypatch):
    """Permission bits pass for root, /proc or a read-only mount; creating the temporary file does not."""
    import graphtop.engine.telemetry.safe_write as sw

    target = tmp_path / "o.jsonl"
    assert check_output(target, "--output", probe=True).kind == "new"
    assert sorted(os.listdir(tmp_path)) == []  # the probe's file is gone
    if Path("/proc/version").is_file():
        with pytest.raises(OutputPathError, match="cannot create a file in /proc"):
            check_output("/proc/version", "--output", probe=True)

    def refuse(_target):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(sw, "_temp_beside", refuse)
    with pytest.raises(OutputPathError, match="Read-only file system") as info:
        check_output(target, "--output", probe=True)
    assert "\n" not in str(info.value)
    assert check_output(target, "--output").kind == "new"  # without the probe: the bits only


@pytest.mark.parametrize("suffix", ["/", "/.", "//", "/./", "/.."])
def test_a_path_ending_in_a_slash_or_dot_is_refused_not_written_over(tmp_path, suffix):
    """pathlib drops a trailing ``/`` or ``/.``: ``trace.jsonl/`` would otherwise replace trace.jsonl."""
    existing = tmp_path / "trace.jsonl"
    existing.write_text("precious\n")
    for name in (f"{existing}{suffix}", f"{tmp_path / 'new'}{suffix}"):
        with pytest.raises(OutputPathError, match=r"(names a folder|is a directory)") as info:
            write_atomic(name, _write(b"x"))
        assert "\n" not in str(info.value)
    assert existing.read_text() == "precious\n" and sorted(os.listdir(tmp_path)) == ["trace.jsonl"]
    with pytest.raises(OutputPathError, match="is a directory"):
        check_output(f"{tmp_path}/.", "--output")


@pytest.mark.parametrize("length", [241, 242, 250, 255])
def test_a_name_at_the_folders_limit_is_written_through_a_shorter_temporary(tmp_path, length):
    """Its temporary name (14 bytes longer) was over 255: a legal name was refused as "File name too long"."""
    target = tmp_path / ("\u00e9" + "b" * (length - 2))  # a two-byte first character: cut on a boundary
    assert len(os.fsencode(target.name)) == length
    target.write_bytes(b"old\n")
    write_atomic(target, _write(b"new\n"))
    assert target.read_bytes() == b"new\n" and sorted(p.name for p in tmp_path.iterdir()) == [target.name]
    staged = open_staged(tmp_path / ("c" * 255), "trace")  # the recorder's staged trace: the same rule
    staged.file.write(b"x")
    staged.publish()
    staged.discard()
    assert (tmp_path / ("c" * 255)).read_bytes() == b"x"


def test_an_interrupt_as_a_temporary_file_is_made_leaves_none_behind(tmp_path: Path, monkeypatch) -> None:
    """A SIGTERM handler raises as the C call it landed in returns: os.open has made the file, the caller
    never got its name. Seen under load: a headless run killed while staging --output left it behind."""
    from graphtop.engine.telemetry import safe_write

    real_open, real_close = os.open, os.close

    def made_then_interrupted(path, *args, **kwargs):
        real_close(real_open(path, *args, **kwargs))
        raise KeyboardInterrupt

    def closed_then_interrupted(fd):
        real_close(fd)
        raise KeyboardInterrupt

    target = tmp_path / "out.jsonl"
    with monkeypatch.context() as m:
        m.setattr(safe_write.os, "open", made_then_interrupted)
        with pytest.raises(KeyboardInterrupt):
            safe_write.open_staged(target, "--output")
    assert list(tmp_path.iterdir()) == []
    with monkeypatch.context() as m:
        m.setattr(safe_write.os, "close", closed_then_interrupted)
        with pytest.raises(KeyboardInterrupt):
            safe_write.check_output(target, "--output", probe=True)
    assert list(tmp_path.iterdir()) == []
