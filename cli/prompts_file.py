"""Reading a prompts file: JSON objects or plain text lines, one prompt per line.

A JSON line is ``{"prompt": "..."}`` or a conversation ``{"messages": [{"role": ..., "content": ...}]}``,
plus sampling fields, an ``id`` and ``"chat": true|false`` (whether a prompt goes through the model's chat
template; a conversation always does).

The one parser for prompt lines. A line that cannot be served is rejected alone, with its number and
the reason, and the other lines still run; nothing a line holds can raise out of here. Lines end at
``\\n`` only: U+2028, U+0085 and the other characters ``str.splitlines`` breaks at are legal inside a
JSON string and inside a prompt. Sampling values are checked by ``SamplingParams`` itself, so a line
accepted here cannot fail later inside sampling.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from graphtop.engine.arguments import short_repr
from graphtop.engine.prompts import conversation_problem
from graphtop.engine.sampling_params import sampling_fields

SAMPLING_FIELDS = set(sampling_fields()) - {"logprobs", "prompt_logprobs", "detokenize"}
"""A line's sampling fields: ``SamplingParams``' own, by name, less those a result line has no room for
(log-probabilities) or that only the engine's own callers choose (``detokenize``)."""
OTHER_FIELDS = {"prompt", "messages", "id", "chat"}
MAX_ID_CHARS = 256
#: Read whole before anything runs: bounded, so a device that never ends (/dev/zero) is an error, not a hang.
MAX_FILE_BYTES = 256 << 20


class PromptsFileError(ValueError):
    """The file as a whole is unusable (missing, unreadable, no prompts)."""


@dataclass
class PromptLine:
    line: int
    prompt: Optional[str]
    sampling: dict[str, Any] = field(default_factory=dict)
    id: Optional[str] = None
    error: Optional[str] = None
    chat: Optional[bool] = None  # the line's "chat"; None: the run's --chat decides
    messages: Optional[list[dict[str, str]]] = None  # a conversation line (``prompt`` is then None)

    @property
    def request_id(self) -> str:
        return self.id or f"line-{self.line}"

    def submitted(self, chat_by_default: bool) -> tuple[Any, bool]:
        """What ``Engine.submit`` takes for this line: (prompt or conversation, chat)."""
        if self.messages is not None:
            return self.messages, True
        return self.prompt, self.chat if self.chat is not None else chat_by_default


def read_prompts(path: str) -> list[PromptLine]:
    p = Path(path)
    if not p.exists():
        raise PromptsFileError(f"prompts file {path} does not exist")
    if p.is_dir():
        raise PromptsFileError(f"prompts file {path} is a directory")
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise PromptsFileError(f"cannot read prompts file {path}: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise PromptsFileError(f"prompts file {path} is larger than {MAX_FILE_BYTES >> 20} MiB")
    try:
        text = data.decode("utf-8-sig")  # a BOM (Windows editors) must not hide line 1's JSON
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise PromptsFileError(f"prompts file {path} is not UTF-8 (line {line}: {e.reason})") from None
    out: list[PromptLine] = []
    for n, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if line:
            out.append(parse_line(n, line))
    if not out:
        raise PromptsFileError(f"prompts file {path} has no prompts")
    _reject_duplicate_ids(out)
    return out


def _reject_duplicate_ids(lines: list[PromptLine]) -> None:
    """Results are matched to prompts by id: a second line with an id already used is rejected."""
    first: dict[str, int] = {}
    for pl in lines:  # a rejected line keeps its id (line-N) in the output too
        seen = first.setdefault(pl.request_id, pl.line)
        if seen != pl.line and not pl.error:
            pl.error = f"line {pl.line}: id {pl.request_id!r} is already used by line {seen}"
            pl.prompt = None  # a rejected line has nothing to submit, as every other rejected line


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


def _load_json(line: str) -> tuple[Any, Optional[str]]:
    """(object, None) or (None, why the line is not acceptable JSON)."""
    try:
        return json.loads(line, parse_constant=_refuse_constant), None
    except json.JSONDecodeError as e:
        return None, f"malformed JSON ({e.msg} at column {e.colno})"
    except _NonFinite as e:
        return None, f"{e.args[0]} is not a finite number"
    except RecursionError:
        return None, "JSON nested too deeply"
    except ValueError as e:  # an integer literal of more than 4300 digits
        return None, f"number out of range ({str(e).splitlines()[0][:60]})"


def _text_problem(name: str, value: str) -> Optional[str]:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f"'{name}' is not valid Unicode (lone surrogate)"
    return None


def _request_id(value: Any) -> tuple[Optional[str], Optional[str]]:
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None, f"'id' must be a string or an integer, got {type(value).__name__}"
    text = str(value)
    if not text or len(text) > MAX_ID_CHARS:
        return None, f"'id' must have 1 to {MAX_ID_CHARS} characters"
    return text, _text_problem("id", text)


def _sampling_problem(values: dict[str, Any]) -> Optional[str]:
    from graphtop.engine.sampling_params import SamplingParams

    try:
        SamplingParams(**values)
    except (TypeError, ValueError) as e:
        return str(e)
    return None


def parse_line(n: int, line: str) -> PromptLine:
    """One non-blank, stripped line -> a servable PromptLine, or one whose ``error`` says why not."""
    if not line.startswith("{"):
        problem = _text_problem("prompt", line)  # cannot happen for decoded UTF-8; kept for callers
        return PromptLine(n, line) if problem is None else PromptLine(n, None, error=f"line {n}: {problem}")

    def bad(why: str) -> PromptLine:
        return PromptLine(n, None, error=f"line {n}: {why}")

    obj, problem = _load_json(line)
    if problem:
        return bad(problem)
    if not isinstance(obj, dict):
        return bad("expected a JSON object")
    if "prompt" not in obj and "messages" not in obj:
        others = f" (it has {', '.join(short_repr(k) for k in sorted(obj)[:5])})" if obj else ""
        return bad(
            f'no \'prompt\' field{others}: a JSON line is {{"prompt": "..."}} or {{"messages": [...]}} '
            "plus sampling fields"
        )
    if "prompt" in obj and "messages" in obj:
        return bad("a line has 'prompt' or 'messages', not both")
    prompt, messages = obj.get("prompt"), obj.get("messages")
    if "prompt" in obj and not isinstance(prompt, str):
        return bad("'prompt' must be a string")
    unknown = set(obj) - SAMPLING_FIELDS - OTHER_FIELDS
    if unknown:
        return bad(f"unknown field(s) {', '.join(sorted(unknown))}")
    chat = obj.get("chat")
    if "chat" in obj and not isinstance(chat, bool):
        return bad(f"'chat' must be true or false, got {type(chat).__name__}")
    rid, problem = _request_id(obj.get("id"))
    if "messages" in obj:
        problem = problem or conversation_problem(messages)
        if chat is False and not problem:
            problem = "'messages' always go through the chat template: \"chat\": false contradicts them"
    else:
        problem = problem or _text_problem("prompt", prompt)
    sampling = {k: v for k, v in obj.items() if k in SAMPLING_FIELDS}
    problem = problem or _sampling_problem(sampling)
    if problem:
        return bad(problem)
    if "messages" in obj:
        conversation = [{"role": m["role"], "content": m["content"]} for m in messages]
        return PromptLine(n, None, sampling, id=rid, chat=True, messages=conversation)
    return PromptLine(n, prompt, sampling, id=rid, chat=chat)
