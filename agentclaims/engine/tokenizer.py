"""Deterministic stand-in tokenizers for the reference KV side.

They only need to be stable (same text, same ids, in every process) and prefix-preserving (the
tokens of ``messages[:k]`` are a prefix of the tokens of ``messages``), so that prefix caching
behaves as it does on a real runtime. Real tokenization comes from the real runtime (a vLLM
lowering asks the server's ``/tokenize``); these ids mean nothing to any model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from agentclaims.engine.blocks import blake2b_hash
from agentclaims.errors import UnknownNameError, UsageError
from agentclaims.protocol import Tokenizer

__all__ = ["ByteTokenizer", "WordTokenizer", "content_text", "tokenizer_named"]

_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_WORD = re.compile(r"\w+|[^\w\s]")


class _Base:
    """Message rendering shared by both tokenizers: a role marker, the content, the tool calls
    and an end marker, so a conversation's tokens are the concatenation of its messages'."""

    tokenizer_id = ""
    specials_base = 0

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def _special(self, name: str) -> int:
        index = _ROLES.index(name) if name in _ROLES else len(_ROLES)
        return self.specials_base + index

    def encode_message(self, message: Mapping[str, Any]) -> list[int]:
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise UsageError("messages.role", f"must be a non-empty string, got {role!r}")
        out = [self._special(role)]
        for key in ("name", "tool_call_id"):
            if isinstance(message.get(key), str):
                out += self.encode(f"{key}={message[key]}")
        out += self.encode(content_text(message.get("content")))
        for call in message.get("tool_calls") or ():
            out += self.encode(json.dumps(call, sort_keys=True, separators=(",", ":")))
        out.append(self.specials_base + len(_ROLES) + 1)
        return out


class ByteTokenizer(_Base):
    """One token per UTF-8 byte (ids 0..255); role markers from 256 up."""

    tokenizer_id = "agentclaims-bytes"
    specials_base = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode())


@lru_cache(maxsize=65_536)
def _word_id(word: str) -> int:
    return 1_000 + blake2b_hash(word.encode()) % 1_000_000


class WordTokenizer(_Base):
    """One token per word or punctuation mark, its id a stable hash (close to real token counts,
    about a word per token); role markers are ids below 1,000."""

    tokenizer_id = "agentclaims-words"
    specials_base = 1

    def encode(self, text: str) -> list[int]:
        return [_word_id(w) for w in _WORD.findall(text)]


def content_text(content: object) -> str:
    """The text of an OpenAI message ``content``: a string, a list of parts, or nothing."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            if not isinstance(part, Mapping):
                raise UsageError("messages.content", f"a content part must be an object: {part!r}")
            text = part.get("text")
            texts.append(text if isinstance(text, str) else json.dumps(part, sort_keys=True))
        return "\n".join(texts)
    raise UsageError("messages.content", f"expected a string or a list of parts, got {content!r}")


_TOKENIZERS: dict[str, type[_Base]] = {
    ByteTokenizer.tokenizer_id: ByteTokenizer,
    WordTokenizer.tokenizer_id: WordTokenizer,
}


def tokenizer_named(tokenizer_id: str) -> Tokenizer:
    """The built-in tokenizer with this id (``agentclaims-bytes`` or ``agentclaims-words``)."""
    cls = _TOKENIZERS.get(tokenizer_id)
    if cls is None:
        raise UnknownNameError("tokenizer_id", tokenizer_id, sorted(_TOKENIZERS))
    return cls()
