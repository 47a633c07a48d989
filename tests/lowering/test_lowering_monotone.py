"""Fail-closed monotonicity: taking evidence away from a descriptor never raises a class.

Evidence is the anchors, an obligation's ``met``, the runtime facts (cache identity and its
fields, the token map), the predicates and the ordering named, and each level a conformance
run passed. An unknown field makes the descriptor unreadable: ``unknown`` in every mode, the
bottom. Every shipped descriptor and every fixture is a starting point.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lowering_fixtures import FIXTURES, SHIPPED, document, ran_here

from agentclaims.conformance import evidence_from_json
from agentclaims.contract import LoweringClass, ProtectionMode
from agentclaims.errors import DescriptorError
from agentclaims.lowering import SELF_TEST, Descriptor, check_descriptor, parse_descriptor

BASES = sorted(
    [*SHIPPED.glob("*.yaml"), *FIXTURES.glob("*.yaml"), *(FIXTURES / "bad").glob("*.yaml")]
)
LEVELS = ("L1", "L2", "L3", "L4", "L5", "L6", "L7", "C1")


@dataclass
class State:
    """A descriptor document, the runs it cites, and whether it was made unreadable."""

    doc: dict[str, Any]
    runs: dict[str, dict[str, str]]
    unreadable: bool = False
    valid: list[bool] = field(default_factory=list)

    @classmethod
    def of(cls, path: Path) -> State:
        """A fresh copy of the state read from ``path``."""
        return copy.deepcopy(_read(path))

    @classmethod
    def read(cls, path: Path) -> State:
        doc = document(path)
        runs: dict[str, dict[str, str]] = {}
        for evidence in _under(doc, "evidence"):
            for anchor in evidence:
                where = anchor["where"]
                if anchor["kind"] == "conformance_run" and where not in runs:
                    runs[where] = (
                        dict.fromkeys(LEVELS, "pass")
                        if where == SELF_TEST
                        else dict(evidence_from_json(path.parent / where)["levels"])
                    )
        return cls(doc, runs)

    def classes(self) -> dict[ProtectionMode, LoweringClass]:
        """The class of each mode, as the checker gives it (with only these runs)."""
        if self.unreadable:
            with pytest.raises(DescriptorError):
                parse_descriptor(self.doc, source="mutated")
            return dict.fromkeys(ProtectionMode, LoweringClass.UNKNOWN)
        # the mutations keep a document valid (checked once per example): skip the schema here
        modes = {
            m: self.doc["modes"][m.value] for m in ProtectionMode if m.value in self.doc["modes"]
        }
        descriptor = Descriptor(
            self.doc["runtime"],
            self.doc["versions"],
            self.doc.get("facts", {}),
            modes,
            "mutated",
            None,
            self.doc,
        )
        check = check_descriptor(descriptor, ran_here(copy.deepcopy(self.runs)))
        return {m.mode: m.lowering_class for m in check.mappings}


@functools.cache
def _read(path: Path) -> State:
    return State.read(path)


def _under(node: Any, key: str) -> Iterator[Any]:
    """The values under ``key`` in every mapping of ``node``, once each (YAML aliases share)."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            if key in item:
                yield item[key]
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _dicts_with(node: Any, key: str) -> list[dict[str, Any]]:
    """Every mapping of ``node`` with ``key``, in a stable order."""
    out: list[dict[str, Any]] = []
    seen: set[int] = set()

    def walk(item: Any) -> None:
        if id(item) in seen:
            return
        seen.add(id(item))
        if isinstance(item, dict):
            if key in item:
                out.append(item)
            for v in item.values():
                walk(v)
        elif isinstance(item, list):
            for v in item:
                walk(v)

    walk(node)
    return out


Mutation = Callable[[State, int], None]


def drop_anchor(s: State, i: int) -> None:
    lists = [d["evidence"] for d in _dicts_with(s.doc, "evidence") if d["evidence"]]
    if lists:
        chosen = lists[i % len(lists)]
        del chosen[i % len(chosen)]


def clear_evidence(s: State, i: int) -> None:
    """Every evidence list of one mode emptied."""
    modes = sorted(s.doc["modes"])
    for d in _dicts_with(s.doc["modes"][modes[i % len(modes)]], "evidence"):
        d["evidence"] = []


def unmeet(s: State, i: int) -> None:
    held = [d for d in _dicts_with(s.doc, "met") if d["met"] is True]
    if held:
        held[i % len(held)]["met"] = False


def drop_fact(s: State, i: int) -> None:
    facts = s.doc.get("facts", {})
    if facts:
        del facts[sorted(facts)[i % len(facts)]]


def drop_identity_field(s: State, i: int) -> None:
    fields = s.doc.get("facts", {}).get("cache_identity", {}).get("fields")
    if fields:
        del fields[i % len(fields)]


def drop_predicates(s: State, i: int) -> None:
    named = [d for d in _dicts_with(s.doc, "predicates") if d["predicates"]]
    if named:
        named[i % len(named)]["predicates"] = []


def drop_ordering(s: State, i: int) -> None:
    ordered = _dicts_with(s.doc, "ordering")
    if ordered:
        chosen = ordered[i % len(ordered)]
        if i % 2:
            del chosen["ordering"]
        else:
            chosen["ordering"] = "none"


def fail_level(s: State, i: int) -> None:
    if s.runs:
        s.runs[sorted(s.runs)[i % len(s.runs)]][LEVELS[i % len(LEVELS)]] = "fail"


def drop_run(s: State, i: int) -> None:
    if s.runs:
        del s.runs[sorted(s.runs)[i % len(s.runs)]]


def add_unknown_field(s: State, i: int) -> None:
    places = [s.doc, *_dicts_with(s.doc, "met"), *_dicts_with(s.doc, "provider")]
    places[i % len(places)]["pinned_forever"] = True
    s.unreadable = True


MUTATIONS: tuple[Mutation, ...] = (
    drop_anchor,
    clear_evidence,
    unmeet,
    drop_fact,
    drop_identity_field,
    drop_predicates,
    drop_ordering,
    fail_level,
    drop_run,
    add_unknown_field,
)


def _assert_never_raised(s: State, steps: list[tuple[Mutation, int]], name: str) -> None:
    before = s.classes()
    for mutate, i in steps:
        mutate(s, i)
        after = s.classes()
        for mode, cls in after.items():
            assert cls.rank <= before[mode].rank, (name, mutate.__name__, i, mode)
        before = after
    if not s.unreadable:
        parse_descriptor(s.doc, source="mutated")  # the mutations left it a valid document


@pytest.mark.parametrize("path", BASES, ids=lambda p: p.name)
@pytest.mark.parametrize("mutate", MUTATIONS, ids=lambda m: m.__name__)
def test_one_removal_never_raises_a_class(path: Path, mutate: Mutation) -> None:
    """Each mutation alone, on each of its first 16 places, lowers or keeps each class."""
    before = State.of(path).classes()
    for i in range(16):
        s = State.of(path)
        mutate(s, i)
        for mode, cls in s.classes().items():
            assert cls.rank <= before[mode].rank, (path.name, i, mode)


@settings(max_examples=200, deadline=None)
@given(
    path=st.sampled_from(BASES),
    steps=st.lists(
        st.tuples(st.sampled_from(MUTATIONS), st.integers(0, 10_000)), min_size=1, max_size=8
    ),
)
def test_removals_in_any_order_never_raise_a_class(
    path: Path, steps: list[tuple[Mutation, int]]
) -> None:
    """After every step of a sequence of removals, no mode ranks above what it was."""
    _assert_never_raised(State.of(path), steps, path.name)
