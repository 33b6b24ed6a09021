"""Writing output files without destroying what is already there.

The one home for how graphtop writes a file the user named (``--output``, ``--record``, the Perfetto
export, the dashboard's trace export):

* an output path that names an input, or another output of the same run, is refused before anything
  runs (``check_distinct``): ``--prompts X --output X`` would otherwise overwrite the prompts;
* a regular file (or a new one) is written to a temporary file in the same folder and renamed over the
  target at the end (``write_atomic``), so an interrupted or failed write leaves the old file or the
  complete new one, never half of either; an existing file keeps its permission bits;
* a target that is not a regular file (a character device such as ``/dev/null``, a FIFO) is written
  straight through: a rename would replace the device node with a plain file; a Unix socket, which no
  file open reaches, is refused up front;
* a symbolic link is never replaced and never followed to replace what it points at: a link to a
  device or FIFO (``/dev/stdout``) is written through, a link to a regular file, a folder or nothing
  is refused (give the file's own path).

A live trace (``open_staged``) is streamed into a temporary file beside its target and renamed over
it once the run has started (``StagedFile.publish``): a run that fails before that (a model that does not
load) leaves the older file as it was, and from then on the trace is readable at its own path while the
run goes on and after a kill (the rename keeps the open file).
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Optional, Sequence, Union

__all__ = [
    "OutputPathError",
    "OutputTarget",
    "StagedFile",
    "check_distinct",
    "check_output",
    "open_staged",
    "write_atomic",
]

PathLike = Union[str, "os.PathLike[str]"]
NEW_FILE_MODE = 0o666  # the kernel applies the umask, as for any new file


class OutputPathError(ValueError):
    """An output path that cannot be written safely; the message is one line."""


@dataclass(frozen=True)
class OutputTarget:
    """What is at an output path now, and so how it must be written."""

    path: Path
    kind: str  # "new" | "regular" | "stream" (device, FIFO: written straight through)
    mode: Optional[int] = None  # permission bits of an existing regular file

    @property
    def streams(self) -> bool:
        return self.kind == "stream"


def _lstat(path: Path, label: str) -> Optional[os.stat_result]:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None  # a missing parent is reported by check_output, naming it
    except OSError as exc:
        raise OutputPathError(f"{label} {path}: {exc.strerror or exc}") from None


def _check_link(path: Path, label: str) -> OutputTarget:
    try:
        st = os.stat(path)
    except OSError:
        raise OutputPathError(f"{label} {path} is a symbolic link to nothing; give a real file path") from None
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        raise OutputPathError(
            f"{label} {path} is a symbolic link (to {os.readlink(path)}); graphtop never replaces a link "
            "or writes through it: give the file's own path"
        )
    if stat.S_ISSOCK(st.st_mode):
        raise _socket_refused(path, label)
    if not os.access(path, os.W_OK):
        raise OutputPathError(f"{label} {path} is not writable")
    return OutputTarget(path, "stream")


def _socket_refused(path: PathLike, label: str) -> OutputPathError:
    """A Unix socket is written through like a device by the rules above, but no file can open one
    (ENXIO): the run found out only at its end, after the whole workload. A FIFO stays allowed."""
    return OutputPathError(f"{label} {path} is a Unix socket, which cannot be opened as a file; give a file path")


def _names_a_folder(raw: str) -> bool:
    """``out/``, ``out/.``, ``..``: pathlib drops a trailing slash or dot, so ``trace.jsonl/`` would
    otherwise become ``trace.jsonl`` and be written over."""
    if raw in ("", ".", ".."):
        return True
    seps = os.sep + (os.altsep or "")
    return raw[-1] in seps or os.path.basename(raw) in (".", "..")


def check_output(path: PathLike, label: str, *, probe: bool = False) -> OutputTarget:
    """Classify ``path`` for writing, or raise :class:`OutputPathError` naming ``label`` (the flag).

    ``probe``: also create (and remove) a temporary file beside a regular or new target, as the write
    will: permission bits alone say nothing for root, a read-only mount or /proc, and a run that finds
    out only at its end has done its work for nothing.
    """
    raw = os.fspath(path)
    if _names_a_folder(raw):
        kind = "is a directory" if os.path.isdir(raw) else "names a folder (it ends in / or a dot), not a file"
        raise OutputPathError(f"{label} {raw} {kind}")
    p = Path(path)
    st = _lstat(p, label)
    if st is not None and stat.S_ISLNK(st.st_mode):
        return _check_link(p, label)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputPathError(f"{label} {path} is a directory")
    if st is not None and stat.S_ISSOCK(st.st_mode):
        raise _socket_refused(path, label)
    if st is not None and not stat.S_ISREG(st.st_mode):
        if not os.access(p, os.W_OK):
            raise OutputPathError(f"{label} {path} is not writable")
        return OutputTarget(p, "stream")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise OutputPathError(f"{label} {path}: folder {parent} does not exist")
    if not parent.is_dir():
        raise OutputPathError(f"{label} {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK) or (st is not None and not os.access(p, os.W_OK)):
        raise OutputPathError(f"{label} {path} is not writable")
    if probe:
        try:
            fd, tmp = _temp_beside(p)
        except OSError as exc:
            raise OutputPathError(f"{label} {path}: cannot create a file in {parent}: {exc.strerror or exc}") from None
        try:  # an interrupt raised as os.close returns must not leave the probe behind
            os.close(fd)
        finally:
            _remove_quietly(tmp)
    if st is None:
        return OutputTarget(p, "new")
    return OutputTarget(p, "regular", stat.S_IMODE(st.st_mode))


def _identity(path: PathLike) -> tuple:
    """Same tuple for two names of one file: (device, inode) when it exists, else the real path."""
    try:
        st = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(path))
    return ("inode", st.st_dev, st.st_ino)


def check_distinct(
    outputs: Sequence[tuple[str, Optional[PathLike]]], inputs: Sequence[tuple[str, Optional[PathLike]]] = ()
) -> None:
    """Refuse an output that is an input or another output (links and hard links included).

    Each entry is ``(label, path)``; entries whose path is None are ignored.
    """
    seen_inputs = [(label, path, _identity(path)) for label, path in inputs if path is not None]
    seen_outputs: list[tuple[str, PathLike, tuple]] = []
    for label, path in outputs:
        if path is None:
            continue
        ident = _identity(path)
        for in_label, in_path, in_ident in seen_inputs:
            if ident == in_ident:
                raise OutputPathError(
                    f"{label} {path} is the same file as {in_label} {in_path}: writing it would destroy the input"
                )
        for out_label, out_path, out_ident in seen_outputs:
            if ident == out_ident:
                raise OutputPathError(f"{label} {path} and {out_label} {out_path} name the same file")
        seen_outputs.append((label, path, ident))


def _temp_stem(name: str, parent: Path) -> str:
    """``name`` cut so ``.{stem}.{8 hex}.tmp`` fits the folder's name limit: a legal 242–255-byte target
    name was refused as "File name too long" over its temporary file's name."""
    try:
        limit = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    room = max(limit - len(".." + "0" * 8 + ".tmp"), 1)
    raw = os.fsencode(name)
    return name if len(raw) <= room else os.fsdecode(raw[:room].decode("utf-8", "ignore").encode("utf-8"))


def _remove_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _temp_beside(target: Path) -> tuple[int, Path]:
    """A new file beside ``target`` and its descriptor. A Python signal handler runs as a C call returns, so
    a SIGTERM landing during ``os.open`` raises after the file was made and before its name is handed back:
    it is removed here, the caller having nothing to remove it by."""
    parent = target.parent if str(target.parent) else Path(".")
    stem = _temp_stem(target.name, parent)
    for _ in range(100):
        tmp = parent / f".{stem}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), NEW_FILE_MODE)
        except FileExistsError:
            continue
        except BaseException:  # an interrupt (SIGTERM) raised as os.open returned: the file exists, unheld
            _remove_quietly(tmp)
            raise
        return fd, tmp
    raise FileExistsError(f"no free temporary name beside {target}")


def write_atomic(path: PathLike, write: Callable[[BinaryIO], None], label: str = "output") -> None:
    """Write ``path`` through ``write(binary_file)`` under the rules in the module docstring.

    The target is classified again here (a long run may have given it time to change). ``OSError``
    from the writing itself propagates; the temporary file is removed first.
    """
    target = check_output(path, label)
    if target.streams:
        with open(target.path, "wb") as f:
            write(f)
        return
    fd, tmp = _temp_beside(target.path)
    try:
        if target.mode is not None:
            os.fchmod(fd, target.mode)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target.path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@dataclass
class StagedFile:
    """An unbuffered binary file written beside its target until ``publish`` renames it into place.

    ``staged`` is None once published, and for a target written straight through (a device, a FIFO).
    """

    file: BinaryIO
    target: Path
    label: str
    staged: Optional[Path] = None

    def publish(self) -> None:
        """Rename the staged file over the target (idempotent); the open file keeps writing to it.

        The target is classified again first: it may have become a link or a folder meanwhile.
        """
        if self.staged is None:
            return
        check_output(self.target, self.label)
        os.replace(self.staged, self.target)
        self.staged = None

    def discard(self) -> None:
        """Close the file and remove it unless published: the target keeps what it held."""
        try:
            self.file.close()
        finally:
            if self.staged is not None:
                try:
                    os.unlink(self.staged)
                except OSError:
                    pass
                self.staged = None


def open_staged(path: PathLike, label: str = "output") -> StagedFile:
    """Open ``path`` for a live, unbuffered stream of whole lines (the trace recorder).

    A regular or new target is written to a temporary file beside it (the existing file's mode kept)
    until ``publish``; a device or FIFO is opened in place.
    """
    target = check_output(path, label)
    if target.streams:
        fd = os.open(target.path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        return StagedFile(os.fdopen(fd, "wb", buffering=0), target.path, label)
    fd, tmp = _temp_beside(target.path)
    try:
        if target.mode is not None:
            os.fchmod(fd, target.mode)
        return StagedFile(os.fdopen(fd, "wb", buffering=0), target.path, label, tmp)
    except BaseException:  # an error, or an interrupt (Ctrl-C, SIGTERM): no temporary file is left behind
        os.close(fd)
        os.unlink(tmp)
        raise
