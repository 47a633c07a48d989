"""Hostile input: limits every request body is checked against before it is parsed or used.

Each limit broken is a 4xx naming what is wrong (``body``, ``body.depth``, ``messages``, a
string's path...), raised before anything changes: no input makes the gateway answer 5xx or
stop answering. The nesting depth is measured on the raw bytes before ``json.loads`` (whose
decoder recurses: a deeply nested body would otherwise raise ``RecursionError``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentclaims.errors import UsageError

__all__ = ["BodyTooLarge", "Limits", "parse_body"]


class BodyTooLarge(UsageError):
    """The body is larger than the gateway accepts (HTTP 413)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request body may hold."""

    max_body_bytes: int = 8 * 1024 * 1024
    max_depth: int = 32
    max_messages: int = 2_048
    max_string_chars: int = 1_000_000
    max_list_items: int = 200_000
    """Token-id prompts, block-hash lists, claims: no list is longer."""
    max_prompt_tokens: int = 262_144
    """Tokens of one prompt, once tokenized (a real engine's own limit applies too)."""


def _depth(raw: bytes) -> int:
    """The deepest nesting of objects and arrays in ``raw``, strings skipped (one pass)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x7B, 0x5B):  # { [
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x7D, 0x5D):  # } ]
            depth -= 1
    return deepest


def _check_sizes(value: Any, limits: Limits, where: str) -> None:
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if len(item) > limits.max_string_chars:
                raise UsageError(
                    path, f"a string of {len(item)} characters; at most {limits.max_string_chars}"
                )
        elif isinstance(item, list):
            if len(item) > limits.max_list_items:
                raise UsageError(
                    path, f"a list of {len(item)} items; at most {limits.max_list_items}"
                )
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(item))
        elif isinstance(item, Mapping):
            stack.extend((v, f"{path}.{k}") for k, v in item.items())


def parse_body(raw: bytes, limits: Limits) -> dict[str, Any]:
    """The request's JSON object, checked against ``limits`` (a ``UsageError`` otherwise)."""
    if len(raw) > limits.max_body_bytes:
        raise BodyTooLarge("body", f"{len(raw)} bytes; at most {limits.max_body_bytes}")
    if not raw:
        return {}
    deepest = _depth(raw)
    if deepest > limits.max_depth:
        raise UsageError("body.depth", f"nested {deepest} levels deep; at most {limits.max_depth}")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError("body", f"not JSON: {exc}") from None
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise UsageError("body.depth", "nested too deep") from None
    if not isinstance(body, dict):
        raise UsageError("body", "expected a JSON object")
    messages = body.get("messages")
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        raise UsageError("messages", f"{len(messages)} messages; at most {limits.max_messages}")
    _check_sizes(body, limits, "body")
    return body
