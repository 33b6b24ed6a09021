"""Find and validate the files of a checkpoint folder before anything heavy happens.

Every problem becomes a one-line CheckpointError naming it and the path. Pickle weights
are refused outright: unpickling runs arbitrary code, and safetensors is memory-mapped.
Every file read must resolve inside the folder: an index naming ``../x`` or ``/etc/passwd`` is
refused, and so is a symbolic link that leaves the folder unless the caller allows external files
(``--allow-external-weights``; a Hugging Face cache snapshot links into ``../../blobs``).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import safe_open

from ..errors import CheckpointError
from .paths import LINK_LOOP, resolve

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
TOKENIZER_EXTRAS = (
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)
CHAT_TEMPLATE_DIR = "additional_chat_templates"  # transformers reads every *.jinja in it
_NOT_REGULAR = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def check_folder(path: Path) -> None:
    """A checkpoint folder that exists and can be listed and entered. An unreadable one (``chmod 000``)
    is said to be so here: past this point every file in it looks missing ("no config.json")."""
    if not path.exists():
        raise CheckpointError(f"checkpoint folder not found: {path}")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint path is not a folder (nor a .gguf file): {path}")
    try:
        os.listdir(path)  # read permission: its files are found by listing it
        os.stat(os.path.join(path, "."))  # search permission: they are opened through it (pathlib drops ".")
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint folder {path}: {err.strerror or err}") from None


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


class _NonFinite(ValueError):
    pass


class _Duplicate(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen[key] = value
    return seen


def read_json(file: Path, what: str, unique_keys: bool = False) -> dict[str, Any]:
    """Parse a JSON object, reporting syntax errors with line and column; NaN/Infinity are refused, and with
    ``unique_keys`` a key given twice in one object (json keeps the last one without a word)."""
    try:
        data = json.loads(
            file.read_text(encoding="utf-8"),
            parse_constant=_refuse_constant,
            object_pairs_hook=_unique_keys if unique_keys else None,
        )
    except _Duplicate as err:
        raise CheckpointError(f"malformed {what}: key {_quoted_key(err.args[0])} appears twice in {file}") from None
    except json.JSONDecodeError as err:
        where = f"line {err.lineno} column {err.colno}"
        raise CheckpointError(f"malformed {what}: {err.msg} at {where} in {file}") from None
    except _NonFinite as err:
        raise CheckpointError(f"malformed {what}: {err.args[0]} is not a finite number in {file}") from None
    except RecursionError:
        raise CheckpointError(f"malformed {what}: nested too deeply in {file}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"unreadable {what}: {err} in {file}") from None
    except ValueError as err:  # an integer literal of more than 4300 digits
        raise CheckpointError(f"malformed {what}: {str(err).splitlines()[0][:80]} in {file}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"malformed {what}: top level is not a JSON object in {file}")
    return data


def _quoted_key(key: str) -> str:
    return repr(key) if len(key) <= 80 else repr(key[:77] + "...")


def inside(folder: Path, name: str, allow_external: bool = False, what: str = "file") -> Path:
    """``folder / name``, refused unless it resolves inside ``folder``.

    A relative name without ``..`` is required whatever ``allow_external`` says: the index names files
    *of* the folder. A symbolic link that leaves the folder is refused unless ``allow_external``.
    """
    if not isinstance(name, str) or not name or "\0" in name:
        raise CheckpointError(f"bad {what} name {name!r} in {folder}")
    parts = Path(name).parts
    if Path(name).is_absolute() or ".." in parts:
        raise CheckpointError(f"{what} '{name}' is outside the checkpoint folder {folder}: refused")
    path = folder / name
    check_regular(path, what)
    if not allow_external:
        real, root = resolve(path, f"{what} '{name}' in {folder}"), resolve(folder, f"checkpoint folder {folder}")
        if real != root and root not in real.parents:
            raise CheckpointError(
                f"{what} '{name}' is a link to {real}, outside the checkpoint folder {folder}: refused "
                "(--allow-external-weights allows it, e.g. for a Hugging Face cache snapshot)"
            )
    return path


def check_regular(path: Path, what: str = "file") -> None:
    """Refuse a checkpoint file that exists but is not a regular file (through links): opening a FIFO
    blocks the loader forever, and transformers silently skips one (a tokenizer_config.json or a chat
    template that is a FIFO would be dropped without a word), nor a link loop (transformers would skip it too, or
    pathlib raise a bare RuntimeError). A missing file is the caller's to judge."""
    try:
        mode = path.stat().st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise CheckpointError(
                f"{what} '{path.name}' is a symbolic link loop ({LINK_LOOP}): refused in {path.parent}"
            ) from None
        return
    if stat.S_ISREG(mode):
        return
    kind = next((label for test, label in _NOT_REGULAR if test(mode)), "not a plain file")
    raise CheckpointError(f"{what} '{path.name}' is {kind}, not a regular file: refused in {path.parent}")


def check_tokenizer_files(path: Path, allow_external: bool = False) -> None:
    """The tokenizer files transformers will open must stay inside the folder too."""
    for name in TOKENIZER_FILES + TOKENIZER_EXTRAS + _extra_chat_templates(path):
        if os.path.lexists(path / name):
            inside(path, name, allow_external, "tokenizer file")


def _extra_chat_templates(path: Path) -> tuple[str, ...]:
    """``additional_chat_templates/*.jinja``, which transformers loads as named chat templates."""
    folder = path / CHAT_TEMPLATE_DIR
    if not folder.is_dir():
        return ()
    return tuple(f"{CHAT_TEMPLATE_DIR}/{p.name}" for p in sorted(folder.glob("*.jinja")))


def read_config_json(path: Path, allow_external: bool = False) -> dict[str, Any]:
    file = path / "config.json"
    if not os.path.lexists(file):
        raise CheckpointError(f"no config.json in {path}")
    return read_json(inside(path, "config.json", allow_external), "config.json")


class SafetensorsReader:
    """A memory-mapped safetensors file whose reads fail as CheckpointError.

    Only calls into safetensors are guarded, so a bug in the caller is never
    mislabelled as a corrupt file.
    """

    def __init__(self, file: Path, device: str = "cpu") -> None:
        self.file = file
        try:  # safetensors reports every failure to open (EACCES too) as "No such file or directory"
            os.close(os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)))
        except OSError as err:
            raise CheckpointError(f"cannot read weights file {file}: {err.strerror or err}") from None
        self._handle = self._guard(safe_open, str(file), framework="pt", device=device)
        self.names: frozenset[str] = frozenset(self._guard(self._handle.keys))

    def _guard(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # SafetensorError has no stable import path; OSError for I/O
            raise CheckpointError(f"corrupt or truncated safetensors file: {err} in {self.file}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._guard(lambda: self._handle.get_slice(name).get_shape()))

    def dtype(self, name: str) -> str:
        """The stored dtype as safetensors spells it (``F32``, ``BF16``, ``I16``, ...)."""
        return str(self._guard(lambda: self._handle.get_slice(name).get_dtype()))

    def tensor(self, name: str) -> torch.Tensor:
        return self._guard(self._handle.get_tensor, name)

    def slice(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        """Rows (``dim`` 0) or columns (``dim`` 1) ``[start, stop)`` of a tensor, reading only those
        (a tensor-parallel rank's shard)."""

        def read() -> torch.Tensor:
            part = self._handle.get_slice(name)
            return part[start:stop] if dim == 0 else part[:, start:stop]

        return self._guard(read)


def tensor_locations(path: Path, allow_external: bool = False) -> dict[str, Path]:
    """Map every tensor name to the safetensors file holding it (sharded or single)."""
    index = path / INDEX_FILE
    if os.path.lexists(index):
        weight_map = read_json(inside(path, INDEX_FILE, allow_external), INDEX_FILE, unique_keys=True).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"malformed {INDEX_FILE}: no 'weight_map' object in {path}")
        if not all(isinstance(shard, str) for shard in weight_map.values()):
            raise CheckpointError(f"malformed {INDEX_FILE}: 'weight_map' values must be file names in {path}")
        shards = {shard: inside(path, shard, allow_external, "shard") for shard in sorted(set(weight_map.values()))}
        for shard, file in shards.items():
            if not file.is_file():
                raise CheckpointError(f"{INDEX_FILE} names missing shard '{shard}' in {path}")
        _no_stray_single_file(path, shards)
        return {name: shards[shard] for name, shard in weight_map.items()}
    single = path / SINGLE_FILE
    files = [single] if os.path.lexists(single) else sorted(path.glob("*.safetensors"))
    files = [inside(path, file.name, allow_external, "weights file") for file in files]
    if not files:
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            more = f" and {len(pickles) - 1} more" if len(pickles) > 1 else ""
            raise CheckpointError(f"refusing pickle weights ({pickles[0]}{more}) in {path}: convert to safetensors")
        raise CheckpointError(f"no weights (*.safetensors) in {path}")
    return _names_by_file(files, path)


def _no_stray_single_file(path: Path, shards: dict[str, Path]) -> None:
    """An index and a ``model.safetensors`` it does not name: graphtop read the shards, transformers reads the
    single file, and which is the model is not decided by a loader's preference (as for a tensor in two
    unindexed files)."""
    if os.path.lexists(path / SINGLE_FILE) and SINGLE_FILE not in shards:
        raise CheckpointError(
            f"both {INDEX_FILE} (with its shards) and a {SINGLE_FILE} it does not name: which "
            f"holds the weights is ambiguous (remove one) in {path}"
        )


def _names_by_file(files: list[Path], path: Path) -> dict[str, Path]:
    """Every tensor name of the unindexed ``files`` mapped to its file; a name in two files is refused (which
    copy is the weight? transformers, which needs an index for several files, has no answer either)."""
    locations: dict[str, Path] = {}
    for file in files:
        for name in sorted(SafetensorsReader(file).names):
            if name in locations:
                raise CheckpointError(
                    f"tensor '{name}' is in both '{locations[name].name}' and '{file.name}' "
                    f"(no {INDEX_FILE} says which to use) in {path}"
                )
            locations[name] = file
    return locations


def has_tokenizer_files(path: Path) -> bool:
    return any((path / name).is_file() for name in TOKENIZER_FILES)
