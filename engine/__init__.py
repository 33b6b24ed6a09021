"""graphtop.engine: the in-process inference engine (never imports textual).

Public API: ``Engine`` (``from_pretrained``, ``submit``, ``generate``, ``step``, ``recapture``,
``wait_for_capture``, ``start_background``, ``shutdown``), ``EngineConfig`` (with ``GraphConfig`` and ``KernelConfig``),
``SamplingParams`` (its errors ``SamplingParamError``), ``RequestHandle`` (its log-probabilities
``TokenLogprob``), ``FinishReason``, ``EventBus`` and the event types in ``graphtop.engine.telemetry.events``.

Names resolve lazily (PEP 562) so that ``graphtop trace ...`` and the event tools do not pay for
importing torch.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Engine": ".engine",
    "EngineError": ".device",
    "EngineInfo": ".lifecycle.info",
    "EngineConfig": ".config",
    "KernelConfig": ".kernel_config",
    "EventBus": ".telemetry.bus",
    "GraphConfig": ".graphs.config",
    "GraphConfigError": ".graphs.config",
    "build_graph_config": ".graphs.config",
    "FallbackReason": ".graphs.fallback",
    "FinishReason": ".request",
    "RequestHandle": ".request",
    "SamplingParams": ".sampling_params",
    "SamplingParamError": ".sampling_params",
    "TokenLogprob": ".request",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'graphtop.engine' has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)
