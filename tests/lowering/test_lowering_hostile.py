"""Hostile descriptors (a key given twice in JSON, a "billion laughs", nesting 100,000 deep, a
5,000-digit number, a file too large, values a megabyte long) fail closed: a ``DescriptorError``
naming the file and the limit passed, in bounded time and memory, its text bounded too; the
CLI exits 2, never with a traceback. A fuzz test holds every generated hostile document to it.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lowering_fixtures import FIXTURES, ROOT, check_file, document

from agentclaims.cli.main import main
from agentclaims.errors import DescriptorError
from agentclaims.lowering import DescriptorCheck, load_descriptor, parse_descriptor
from agentclaims.lowering.document import (
    MAX_BYTES,
    MAX_DEPTH,
    MAX_EXPANDED,
    MAX_NUMBER_CHARS,
    MAX_PROBLEMS,
    MAX_SHOWN,
)

GOOD = FIXTURES / "good.yaml"
BOUND = 10_000
"""The most characters an error's text may have, whatever the input."""


def good_json() -> str:
    """good.yaml as JSON text, one field a line (so that a test can give one twice)."""
    return json.dumps(document(GOOD), indent=1)


def laughs(levels: int = 9, width: int = 9) -> str:
    """A "billion laughs": ``width ** levels`` strings once every alias is expanded."""
    lines = ["descriptor_version: 1", "l0: &l0 [" + ", ".join(['"lol"'] * width) + "]"]
    for level in range(1, levels):
        aliases = ", ".join([f"*l{level - 1}"] * width)
        lines.append(f"l{level}: &l{level} [{aliases}]")
    return "\n".join(lines) + "\n"


def digits(n: int) -> str:
    return "1" + "0" * (n - 1)


# ---------------------------------------------------------------------- the CLI on real files
CLI_CASES: dict[str, tuple[Callable[[], str], str]] = {
    "duplicate-key.json": (
        lambda: good_json().replace(
            '"claimed": "adapter_policy"', '"claimed": "rejected",\n "claimed": "adapter_policy"'
        ),
        "modes.hard_protected.claimed: bad JSON: duplicate field 'claimed'",
    ),
    "billion-laughs.yaml": (
        laughs,
        f"bad YAML: larger than {MAX_EXPANDED} characters with its aliases expanded",
    ),
    "deep.json": (
        lambda: "[" * 100_000 + "]" * 100_000,
        f"line 1, column {MAX_DEPTH + 1}: bad JSON: nested deeper than {MAX_DEPTH} levels",
    ),
    "deep.yaml": (
        lambda: "descriptor_version: 1\nx: " + "[" * 100_000 + "]" * 100_000 + "\n",
        f"line 2, column {MAX_DEPTH + 3}: bad YAML: nested deeper than {MAX_DEPTH} levels",
    ),
    "deep-block.yaml": (
        lambda: "- " * 100_000 + "x\n",
        f"bad YAML: nested deeper than {MAX_DEPTH} levels",
    ),
    "huge-number.json": (
        lambda: '{"descriptor_version": ' + digits(5000) + "}",
        f"line 1, column 24: bad JSON: a number of 5000 characters: at most {MAX_NUMBER_CHARS}",
    ),
    "huge-number.yaml": (
        lambda: f"descriptor_version: {digits(5000)}\n",
        f"line 1, column 21: bad YAML: a number of 5000 characters: at most {MAX_NUMBER_CHARS}",
    ),
    "oversized.yaml": (
        lambda: GOOD.read_text() + "# " + "x" * MAX_BYTES + "\n",
        f"(file): larger than {MAX_BYTES} bytes (MAX_BYTES): not read",
    ),
}


@pytest.mark.parametrize("name", sorted(CLI_CASES))
def test_the_cli_refuses_a_hostile_file_with_status_2(tmp_path: Path, name: str) -> None:
    """``agentclaims lowering check FILE`` in a fresh process: status 2, stderr names the file
    and the limit passed, no traceback, quickly (the laughs alone once took 43 s and 3 GB)."""
    make, problem = CLI_CASES[name]
    path = tmp_path / name
    path.write_text(make())
    done = subprocess.run(
        [sys.executable, "-m", "agentclaims.cli.main", "lowering", "check", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"agentclaims lowering check: {path}: " in done.stderr
    assert problem in done.stderr
    assert len(done.stderr) < BOUND


# ---------------------------------------------------------------------- JSON: a key given twice
DUPLICATES = {
    "top level": (
        ('"runtime": "examplekv"', '"runtime": "other",\n "runtime": "examplekv"'),
        "runtime",
    ),
    "a mode's field": (
        ('"claimed": "adapter_policy"', '"claimed": "rejected",\n "claimed": "adapter_policy"'),
        "modes.hard_protected.claimed",
    ),
    "an obligation's field": (
        ('"met": true', '"met": false,\n "met": true'),
        "modes.hard_protected.obligations.claim_identity.met",
    ),
    "an anchor in a list": (
        ('"kind": "doc"', '"kind": "test",\n "kind": "doc"'),
        "facts.cache_identity.evidence[0].kind",
    ),
}


@pytest.mark.parametrize("case", sorted(DUPLICATES))
def test_a_json_key_given_twice_is_named_by_its_path(tmp_path: Path, case: str) -> None:
    """At any nesting level, as the YAML form is: the last value silently winning could turn
    an earlier ``met: false`` into ``met: true``."""
    (old, new), field = DUPLICATES[case]
    path = tmp_path / "twice.json"
    path.write_text(good_json().replace(old, new, 1))
    with pytest.raises(DescriptorError) as info:
        load_descriptor(path)
    key = field.rsplit(".", 1)[-1].split("[")[0]
    assert info.value.problems == ((field, f"bad JSON: duplicate field {key!r}"),)
    assert info.value.file == str(path)


def test_json_without_a_key_given_twice_reads_as_its_yaml_does(tmp_path: Path) -> None:
    """The checks added cost a good JSON descriptor nothing."""
    path = tmp_path / "good.json"
    path.write_text(good_json())
    assert load_descriptor(path).document == load_descriptor(GOOD).document


# ---------------------------------------------------------------------- YAML aliases
def test_aliases_that_share_evidence_are_still_read() -> None:
    """The shipped descriptors anchor shared evidence (``&name``) and cite it (``*name``)."""
    path = ROOT / "integrations" / "descriptors" / "dynamo.yaml"
    assert "*no_claims" in path.read_text()
    assert load_descriptor(path).runtime == "dynamo"


def test_a_billion_laughs_is_refused_while_composing(tmp_path: Path) -> None:
    """Refused on the line where the expansion passes ``MAX_EXPANDED``, before it is built."""
    path = tmp_path / "laughs.yaml"
    path.write_text(laughs())
    with pytest.raises(DescriptorError) as info:
        load_descriptor(path)
    assert info.value.field == "line 7, column 5"  # l5: 9 ** 5 strings of 4
    assert "(MAX_EXPANDED)" in info.value.message


def test_an_alias_inside_the_node_it_names_is_refused(tmp_path: Path) -> None:
    """A recursive document (``&a [*a]``) would be infinitely deep."""
    path = tmp_path / "cycle.yaml"
    path.write_text("descriptor_version: 1\nx: &a [1, *a]\n")
    with pytest.raises(DescriptorError, match=r"line 2, column 11: bad YAML: the alias \*a is"):
        load_descriptor(path)


def test_depth_through_aliases_is_counted_before_the_schema(tmp_path: Path) -> None:
    """Aliases can nest deeper than the text does: the document's depth is checked as built."""
    path = tmp_path / "deep-alias.yaml"
    inner, outer = "[" * 40 + "]" * 40, "[" * 25 + "*a" + "]" * 25  # 1 + 25 + 40 levels
    path.write_text(f"descriptor_version: 1\na: &a {inner}\nb: {outer}\n")
    with pytest.raises(DescriptorError, match=f"b\\[0\\].*: nested deeper than {MAX_DEPTH}"):
        load_descriptor(path)


# ---------------------------------------------------------------------- limits, at the edge
def nested(depth: int) -> str:
    return "[" * (depth - 1) + "]" * (depth - 1)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_the_depth_limit_is_exact(tmp_path: Path, suffix: str) -> None:
    """``MAX_DEPTH`` levels (the document one of them) are read; one more is refused."""
    path = tmp_path / f"d{suffix}"
    for depth, refused in ((MAX_DEPTH, False), (MAX_DEPTH + 1, True)):
        path.write_text(f'{{"descriptor_version": 1, "x": {nested(depth)}}}')
        with pytest.raises(DescriptorError) as info:
            load_descriptor(path)
        assert ("nested deeper" in info.value.message) == refused


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
@pytest.mark.parametrize(
    "literal",
    [digits(MAX_NUMBER_CHARS + 1), "1." + "0" * 5000, "-" + digits(5000), "1.0e+" + "9" * 200],
)
def test_a_number_longer_than_the_limit_is_refused(
    tmp_path: Path, suffix: str, literal: str
) -> None:
    """Integers, floats and exponents alike; a number of ``MAX_NUMBER_CHARS`` is read."""
    path = tmp_path / f"n{suffix}"
    path.write_text(f'{{"descriptor_version": {literal}}}')
    with pytest.raises(DescriptorError, match=f"a number of {len(literal)} characters"):
        load_descriptor(path)
    path.write_text(f'{{"descriptor_version": {digits(MAX_NUMBER_CHARS)}}}')
    with pytest.raises(DescriptorError, match="descriptor_version: unknown version 1000"):
        load_descriptor(path)


def test_a_deep_document_given_as_objects_is_refused_not_a_recursion_error() -> None:
    """What a gateway serves is parsed by others: ``parse_descriptor`` bounds depth itself."""
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(DescriptorError) as info:
        parse_descriptor({"descriptor_version": 1, "x": deep}, source="served")
    assert info.value.field.startswith("x[0][0]")
    assert len(info.value.field) <= MAX_SHOWN
    assert info.value.message == f"nested deeper than {MAX_DEPTH} levels (MAX_DEPTH)"


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_an_endless_device_is_refused_unread() -> None:
    with pytest.raises(DescriptorError, match=r"\(file\): not a regular file"):
        load_descriptor("/dev/zero")


def test_a_fifo_in_a_folder_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A FIFO named like a descriptor would block the checker on its opening forever: the
    folder scan names it (status 2) and goes no further, in bounded time."""
    import os

    (tmp_path / "good.yaml").write_text(GOOD.read_text())
    os.mkfifo(tmp_path / "pipe.yaml")
    done = subprocess.run(
        [sys.executable, "-m", "agentclaims.cli.main", "lowering", "check", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert f"{tmp_path / 'pipe.yaml'}: (file): not a regular file" in done.stderr
    assert "Traceback" not in done.stderr


YAML_VALUES = {
    "as_of: 2026-13-45": "cannot read this value: month must be in 1..12",
    "as_of: !!int abc": "cannot read this value: invalid literal for int()",
    "as_of: !!float abc": "cannot read this value: could not convert string to float",
    "? [a, b]\n: 1": "a field name is a string, not list",
    "1: x": "a field name is a string, not int 1",
    "yes: x": "a field name is a string, not bool True",
    "<<: {runtime: x}": "could not determine a constructor for the tag 'tag:yaml.org,2002:merge'",
}


@pytest.mark.parametrize("line", sorted(YAML_VALUES))
def test_a_yaml_value_no_constructor_can_build_is_named(tmp_path: Path, line: str) -> None:
    """A date out of range, a tag on a wrong value, a key that is not a string: named where
    it stands (these were a ValueError or a TypeError)."""
    path = tmp_path / "value.yaml"
    path.write_text(f"descriptor_version: 1\n{line}\n")
    with pytest.raises(DescriptorError) as info:
        load_descriptor(path)
    assert info.value.field.startswith("line 2, column ")
    assert YAML_VALUES[line] in info.value.message


# ---------------------------------------------------------------------- what an error echoes
def test_a_long_value_is_echoed_cut() -> None:
    """A megabyte-long runtime: the schema's message keeps what is wrong with it, the value
    shown is cut to ``MAX_SHOWN`` characters."""
    doc = document(GOOD) | {"runtime": "A" * 1_000_000}
    with pytest.raises(DescriptorError) as info:
        parse_descriptor(doc, source="inline")
    [(field, message)] = info.value.problems
    assert field == "runtime"
    assert message.startswith("'AAAA")
    assert message.endswith("AAA... does not match '^[a-z0-9][a-z0-9._+-]*$'")
    assert len(message) < 2 * MAX_SHOWN


def test_a_long_version_and_a_long_key_are_echoed_cut() -> None:
    """``descriptor_version`` is echoed by the checker itself; a key is part of a field."""
    with pytest.raises(DescriptorError) as info:
        parse_descriptor({"descriptor_version": "9" * 100_000}, source="inline")
    assert len(info.value.message) < 2 * MAX_SHOWN
    doc = document(GOOD) | {"k" * 100_000: 1}
    with pytest.raises(DescriptorError) as info:
        parse_descriptor(doc, source="inline")
    assert info.value.field == "k" * (MAX_SHOWN - 3) + "..."


def test_at_most_max_problems_are_listed_then_how_many_more() -> None:
    """A thousand unknown fields: ten listed, then a count, not a thousand lines."""
    doc = document(GOOD) | {f"k{i:04}": 1 for i in range(1000)}
    with pytest.raises(DescriptorError) as info:
        parse_descriptor(doc, source="inline")
    assert len(info.value.problems) == MAX_PROBLEMS + 1
    assert info.value.problems[0] == ("k0000", "unknown field")
    assert info.value.problems[-1] == (
        "(document)",
        f"{1000 - MAX_PROBLEMS} more problem(s), not listed (MAX_PROBLEMS)",
    )


# ---------------------------------------------------------------------- fuzz
# A document is a tree of nodes, written out as JSON or YAML text by ``text``: what a Python
# value cannot hold (a key given twice, an alias, a 5,000-digit literal) is written as is.
Node = tuple[Any, ...]
KEYS = ["descriptor_version", "runtime", "versions", "modes", "hard_protected", "claimed"]
KEYS += ["met", "evidence", "kind", "where", "facts", "x"]
PLAIN = ["yes", "on", "~", ".inf", ".nan", "2026-13-45", "2026-11-01", "1:2:3", "0x1F", "0o17"]
PLAIN += ["1_000", "!!int abc", "!!float x", "!!binary zz", "!!python/object:os.system x"]
PLAIN += ["!!set {a: 1}", "!!timestamp 2026-99-99", "!custom x", "<<", "=", "*undefined", "&"]


def number() -> st.SearchStrategy[Node]:
    """A JSON number literal, sometimes far too long."""
    length = st.one_of(st.integers(1, 4), st.integers(98, 102), st.integers(4200, 6000))
    fraction = st.one_of(st.just(""), length.map(lambda n: "." + "5" * n))
    exponent = st.sampled_from(["", "e5", "E-300", "e+99999"])
    parts = st.tuples(st.sampled_from(["", "-"]), length.map(digits), fraction, exponent)
    return parts.map(lambda p: ("num", "".join(p)))


def string() -> st.SearchStrategy[Node]:
    short = st.text(max_size=12)
    long = st.tuples(st.text(min_size=1, max_size=3), st.integers(100, 20_000))
    return st.one_of(short, long.map(lambda t: t[0] * t[1])).map(lambda s: ("str", s))


LEAVES = st.one_of(
    number(),
    string(),
    st.sampled_from([("lit", "true"), ("lit", "false"), ("lit", "null")]),
    st.sampled_from(PLAIN).map(lambda s: ("plain", s)),
    st.sampled_from("ab").map(lambda name: ("alias", name)),
    st.tuples(st.integers(2, 9), st.integers(2, 9)).map(lambda t: ("laughs", *t)),
)


def extend(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
    keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=4)).map(lambda s: ("str", s))
    keys = st.one_of(keys, st.sampled_from(PLAIN[:4]).map(lambda s: ("plain", s)))
    depth = st.sampled_from([2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 100_000])
    return st.one_of(
        st.lists(children, max_size=5).map(lambda c: ("list", c)),
        st.lists(st.tuples(keys, children), max_size=5).map(lambda c: ("map", c)),
        st.tuples(depth, st.booleans(), children).map(lambda t: ("deep", *t)),
        st.tuples(st.sampled_from("ab"), children).map(lambda t: ("anchor", *t)),
    )


HOSTILE = st.recursive(LEAVES, extend, max_leaves=12)


def as_node(value: object) -> Node:
    """A parsed document's value as a node (to splice hostile nodes into good.yaml)."""
    if isinstance(value, dict):
        return ("map", [(("str", k), as_node(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [as_node(v) for v in value])
    if isinstance(value, str):
        return ("str", value)
    return ("lit", json.dumps(value))


def spliced(node: Node, path: list[str], hostile: Node) -> Node:
    """``node`` with its field at ``path`` (added where missing) replaced by ``hostile``."""
    if not path or node[0] != "map":
        return hostile
    fields = dict(node[1])
    key = ("str", path[0])
    fields[key] = spliced(fields.get(key, ("map", [])), path[1:], hostile)
    return ("map", list(fields.items()))


PATHS = [
    "descriptor_version",
    "runtime",
    "facts",
    "modes.hard_protected.claimed",
    "modes.hard_protected.primitive.evidence",
    "modes.hard_protected.obligations.claim_identity",
    "modes.hard_protected.obligations.claim_identity.met",
    "modes.expiring",
    "unknown",
]
DOCUMENTS = st.one_of(
    HOSTILE,
    st.tuples(st.sampled_from(PATHS), HOSTILE).map(
        lambda t: spliced(as_node(document(GOOD)), t[0].split("."), t[1])
    ),
)


def text(node: Node, yaml: bool) -> str:
    """``node`` written as JSON or (``yaml``) as YAML flow text."""
    kind, *rest = node
    if kind == "num" or kind == "lit" or (kind == "plain" and yaml):
        return str(rest[0])
    if kind in ("str", "plain"):
        return json.dumps(rest[0])
    if kind == "list":
        return "[" + ", ".join(text(child, yaml) for child in rest[0]) + "]"
    if kind == "map":
        pairs = (f"{text(key, yaml)}: {text(value, yaml)}" for key, value in rest[0])
        return "{" + ", ".join(pairs) + "}"
    if kind == "deep":
        depth, as_map, inner = rest
        opening, closing = ('{"d": ', "}") if as_map else ("[", "]")
        return opening * depth + text(inner, yaml) + closing * depth
    if kind == "anchor":
        return (f"&{rest[0]} " if yaml else "") + text(rest[1], yaml)
    if kind == "alias":
        return f"*{rest[0]}" if yaml else json.dumps(rest[0])
    levels, width = rest
    if not yaml:
        return json.dumps([["lol"] * width])
    out = ["&l0 [" + ", ".join(['"lol"'] * width) + "]"]
    out += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "[" + ", ".join(out) + "]"


def checked(path: Path) -> str:
    """What checking ``path`` as the CLI does gives: ``""`` for a result, else the text of the
    DescriptorError (anything else raised fails the test)."""
    try:
        assert isinstance(check_file(path), DescriptorCheck)
    except DescriptorError as exc:
        return str(exc)
    return ""


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(doc=DOCUMENTS)
def test_a_hostile_document_is_a_result_or_a_bounded_descriptor_error(doc: Node) -> None:
    """Written as JSON and as YAML: the checker returns a result or raises a DescriptorError
    whose text stays under ``BOUND``; the CLI exits 0, 1 or 2, its stderr as bounded."""
    with tempfile.TemporaryDirectory() as folder:
        paths = [Path(folder) / "hostile.json", Path(folder) / "hostile.yaml"]
        for path in paths:
            path.write_text(text(doc, yaml=path.suffix == ".yaml"))
            assert len(checked(path)) < BOUND
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["lowering", "check", *map(str, paths)])
        assert code in (0, 1, 2)
        assert len(err.getvalue()) < 2 * BOUND


def test_the_docs_state_the_limits_as_they_are() -> None:
    """docs/lowering.md's table of limits gives each constant's value."""
    docs = (ROOT / "docs" / "lowering.md").read_text()
    rows = dict(re.findall(r"^\| `(MAX_\w+)` \| ([^|]+) \|", docs, re.MULTILINE))
    assert rows == {
        "MAX_BYTES": f"{MAX_BYTES // 1024} KiB",
        "MAX_DEPTH": str(MAX_DEPTH),
        "MAX_NUMBER_CHARS": str(MAX_NUMBER_CHARS),
        "MAX_EXPANDED": f"{MAX_EXPANDED // 1024} KiB",
    }
