"""load_checkpoint: a HF-format safetensors folder -> ready DecoderForCausalLM + tokenizer.

Cheap checks run first (folder, config, architecture, weight files, tokenizer) so a bad
path fails in milliseconds with one clear line. The module is then built on the meta
device (no host allocation, no random init), materialised on the target device, and
each tensor is read memory-mapped straight onto that device and copied into place.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import torch

from .checkpoint.config_check import (
    check_architecture_fields,
    check_config_fields,
    check_model_fits,
    check_spec,
    ignored_token_ids,
    no_token_id_warning,
    token_id_problem,
)
from .checkpoint.files import (
    SafetensorsReader,
    check_folder,
    check_tokenizer_files,
    has_tokenizer_files,
    inside,
    read_config_json,
    read_json,
    tensor_locations,
)
from .checkpoint.gguf import Progress as GGUFProgress
from .checkpoint.gguf import gguf_folder, is_gguf
from .checkpoint.paths import expand_user, utf8_path
from .checkpoint.tokenizer_check import check_tokenizer
from .checkpoint.weight_checks import FiniteChecks, check_float_dtype, tensor_to_check
from .decoder import DecoderForCausalLM
from .errors import CheckpointError
from .parallel.layout import TensorParallel, tp_problem
from .parallel.loading import ShardLoader, build_sharded
from .registry import architecture_name, check_model_type, model_class, resolve, spec_from_hf_config, stored_at
from .spec import ModelSpec, as_int_tuple, located

log = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}
_SERVABLE = (torch.float32, torch.bfloat16, torch.float16)
# Tensors some exporters leave in checkpoints that carry nothing we need.
_HARMLESS_SUFFIXES = ("rotary_emb.inv_freq", "lm_head.weight")


@dataclass
class LoadedCheckpoint:
    model: DecoderForCausalLM
    tokenizer: Any  # transformers PreTrainedTokenizerBase
    spec: ModelSpec
    path: Path
    hf_config: Any  # transformers PretrainedConfig
    weights_bytes: int

    @property
    def dtype(self) -> torch.dtype:
        return self.model.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.model.embed_tokens.weight.device


def resolve_dtype(dtype: torch.dtype | str | None, hf_config: Any) -> torch.dtype:
    """Explicit dtype wins; None/"auto" takes the config's dtype if servable, else float32."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _SERVABLE:
            raise ValueError(f"unsupported dtype {dtype}; use float32, bfloat16 or float16")
        return dtype
    if dtype is not None and dtype != "auto":
        if str(dtype).lower() not in _DTYPES:
            raise ValueError(f"unsupported dtype '{dtype}'; use float32, bfloat16 or float16")
        return _DTYPES[str(dtype).lower()]
    declared = getattr(hf_config, "dtype", None)
    if declared is None and "torch_dtype" in getattr(hf_config, "__dict__", {}):
        declared = hf_config.__dict__["torch_dtype"]  # transformers 4 spelling
    if isinstance(declared, str):
        declared = _DTYPES.get(declared.lower())
    return declared if declared in _SERVABLE else torch.float32


def _device_str(device: torch.device | str) -> str:
    """safetensors wants an explicit index for CUDA."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


def _load_hf_config(path: Path, ignored: tuple[str, ...] = ()) -> Any:
    """transformers' config of ``path``, the ``ignored`` token-id keys set to None
    (config_check.ignored_token_ids) and transformers' own warning about them kept off stderr."""
    from transformers import AutoConfig

    try:
        with no_token_id_warning(ignored):
            config = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as err:
        raise CheckpointError(f"config.json rejected by transformers ({type(err).__name__}: {err}) in {path}") from None
    for key in ignored:
        setattr(config, key, None)
    return config


def _load_tokenizer(path: Path) -> Any:
    if not has_tokenizer_files(path):
        raise CheckpointError(
            f"no tokenizer files (tokenizer.json / tokenizer_config.json / tokenizer.model) in {path}"
        )
    _check_vocabulary_files(path)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as err:
        raise CheckpointError(f"tokenizer failed to load ({type(err).__name__}: {err}) in {path}") from None


_VOCABULARY_FILES = ("tokenizer.json", "vocab.json", "vocab.txt")
"""Files a tokenizer reads its vocabulary from, besides a tokenizer.model."""


def _check_vocabulary_files(path: Path) -> None:
    """Refuse, before transformers tries, a tokenizer folder it cannot read a vocabulary from: with only a
    tokenizer_config.json it builds an empty tokenizer (every prompt becomes no tokens) or fails asking for
    sentencepiece or tiktoken; a lone tokenizer.model without the sentencepiece (or tiktoken) package makes
    it print a paragraph about SentencePiece, then fail naming tiktoken."""
    if any((path / name).is_file() for name in _VOCABULARY_FILES):
        return
    if not (path / "tokenizer.model").is_file():
        raise CheckpointError(
            f"no tokenizer vocabulary (tokenizer.json, vocab.json or tokenizer.model; "
            f"tokenizer_config.json alone names none) in {path}"
        )
    if all(importlib.util.find_spec(name) is None for name in ("sentencepiece", "tiktoken")):
        raise CheckpointError(
            f"the tokenizer is only a tokenizer.model (no tokenizer.json), and reading it needs "
            f"the sentencepiece package (pip install sentencepiece) in {path}"
        )


def _stop_tokens(spec: ModelSpec, path: Path, tokenizer: Any, allow_external: bool = False) -> tuple[int, ...]:
    """Union of config, generation_config.json and tokenizer EOS ids, config order first.

    Instruct checkpoints often list their turn-end token only in generation_config.json.
    """
    ids = list(spec.eos_token_ids)
    gen = path / "generation_config.json"
    if os.path.lexists(gen):  # a link out of the folder or a FIFO is refused, not skipped
        gen = inside(path, gen.name, allow_external)
        try:
            eos = read_json(gen, "generation_config.json").get("eos_token_id")
        except CheckpointError:
            log.warning("ignoring unreadable generation_config.json in %s", path)
            eos = None
        ids += _generation_eos(eos, spec.vocab_size, gen)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    return tuple(dict.fromkeys(ids))


def _generation_eos(value: Any, vocab_size: int, file: Path) -> tuple[int, ...]:
    """generation_config.json's ``eos_token_id`` under config.json's rule (config_check.token_id_problem):
    a float, bool, string or out-of-vocabulary id would otherwise be truncated, misread or never match."""
    if value is None:
        return ()
    problem = token_id_problem("eos_token_id", value, vocab_size)
    if problem:
        raise CheckpointError(f"generation_config.json: {problem} in {file.parent}")
    return as_int_tuple(value)


def _materialise(
    spec: ModelSpec, device: torch.device | str, dtype: torch.dtype, tp: Optional[TensorParallel] = None
) -> DecoderForCausalLM:
    """Build without allocating or initialising, then get uninitialised storage on `device`
    (a tensor-parallel rank builds only its shard)."""
    with torch.device("meta"):
        model = model_class(spec)(spec) if tp is None or tp.size == 1 else build_sharded(spec, tp)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.tie_weights()  # to_empty re-creates parameters, which unties them
    model.reset_rope_cache(device)  # non-persistent, float32
    return model


@torch.no_grad()
def _copy_weights(
    model: DecoderForCausalLM,
    spec: ModelSpec,
    locations: dict[str, Path],
    device: str,
    path: Path,
    shard: Optional[ShardLoader] = None,
) -> None:
    """Every parameter from its safetensors file, where ``spec``'s family stores it (``registry.stored_at``:
    under its own name, or as rows of a stacked tensor); ``shard``: this rank's slices only."""
    params = dict(model.named_parameters())  # deduplicated: a tied lm_head is not listed
    at = stored_at(spec)
    where = {name: at(name) for name in params}
    missing = [where[name].name for name in params if where[name].name not in locations]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"missing tensor '{missing[0]}'{more} in {path}")
    by_file: dict[Path, list[str]] = defaultdict(list)
    for name in params:
        by_file[locations[where[name].name]].append(name)
    with FiniteChecks() as finite:
        for file, names in by_file.items():
            reader = SafetensorsReader(file, device if shard is None else "cpu")
            for name in names:
                src = where[name]
                if src.name not in reader.names:
                    raise CheckpointError(
                        f"tensor '{src.name}' is not in shard '{file.name}' named by the index in {path}"
                    )
                got = reader.shape(src.name)
                want = src.shape(shard.full_shape(name) if shard is not None else tuple(params[name].shape))
                if got != want:
                    raise CheckpointError(f"tensor '{src.name}' has shape {list(got)}, expected {list(want)} in {file}")
                check_float_dtype(src.name, reader.dtype(src.name), file)
                if shard is None:
                    source = (
                        reader.tensor(src.name) if src.rows is None else reader.slice(src.name, 0, src.start, src.stop)
                    )
                    params[name].copy_(source)
                    finite.submit(src.name, tensor_to_check(source, params[name]), file)
                else:  # this rank's slice only: the rank checks what it loaded
                    shard.copy(reader, name, params[name], src)
                    finite.submit(src.name, params[name], file)
    used = {src.name for src in where.values()}
    unused = [n for n in locations if n not in used and not n.endswith(_HARMLESS_SUFFIXES)]
    if unused:
        log.warning("ignored %d unused tensors in %s (first: %s)", len(unused), path, unused[0])


_EMBED, _LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"
_COMPARE_BYTES = 64 << 20  # rows compared at a time: bounded extra memory for any vocabulary


def _tie_as_stored(spec: ModelSpec, locations: dict[str, Path], path: Path) -> ModelSpec:
    """``tie_word_embeddings`` true, but the checkpoint stores an lm_head that differs from the embedding:
    transformers (5.x) then does not tie them and serves the stored lm_head, so graphtop does the same
    (tying would silently serve other logits than the reference)."""
    if not spec.tie_word_embeddings or _LM_HEAD not in locations or _EMBED not in locations:
        return spec
    if _stored_equal(locations[_EMBED], _EMBED, locations[_LM_HEAD], _LM_HEAD):
        return spec
    log.warning(
        "tie_word_embeddings is true but the stored %s differs from %s: untied, as transformers does, in %s",
        _LM_HEAD,
        _EMBED,
        path,
    )
    return replace(spec, tie_word_embeddings=False)


@torch.no_grad()
def _stored_equal(file_a: Path, name_a: str, file_b: Path, name_b: str) -> bool:
    """Whether two stored tensors hold the same values (transformers' ``torch.equal`` test), read a bounded
    number of rows at a time."""
    a, b = SafetensorsReader(file_a), SafetensorsReader(file_b)
    if name_a not in a.names or name_b not in b.names:
        return False  # the index names the wrong shard: _copy_weights says so
    shape = a.shape(name_a)
    if shape != b.shape(name_b) or len(shape) != 2:
        return False
    rows = max(1, _COMPARE_BYTES // max(1, shape[1] * 4))
    same_dtype = a.dtype(name_a) == b.dtype(name_b)
    for start in range(0, shape[0], rows):
        stop = min(start + rows, shape[0])
        x, y = a.slice(name_a, 0, start, stop), b.slice(name_b, 0, start, stop)
        if not same_dtype:  # float32 holds every f16 / bf16 value exactly
            x, y = x.float(), y.float()
        if not torch.equal(x, y):
            return False
    return True


def _model_vocabulary(spec: ModelSpec, locations: dict[str, Path]) -> int:
    """Tokens the model can embed: config.json's vocab_size, or the stored embedding's rows when fewer (the
    two disagreeing is refused later, by the size or the shape check)."""
    file = locations.get(_EMBED)
    reader = SafetensorsReader(file) if file is not None else None
    if reader is None or _EMBED not in reader.names or len(reader.shape(_EMBED)) != 2:
        return spec.vocab_size
    return min(spec.vocab_size, reader.shape(_EMBED)[0])


@dataclass
class CheckpointMeta:
    """Everything of a checkpoint folder but its weights (cheap to read)."""

    path: Path
    hf_config: Any  # transformers PretrainedConfig
    spec: ModelSpec
    locations: dict[str, Path]  # tensor name -> safetensors file
    tokenizer: Any
    allow_external_weights: bool = False
    source: Optional[Path] = None  # what the user named: the folder, or the .gguf file it came from


def read_checkpoint(
    path: str | Path, *, allow_external_weights: bool = False, progress: Optional[GGUFProgress] = None
) -> CheckpointMeta:
    """The cheap checks and reads (folder, config, architecture, weight files, tokenizer), in that order,
    so a bad path fails in milliseconds with one clear line. Files must resolve inside the folder
    (``allow_external_weights`` admits symbolic links out of it) and config.json values are validated
    (config_check). ``progress`` hears a .gguf's one-time conversion (the slow part of its first load)."""
    source = path = utf8_path(expand_user(path, f"checkpoint path {path}"), "checkpoint path")
    if is_gguf(path):  # dequantized once into a cached folder (models/checkpoint/gguf.py), read from there
        path = utf8_path(gguf_folder(path, progress=progress), "converted folder")
    check_folder(path)
    raw_config = read_config_json(path, allow_external_weights)
    check_architecture_fields(raw_config, str(path))
    resolve(architecture_name(raw_config), str(path))  # before AutoConfig: clearer error
    check_model_type(raw_config, str(path))
    check_config_fields(raw_config, str(path))
    hf_config = _load_hf_config(path, ignored_token_ids(raw_config, str(path)))
    spec = spec_from_hf_config(hf_config, str(path))
    check_spec(spec, str(path))
    locations = tensor_locations(path, allow_external_weights)
    spec = _tie_as_stored(spec, locations, path)
    check_tokenizer_files(path, allow_external_weights)
    tokenizer = _load_tokenizer(path)
    check_tokenizer(tokenizer, _model_vocabulary(spec, locations), str(path), path)
    spec = replace(spec, eos_token_ids=_stop_tokens(spec, path, tokenizer, allow_external_weights))
    return CheckpointMeta(path, hf_config, spec, locations, tokenizer, allow_external_weights, source)


def load_checkpoint(
    path: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str | None = None,
    tp: Optional[TensorParallel] = None,
    meta: Optional[CheckpointMeta] = None,
    *,
    allow_external_weights: bool = False,
    progress: Optional[GGUFProgress] = None,
) -> LoadedCheckpoint:
    """Load a safetensors checkpoint folder of a supported family (``registry.FAMILIES``), or a ``.gguf`` file of one
    (dequantized once into a cached folder, models/checkpoint/gguf.py).

    ``tp`` (size > 1): build and fill only this rank's shard (``models/parallel``); ``spec`` stays the
    whole model's, ``model.spec`` is the rank's (its heads, KV heads and MLP features). ``meta``: what
    ``read_checkpoint`` already read of ``path``; ``progress``: see ``read_checkpoint``.

    Raises CheckpointError (a ValueError) with a one-line message for any checkpoint
    problem; ValueError for a bad `dtype` argument. Never unpickles, never runs remote code.
    Files must resolve inside the folder (``allow_external_weights`` admits symbolic links out of it),
    config.json values are validated (config_check) and the model must fit before it is allocated;
    weights must be floating point and finite.
    """
    if meta is None:
        meta = read_checkpoint(path, allow_external_weights=allow_external_weights, progress=progress)
    model = load_weights(meta.path, meta.spec, device, resolve_dtype(dtype, meta.hf_config), tp, meta.locations)
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return LoadedCheckpoint(model, meta.tokenizer, meta.spec, meta.source or meta.path, meta.hf_config, weights_bytes)


def load_weights(
    path: Path,
    spec: ModelSpec,
    device: torch.device | str,
    dtype: torch.dtype,
    tp: Optional[TensorParallel] = None,
    locations: Optional[dict[str, Path]] = None,
    *,
    allow_external_weights: bool = False,
) -> DecoderForCausalLM:
    """The decoder of ``spec`` (a tensor-parallel rank: its shard) with its weights from ``path``.

    What ``load_checkpoint`` does once the config is read; a worker rank, handed the spec, calls only
    this (no transformers import, no tokenizer)."""
    path = Path(path)
    sharded = tp is not None and tp.size > 1
    if sharded:
        problem = tp_problem(spec, tp.size)
        if problem:
            raise CheckpointError(located(problem, str(path)))
    device_str = _device_str(device)
    if not sharded:  # a rank's shard is a fraction of this; each rank's allocation says if it fits
        check_model_fits(spec, dtype, device_str, str(path))
    model = _materialise(spec, device_str, dtype, tp)
    if locations is None:
        locations = tensor_locations(path, allow_external_weights)
    _copy_weights(model, spec, locations, device_str, path, ShardLoader(spec, tp) if sharded else None)
    return model.eval().requires_grad_(False)
