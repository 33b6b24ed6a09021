"""The supported families, one line each, and the lookups over them: `config.architectures[0]` -> family,
its ModelSpec, its model class, where its checkpoints store each parameter.

A family is one file in models/families/ (models/family.py says what it holds); adding one is that file, its
line in ``FAMILIES`` and its tests (docs/architecture.md, "Adding a model family").
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from .errors import CheckpointError
from .families import gemma2, gemma3, llama, mistral, mixtral, phi3, qwen2, qwen3, qwen3_moe
from .family import Family, Stored
from .spec import ModelSpec, located

FAMILIES: tuple[Family, ...] = (
    llama.FAMILY,
    mistral.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    gemma2.FAMILY,
    gemma3.FAMILY,
    phi3.FAMILY,
    qwen3_moe.FAMILY,
    mixtral.FAMILY,
)
ARCHITECTURES: dict[str, Family] = {family.architecture: family for family in FAMILIES}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(ARCHITECTURES)
_BY_MODEL_TYPE = {family.model_type: name for name, family in ARCHITECTURES.items()}


def architecture_name(config: Any) -> str:
    """`architectures[0]`, falling back to `model_type` for configs saved without it.

    Accepts a transformers config or the raw config.json dict.
    """
    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    archs = get("architectures") or []
    if archs:
        return str(archs[0])
    return _BY_MODEL_TYPE.get(str(get("model_type")), f"<none; model_type={get('model_type')!r}>")


def resolve(name: str, where: str | None = None) -> Family:
    """The family for an architecture name, or CheckpointError listing what is supported."""
    try:
        return ARCHITECTURES[name]
    except KeyError:
        suffix = f" (in {where})" if where else ""
        raise CheckpointError(
            f"unsupported architecture '{name}'; supported: {', '.join(SUPPORTED_ARCHITECTURES)}{suffix}"
        ) from None


def check_model_type(config: dict[str, Any], where: str | None = None) -> None:
    """Refuse a config.json whose ``architectures[0]`` and ``model_type`` name different families: graphtop
    builds the first, transformers (AutoConfig, and the parity reference) the second, so one of the two
    silently serves another model (Qwen3's q/k norms dropped, Qwen2's biases ignored, ...)."""
    archs, model_type = config.get("architectures") or [], config.get("model_type")
    if not archs or model_type is None:
        return
    family = resolve(str(archs[0]), where)
    if model_type != family.model_type:
        raise CheckpointError(
            located(
                f"config.json: 'architectures' names {archs[0]} (model_type '{family.model_type}') but 'model_type' is "
                f"{model_type!r}, which transformers would build instead: refused",
                where,
            )
        )


def spec_from_hf_config(config: Any, where: str | None = None) -> ModelSpec:
    """Freeze a transformers config (v4 or v5 layout) into a ModelSpec, refusing what we can't run."""
    return resolve(architecture_name(config), where).read(config, where)


def model_class(spec: ModelSpec) -> type[nn.Module]:
    return resolve(spec.architecture).model


def stored_at(spec: ModelSpec) -> Callable[[str], Stored]:
    """Where each parameter of ``spec``'s model (the whole model's spec, also for a tensor-parallel rank) is
    in its checkpoints, by parameter name."""
    family = resolve(spec.architecture)
    return lambda name: family.stored(name, spec)


def stored_shapes(spec: ModelSpec, params: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensors, name -> shape, for a model of ``spec`` with parameters ``params`` (name ->
    shape): what a file must hold for the model to load."""
    where = stored_at(spec)
    return {where(name).name: where(name).shape(shape) for name, shape in params.items()}
