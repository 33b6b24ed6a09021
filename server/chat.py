"""A chat request's ``messages`` checked and made into the conversation the chat template renders.

Text only: content is a string or a list of ``{"type": "text", "text": ...}`` parts (joined with
newlines, as vLLM joins them); an image, audio or file part, a tool message or an assistant's tool calls
are refused by name, since the engine has no such inputs. ``developer`` (OpenAI's newer name for the
system role) is passed to the template as ``system``, which every template knows.
"""

from __future__ import annotations

from typing import Any

from .errors import ApiError

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
KEYS = {"role", "content", "name"}
MAX_MESSAGES = 4096


def chat_messages(messages: Any) -> list[dict[str, str]]:
    """The conversation as ``[{"role", "content"[, "name"]}]``; ApiError (400) naming the bad part."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of messages", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise ApiError(400, f"messages holds {len(messages)} messages; at most {MAX_MESSAGES}", param="messages")
    return [_message(i, m) for i, m in enumerate(messages)]


def _message(i: int, m: Any) -> dict[str, str]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise ApiError(400, f"{where} must be an object with a role and a content", param=where)
    extra = sorted(set(m) - KEYS)
    if extra:
        raise ApiError(
            400,
            f"{where}.{extra[0]} is not supported (graphtop takes role, content and name)",
            param=f"{where}.{extra[0]}",
            code="unsupported_field",
        )
    role = m.get("role")
    if not isinstance(role, str):
        raise ApiError(400, f"{where}.role must be a string", param=f"{where}.role")
    if role not in ROLES:
        raise ApiError(
            400,
            f"{where}.role {role!r} is not supported (system, developer, user or assistant)",
            param=f"{where}.role",
            code="unsupported_value",
        )
    out = {"role": ROLES[role], "content": _content(where, m.get("content"))}
    name = m.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise ApiError(400, f"{where}.name must be a string", param=f"{where}.name")
        out["name"] = _unicode(f"{where}.name", name)
    return out


def _content(where: str, content: Any) -> str:
    if isinstance(content, str):
        return _unicode(f"{where}.content", content)
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or a list of text parts", param=f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ApiError(400, f"{at} must be an object with a type", param=at)
        if part["type"] != "text":
            raise ApiError(
                400,
                f"{at}.type {part['type']!r} is not supported (text only)",
                param=f"{at}.type",
                code="unsupported_value",
            )
        if set(part) - {"type", "text"} or not isinstance(part.get("text"), str):
            raise ApiError(400, f'{at} must be {{"type": "text", "text": STRING}}', param=at)
        texts.append(_unicode(f"{at}.text", part["text"]))
    return "\n".join(texts)


def _unicode(where: str, text: str) -> str:
    """JSON may carry a lone surrogate (``"\\ud800"``); the tokenizer would fail on it with a riddle."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(400, f"{where} is not valid Unicode ({e.reason} at character {e.start})", param=where) from None
    return text
