"""Find and validate the files of a checkpoint folder before anything heavy happens.

Every problem becomes a one-line CheckpointError naming it and the path. Pickle weights
are refused outright: unpickling runs arbitrary code, and safetensors is memory-mapped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import safe_open

from .errors import CheckpointError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_folder(path: Path) -> None:
    if not path.exists():
        raise CheckpointError(f"checkpoint folder not found: {path}")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint path is not a folder (nor a .gguf file): {path}")


def read_json(file: Path, what: str) -> dict[str, Any]:
    """Parse a JSON object, reporting syntax errors with line and column."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        where = f"line {err.lineno} column {err.colno}"
        raise CheckpointError(f"malformed {what}: {err.msg} at {where} in {file}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"unreadable {what}: {err} in {file}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"malformed {what}: top level is not a JSON object in {file}")
    return data


def read_config_json(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.is_file():
        raise CheckpointError(f"no config.json in {path}")
    return read_json(file, "config.json")


class SafetensorsReader:
    """A memory-mapped safetensors file whose reads fail as CheckpointError.

    Only calls into safetensors are guarded, so a bug in the caller is never
    mislabelled as a corrupt file.
    """

    def __init__(self, file: Path, device: str = "cpu") -> None:
        self.file = file
        self._handle = self._guard(safe_open, str(file), framework="pt", device=device)
        self.names: frozenset[str] = frozenset(self._guard(self._handle.keys))

    def _guard(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # SafetensorError has no stable import path; OSError for I/O
            raise CheckpointError(f"corrupt or truncated safetensors file: {err} in {self.file}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._guard(lambda: self._handle.get_slice(name).get_shape()))

    def tensor(self, name: str) -> torch.Tensor:
        return self._guard(self._handle.get_tensor, name)


def tensor_locations(path: Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file holding it (sharded or single)."""
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index, INDEX_FILE).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"malformed {INDEX_FILE}: no 'weight_map' object in {path}")
        for shard in sorted(set(weight_map.values())):
            if not (path / shard).is_file():
                raise CheckpointError(f"{INDEX_FILE} names missing shard '{shard}' in {path}")
        return {name: path / shard for name, shard in weight_map.items()}
    single = path / SINGLE_FILE
    files = [single] if single.is_file() else sorted(path.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            more = f" and {len(pickles) - 1} more" if len(pickles) > 1 else ""
            raise CheckpointError(
                f"refusing pickle weights ({pickles[0]}{more}) in {path}: convert to safetensors"
            )
        raise CheckpointError(f"no weights (*.safetensors) in {path}")
    locations: dict[str, Path] = {}
    for file in files:
        locations.update(dict.fromkeys(SafetensorsReader(file).names, file))
    return locations


def has_tokenizer_files(path: Path) -> bool:
    return any((path / name).is_file() for name in TOKENIZER_FILES)
