"""GGUF files: dequantized through transformers' GGUF support into a cached safetensors folder.

Why a folder: reading a GGUF through transformers parses its metadata several times and dequantizes
every tensor (tens of seconds even for a 135M model on two cores); the folder it produces loads like
any checkpoint (memory-mapped, well under a second). So a GGUF file is converted once, into the user
cache, keyed by the file's path, size and modification time, and every later load reads the folder.

What the conversion fixes up (transformers 5.x): a config read from GGUF has no ``architectures``
(set from ``model_type``) and carries a ``quantization_config`` that would make the folder look
quantized (dropped); ``save_pretrained`` refuses GGUF-loaded models, so the state dict is written
with safetensors directly, minus a tied ``lm_head.weight``.

What it restores (transformers 5.x reads some families' metadata only in part): gguf_metadata.py.

What the conversion checks first (a refused file leaves nothing in the cache): the metadata under
config.json's rules (config_check), the declared model's size against the host, the tokenizer
(tokenizer_check), and every weight of the declared model present in the file's tensor table with its
shape, all before transformers allocates the model; then what transformers reports it could not load
(it would fill a missing weight with random values, print a load report and carry on).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

from ..errors import CheckpointError
from ..registry import architecture_name, model_class, spec_from_hf_config, stored_shapes
from ..spec import ModelSpec
from .cache import build_once, cache_root, no_progress_bars
from .config_check import (
    check_architecture_fields,
    check_config_fields,
    check_model_fits,
    check_spec,
    ignored_token_ids,
    no_token_id_warning,
)
from .gguf_metadata import restore_metadata
from .paths import expand_user, resolve
from .tokenizer_check import check_tokenizer
from .weight_checks import check_finite

GGUF_SUFFIX = ".gguf"
GGUF_EXTRA = "pip install 'graphtop[gguf]'"
SOURCE_FILE = "gguf_source.json"  # what a cached folder was converted from

CONVERTING = "converting GGUF to the cache (one time)"
"""What a first load of a .gguf says it does: tens of seconds (dequantizing every tensor) that later loads skip."""

Progress = Callable[[str, str, int, int], None]
"""``progress(label, step, done, total)``: where a conversion is (``total`` 0: a step of unknown length).
Called on the loading thread; it must be quick and must not raise."""


def _no_progress(label: str, step: str, done: int, total: int) -> None:
    pass


def is_gguf(path: Path) -> bool:
    return path.suffix.lower() == GGUF_SUFFIX


def gguf_folder(
    gguf_file: Path | str, cache_dir: Path | str | None = None, progress: Optional[Progress] = None
) -> Path:
    """The checkpoint folder converted from ``gguf_file``, converting it on first use (``progress`` hears how
    far the conversion is; a load from the cache says nothing)."""
    file = _real_file(gguf_file)
    if not file.exists():
        raise CheckpointError(f"GGUF file not found: {gguf_file}")
    if not file.is_file():
        raise CheckpointError(f"GGUF path is not a file: {gguf_file}")
    return build_once(converted_folder(file, cache_dir), lambda staging: convert_gguf(file, staging, progress))


def _real_file(gguf_file: Path | str) -> Path:
    """The file a GGUF path names, every link followed (the cache key is the real file's)."""
    return resolve(expand_user(gguf_file, f"GGUF file {gguf_file}"), f"GGUF file {gguf_file}")


def converted_folder(gguf_file: Path | str, cache_dir: Path | str | None = None) -> Path:
    """Where the conversion of ``gguf_file`` lives in the cache (whether or not it exists yet): keyed by the
    file's resolved path, size and modification time, so a changed file is converted again."""
    file = _real_file(gguf_file)
    st = file.stat()
    key = hashlib.sha1(f"{file}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_root(cache_dir) / "gguf" / f"{file.stem}-{key}"


def convert_gguf(gguf_file: Path, folder: Path, progress: Optional[Progress] = None) -> None:
    """Write an HF safetensors checkpoint (config, weights, tokenizer) of ``gguf_file`` into ``folder``.

    Everything is checked before anything is written (``build_once`` then removes the staging folder, so a
    refused file leaves no cache entry): the metadata as config.json would be, the size against the host
    before transformers allocates the model, the tokenizer, and every tensor present with its shape
    (transformers would fill a missing one with random values, print a load report and carry on)."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise CheckpointError(f"reading GGUF needs the package(s) {', '.join(missing)}: {GGUF_EXTRA} ({gguf_file})")
    from transformers import AutoConfig, AutoTokenizer

    def say(step: str, done: int = 0, total: int = 0) -> None:
        (progress or _no_progress)(CONVERTING, step, done, total)

    where, name = str(gguf_file.parent), gguf_file.name
    say("reading the metadata")
    reader = _tensor_table(gguf_file)  # the file's layout, before transformers dequantizes from it
    _no_experts(reader, gguf_file)
    with no_token_id_warning(None):  # checked below, as config.json's would be
        config = _read(lambda: AutoConfig.from_pretrained(where, gguf_file=name), "metadata", gguf_file)
    arch = architecture_name(config)
    config.architectures = [arch]
    restore_metadata(reader, config)  # what transformers' reader leaves out for Gemma and Phi-3
    spec = _checked_spec(config, gguf_file)  # refuses what graphtop cannot run, before the slow part
    _check_tensors(spec, reader, gguf_file)
    say("reading the tokenizer")
    tokenizer = _read(lambda: AutoTokenizer.from_pretrained(where, gguf_file=name), "tokenizer", gguf_file)
    check_tokenizer(tokenizer, spec.vocab_size, str(gguf_file))
    model = _load_model(where, name, gguf_file, lambda done, total: say("tensor", done, total))
    restore_metadata(reader, model.config)  # its config is read from the file again: the folder's config.json
    say("checking the weights")
    _check_finite(model, gguf_file)
    say("writing the converted folder")
    _write(model, tokenizer, arch, gguf_file, folder)


def _no_experts(reader: Any, gguf_file: Path) -> None:
    """Refuse a mixture of experts (``<arch>.expert_count`` above 0: llama.cpp's Mixtral, Qwen3-MoE): llama.cpp
    stores each layer's experts merged in one tensor, which neither transformers' reader nor graphtop's
    expert weights take; read as its dense base it would serve another model."""
    for name, field in reader.fields.items():
        if name.endswith(".expert_count") and field.data and int(field.contents()) > 0:
            raise CheckpointError(
                f"GGUF metadata declares a mixture of {int(field.contents())} experts: GGUF files of "
                f"mixture-of-experts models are not supported (load the Hugging Face checkpoint) in {gguf_file}"
            )


def config_dict(config: Any) -> dict[str, Any]:
    """The config.json a converted folder gets: transformers' config of the GGUF, minus the
    ``quantization_config`` a GGUF-read config carries (the weights are written dequantized)."""
    data = config.to_dict()
    data.pop("quantization_config", None)
    return data


def _checked_spec(config: Any, gguf_file: Path) -> ModelSpec:
    """config_check's rules on the metadata, as on any config.json, and the model's size against the host:
    a tiny file can declare a model of any size, which transformers would allocate before reading a tensor."""
    where = str(gguf_file)
    try:
        data = config_dict(config)
        check_architecture_fields(data, where)
        check_config_fields(data, where)
        for key in ignored_token_ids(data, where):
            setattr(config, key, None)
        spec = spec_from_hf_config(config, where)
        check_spec(spec, where)
    except CheckpointError as err:
        raise CheckpointError(str(err).replace("config.json: ", "GGUF metadata: ", 1)) from None
    check_model_fits(spec, torch.float32, "cpu", where)  # dequantized to float32 on the host
    return spec


def _tensor_table(gguf_file: Path) -> Any:
    """gguf-py's reader of the file (what transformers reads it with), refusing a file that is cut short or
    whose tensors share data bytes: gguf-py reports the first as "cannot reshape array", and serves the
    second, so two weights would silently hold the same (wrong) values. safetensors refuses both."""
    reader = _read(lambda: _bounded_reader(gguf_file), "metadata", gguf_file)
    _check_disjoint(reader.tensors, gguf_file)
    return reader


class _Truncated(Exception):
    pass


def _bounded_reader(gguf_file: Path) -> Any:
    """A ``GGUFReader`` whose every read past the end of the file raises ``_Truncated`` (said as such) instead
    of coming back short. ``_get`` is gguf-py's one reading primitive; were it renamed, a truncated file would
    still be refused, only in gguf-py's words."""
    import gguf
    import numpy as np

    class Reader(gguf.GGUFReader):
        def _get(self, offset: int, dtype: Any, count: int = 1, *args: Any, **kwargs: Any) -> Any:
            end = int(offset) + np.dtype(dtype).itemsize * int(count)
            if end > self.data.size:
                raise _Truncated(end, self.data.size)
            return super()._get(offset, dtype, count, *args, **kwargs)

    try:
        return Reader(str(gguf_file))
    except _Truncated as cut:
        end, size = cut.args
        raise CheckpointError(
            f"GGUF file is truncated: its tensor table or data reaches byte {end:,}, the file "
            f"holds {size:,} bytes in {gguf_file}"
        ) from None


def _check_disjoint(tensors: Any, gguf_file: Path) -> None:
    """No two tensors' data byte ranges overlap (a tensor table may point anywhere in the file)."""
    spans = sorted((int(t.data_offset), int(t.data_offset) + int(t.n_bytes), t.name) for t in tensors if t.n_bytes)
    for (_, end, first), (start, stop, second) in zip(spans, spans[1:]):
        if start < end:
            raise CheckpointError(
                f"GGUF tensors '{first}' and '{second}' overlap in the file (their data share "
                f"{min(end, stop) - start:,} bytes): refused in {gguf_file}"
            )


def _check_tensors(spec: ModelSpec, reader: Any, gguf_file: Path) -> None:
    """Every weight of the model the metadata declares, present in the file with its shape, checked from
    the tensor table alone (nothing is dequantized) before transformers allocates the model: it would
    random-initialise a missing or mis-shaped weight, and a tiny file can declare any number of layers."""
    held = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}  # GGUF lists dims inner first
    names = _gguf_names(reader, spec.num_layers)
    if names is None:
        return  # an architecture gguf-py does not map: _load_model's check of what transformers loaded decides
    with torch.device("meta"):
        params = {n: tuple(p.shape) for n, p in model_class(spec)(spec).named_parameters()}  # tied lm_head once
    wanted = stored_shapes(spec, params)  # transformers' names, which gguf-py maps (Phi-3's fused ones too)
    missing = []
    for hf_name, shape in wanted.items():
        base, _, suffix = hf_name.rpartition(".")
        mapped = names.get_name(base)
        if mapped is None:
            continue
        tensor = f"{mapped}.{suffix}"
        if tensor not in held:
            missing.append(f"'{tensor}' ({hf_name})")
        elif held[tensor] != shape:
            raise CheckpointError(
                f"GGUF tensor '{tensor}' has shape {list(held[tensor])}, the model its metadata "
                f"declares needs {list(shape)} in {gguf_file}"
            )
    if missing:
        raise CheckpointError(f"GGUF file lacks tensor {missing[0]}{_more(missing)} in {gguf_file}")


def _gguf_names(reader: Any, num_layers: int) -> Any:
    """gguf-py's map from HF module names to the file's tensor names (what transformers' GGUF loader
    uses), or None for an architecture it does not know."""
    import gguf

    field = reader.fields.get("general.architecture")
    if field is None or not field.data:
        return None
    arch = bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    key = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
    return None if key is None else gguf.get_tensor_name_map(key, num_layers)


def _load_model(where: str, name: str, gguf_file: Path, tensors: Callable[[int, int], None]) -> Any:
    """transformers' model of the GGUF, refused when a parameter was missing from the file or had another
    shape (transformers reports those in a table on stderr, random-initialises them and goes on). numpy's
    warnings about non-finite values while dequantizing stay off stderr: ``_check_finite`` refuses those
    weights in one line. ``tensors(done, total)`` hears each tensor dequantized."""
    import numpy as np
    from transformers import AutoModelForCausalLM

    with no_progress_bars(), _counted_dequantize(tensors), _transformers_errors_only(), np.errstate(all="ignore"):
        model, info = _read(
            lambda: AutoModelForCausalLM.from_pretrained(
                where, gguf_file=name, output_loading_info=True, ignore_mismatched_sizes=True
            ),
            "tensors",
            gguf_file,
        )
    mismatched = sorted(info.get("mismatched_keys") or (), key=str)
    if mismatched:
        key, stored, wanted = mismatched[0]
        raise CheckpointError(
            f"GGUF tensor for '{key}' has shape {list(stored)}, the model its metadata declares "
            f"needs {list(wanted)}{_more(mismatched)} in {gguf_file}"
        )
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise CheckpointError(f"GGUF file lacks tensor '{missing[0]}'{_more(missing)} in {gguf_file}")
    return model


def _check_finite(model: Any, gguf_file: Path) -> None:
    """Every dequantized weight finite before anything is written (a tensor whose type field lies, or a
    quantized block with an infinite scale, dequantizes to NaN): refused afterwards, at load, the weights
    would already sit in the cache, hundreds of MB that every later load refuses again, named there
    rather than in the user's file."""
    for key, tensor in model.state_dict().items():
        check_finite(key, tensor, gguf_file)


def _more(items: Any) -> str:
    return f" (and {len(items) - 1} more)" if len(items) > 1 else ""


def _write(model: Any, tokenizer: Any, arch: str, gguf_file: Path, folder: Path) -> None:
    """The checked model as a checkpoint folder: config.json last, the mark of a complete folder."""
    from safetensors.torch import save_file

    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    weights = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    data = config_dict(model.config)
    data["architectures"] = [arch]
    (folder / "generation_config.json").write_text(model.generation_config.to_json_string())
    tokenizer.save_pretrained(folder)
    st = gguf_file.stat()
    source = {"gguf_file": str(gguf_file), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    (folder / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
    (folder / "config.json").write_text(json.dumps(data, indent=2) + "\n")


@contextmanager
def _transformers_errors_only() -> Iterator[None]:
    """transformers' warnings off while it loads the tensors: what its load report says (missing or
    mis-shaped tensors) is checked here and refused in one line instead."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _read(load: Any, what: str, file: Path) -> Any:
    try:
        return load()
    except CheckpointError:
        raise
    except Exception as err:
        msg = _one_line(str(err)) or type(err).__name__
        raise CheckpointError(
            f"GGUF {what} not readable by transformers ({type(err).__name__}: {msg}) in {file}"
        ) from None


_REASON_CHARS = 300


def _one_line(reason: str) -> str:
    """transformers' reason joined into one line, not cut at its first: a config validation error's first line
    names only the validator ("Class validation error for validator 'validate_architecture':"), the reason
    follows it. Bounded, so a long report stays a readable line."""
    text = " ".join(line.strip() for line in reason.splitlines() if line.strip())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 1] + "…"


def _counting(items: Iterable[Any], tensors: Callable[[int, int], None]) -> Iterator[Any]:
    """``items`` one by one, saying how many are done after each."""
    items = list(items)
    tensors(0, len(items))
    for done, item in enumerate(items, 1):
        yield item
        tensors(done, len(items))


@contextmanager
def _counted_dequantize(tensors: Callable[[int, int], None]) -> Iterator[None]:
    """transformers' dequantization loop draws a plain tqdm bar on stderr, outside its own progress-bar
    switch; a stray bar would tear the dashboard or the headless progress display. The loop iterates over
    that bar, so its place is taken by an iterator that reports each tensor to ``tensors`` instead (the
    loading progress the displays draw); a transformers without the name keeps its bar switched off."""
    from transformers import modeling_gguf_pytorch_utils as mod

    bar = getattr(mod, "tqdm", None)
    if bar is None:
        yield
        return

    def counted(iterable: Any = None, *args: Any, **kwargs: Any) -> Any:
        if iterable is None:  # a bar driven by hand: kept, switched off
            return bar(*args, **{**kwargs, "disable": True})
        return _counting(iterable, tensors)

    mod.tqdm = counted
    try:
        yield
    finally:
        mod.tqdm = bar
