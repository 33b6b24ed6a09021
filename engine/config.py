"""Engine settings. Graph settings live in ``graphs.config`` (they have lock/downgrade semantics), kernel
choices in ``kernel_config`` (the ``GRAPHTOP_*`` environment variables override them there)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .errors import EngineError
from .graphs.config import GraphConfig
from .kernel_config import KernelConfig, resolve_kernel_config

_INT_FIELDS = (
    "page_size",
    "chunked_prefill_size",
    "max_running_requests",
    "max_context_len",
    "cpu_kv_budget_mb",
    "activation_reserve_mb",
    "max_total_tokens",
    "fused_gemv_max_rows",
    "parity_every",
    "tp_size",
)
_OPTIONAL_FIELDS = ("max_running_requests", "max_context_len", "max_total_tokens")
_BOOL_FIELDS = ("fused_kernels", "overlap_schedule", "allow_external_weights", "capture_before_serving")


@dataclass
class EngineConfig:
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: Optional[str] = None  # float32 | bfloat16 | float16; None: bf16 on CUDA, fp32 on CPU
    attention_backend: str = "auto"  # auto | torch | flashinfer
    page_size: int = 1
    chunked_prefill_size: int = 2048
    max_running_requests: Optional[int] = None
    max_context_len: Optional[int] = None
    mem_fraction_static: float = 0.85
    cpu_kv_budget_mb: int = 512
    activation_reserve_mb: int = 2048
    max_total_tokens: Optional[int] = None
    fused_kernels: bool = True  # Triton RMSNorm/RoPE/SiLU and fused qkv/gate_up GEMMs (CUDA, bf16/fp16)
    overlap_schedule: bool = True  # launch greedy decode step N+1 before reading N back (engine/step/overlap.py)
    fused_gemv_max_rows: int = 1  # fused path: batches of <= this many tokens (max 4) use the fused-GEMV layers
    parity_every: int = 0  # re-run one graph step in N eagerly and compare logits (engine/parity/checker.py); 0: off
    parity_tolerance: Optional[float] = None  # relative error over which a check is a mismatch; None: by dtype
    allow_external_weights: bool = False  # checkpoint files may be symbolic links out of the folder
    tp_size: int = 1  # tensor-parallel ranks (engine/distributed): one process and one device each
    # False: serve from the moment the model is loaded, eagerly (not_yet_captured) until each step's
    # bucket is captured, capturing between steps. True: capture every graph before the constructor
    # returns (benchmarks: every step measures graphs, not eager warm-up).
    capture_before_serving: bool = False
    # graphtop's cache folder (built checkpoints; compiled Triton kernels in its triton/); None:
    # $GRAPHTOP_CACHE_DIR, else the user cache folder
    cache_dir: Optional[str] = None
    # A Jinja chat template used instead of the tokenizer's (``--chat-template``); None: the tokenizer's
    chat_template: Optional[str] = None
    graphs: GraphConfig = field(default_factory=GraphConfig)
    kernels: KernelConfig = field(default_factory=KernelConfig)

    def validate(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_FIELDS:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r:.40} ({type(value).__name__})")
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {type(getattr(self, name)).__name__}")
        if isinstance(self.mem_fraction_static, bool) or not isinstance(self.mem_fraction_static, (int, float)):
            raise TypeError(f"mem_fraction_static must be a number, got {type(self.mem_fraction_static).__name__}")
        if self.tp_size < 1:
            raise ValueError(f"tensor-parallel size must be >= 1, got {self.tp_size}")
        if self.page_size < 1:
            raise ValueError(f"page size must be >= 1, got {self.page_size}")
        if self.fused_gemv_max_rows < 0:
            raise ValueError(f"fused GEMV max rows must be >= 0, got {self.fused_gemv_max_rows}")
        if self.parity_every < 0:
            raise ValueError(f"parity every must be >= 0, got {self.parity_every}")
        if self.parity_tolerance is not None and not self.parity_tolerance > 0:
            raise ValueError(f"parity tolerance must be positive, got {self.parity_tolerance}")
        if self.chunked_prefill_size < 1:
            raise ValueError(f"chunked prefill size must be >= 1, got {self.chunked_prefill_size}")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise ValueError(f"max running requests must be >= 1, got {self.max_running_requests}")
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(f"mem fraction static must be in (0, 1), got {self.mem_fraction_static}")
        if self.attention_backend not in ("auto", "torch", "flashinfer"):
            raise ValueError(f"unknown attention backend {self.attention_backend!r}; choose auto, torch or flashinfer")
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"unknown dtype {self.dtype!r}; choose float32, bfloat16 or float16")
        if self.max_context_len is not None and self.max_context_len < 2:
            raise ValueError(
                f"max context len must be >= 2 (a prompt token and one to generate), got {self.max_context_len}"
            )
        if self.max_total_tokens is not None and self.max_total_tokens < 2:  # a pool of 1 token admits no request
            raise ValueError(
                f"max total tokens must be >= 2 (a prompt token and one to generate), got {self.max_total_tokens}"
            )
        if self.max_total_tokens is not None and self.page_size > self.max_total_tokens:
            raise ValueError(
                f"page size {self.page_size} is larger than max total tokens {self.max_total_tokens}: "
                "the KV pool could not hold one page"
            )
        if self.cache_dir is not None and not isinstance(self.cache_dir, str):
            raise TypeError(f"cache_dir must be a folder path (str) or None, got {type(self.cache_dir).__name__}")
        if self.chat_template is not None and not (isinstance(self.chat_template, str) and self.chat_template):
            raise TypeError(f"chat_template must be a non-empty template text or None, got {self.chat_template!r:.40}")
        if not isinstance(self.graphs, GraphConfig):  # a dict would fail later as "'dict' has no attribute"
            raise TypeError(
                f"graphs must be a GraphConfig, got {type(self.graphs).__name__}; build one with "
                "GraphConfig(decode_bs=...) or build_graph_config(json_text, {})"
            )
        self.graphs.validate()  # the checks JSON and flags go through (GraphConfigError, a ValueError)
        resolve_kernel_config(self.kernels)  # a bad value (or GRAPHTOP_* override) is a usage error here


def context_limit(max_context_len: Optional[int], model_positions: int) -> int:
    """The context length an engine runs with: ``max_context_len``, or the model's positions without one.

    One above the model's positions is refused, not lowered without a word: a run asked for a longer
    context than it gets would only learn it from requests cut short (vLLM refuses a max_model_len above
    the model's derived maximum the same way)."""
    if max_context_len is None:
        return model_positions
    if max_context_len > model_positions:
        raise EngineError(
            f"max context len {max_context_len} is above the model's {model_positions} positions "
            f"(max_position_embeddings): use at most {model_positions}, or leave it unset"
        )
    return max_context_len
