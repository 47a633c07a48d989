"""The checker at both ends of ``GET /v1/descriptor``: the gateway serves its KV side's
descriptor checked, and a client checks what it was served again before trusting any mode.

The gateway's ``lowering`` section carries the descriptor document, the conformance runs its
classes rest on and the runtime version; its ``modes`` carry the checker's result.
``trusted_modes`` is what the SDK reads: the section checked again with the same checker, each
mode no stronger than the class the backend states for it, and every mode ``unknown`` when the
descriptor carries no lowering section that checks (fail closed).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentclaims.contract import LoweringClass, ProtectionMode
from agentclaims.errors import DescriptorError
from agentclaims.lowering.check import (
    DescriptorCheck,
    MappingResult,
    Runs,
    check_descriptor,
)
from agentclaims.lowering.document import Descriptor, load_descriptor, parse_descriptor
from agentclaims.protocol import Descriptor as BackendDescriptor
from agentclaims.protocol import stated_class

__all__ = [
    "CONNECTOR_DESCRIPTOR",
    "REFERENCE_DESCRIPTOR",
    "LoweringSource",
    "ServedLowering",
    "reference_descriptor",
    "serve_lowering",
    "trusted_modes",
]

REFERENCE_DESCRIPTOR = Path(__file__).with_name("descriptors") / "reference-engine.yaml"
CONNECTOR_DESCRIPTOR = Path(__file__).with_name("descriptors") / "vllm-agentclaims-connector.yaml"
"""vLLM 0.32 / 0.33 with the agentclaims connector (the vLLM KV side's ``lowering``)."""
"""The reference engine's descriptor, shipped with the engine it describes."""

LoweringSource = Descriptor | Mapping[str, Any] | str | Path
"""A descriptor: read already, a parsed document, or the path of a YAML or JSON file."""


@functools.cache
def reference_descriptor() -> Descriptor:
    """The reference engine's descriptor (read once), named by its place in the package."""
    descriptor = load_descriptor(REFERENCE_DESCRIPTOR)
    name = "agentclaims/lowering/descriptors/" + REFERENCE_DESCRIPTOR.name
    return dataclasses.replace(descriptor, source=name)


class ServedLowering:
    """A KV side's descriptor as the gateway serves it: ``section`` and ``modes``."""

    def __init__(self, section: dict[str, Any] | None, modes: Mapping[ProtectionMode, Any]):
        self.section = section
        self.modes = {
            mode.value: {
                "lowering_class": r.lowering_class.value,
                "claimed": r.claimed.value,
                "reasons": list(r.reasons),
            }
            for mode, r in modes.items()
        }


def serve_lowering(
    source: LoweringSource | None,
    *,
    name: str,
    runs: Mapping[str, Mapping[str, str]] | None = None,
    runtime_version: str | None = None,
    targets: Mapping[str, Mapping[str, Any]] | None = None,
) -> ServedLowering:
    """Check the descriptor of the KV side ``name`` (``runs`` by ``where``, each run on the
    runtime ``targets`` names, else files beside it) and say what to serve. A missing or
    unreadable descriptor makes every mode ``unknown``."""
    if source is None:
        return ServedLowering(None, _all_unknown(f"no lowering descriptor for KV side {name!r}"))
    try:
        descriptor = _descriptor(source, name)
    except DescriptorError as exc:
        return ServedLowering({"source": exc.file, "error": str(exc)}, _all_unknown(str(exc)))
    found = Runs(runs, base_dir=descriptor.base_dir, targets=targets)
    check = check_descriptor(
        descriptor, found, runtime_version=runtime_version, require_version=True
    )
    section = {
        "source": descriptor.source,
        "runtime": descriptor.runtime,
        "versions": descriptor.versions,
        "runtime_version": runtime_version,
        "descriptor": dict(descriptor.document),
        "runs": found.read,
        "run_targets": {
            where: found.targets[where] for where in found.read if where in found.targets
        },
    }
    return ServedLowering(section, _by_mode(check))


def _descriptor(source: LoweringSource, name: str) -> Descriptor:
    if isinstance(source, Descriptor):
        return source
    if isinstance(source, str | Path):
        return load_descriptor(source)
    return parse_descriptor(source, source=f"kv_side:{name}")


def _by_mode(check: DescriptorCheck) -> dict[ProtectionMode, MappingResult]:
    return {m.mode: m for m in check.mappings}


def _all_unknown(why: str, runtime: str = "?", version: str = "?") -> dict[ProtectionMode, Any]:
    return {
        mode: MappingResult(
            runtime, version, mode, LoweringClass.UNKNOWN, LoweringClass.UNKNOWN, (why,)
        )
        for mode in ProtectionMode
    }


def trusted_modes(descriptor: BackendDescriptor) -> dict[ProtectionMode, MappingResult]:
    """What a client may trust of a backend's descriptor, per mode: its ``lowering`` section
    checked again, never above the class the backend states for the mode."""
    section = descriptor.get("lowering")
    try:
        key = json.dumps(section, sort_keys=True)
    except (TypeError, ValueError):
        return _all_unknown("the backend's lowering section is not JSON")
    checked = _checked(key)
    out = {}
    for mode, result in checked.items():
        stated = stated_class(descriptor, mode)
        if stated.rank < result.lowering_class.rank:
            why = f"the backend states {stated} for {mode}"
            result = MappingResult(
                result.runtime,
                result.version,
                mode,
                result.claimed,
                stated,
                (*result.reasons, why),
            )
        out[mode] = result
    return out


@functools.lru_cache(maxsize=64)
def _checked(section_json: str) -> dict[ProtectionMode, MappingResult]:
    """The check of one served section (cached: every session on a backend reads the same)."""
    section = json.loads(section_json)
    if not isinstance(section, Mapping):
        return _all_unknown("the backend serves no lowering descriptor")
    if not isinstance(section.get("descriptor"), Mapping):
        error = section.get("error")
        why = f": {error}" if isinstance(error, str) else ""
        return _all_unknown(f"the backend's lowering descriptor did not check{why}")
    source = f"backend descriptor ({section.get('source', '?')})"
    try:
        descriptor = parse_descriptor(section["descriptor"], source=source)
    except DescriptorError as exc:
        return _all_unknown(str(exc))
    runs = section.get("runs")
    targets = section.get("run_targets")
    version = section.get("runtime_version")
    check = check_descriptor(
        descriptor,
        Runs(
            runs if isinstance(runs, Mapping) else None,
            targets=targets if isinstance(targets, Mapping) else None,
        ),
        runtime_version=version if isinstance(version, str) else None,
        require_version=True,
    )
    return _by_mode(check)
