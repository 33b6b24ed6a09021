"""The response bodies of the OpenAI API: whole responses and the chunks of a stream.

Shapes as OpenAI (and vLLM) send them: ``text_completion`` objects for ``/v1/completions`` (the same
object name for stream chunks), ``chat.completion`` and ``chat.completion.chunk`` for chat; a stream is
Server-Sent Events, ``data: {json}\\n\\n`` per chunk and ``data: [DONE]\\n\\n`` at the end; with
``stream_options.include_usage`` every chunk carries ``"usage": null`` and one last chunk with no
choices carries the usage, and with ``continuous_usage_stats`` too every chunk carries the usage so far
(vLLM's). Log-probabilities are written by ``logprobs.LogprobWriter``; with ``echo`` a completion's text
(and its log-probabilities) begin with its prompt's, in a stream in the choice's first chunk.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from graphtop.engine.request import TokenLogprob

from .generation import ChoiceUpdate, Echo
from .logprobs import LogprobWriter, Scored

DONE = "data: [DONE]\n\n"


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


@dataclass
class Choice:
    """One choice of a whole (not streamed) response, gathered from its updates."""

    text: str = ""
    finish_reason: Optional[str] = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    echo: Optional[Echo] = None

    def add(self, update: ChoiceUpdate) -> None:
        self.text += update.text
        self.finish_reason = update.finish_reason or self.finish_reason
        self.logprobs += update.logprobs
        self.echo = update.echo or self.echo


@dataclass
class ResponseShape:
    """What one response says about itself, and how its choices are written. ``logprobs``: the writer when
    the request asked for log-probabilities; ``running_usage``: the usage so far, for every chunk of a
    stream that asked for ``continuous_usage_stats``."""

    chat: bool
    model: str
    request_id: str
    include_usage: bool = False
    logprobs: Optional[LogprobWriter] = None
    running_usage: Optional[Callable[[], dict[str, int]]] = None
    created: int = field(default_factory=lambda: int(time.time()))
    _offsets: dict[int, int] = field(default_factory=dict)  # a streamed choice's text_offset so far

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    def _logprobs(self, index: int, logprobs: list[TokenLogprob], echo: Optional[Echo]) -> Optional[dict[str, Any]]:
        if self.logprobs is None:
            return None
        if self.chat:
            return self.logprobs.chat(logprobs)
        entries: list[Scored] = []
        if echo is not None:
            entries += [(echo.ids[0], None)] + [(lp.token, lp) for lp in echo.logprobs]
        entries += [(lp.token, lp) for lp in logprobs]
        written, self._offsets[index] = self.logprobs.completion(entries, self._offsets.get(index, 0))
        return written

    # --- whole responses --------------------------------------------------------------------------
    def response(self, choices: list[Choice], usage: dict[str, int]) -> dict[str, Any]:
        out = []
        for i, c in enumerate(choices):
            logprobs = self._logprobs(i, c.logprobs, c.echo)
            if self.chat:
                message = {"role": "assistant", "content": c.text}
                out.append({"index": i, "message": message, "logprobs": logprobs, "finish_reason": c.finish_reason})
            else:
                text = c.echo.text + c.text if c.echo is not None else c.text
                out.append({"index": i, "text": text, "logprobs": logprobs, "finish_reason": c.finish_reason})
        return {**self._head(self.object), "choices": out, "usage": usage}

    # --- stream chunks ----------------------------------------------------------------------------
    def _chunk(self, choices: list[dict[str, Any]]) -> str:
        body = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": choices}
        if self.running_usage is not None:
            body["usage"] = self.running_usage()
        elif self.include_usage:
            body["usage"] = None
        return sse(body)

    def role_chunk(self, count: int) -> str:
        """Chat streams open each choice with the assistant's role (OpenAI's first chunk)."""
        return self._chunk(
            [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                for i in range(count)
            ]
        )

    def update_chunk(self, updates: list[ChoiceUpdate]) -> str:
        choices = []
        for u in updates:
            logprobs = self._logprobs(u.index, u.logprobs, u.echo)
            if self.chat:
                delta = {"content": u.text} if u.text else {}
                choices.append(
                    {"index": u.index, "delta": delta, "logprobs": logprobs, "finish_reason": u.finish_reason}
                )
            else:
                text = u.echo.text + u.text if u.echo is not None else u.text
                choices.append({"index": u.index, "text": text, "logprobs": logprobs, "finish_reason": u.finish_reason})
        return self._chunk(choices)

    def usage_chunk(self, usage: dict[str, int]) -> str:
        return sse(
            {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [], "usage": usage}
        )
