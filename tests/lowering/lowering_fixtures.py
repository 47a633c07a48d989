"""Shared paths and helpers of the lowering tests: fixtures under ``fixtures/``, the shipped
descriptors under ``integrations/descriptors/``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from agentclaims.contract import LoweringClass, ProtectionMode
from agentclaims.errors import DescriptorError
from agentclaims.lowering import DescriptorCheck, Runs, check_descriptor, load_descriptor
from agentclaims.lowering import parse_descriptor as parse

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
SHIPPED = ROOT / "integrations" / "descriptors"
RUN = "runs/all-pass.json"
"""The conformance run good.yaml cites (fixtures/runs/all-pass.json)."""
PASSING = dict.fromkeys(("L1", "L2", "L3", "L4", "L5", "L6", "L7", "C1"), "pass")
"""Every level of a run passed."""


EXAMPLE_TARGET = {"runtime": "examplekv", "runtime_version": "1.4.2"}
"""What the fixtures' runs ran on: good.yaml's runtime, a version in its range."""


def ran_here(runs: dict[str, Any] | None, target: dict[str, Any] | None = None) -> Runs:
    """``runs`` (where -> levels) given as run on ``target`` (default: ``EXAMPLE_TARGET``)."""
    given = runs or {}
    return Runs(given, targets=dict.fromkeys(given, target or EXAMPLE_TARGET))


def check_file(path: Path) -> DescriptorCheck:
    """Check ``path`` as ``agentclaims lowering check`` does (runs beside it, self-test run)."""
    descriptor = load_descriptor(path)
    return check_descriptor(descriptor, Runs(base_dir=descriptor.base_dir, self_test=True))


def document(path: Path) -> dict[str, Any]:
    """The parsed document of a fixture, a copy the test may change."""
    return copy.deepcopy(yaml.safe_load(path.read_text()))


def classes(
    doc: object, runs: dict[str, dict[str, str]] | None = None
) -> dict[ProtectionMode, LoweringClass]:
    """Each mode's class of ``doc`` checked with only the ``runs`` given; every mode
    ``unknown`` when it does not parse (what the SDK makes of such a descriptor)."""
    try:
        descriptor = parse(doc, source="test")
    except DescriptorError:
        return dict.fromkeys(ProtectionMode, LoweringClass.UNKNOWN)
    check = check_descriptor(descriptor, ran_here(runs))
    return {m.mode: m.lowering_class for m in check.mappings}
