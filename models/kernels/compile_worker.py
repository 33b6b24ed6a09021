"""A kernel-compile worker: ``python -m graphtop.models.kernels.compile_worker``.

Reads one JSON request per line on stdin (a ``KernelVariant``'s fields), compiles it into Triton's
on-disk cache, and answers one JSON line on stdout: ``{"seconds": ...}`` or ``{"error": "..."}``.
Its own process, started by ``compile_pool.KernelCompiler``: a plain subprocess rather than a
multiprocessing child, so it never re-imports the program that runs the engine (a script without a
``__main__`` guard would build a second engine in every worker).
"""

from __future__ import annotations

import json
import sys
from typing import Iterable, TextIO

from .precompile import KernelVariant, compile_variant


def serve(lines: Iterable[str] = sys.stdin, out: TextIO = sys.stdout) -> None:
    for line in lines:
        if not line.strip():
            continue
        try:
            answer = {"seconds": compile_variant(KernelVariant(**json.loads(line)))}
        except Exception as e:  # the engine hears about it; its launch then compiles (and reports) itself
            answer = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    serve()
