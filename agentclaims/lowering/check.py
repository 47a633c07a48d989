"""The lowering checker: classify each runtime x mode mapping of a descriptor, failing closed.

A lowering is conformant only if it binds behaviour to the accepted claim's identity, a
materialization predicate, ordered lifecycle events and claim-scoped outcomes. Per mode::

    rejected                 the primitive is no sound carrier of the mode (hard -> a soft
                             priority), or a declared behaviour breaks an obligation (generic
                             counters only, restore after reuse, a failure on the wrong claim...)
    unknown                  otherwise, when no evidence anchor counts
    native_conformance       every obligation met, anchored and shown (a test, or a
      / adapter_policy       conformance run in which every level of the mode passed), by the
                             runtime itself / by an adapter that enforces it
    adapter_observational    an adapter with claim identity, ordered events and claim-scoped
                             outcomes, whose enforcement is not shown (or an event observer)
    approximation_substrate  a sound primitive, anchored, without the obligations

then capped at the mapping's ``claimed`` class. Only ``conformance_run`` anchors are read: a run
that cannot be read, or in which a level of the mode did not pass, supports nothing. Taking
evidence away (an anchor, a ``met``, a fact, a passing level) can only lower a class: the
ranks of ``LoweringClass`` are that order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentclaims.contract import ConformanceStatus, LoweringClass, ProtectionMode
from agentclaims.errors import UsageError
from agentclaims.lowering.document import Descriptor, version_in_range

__all__ = [
    "HONOURED",
    "IDENTITY_FIELDS",
    "OBLIGATIONS",
    "PRIMITIVES",
    "SELF_TEST",
    "DescriptorCheck",
    "MappingResult",
    "Primitive",
    "Runs",
    "check_descriptor",
    "honours",
]

OBLIGATIONS = (
    "claim_identity",
    "materialization_predicate",
    "ordered_lifecycle_events",
    "claim_scoped_outcomes",
)
"""The four obligations of a conformant lowering, in the order they are checked."""
_OBSERVED = ("claim_identity", "ordered_lifecycle_events", "claim_scoped_outcomes")
"""What an adapter needs to join a runtime's events to claims (adapter_observational)."""
IDENTITY_FIELDS = ("cache_key_domain", "model_id", "tokenizer_id", "salt_namespace", "block_size")
"""The cache identity fields a claim cannot do without (``adapter_id`` is optional)."""
_SHOWN_BY = frozenset({"test", "conformance_run"})
SELF_TEST = "self_test:reference_engine"
"""A ``conformance_run`` anchor's ``where`` naming a run of the suite on a scratch reference
engine, made when the checker needs it (the reference engine's own descriptor uses it)."""
HONOURED = frozenset({LoweringClass.NATIVE_CONFORMANCE, LoweringClass.ADAPTER_POLICY})
"""The classes a client may accept a claim on: enforcement shown. Anything weaker only
approximates the mode (or observes it), and ``rejected`` and ``unknown`` never count."""


def honours(cls: LoweringClass) -> bool:
    """Whether a mode of class ``cls`` is honoured (``HONOURED``): fail closed."""
    return cls in HONOURED


_ALL = frozenset(ProtectionMode)
_M = ProtectionMode


@dataclass(frozen=True, slots=True)
class Primitive:
    """What a kind of runtime primitive does, and which modes it can soundly carry."""

    does: str
    sound_for: frozenset[ProtectionMode]
    ceiling: Mapping[ProtectionMode, tuple[LoweringClass, str]] = field(default_factory=dict)
    """Per mode, the best class it can reach, and why."""


PRIMITIVES: Mapping[str, Primitive] = {
    "claim_arbiter": Primitive("the runtime accepts, refuses and reports claims itself", _ALL),
    "block_reference_hold": Primitive(
        "an adapter holds references on the claimed blocks and defers or refuses what cannot fit",
        _ALL - {_M.OFFLOADABLE},
    ),
    "event_observer": Primitive(
        "an adapter joins the runtime's events to claims; nothing enforces them",
        _ALL,
        dict.fromkeys(
            _ALL,
            (LoweringClass.ADAPTER_OBSERVATIONAL, "an event observer enforces nothing"),
        ),
    ),
    "eviction_priority": Primitive(
        "a soft priority: evicted last, still evicted, without a refusal",
        frozenset({_M.SOFT_PRIORITY, _M.DEMOTABLE, _M.BEST_EFFORT}),
    ),
    "timed_pin": Primitive(
        "a pin released on a timeout or when idle, with no claim event",
        _ALL - {_M.OFFLOADABLE},
        {
            _M.HARD_PROTECTED: (
                LoweringClass.APPROXIMATION_SUBSTRATE,
                "a pin that lets go on a timeout is at best an approximation of hard_protected",
            )
        },
    ),
    "offload_tier": Primitive(
        "blocks move to a slower tier", frozenset({_M.OFFLOADABLE, _M.BEST_EFFORT})
    ),
    "lru_prefix_cache": Primitive(
        "ordinary LRU prefix caching: every block is an eviction victim",
        frozenset({_M.BEST_EFFORT}),
    ),
    "routing_affinity": Primitive(
        "requests routed to where the prefix was: nothing is kept resident",
        frozenset({_M.BEST_EFFORT}),
    ),
    "scheduling_priority": Primitive("orders scheduling only, never eviction", frozenset()),
    "none": Primitive("no primitive", frozenset()),
}
"""The primitive kinds a descriptor may name (the schema's enum), and what each can carry."""


@dataclass(frozen=True, slots=True)
class MappingResult:
    """The checker's verdict on one runtime x mode mapping."""

    runtime: str
    version: str
    mode: ProtectionMode
    claimed: LoweringClass
    lowering_class: LoweringClass
    reasons: tuple[str, ...]

    @property
    def below_claimed(self) -> bool:
        return self.lowering_class.rank < self.claimed.rank

    def to_dict(self) -> dict[str, Any]:
        """The mapping as ``agentclaims lowering check --json`` prints it."""
        return {
            "runtime": self.runtime,
            "version": self.version,
            "mode": self.mode.value,
            "claimed": self.claimed.value,
            "class": self.lowering_class.value,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True, slots=True)
class DescriptorCheck:
    """Every mode of one descriptor, in ``ProtectionMode`` order (undescribed ones ``unknown``)."""

    descriptor: Descriptor
    mappings: tuple[MappingResult, ...]

    def __getitem__(self, mode: ProtectionMode) -> MappingResult:
        return next(m for m in self.mappings if m.mode is mode)

    @property
    def described(self) -> tuple[MappingResult, ...]:
        """The mappings the descriptor states (what ``agentclaims lowering check`` prints)."""
        return tuple(m for m in self.mappings if m.mode in self.descriptor.modes)

    @property
    def below_claimed(self) -> tuple[MappingResult, ...]:
        return tuple(m for m in self.mappings if m.below_claimed)


RunLevels = Mapping[str, str]
"""One conformance run: ``level -> status``."""


class Runs:
    """Where ``conformance_run`` anchors are looked up: ``given`` runs (``where -> levels``),
    else a JSON file at ``where`` under ``base_dir`` (the output of ``agentclaims conformance
    --json``), else, with ``self_test``, ``SELF_TEST`` run now. ``read`` keeps every run found,
    so that whoever serves a descriptor can serve the runs its classes rest on."""

    def __init__(
        self,
        given: Mapping[str, RunLevels] | None = None,
        *,
        base_dir: Path | None = None,
        self_test: bool = False,
        targets: Mapping[str, Any] | None = None,
    ) -> None:
        self.read: dict[str, dict[str, str]] = {}
        self.targets: dict[str, dict[str, Any]] = {
            where: dict(t) for where, t in (targets or {}).items() if isinstance(t, Mapping)
        }
        """What ran each run read (``runtime``, ``runtime_version``): a run counts only for a
        descriptor of that runtime and a range with that version. ``SELF_TEST`` ran on the
        reference engine; a run that does not say what it ran on supports nothing."""
        self._given = dict(given or {})
        self._base_dir = base_dir
        self._self_test = self_test
        self._missing: dict[str, str] = {}

    def levels(self, where: str) -> RunLevels | str:
        """The run at ``where``, or why there is none."""
        if where in self.read:
            return self.read[where]
        if where in self._missing:
            return self._missing[where]
        try:
            found = self._find(where)
        except LookupError as exc:
            self._missing[where] = str(exc.args[0])
            return self._missing[where]
        self.read[where] = found
        return found

    def _find(self, where: str) -> dict[str, str]:
        if where in self._given:
            run = self._given[where]
            if not isinstance(run, Mapping):
                raise LookupError(f"given as {type(run).__name__}, not levels")
            return {str(k): str(v) for k, v in run.items()}
        if where == SELF_TEST and self._self_test:
            from agentclaims.conformance import self_test

            return dict(asyncio.run(self_test())["levels"])  # its target: by name (target())
        if where.startswith("self_test:"):
            raise LookupError("not run here")
        if self._base_dir is None or not (self._base_dir / where).is_file():
            raise LookupError("no such file beside the descriptor")
        from agentclaims.conformance import evidence_from_json

        try:
            saved = evidence_from_json(self._base_dir / where)
        except UsageError as exc:
            raise LookupError(exc.message) from None
        if saved["target"] is not None:
            self.targets[where] = dict(saved["target"])
        return dict(saved["levels"])

    def target(self, where: str) -> dict[str, Any] | None:
        """What ran the run at ``where``: as it said, or, for ``SELF_TEST``, the reference
        engine; ``None`` when that is not known."""
        if where == SELF_TEST:  # by its name: whatever a served section says it ran on
            from agentclaims.conformance.evidence import REFERENCE_RUNTIME

            return {"runtime": REFERENCE_RUNTIME, "runtime_version": None}
        return self.targets.get(where)


def check_descriptor(
    descriptor: Descriptor,
    runs: Runs | None = None,
    *,
    runtime_version: str | None = None,
    require_version: bool = False,
) -> DescriptorCheck:
    """Classify every mode of ``descriptor``. ``runtime_version`` is the version of the runtime
    it is applied to: outside the descriptor's range every mode is ``unknown`` (and so it is
    with none stated when ``require_version`` and the range is not ``*``)."""
    runs = runs if runs is not None else Runs(base_dir=descriptor.base_dir)
    outside = _outside(descriptor.versions, runtime_version, require_version)
    out = []
    for mode in ProtectionMode:
        mapping = descriptor.modes.get(mode)
        if mapping is None:
            claimed, cls, reasons = LoweringClass.UNKNOWN, LoweringClass.UNKNOWN, ["not described"]
        else:
            claimed = LoweringClass(mapping["claimed"])
            if outside:
                cls, reasons = LoweringClass.UNKNOWN, [outside]
            else:
                cls, reasons = _Mapping(mode, mapping, descriptor, runs).classify()
            cls, reasons = _capped(cls, claimed, reasons)
        reasons = list(dict.fromkeys(reasons))
        out.append(
            MappingResult(
                descriptor.runtime, descriptor.versions, mode, claimed, cls, tuple(reasons)
            )
        )
    return DescriptorCheck(descriptor, tuple(out))


def _outside(versions: str, runtime_version: str | None, require: bool) -> str | None:
    if runtime_version is not None and not version_in_range(runtime_version, versions):
        return f"runtime version {runtime_version} is outside the descriptor's range {versions}"
    if runtime_version is None and require and versions.strip() != "*":
        return f"no runtime version stated to match the descriptor's range {versions}"
    return None


def _capped(
    cls: LoweringClass, claimed: LoweringClass, reasons: list[str]
) -> tuple[LoweringClass, list[str]]:
    if cls.rank > claimed.rank:
        return claimed, [*reasons, f"capped at its claimed class {claimed} (shown: {cls})"]
    if cls.rank < claimed.rank:
        return cls, [*reasons, f"below its claimed class {claimed}"]
    return cls, reasons


Anchor = Mapping[str, Any]


class _Mapping:
    """One mode's mapping being classified: the reasons found so far, and the anchors that count."""

    def __init__(
        self, mode: ProtectionMode, mapping: Mapping[str, Any], descriptor: Descriptor, runs: Runs
    ) -> None:
        from agentclaims.conformance import MODE_LEVELS

        self.mode = mode
        self.mapping = mapping
        self.descriptor = descriptor
        self.facts = descriptor.facts
        self.runs = runs
        self.levels = MODE_LEVELS[mode]
        self.reasons: list[str] = []

    def counting(self, anchors: Iterable[Anchor]) -> list[Anchor]:
        """The anchors that count as evidence for this mode (a run only when every level of
        the mode passed in it)."""
        out = []
        for anchor in anchors:
            if anchor["kind"] != "conformance_run" or self._run_supports(anchor["where"]):
                out.append(anchor)
        return out

    def _run_supports(self, where: str) -> bool:
        run = self.runs.levels(where)
        if isinstance(run, str):
            self.reasons.append(f"conformance run {where}: unavailable ({run}): supports nothing")
            return False
        elsewhere = self._not_this_runtimes(where)
        if elsewhere is not None:
            self.reasons.append(f"conformance run {where}: {elsewhere}: supports nothing")
            return False
        if not self.levels:
            self.reasons.append(
                f"conformance run {where}: no level exercises {self.mode}: supports nothing here"
            )
            return False
        failed = [
            f"{lvl} {run.get(lvl, 'missing')}"
            for lvl in self.levels
            if run.get(lvl) != ConformanceStatus.PASS.value
        ]
        for what in failed:
            self.reasons.append(f"conformance run {where}: {what}: cannot support {self.mode}")
        return not failed

    def _not_this_runtimes(self, where: str) -> str | None:
        """Why the run at ``where`` is not evidence about this descriptor's runtime (it ran on
        another, on a version outside the range, or does not say what it ran on), or ``None``."""
        target = self.runs.target(where)
        d = self.descriptor
        if target is None:
            return (
                "it does not say what it ran on (no target: rerun agentclaims conformance --json)"
            )
        if target.get("runtime") != d.runtime:
            return f"it ran on {target.get('runtime')!r}, not on {d.runtime!r}"
        version = target.get("runtime_version")
        if d.versions.strip() != "*" and (
            not isinstance(version, str) or not version_in_range(version, d.versions)
        ):
            return f"it ran on version {version!r}, outside the descriptor's range {d.versions}"
        return None

    def classify(self) -> tuple[LoweringClass, list[str]]:
        mode, mapping = self.mode, self.mapping
        primitive = mapping["primitive"]
        kind = PRIMITIVES[primitive["kind"]]
        obligations = mapping["obligations"]
        offload = mapping.get("offload") if mode is _M.OFFLOADABLE else None
        rejected = _unsound(mode, primitive["kind"], kind, obligations, offload)
        counted = {
            name: self.counting(obligations[name].get("evidence", ())) for name in OBLIGATIONS
        }
        anchored = [*self.counting(primitive.get("evidence", ())), *_flat(counted.values())]
        offload_anchors = self.counting(offload.get("evidence", ())) if offload else []
        if rejected:
            return LoweringClass.REJECTED, [*rejected, *self.reasons]
        if not anchored and not offload_anchors:
            return LoweringClass.UNKNOWN, [*self.reasons, "no anchored evidence"]
        met = {
            name: self._supported(name, obligations[name], counted[name]) for name in OBLIGATIONS
        }
        shown = {name: any(a["kind"] in _SHOWN_BY for a in counted[name]) for name in OBLIGATIONS}
        if offload is not None:
            met["offload"] = self._offload_supported(offload, offload_anchors)
            shown["offload"] = any(a["kind"] in _SHOWN_BY for a in offload_anchors)
        unshown = [name for name, ok in shown.items() if not ok]
        adapter = primitive["provider"] == "adapter"
        if all(met.values()) and not unshown:
            cls = LoweringClass.ADAPTER_POLICY if adapter else LoweringClass.NATIVE_CONFORMANCE
            by = sorted({a["kind"] for a in _flat(counted.values())} & _SHOWN_BY)
            self.reasons.append(f"every obligation met, anchored and shown (by {' and '.join(by)})")
        else:
            if all(met.values()):
                self.reasons.append(
                    f"not shown: no test or passing conformance run anchors {', '.join(unshown)}"
                )
            if adapter and all(met[name] for name in _OBSERVED):
                cls = LoweringClass.ADAPTER_OBSERVATIONAL
                self.reasons.append(
                    "an adapter joins events to claims, but its enforcement is not shown"
                )
            else:
                cls = LoweringClass.APPROXIMATION_SUBSTRATE
                self.reasons.append(
                    f"{primitive['kind']} ({kind.does}) only approximates {mode}: "
                    "not every obligation is met and anchored"
                )
        ceiling = kind.ceiling.get(mode)
        if ceiling is not None and ceiling[0].rank < cls.rank:
            cls = ceiling[0]
            self.reasons.append(ceiling[1])
        return cls, self.reasons

    def _supported(
        self, name: str, obligation: Mapping[str, Any], counted: Sequence[Anchor]
    ) -> bool:
        note = obligation.get("note")
        if not obligation["met"]:
            self.reasons.append(f"{name}: not met" + (f": {note}" if note else ""))
            return False
        gaps = [] if counted else [f"{name}: met, but no evidence anchor counts"]
        gaps += _unstated(name, obligation)
        if name == "claim_identity":
            gaps += self._identity_gaps()
        if name == "materialization_predicate" and not obligation.get("predicates"):
            gaps.append("materialization_predicate: missing predicate (none named)")
        if name in ("claim_identity", "materialization_predicate"):
            gaps += self._token_map_gaps(name)
        self.reasons += gaps
        return not gaps

    def _identity_gaps(self) -> list[str]:
        identity = self.facts.get("cache_identity")
        if identity is None:
            return ["claim_identity: missing cache identity (facts.cache_identity)"]
        gaps = []
        lacking = [f for f in IDENTITY_FIELDS if f not in identity["fields"]]
        if lacking:
            gaps.append(f"claim_identity: the cache identity lacks {', '.join(lacking)}")
        if not self.counting(identity["evidence"]):
            gaps.append("claim_identity: the cache identity has no evidence anchor that counts")
        return gaps

    def _token_map_gaps(self, name: str) -> list[str]:
        token_map = self.facts.get("token_map")
        if token_map is None:
            return [f"{name}: missing token map (facts.token_map)"]
        if not self.counting(token_map["evidence"]):
            return [f"{name}: the token map has no evidence anchor that counts"]
        return []

    def _offload_supported(self, offload: Mapping[str, Any], counted: Sequence[Anchor]) -> bool:
        gaps = [] if counted else ["offload: no evidence anchor counts"]
        gaps += _unstated("offload", offload)
        self.reasons += gaps
        return not gaps


_UNSTATED: Mapping[str, tuple[tuple[str, str], ...]] = {
    "claim_identity": (("bound_at", "claim_identity: bound to no claim (bound_at: none)"),),
    "ordered_lifecycle_events": (
        (
            "ordering",
            "ordered_lifecycle_events: missing ordering (no per-claim or stream sequence)",
        ),
    ),
    "claim_scoped_outcomes": (
        ("source", "claim_scoped_outcomes: no claim-scoped outcome source (source: none)"),
        ("attribution", "claim_scoped_outcomes: outcomes tied to no claim (attribution: none)"),
    ),
    "offload": (
        ("restore", "offload: nothing restores an offloaded claim (restore: none)"),
        (
            "on_restore_failure",
            "offload: a failed restore is not reported (on_restore_failure: none)",
        ),
    ),
}
"""Per section, the details that leave an obligation unmet when ``none`` (or not stated)."""


def _unstated(section: str, fields: Mapping[str, Any]) -> list[str]:
    return [why for name, why in _UNSTATED.get(section, ()) if fields.get(name, "none") == "none"]


def _flat(groups: Iterable[Sequence[Anchor]]) -> list[Anchor]:
    return [a for group in groups for a in group]


def _unsound(
    mode: ProtectionMode,
    kind_name: str,
    kind: Primitive,
    obligations: Mapping[str, Any],
    offload: Mapping[str, Any] | None,
) -> list[str]:
    """What makes the mapping unsound whatever its evidence: a primitive that cannot carry the
    mode, or a declared behaviour that breaks an obligation (the bad lowerings)."""
    out = []
    if mode not in kind.sound_for:
        out.append(f"{mode} lowered to {kind_name} ({kind.does}): not a sound lowering of {mode}")
    if obligations["claim_identity"]["bound_at"] == "after_the_fact":
        out.append(
            "claim_identity: claims registered after the fact: the runtime acted before "
            "an accepted claim existed"
        )
    outcomes = obligations["claim_scoped_outcomes"]
    if outcomes["source"] == "generic_counters":
        out.append(
            "claim_scoped_outcomes: generic counters only: an aggregate cannot say which "
            "claim an outcome befell"
        )
    if outcomes["attribution"] in ("request_id", "block_hash"):
        out.append(
            f"claim_scoped_outcomes: failure on the wrong claim: outcomes are attributed by "
            f"{outcomes['attribution']}, not by the claim they befell"
        )
    if offload is not None:
        out += _unsound_offload(offload)
    return out


_OFFLOAD_RULES: tuple[tuple[Callable[[Mapping[str, Any]], bool], str], ...] = (
    (
        lambda o: o["claim_bound"] is False,
        "offload: offload with no claim: blocks change tier without the claim that must "
        "restore them",
    ),
    (
        lambda o: o["restore"] == "after_reuse",
        "offload: restore after reuse: the reuse ran before the claimed KV was back",
    ),
    (
        lambda o: o["on_restore_failure"] == "recompute_counted_as_restore",
        "offload: fallback recompute counted as a restore: a lost prefix reads as restored",
    ),
    (
        lambda o: o["failure_attributed_to"] in ("none", "request"),
        "offload: load failure tied to no claim: a failed restore ends no claim",
    ),
)


def _unsound_offload(offload: Mapping[str, Any]) -> list[str]:
    return [why for broken, why in _OFFLOAD_RULES if broken(offload)]
