"""The bad-lowering suite: one descriptor per mapping the checker must reject (fixtures/bad/),
each a good lowering (fixtures/good.yaml, fixtures/offload-good.yaml) with one thing broken."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lowering_fixtures import FIXTURES, check_file

from agentclaims.cli.main import main
from agentclaims.contract import LoweringClass, ProtectionMode

BAD = sorted((FIXTURES / "bad").glob("*.yaml"))
EXPECT = re.compile(r'# expect: (?P<mode>\w+) (?P<cls>\w+) "(?P<reason>[^"]+)"')


def expectation(path: Path) -> tuple[ProtectionMode, LoweringClass, str]:
    """What a bad fixture's ``# expect: MODE CLASS "REASON"`` line says it checks to."""
    match = EXPECT.search(path.read_text())
    assert match is not None, f"{path.name} states no expectation"
    return ProtectionMode(match["mode"]), LoweringClass(match["cls"]), match["reason"]


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_lowering_is_rejected_with_its_reason(path: Path) -> None:
    """The bad mapping checks below the adapter_policy it claims, to its class, saying why."""
    mode, expected, reason = expectation(path)
    mapping = check_file(path)[mode]
    assert mapping.claimed is LoweringClass.ADAPTER_POLICY
    assert mapping.below_claimed
    assert mapping.lowering_class is expected
    assert any(reason in why for why in mapping.reasons), mapping.reasons


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("good.yaml", ProtectionMode.HARD_PROTECTED),
        ("offload-good.yaml", ProtectionMode.OFFLOADABLE),
    ],
)
def test_the_good_lowerings_they_break_check_to_adapter_policy(
    name: str, mode: ProtectionMode
) -> None:
    """Unbroken, the same descriptors are adapter_policy: the one change is what rejects."""
    mapping = check_file(FIXTURES / name)[mode]
    assert mapping.lowering_class is LoweringClass.ADAPTER_POLICY
    assert not mapping.below_claimed


def test_the_suite_has_every_bad_lowering_of_the_contract() -> None:
    """One fixture per mapping the contract says a checker must reject, and no other."""
    assert {p.stem for p in BAD} == {
        "generic-counters-only",
        "restore-after-reuse",
        "fallback-recompute-counted-as-restore",
        "failure-on-the-wrong-claim",
        "claims-registered-after-the-fact",
        "missing-ordering",
        "missing-predicate",
        "missing-cache-identity",
        "missing-token-map",
        "offload-with-no-claim",
        "load-failure-tied-to-no-claim",
        "hard-lowered-to-soft-priority",
    }


def test_the_cli_exits_1_on_the_bad_lowerings(capsys: pytest.CaptureFixture[str]) -> None:
    """``agentclaims lowering check fixtures/bad`` parses every file and exits 1."""
    assert main(["lowering", "check", str(FIXTURES / "bad")]) == 1
    out = capsys.readouterr()
    assert out.err == ""
    assert f"{len(BAD)} below their claimed class" in out.out
