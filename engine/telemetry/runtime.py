"""Where endpoints live and how viewers find them: a private per-user runtime folder.

The folder (``$GRAPHTOP_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/graphtop``, else
``/tmp/graphtop-<uid>``) is created with mode 0700 and refused when another user owns it, it is a
symlink, or the user named it and it is open to others, so its Unix sockets cannot be reached by other
users at all. Each serving engine writes one
entry ``<pid>-<n>.json`` (mode 0600) next to its socket: pid, model, device, start time, endpoint and
the endpoint's token. ``graphtop ps`` lists the entries whose process is alive; ``graphtop attach``
reads the token from the entry, so a viewer of the same user never types it.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from .pid_check import process_alive

ENV_RUNTIME_DIR = "GRAPHTOP_RUNTIME_DIR"
MAX_IPC_PATH = 100  # sun_path holds 108 bytes on Linux, 104 on macOS; keep a margin


class EndpointError(Exception):
    """The endpoint cannot be set up or reached; the message is one line."""


def check_tcp_port(address: str, *, wildcard: bool) -> None:
    """Refuse a ``tcp://HOST:PORT`` whose port is outside 1-65535: ZeroMQ takes it modulo 2**16 (99999
    binds or reaches 34463, -1 65535). ``wildcard``: ``*`` (any free port) is allowed, as when serving."""
    _, _, port = address[len("tcp://") :].rpartition(":")
    if wildcard and port == "*":
        return
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        rule = "1-65535 or *" if wildcard else "1-65535"
        raise EndpointError(f"telemetry address {address!r}: the port must be {rule}")


def _runtime_dir_choice() -> tuple[Path, bool]:
    """(folder, given): the per-user folder for sockets and entries, and whether the user named it; the
    one place its environment override is read."""
    override = os.environ.get(ENV_RUNTIME_DIR)
    if override:
        return Path(override).expanduser(), True
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / "graphtop", False
    return Path(tempfile.gettempdir()) / f"graphtop-{os.getuid()}", False


def default_runtime_dir() -> Path:
    """The per-user folder for sockets and entries (``$GRAPHTOP_RUNTIME_DIR`` when set)."""
    return _runtime_dir_choice()[0]


def private_dir(path: Optional[Path] = None) -> Path:
    """Create (or check) ``path`` as a folder only this user can enter; raise EndpointError otherwise.

    A too-open folder of ours is closed to 0700 only when it is the default one, which this program
    names and creates itself. A folder the user gave (``path``, ``$GRAPHTOP_RUNTIME_DIR``) may be shared
    on purpose: changing its mode behind their back could break whatever else uses it, so it is refused
    with its mode instead."""
    given = path is not None
    if path is None:
        path, given = _runtime_dir_choice()
    path = Path(path)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise EndpointError(f"cannot create the runtime folder {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise EndpointError(f"runtime folder {path} is not a folder (a symlink?)")
    if st.st_uid != os.getuid():
        raise EndpointError(f"runtime folder {path} belongs to another user (uid {st.st_uid})")
    if st.st_mode & 0o077:
        mode = stat.S_IMODE(st.st_mode)
        if given:
            raise EndpointError(
                f"runtime folder {path} is open to other users (mode {mode:04o}); make it "
                f"private (chmod 700) or set {ENV_RUNTIME_DIR} to another folder"
            )
        os.chmod(path, 0o700)  # the default folder, ours but too open (e.g. created under a lax umask)
    return path


def new_token() -> str:
    return secrets.token_urlsafe(32)


@dataclass
class EndpointEntry:
    """What ``graphtop ps`` shows and ``graphtop attach`` needs about one serving engine."""

    pid: int
    endpoint: str
    token: str
    model: str
    device: str
    started: float
    path: str = ""  # the entry file itself (not stored)

    @property
    def transport(self) -> str:
        return self.endpoint.split("://", 1)[0]


def entry_stem(pid: int, serial: int) -> str:
    return f"{pid}-{serial}"


def ipc_address(folder: Path, stem: str) -> str:
    path = str(folder / f"{stem}.sock")
    if len(path.encode()) > MAX_IPC_PATH:
        raise EndpointError(
            f"socket path {path} is too long for a Unix socket ({len(path)} > {MAX_IPC_PATH} bytes); "
            f"set {ENV_RUNTIME_DIR} to a shorter folder"
        )
    return f"ipc://{path}"


def write_entry(folder: Path, stem: str, entry: EndpointEntry) -> Path:
    """Write (or replace) the entry atomically with mode 0600: it holds the token."""
    target = folder / f"{stem}.json"
    data = {k: v for k, v in asdict(entry).items() if k != "path"}
    fd, tmp = tempfile.mkstemp(prefix=f".{stem}.", dir=str(folder))  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def remove_entry(folder: Path, stem: str) -> None:
    for suffix in (".json", ".sock"):
        (folder / f"{stem}{suffix}").unlink(missing_ok=True)


MAX_ENTRY_BYTES = 64 << 10
"""An entry is a few hundred bytes; a larger ``*.json`` in the folder is not one."""

MAX_PID = 2**22
"""Linux's largest pid_max: a pid past it (or 0, or negative, which ``kill`` takes for a process
group or every process) is no engine's."""

_ENTRY_TYPES = {"pid": int, "endpoint": str, "token": str, "model": str, "device": str, "started": (int, float)}


def _entry_from(data: object, path: Path) -> Optional[EndpointEntry]:
    """The entry in ``data``, or None when it is not one this version wrote (wrong fields or types)."""
    if not isinstance(data, dict) or set(data) != set(_ENTRY_TYPES):
        return None
    for key, kind in _ENTRY_TYPES.items():
        if isinstance(data[key], bool) or not isinstance(data[key], kind):
            return None
    if not 0 < data["pid"] <= MAX_PID or not math.isfinite(data["started"]) or data["started"] < 0:
        return None
    return EndpointEntry(**data, path=str(path))


def list_entries(folder: Optional[Path] = None, *, prune: bool = True) -> list[EndpointEntry]:
    """Entries of engines still running, oldest first; entries of dead processes (zombies and reused
    pids too, ``pid_check``) are removed."""
    folder = Path(folder) if folder is not None else default_runtime_dir()
    if not folder.is_dir():
        return []
    found: list[EndpointEntry] = []
    for path in sorted(folder.glob("*.json")):
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY_BYTES:
                continue  # a FIFO would block the read, a link to /dev/zero never end it: not an entry
            entry = _entry_from(json.loads(path.read_text(encoding="utf-8")), path)
        except (OSError, ValueError, TypeError, RecursionError):
            continue  # unreadable or from another version: not ours to judge
        if entry is None:
            continue
        if not process_alive(entry.pid, entry.started):
            if prune:
                remove_entry(folder, path.stem)
            continue
        found.append(entry)
    return sorted(found, key=lambda e: e.started)


def _socket_file(endpoint: str) -> Optional[str]:
    """The real path of the socket file an ``ipc://PATH`` endpoint or a bare PATH names (None for TCP,
    an empty path or Linux's abstract ``@NAME``): ``./x.sock``, ``a//x.sock``, a link to the socket and
    a relative ``ipc://x.sock`` all name one file, so they are compared resolved, never as typed."""
    path = endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else "" if "://" in endpoint else endpoint
    if not path or path.startswith("@"):
        return None
    return os.path.realpath(path)


def find_entry(endpoint: str, folder: Optional[Path] = None) -> Optional[EndpointEntry]:
    """The entry whose endpoint (or pid, or socket path) is ``endpoint``. Only entries of this user's
    private folder are candidates, so a path resolved to one of their sockets names that engine."""
    entries = list_entries(folder)
    for entry in entries:
        if endpoint in (entry.endpoint, str(entry.pid)):
            return entry
    wanted = _socket_file(endpoint)
    if wanted is None:
        return None
    for entry in entries:
        if entry.transport == "ipc" and _socket_file(entry.endpoint) == wanted:
            return entry
    return None
