"""``Engine.from_pretrained``: from a checkpoint path (or the demo model) to a serving engine.

Its own module because it is the one place that knows how a tensor-parallel group comes up: the
checkpoint is read cheaply first (so a bad folder or an unsupported split fails before any process
starts), the worker ranks are spawned, and rank 0's shard loads while they load theirs.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from ..config import EngineConfig
from ..device import resolve_device, resolve_dtype
from ..distributed.group import TensorParallelGroup
from ..kernel_config import resolve_kernel_config
from ..telemetry import events as ev
from ..telemetry.bus import EventBus

log = logging.getLogger("graphtop.engine")


@dataclass(frozen=True)
class Loaded:
    """What an engine is built from: the checkpoint (rank 0's shard with tensor parallelism), the checked
    config, the bus, whether it is the demo model, and the tensor-parallel group (None without)."""

    checkpoint: Any
    config: EngineConfig
    bus: Optional[EventBus]
    demo: bool
    tp: Optional[TensorParallelGroup]


@contextmanager
def loading(
    path: Union[str, Path, None], config: Optional[EngineConfig], bus: Optional[EventBus], overrides: dict[str, Any]
) -> Iterator[Loaded]:
    """The checkpoint at ``path`` (None: the demo model), loaded for ``Engine.from_pretrained`` to build
    its engine from inside this block: with tensor parallelism a worker that fails to load or capture
    ends the block with its reason, and the group is closed if the block fails."""
    from graphtop.models import DEMO_NOTE, ensure_demo_model

    if config is not None and not isinstance(config, EngineConfig):
        raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
    config = config or EngineConfig()
    options = {f.name for f in fields(EngineConfig)}
    for k in overrides:
        if k not in options:
            raise TypeError(f"unknown engine option {k!r}")
    # a copy: the caller's config is theirs to reuse, and stays as it was even when validation refuses
    config = replace(config, **overrides)
    config.validate()
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    demo = path is None
    if demo:
        path = ensure_demo_model()
    assert path is not None
    if config.tp_size == 1:
        yield _load_one(path, config, bus, device, dtype, demo)
    else:
        yield from _load_group(path, config, bus, device, dtype, demo)
    if demo:  # once it loaded: a load that fails says so in one line, without this note before it
        log.warning(DEMO_NOTE)


def _load_one(
    path: Union[str, Path], config: EngineConfig, bus: Optional[EventBus], device: Any, dtype: Any, demo: bool
) -> Loaded:
    from graphtop.models import load_checkpoint

    ckpt = load_checkpoint(
        path,
        device=str(device),
        dtype=dtype,
        allow_external_weights=config.allow_external_weights,
        progress=_progress(bus),
    )
    return Loaded(ckpt, config, bus, demo, None)


def _load_group(
    path: Union[str, Path], config: EngineConfig, bus: Optional[EventBus], device: Any, dtype: Any, demo: bool
) -> Iterator[Loaded]:
    from graphtop.models import CheckpointError, load_checkpoint, read_checkpoint
    from graphtop.models.parallel import TensorParallel, tp_problem

    meta = read_checkpoint(path, allow_external_weights=config.allow_external_weights, progress=_progress(bus))
    problem = tp_problem(meta.spec, config.tp_size)
    if problem:  # before any process is spawned
        raise CheckpointError(f"{problem} in {meta.path}")
    bus = bus if bus is not None else EventBus()  # the workers' events are relayed onto it
    tp = TensorParallelGroup.start(
        config.tp_size, device, dtype, meta, resolve_kernel_config(config.kernels), bus.publish
    )
    try:
        with tp.step_guard():  # a worker that fails to load or capture ends this with its reason
            ckpt = load_checkpoint(path, str(tp.device), dtype, TensorParallel(0, tp.size, tp.comm), meta)
            yield Loaded(ckpt, config, bus, demo, tp)
    except BaseException:
        tp.close()
        raise


def _progress(bus: Optional[EventBus]) -> Any:
    """What the checkpoint loader calls with its progress (a .gguf's one-time conversion): ``load_progress``
    events on ``bus``, where the displays (the headless progress line, the dashboard) show them."""
    if bus is None:
        return None

    def publish(label: str, step: str, done: int, total: int) -> None:
        bus.publish(ev.LoadProgress(label=label, step=step, done=done, total=total))

    return publish
