"""A chat conversation as a prompt: a list of ``{"role": ..., "content": ...}`` messages.

The one set of rules for a conversation, used by ``Engine.submit`` (which raises on a bad one) and by
the prompts file reader (which rejects that line alone): a bad message must be named here, in one line,
not surface from inside a chat template as a jinja2 error or, worse, render as something else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

ROLES = ("system", "user", "assistant")
FIELDS = ("role", "content")


def is_conversation(prompt: Any) -> bool:
    """Whether ``prompt`` is meant as messages (a list holding a mapping), not text or token ids."""
    return isinstance(prompt, (list, tuple)) and any(isinstance(m, Mapping) for m in prompt)


def conversation_problem(messages: Any) -> Optional[str]:
    """Why ``messages`` is not a conversation the engine takes (one line), or None."""
    if not isinstance(messages, (list, tuple)):
        return f"'messages' must be a list of messages, got {type(messages).__name__}"
    if not messages:
        return "'messages' is empty: a conversation needs at least one message"
    for i, message in enumerate(messages):
        problem = _message_problem(message)
        if problem:
            return f"message #{i}: {problem}"
    return None


def _message_problem(message: Any) -> Optional[str]:
    if not isinstance(message, Mapping):
        return f"a message is an object with 'role' and 'content', got {type(message).__name__}"
    unknown = sorted(str(k) for k in message if k not in FIELDS)
    if unknown:
        return f"unknown field(s) {', '.join(unknown[:5])} (a message has 'role' and 'content')"
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        shown = role if isinstance(role, str) and len(role) <= 40 else type(role).__name__
        return f"'role' must be one of {', '.join(ROLES)}, got {shown!r}" if "role" in message else "no 'role'"
    if not isinstance(content, str):
        return (
            "no 'content'" if "content" not in message else f"'content' must be a string, got {type(content).__name__}"
        )
    try:
        content.encode("utf-8")
    except UnicodeEncodeError:
        return "'content' is not valid Unicode (lone surrogate)"
    return None


def as_messages(messages: Any) -> list[dict[str, str]]:
    """A checked conversation as plain dicts (what a chat template renders); raises ValueError."""
    problem = conversation_problem(messages)
    if problem:
        raise ValueError(f"bad conversation: {problem}")
    return [{"role": m["role"], "content": m["content"]} for m in messages]
