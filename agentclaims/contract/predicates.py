"""Materialization predicates: which logical block positions of a claimed object must survive.

Positions are ``0..footprint-1``. A prefix cache can only reuse a leading run of blocks, so
``leading_prefix_at_least(n)`` is the predicate that matters for prefix reuse: with block 0 lost,
nothing is reusable even if every later block survives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from agentclaims.errors import UnknownNameError, UsageError

__all__ = [
    "ContiguousRange",
    "LeadingPrefixAtLeast",
    "MaterializationPredicate",
    "PredicateOnWire",
    "leading_run",
    "predicate_from_dict",
]


def leading_run(survived: Sequence[bool]) -> int:
    """Length of the leading run of surviving positions."""
    for i, alive in enumerate(survived):
        if not alive:
            return i
    return len(survived)


@dataclass(frozen=True, slots=True)
class LeadingPrefixAtLeast:
    """The first ``n`` positions all survive."""

    n: int
    kind: Literal["leading_prefix_at_least"] = "leading_prefix_at_least"

    def __post_init__(self) -> None:
        _check_count("materialization_predicate.n", self.n, minimum=1)

    @property
    def span(self) -> int:
        """Positions ``0..span-1`` must exist in the claimed object."""
        return self.n

    def holds(self, survived: Sequence[bool]) -> bool:
        return len(survived) >= self.n and all(survived[: self.n])

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "n": self.n}


@dataclass(frozen=True, slots=True)
class ContiguousRange:
    """Every position in ``[start, start + n)`` survives."""

    start: int
    n: int
    kind: Literal["contiguous_range"] = "contiguous_range"

    def __post_init__(self) -> None:
        _check_count("materialization_predicate.start", self.start, minimum=0)
        _check_count("materialization_predicate.n", self.n, minimum=1)

    @property
    def span(self) -> int:
        return self.start + self.n

    def holds(self, survived: Sequence[bool]) -> bool:
        return len(survived) >= self.span and all(survived[self.start : self.span])

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "start": self.start, "n": self.n}


MaterializationPredicate: TypeAlias = LeadingPrefixAtLeast | ContiguousRange


def predicate_from_dict(data: Mapping[str, Any]) -> MaterializationPredicate:
    """Parse ``{"kind": "leading_prefix_at_least", "n": 4}`` and friends."""
    if not isinstance(data, Mapping):
        raise UsageError("materialization_predicate", f"expected an object, got {data!r}")
    kind = data.get("kind")
    try:
        if kind == "leading_prefix_at_least":
            return LeadingPrefixAtLeast(n=data["n"])
        if kind == "contiguous_range":
            return ContiguousRange(start=data["start"], n=data["n"])
    except KeyError as exc:
        raise UsageError(f"materialization_predicate.{exc.args[0]}", "missing") from None
    raise UnknownNameError(
        "materialization_predicate.kind", kind, ["leading_prefix_at_least", "contiguous_range"]
    )


class PredicateOnWire:
    """Annotation metadata for a predicate field of a wire type: pydantic reads it with
    :func:`predicate_from_dict` (the ``kind`` names which one)."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_plain_validator_function(_read_predicate)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        return {"type": "object", "description": "a materialization predicate (by its kind)"}


def _read_predicate(value: Any) -> MaterializationPredicate | None:
    if value is None or isinstance(value, LeadingPrefixAtLeast | ContiguousRange):
        return value
    return predicate_from_dict(value)


def _check_count(field: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(field, f"expected an integer, got {value!r}")
    if value < minimum:
        raise UsageError(field, f"must be >= {minimum}, got {value}")
