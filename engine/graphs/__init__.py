"""graphtop.engine.graphs: CUDA graphs, in one package.

Graph backends that capture and replay (``backend``, ``full``, ``breakable``, ``emulated``, chosen in
``factory``), the static buffers and their one-copy upload (``buffers``, ``upload``), the phase runners
and their capture jobs (``runners/``), the model runner that routes each batch to a graph or the eager
path and paces capture between steps (``model_runner``), and the pure, torch-free rules the engine, the
dashboard's what-if and the advisor share (``bucket_policy``, ``bucket_list``, ``bucket_advisor``,
``config``, ``fallback``).
"""
