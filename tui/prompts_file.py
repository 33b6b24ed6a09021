"""Reading a prompts file: JSON objects or plain text lines, one prompt per line.

A malformed line is reported with its number and skipped; the other lines still run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

SAMPLING_FIELDS = {"max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "ignore_eos"}


class PromptsFileError(ValueError):
    """The file as a whole is unusable (missing, unreadable, no prompts)."""


@dataclass
class PromptLine:
    line: int
    prompt: Optional[str]
    sampling: dict[str, Any] = field(default_factory=dict)
    id: Optional[str] = None
    error: Optional[str] = None


def read_prompts(path: str) -> list[PromptLine]:
    p = Path(path)
    if not p.exists():
        raise PromptsFileError(f"prompts file {path} does not exist")
    if p.is_dir():
        raise PromptsFileError(f"prompts file {path} is a directory")
    try:
        text = p.read_text(encoding="utf-8-sig")  # a BOM (Windows editors) must not hide line 1's JSON
    except (OSError, UnicodeDecodeError) as e:
        raise PromptsFileError(f"cannot read prompts file {path}: {e}") from None
    out: list[PromptLine] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        out.append(_parse_line(n, line))
    if not out:
        raise PromptsFileError(f"prompts file {path} has no prompts")
    return out


def _parse_line(n: int, line: str) -> PromptLine:
    if not line.startswith("{"):
        return PromptLine(n, line)
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        return PromptLine(n, None, error=f"line {n}: malformed JSON ({e.msg} at column {e.colno})")
    if not isinstance(obj, dict):
        return PromptLine(n, None, error=f"line {n}: expected a JSON object")
    prompt = obj.get("prompt")
    if not isinstance(prompt, str):
        return PromptLine(n, None, error=f"line {n}: 'prompt' must be a string")
    unknown = set(obj) - SAMPLING_FIELDS - {"prompt", "id"}
    if unknown:
        return PromptLine(n, None, error=f"line {n}: unknown field(s) {', '.join(sorted(unknown))}")
    rid = obj.get("id")
    return PromptLine(n, prompt, {k: v for k, v in obj.items() if k in SAMPLING_FIELDS},
                      id=str(rid) if rid is not None else None)

