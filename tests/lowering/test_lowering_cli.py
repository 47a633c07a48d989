"""``agentclaims lowering check FILE... [--json]``: its output and its exit status."""

from __future__ import annotations

import json

import pytest
from lowering_fixtures import FIXTURES

from agentclaims.cli.main import main

GOOD = str(FIXTURES / "good.yaml")
BELOW = str(FIXTURES / "bad" / "missing-ordering.yaml")
MALFORMED = str(FIXTURES / "malformed" / "unknown-field.yaml")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["lowering", "check", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_is_one_object_of_mappings_with_exactly_their_fields(capsys) -> None:
    """``--json`` prints ``{"mappings": [...]}``, each with runtime, version, mode, claimed,
    class and reasons; every file parsed and none below its claim: status 0."""
    code, out, err = run(capsys, GOOD, "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert list(doc) == ["mappings"]
    [mapping] = doc["mappings"]
    assert mapping == {
        "runtime": "examplekv",
        "version": ">=1.0,<2.0",
        "mode": "hard_protected",
        "claimed": "adapter_policy",
        "class": "adapter_policy",
        "reasons": ["every obligation met, anchored and shown (by conformance_run and test)"],
    }


def test_a_mapping_below_its_claim_exits_1(capsys) -> None:
    """One mapping below its claimed class among good ones: status 1."""
    code, out, _ = run(capsys, GOOD, BELOW, "--json")
    assert code == 1
    classes = [m["class"] for m in json.loads(out)["mappings"]]
    assert classes == ["adapter_policy", "approximation_substrate"]


def test_a_file_that_did_not_parse_exits_2_and_the_rest_is_still_checked(capsys) -> None:
    """Status 2 wins over 1; the parsed files' mappings are still printed."""
    code, out, err = run(capsys, BELOW, MALFORMED, GOOD, "--json")
    assert code == 2
    assert len(json.loads(out)["mappings"]) == 2
    assert f"{MALFORMED}: modes.hard_protected.primitive.pinned: unknown field" in err


def test_the_table_flags_a_mapping_below_its_claim(capsys) -> None:
    """Without --json: one block per file, each mapping with its reasons, then a summary."""
    code, out, _ = run(capsys, BELOW)
    assert code == 1
    assert f"{BELOW}: examplekv >=1.0,<2.0" in out
    assert "class approximation_substrate  BELOW CLAIMED" in out
    assert "      - ordered_lifecycle_events: missing ordering" in out
    assert out.rstrip().endswith(
        "1 descriptor(s), 1 mappings, 1 below their claimed class, 0 file(s) did not parse"
    )


def test_a_folder_stands_for_its_yaml_files(capsys) -> None:
    """A folder is read as its descriptor files, sorted (sub-folders are not scanned)."""
    code, out, _ = run(capsys, str(FIXTURES), "--json")
    assert code == 0
    assert [m["mode"] for m in json.loads(out)["mappings"]] == ["hard_protected", "offloadable"]


def test_a_folder_is_scanned_for_every_format_the_checker_reads(capsys, tmp_path) -> None:
    """A folder holding only an over-claiming .json fails as the file given directly does."""
    import yaml

    doc = yaml.safe_load((FIXTURES / "bad" / "missing-ordering.yaml").read_text())
    (tmp_path / "over.json").write_text(json.dumps(doc))
    direct, _, _ = run(capsys, str(tmp_path / "over.json"), "--json")
    code, out, _ = run(capsys, str(tmp_path), "--json")
    assert direct == code == 1
    assert [m["class"] for m in json.loads(out)["mappings"]] == ["approximation_substrate"]


def test_a_folder_with_no_descriptor_fails(capsys, tmp_path) -> None:
    """Zero mappings from a scan that found nothing is not a pass: status 2, naming it."""
    (tmp_path / "notes.txt").write_text("not a descriptor")
    code, _, err = run(capsys, str(tmp_path))
    assert code == 2
    assert f"{tmp_path}: no descriptor in it (*.yaml, *.yml, *.json)" in err


def test_a_version_range_that_matches_nothing_does_not_pass(capsys, tmp_path) -> None:
    text = (FIXTURES / "good.yaml").read_text().replace('">=1.0,<2.0"', '">=2.0,<1.0"')
    (tmp_path / "never.yaml").write_text(text)
    code, _, err = run(capsys, str(tmp_path / "never.yaml"))
    assert code == 2
    assert "matches no version" in err
