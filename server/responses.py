"""The response bodies of the OpenAI API: whole responses and the chunks of a stream.

Shapes as OpenAI (and vLLM) send them: ``text_completion`` objects for ``/v1/completions`` (the same
object name for stream chunks), ``chat.completion`` and ``chat.completion.chunk`` for chat; a stream is
Server-Sent Events, ``data: {json}\\n\\n`` per chunk and ``data: [DONE]\\n\\n`` at the end; with
``stream_options.include_usage`` every chunk carries ``"usage": null`` and one last chunk with no
choices carries the usage.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from .generation import ChoiceUpdate

DONE = "data: [DONE]\n\n"


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


@dataclass
class ResponseShape:
    """What one response says about itself, and how its choices are written."""

    chat: bool
    model: str
    request_id: str
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    # --- whole responses --------------------------------------------------------------------------
    def response(self, texts: list[str], reasons: list[Optional[str]], usage: dict[str, int]) -> dict[str, Any]:
        choices = []
        for i, (text, reason) in enumerate(zip(texts, reasons)):
            if self.chat:
                choices.append(
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": None,
                        "finish_reason": reason,
                    }
                )
            else:
                choices.append({"index": i, "text": text, "logprobs": None, "finish_reason": reason})
        return {**self._head(self.object), "choices": choices, "usage": usage}

    # --- stream chunks ----------------------------------------------------------------------------
    def _chunk(self, choices: list[dict[str, Any]]) -> str:
        body = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": choices}
        if self.include_usage:
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
            if self.chat:
                delta = {"content": u.text} if u.text else {}
                choices.append({"index": u.index, "delta": delta, "logprobs": None, "finish_reason": u.finish_reason})
            else:
                choices.append({"index": u.index, "text": u.text, "logprobs": None, "finish_reason": u.finish_reason})
        return self._chunk(choices)

    def usage_chunk(self, usage: dict[str, int]) -> str:
        return sse(
            {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [], "usage": usage}
        )
