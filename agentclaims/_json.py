"""JSON on the gateway's per-request path: orjson where it is installed (a dependency of the
``serve`` extra; several times faster both ways), else the standard library.

Both give the same documents for what the gateway parses and sends. Where orjson refuses what
the standard library accepts (an integer past 64 bits, ``NaN``, a key that is not a string),
the standard library decides, so what is accepted and every error message stay as they were.
orjson reads integers outside ``[-2**63, 2**64)`` as floats, silently: a document with a run
of 19 digits or more (such a number, or such text in a string) is read by the standard
library unless every such run is within that range. Nanosecond timestamps (19 digits, in every
event) and 64-bit block hashes are.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["dumps", "loads", "may_stream"]

_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"0" * 9)
_LONG_RUN = b"0" * 19
"""A run of 19 digits, once every digit reads as ``0``: a byte translation and a substring
search, both in C, about ten times faster than a regular expression's scan of an answer."""
_LONGER_RUN, _NEGATIVE_RUN = b"0" * 20, b"-" + _LONG_RUN
_ZERO, _MINUS = ord("0"), ord("-")
_EXACT = range(-(2**63), 2**64)
"""The integers orjson reads exactly (as ``int``)."""

_orjson: Any
try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - the serve extra installs it
    _orjson = None


def loads(raw: bytes | str) -> Any:
    """``raw`` parsed; ``ValueError`` (``json.JSONDecodeError``) when it is not JSON."""
    if _orjson is not None and _exact(
        raw if isinstance(raw, bytes) else raw.encode(errors="surrogatepass")
    ):
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass  # the standard library's verdict and message (it accepts a little more)
    return json.loads(raw)


def _exact(raw: bytes) -> bool:
    """Whether orjson reads ``raw``'s integers as the standard library does: no run of 19
    digits or more, or each such run (with its sign) an integer within 64 bits. A run that
    is not a whole integer (the digits after a decimal point, text in a string) counts as
    one: at worst the standard library reads a document orjson would have read the same."""
    zeroed = raw.translate(_DIGITS_AS_ZERO)
    start = zeroed.find(_LONG_RUN)
    if start < 0 or (_LONGER_RUN not in zeroed and _NEGATIVE_RUN not in zeroed):
        return True  # none, or only runs of 19 digits without a sign: below 2**64
    while start >= 0:  # each run's start (the leftmost: the search goes on past its end)
        end = start + len(_LONG_RUN)
        while end < len(zeroed) and zeroed[end] == _ZERO:
            end += 1
        if start and raw[start - 1] == _MINUS:
            start -= 1
        if int(raw[start:end]) not in _EXACT:
            return False
        start = zeroed.find(_LONG_RUN, end)
    return True


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON (non-ASCII characters as they are)."""
    if _orjson is not None:
        try:
            out: bytes = _orjson.dumps(value)
            return out
        except TypeError:
            pass  # what orjson will not write (a big integer, a non-string key): as stdlib does
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate (read from a "\\ud800" escape): escaped again
        return json.dumps(value, separators=(",", ":")).encode()


_STREAM_KEYS = re.compile(rb'"stream"\s*:\s*(false\b)?')


def may_stream(body: bytes) -> bool:
    """Whether a request's JSON body may ask for a stream, read without parsing it. Inside a
    JSON string a quote is escaped, so ``"stream":`` matches only a key, at some depth: a body
    whose every such key is ``false``, or that has none, asks for no stream whatever their
    depth; any other may (one nested deeper only makes its reader take the careful way)."""
    return any(not value for value in _STREAM_KEYS.findall(body))
