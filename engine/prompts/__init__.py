"""Prompts: text, token ids or a conversation, encoded into token ids and refused up front when they
can never be served.

``encode``: the tokenizer and chat-template calls and the admission check; ``conversation``: the rules
for a list of messages; ``byte_limit``: a prompt too long for the context by its bytes alone.
"""

from .byte_limit import PromptByteLimit
from .conversation import as_messages, conversation_problem, is_conversation
from .encode import (
    Prompt,
    Unencodable,
    admission_problem,
    chat_template_options,
    encode_messages,
    encode_prompt,
    has_chat_template,
)

__all__ = [
    "Prompt",
    "PromptByteLimit",
    "Unencodable",
    "admission_problem",
    "as_messages",
    "chat_template_options",
    "conversation_problem",
    "encode_messages",
    "encode_prompt",
    "has_chat_template",
    "is_conversation",
]
