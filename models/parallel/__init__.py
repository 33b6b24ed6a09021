"""Tensor parallelism for the decoder (Megatron-style): what each rank holds, the sharded layers, and
loading a rank's shard straight from safetensors slices.

The engine owns the processes and the process group; this package only needs an object that can
all-reduce and all-gather (``Communicator``), so it never imports the engine.
"""

from .layers import ParallelLMHead, RowParallelLinear, VocabParallelEmbedding
from .layout import Communicator, TensorParallel, shard_spec, tp_problem

__all__ = [
    "Communicator",
    "ParallelLMHead",
    "RowParallelLinear",
    "TensorParallel",
    "VocabParallelEmbedding",
    "shard_spec",
    "tp_problem",
]
