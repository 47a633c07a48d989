"""Hostile input: limits every request body is checked against before it is parsed or used.

Each limit broken is a 4xx naming what is wrong (``body``, ``body.depth``, ``messages``, a
string's path...), raised before anything changes: no input makes the gateway answer 5xx or
stop answering. The body is parsed first (a body nested past what the parser takes is refused
as too deep, not a ``RecursionError``), then its containers are walked for depth, list length
and string length; a body too short to break any of those limits is not walked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentclaims import _json
from agentclaims.errors import UsageError

__all__ = ["EVENTS_PER_ANSWER", "SEQ_LIMIT", "BodyTooLarge", "Limits", "parse_body"]

SEQ_LIMIT = 2**62
"""Event sequence numbers stay below it (the bound on a caller's ``since``); a read from it is
past every event, its page empty and naming the last one."""
EVENTS_PER_ANSWER = 4096
"""At most this many events are scanned for one answer that carries a session's events (a
completion's, a release's; its session's are kept; ``more`` says when others wait: the session
then polls)."""


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


_SCALARS = frozenset({int, float, bool, type(None)})
"""What JSON parses to that holds no string and no container."""


def _check_shape(value: Any, limits: Limits, where: str) -> None:
    """Every container within ``limits.max_depth`` levels and ``limits.max_list_items``
    items, every string (key or value) within ``limits.max_string_chars``: one walk over the
    parsed body's containers (a path is spelt out only for a container, or for what is wrong)."""
    max_chars = limits.max_string_chars
    stack: list[tuple[Any, str, int]] = [(value, where, 1)]
    while stack:
        item, path, depth = stack.pop()
        if depth > limits.max_depth:
            raise UsageError("body.depth", f"nested over {limits.max_depth} levels deep at {path}")
        if isinstance(item, list):
            if len(item) > limits.max_list_items:
                raise UsageError(
                    path, f"a list of {len(item)} items; at most {limits.max_list_items}"
                )
            if set(map(type, item)) <= _SCALARS:
                continue  # numbers only (token ids, block hashes): nothing inside to check
            pairs: Any = enumerate(item)
            name = "{0}[{1}]"
        else:
            pairs = item.items()
            name = "{0}.{1}"
        for key, v in pairs:
            if type(v) is str:
                if len(v) > max_chars:
                    raise UsageError(
                        name.format(path, key),
                        f"a string of {len(v)} characters; at most {max_chars}",
                    )
            elif isinstance(v, (list, dict)):
                stack.append((v, name.format(path, key), depth + 1))
            if type(key) is str and len(key) > max_chars:
                raise UsageError(path, f"a key of {len(key)} characters; at most {max_chars}")


def parse_body(raw: bytes, limits: Limits) -> dict[str, Any]:
    """The request's JSON object, checked against ``limits`` (a ``UsageError`` otherwise)."""
    if len(raw) > limits.max_body_bytes:
        raise BodyTooLarge("body", f"{len(raw)} bytes; at most {limits.max_body_bytes}")
    if not raw:
        return {}
    try:
        body = _json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError("body", f"not JSON: {exc}") from None
    except RecursionError:  # deeper than the parser goes: far past max_depth
        raise UsageError("body.depth", f"nested far over {limits.max_depth} levels deep") from None
    if not isinstance(body, dict):
        raise UsageError("body", "expected a JSON object")
    messages = body.get("messages")
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        raise UsageError("messages", f"{len(messages)} messages; at most {limits.max_messages}")
    if (
        len(raw) <= min(limits.max_string_chars, limits.max_list_items)
        and raw.count(b"[") + raw.count(b"{") <= limits.max_depth
    ):
        return body  # too short for a string or a list past the limits, too few brackets to nest
    _check_shape(body, limits, "body")
    return body
