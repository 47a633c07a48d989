"""Malformed descriptors (fixtures/malformed/) are a clear error naming the file and the field,
never a traceback and never a class."""

from __future__ import annotations

import pytest
from lowering_fixtures import FIXTURES

from agentclaims.cli.main import main
from agentclaims.errors import DescriptorError, UsageError
from agentclaims.lowering import load_descriptor, parse_descriptor

MALFORMED = FIXTURES / "malformed"

# file -> (the field named, what is said of it)
CASES = {
    "bad-yaml.yaml": ("line 32, column 17", "bad YAML: while parsing a flow sequence"),
    "duplicate-field.yaml": ("line 36, column 9", "duplicate field 'met'"),
    "wrong-type.yaml": (
        "modes.hard_protected.obligations.claim_identity.met",
        "'yes' is not of type 'boolean'",
    ),
    "wrong-type.json": (
        "modes.hard_protected.obligations.claim_scoped_outcomes.attribution",
        "7 is not one of ['claim_id', 'request_id', 'block_hash', 'none']",
    ),
    "unknown-version.yaml": (
        "descriptor_version",
        "unknown version 2: this checker reads version 1",
    ),
    "unknown-field.yaml": ("modes.hard_protected.primitive.pinned", "unknown field"),
    "missing-field.yaml": ("modes.hard_protected.claimed", "missing (required)"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_descriptor_names_the_file_and_the_field(name: str) -> None:
    """Reading it raises DescriptorError: ``FILE: FIELD: message``, the field it names."""
    field, message = CASES[name]
    path = MALFORMED / name
    with pytest.raises(DescriptorError) as info:
        load_descriptor(path)
    assert (info.value.file, info.value.field) == (str(path), field)
    assert message in info.value.message
    assert str(info.value).startswith(f"{path}: {field}: ")
    assert isinstance(info.value, UsageError)


def test_every_malformed_fixture_is_a_case() -> None:
    """Each file of fixtures/malformed/ is checked here."""
    assert {p.name for p in MALFORMED.iterdir()} == set(CASES)


def test_the_cli_reports_each_malformed_file_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One stderr line per problem, naming the file and the field; no traceback; status 2."""
    assert main(["lowering", "check", *sorted(str(p) for p in MALFORMED.iterdir())]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for name, (field, _) in CASES.items():
        assert f"agentclaims lowering check: {MALFORMED / name}: {field}: " in err


def test_every_problem_of_a_document_is_listed() -> None:
    """Two wrong fields give two problems, in field order."""
    doc = {
        "descriptor_version": 1,
        "runtime": "Not Valid",
        "versions": "*",
        "modes": {"hard_protected": {"claimed": "native"}},
    }
    with pytest.raises(DescriptorError) as info:
        parse_descriptor(doc, source="inline")
    fields = [field for field, _ in info.value.problems]
    assert fields == [
        "modes.hard_protected.claimed",
        "modes.hard_protected.obligations",
        "modes.hard_protected.primitive",
        "runtime",
    ]


def test_a_document_that_is_not_a_mapping_is_named_so() -> None:
    """A YAML list at the top is not a descriptor."""
    with pytest.raises(DescriptorError, match=r"inline: \(document\): expected a mapping"):
        parse_descriptor(["modes"], source="inline")


def test_a_missing_file_is_a_descriptor_error(tmp_path) -> None:
    """A path that cannot be read is named, not a traceback."""
    with pytest.raises(DescriptorError, match="cannot read"):
        load_descriptor(tmp_path / "nothing.yaml")


def test_a_missing_version_is_named() -> None:
    """No descriptor_version: the checker cannot know how to read the rest."""
    with pytest.raises(DescriptorError, match="descriptor_version: missing"):
        parse_descriptor({"runtime": "x"}, source="inline")
