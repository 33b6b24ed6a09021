"""Tensor parallelism's processes: the group, the worker ranks, what travels between them.

``group`` (rank 0, in the engine's process) spawns and feeds the workers; ``worker`` is a spawned
rank; ``wire`` the per-step message; ``lockstep`` the model runners that capture and serve in step;
``collectives`` the all-reduce / all-gather the sharded model calls (models/parallel).
"""
