"""Docs that cannot drift: every fenced block of README.md and docs/*.md either runs here, as
written, or says what it needs that the tests start themselves.

* Each block names its language: ``python``, ``sh``, ``json``, ``yaml``, ``toml`` or ``text``
  (output, diagrams).
* A fence may be indented (a block inside a list item); its lines lose their common
  indentation before they are run or parsed.
* A ``python`` or ``sh`` block that needs something first (a server, the vLLM environment, the
  traces, minutes of CPU) is preceded by ``<!-- needs: WHAT -->``; the others run here, from
  an empty folder (the README's Python blocks run in ``test_readme.py``). Every ``python``
  block, marked or not, compiles.
* Every ``agentclaims`` command line, marked or not, parses with the real CLI parser; every
  ``make`` target exists; every script a command runs is in the repository.
* ``json``, ``yaml`` and ``toml`` blocks parse (a JSON block may be JSON lines).
* Every page of docs/ stays under 500 lines (docs/vllm.md under 450).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from agentclaims.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"python", "sh", "json", "yaml", "toml", "text"}
_FENCE = re.compile(r"^\s*```(\S*)\s*$")
_CLOSING = re.compile(r"^\s*```\s*$")
_OPERATORS = {";", "&", "&&", "|", "||"}
_NEEDS = re.compile(r"^<!-- needs: (.+\S) -->$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    text: str
    needs: str | None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            opening = _FENCE.match(lines[i])
            if opening is None:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if _CLOSING.match(lines[j]))
            marker = _NEEDS.match(lines[i - 1].strip()) if i else None
            text = textwrap.dedent("\n".join(lines[i + 1 : end]) + "\n")
            found.append(
                Block(page, i + 1, opening[1], text, marker[1] if marker else None)
            )  # fmt: skip
            i = end + 1
    return found


BLOCKS = blocks()


def commands(block: Block) -> list[list[str]]:
    """The command lines of a ``sh`` block, continuations joined, comments and leading
    ``NAME=value`` assignments dropped."""
    out = []
    for line in block.text.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token in _OPERATORS:
                while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                    words = words[1:]
                if words:
                    out.append(words)
                words = []
            else:
                words.append(token)
    return out


def test_every_block_names_its_language() -> None:
    bad = [f"{b.name} ({b.language!r})" for b in BLOCKS if b.language not in LANGUAGES]
    assert not bad, f"fenced blocks need one of {sorted(LANGUAGES)}: {bad}"


def test_pages_stay_readable() -> None:
    for page in PAGES[1:]:
        limit = 450 if page.name == "vllm.md" else 500
        assert len(page.read_text().splitlines()) <= limit, page.name


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.language in ("json", "yaml", "toml")], ids=lambda b: b.name
)
def test_data_blocks_parse(block: Block) -> None:
    if block.language == "yaml":
        yaml.safe_load(block.text)
    elif block.language == "toml":
        tomllib.loads(block.text)
    else:
        try:
            json.loads(block.text)
        except json.JSONDecodeError:  # JSON lines: one object per line
            for line in filter(str.strip, block.text.splitlines()):
                json.loads(line)


SH = [b for b in BLOCKS if b.language == "sh"]


@pytest.mark.parametrize("block", SH, ids=lambda b: b.name)
def test_command_lines_name_what_exists(block: Block) -> None:
    """Real subcommands and flags, real make targets, real scripts."""
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    for words in commands(block):
        program = Path(words[0]).name
        if program == "agentclaims":
            try:
                build_parser().parse_args(words[1:])
            except SystemExit as exc:
                pytest.fail(f"{block.name}: `{shlex.join(words)}` does not parse ({exc})")
        elif program == "make":
            for target in (w for w in words[1:] if not w.startswith("-") and "=" not in w):
                assert target in targets, f"{block.name}: no make target {target!r}"
        elif program.startswith("python"):
            script = next((w for w in words[1:] if w.endswith(".py")), None)
            if script is not None and not script.startswith("/"):
                assert (ROOT / script).is_file(), f"{block.name}: no script {script}"


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in SH if b.needs is None], ids=lambda b: b.name)
def test_unmarked_command_blocks_run(block: Block, tmp_path: Path) -> None:
    bin_dir = str(Path(sys.executable).parent)
    for words in commands(block):
        done = subprocess.run(
            words,
            cwd=ROOT
            if any(w.startswith(("integrations/", "examples/")) for w in words)
            else tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
            env={**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"},
        )
        assert done.returncode == 0, f"{block.name}: {shlex.join(words)}\n{done.stderr[-2000:]}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "block",
    [
        b
        for b in BLOCKS
        if b.language == "python" and b.needs is None and b.page.name != "README.md"
    ],
    ids=lambda b: b.name,
)
def test_unmarked_python_blocks_run(block: Block, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", block.text],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "error::DeprecationWarning"},
    )
    assert done.returncode == 0, f"{block.name}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.language == "python"], ids=lambda b: b.name
)
def test_python_blocks_compile(block: Block) -> None:
    """The marked ones do not run here: their syntax is checked at least."""
    try:
        compile(block.text, block.name, "exec")
    except SyntaxError as exc:
        pytest.fail(f"{block.name}: {exc}")


def test_indented_blocks_are_found() -> None:
    """A fence inside a list item counts as one at the start of a line does, its lines
    dedented."""
    indented = [b for b in BLOCKS if b.page.read_text().splitlines()[b.line - 1][0] == " "]
    assert indented, "no indented fence found: the fence pattern is wrong"
    assert all(b.text.strip() and not b.text[0].isspace() for b in indented)


def test_marked_blocks_say_what_they_need() -> None:
    markers = [b for b in BLOCKS if b.needs is not None]
    assert markers, "no block is marked: the marker pattern is wrong"
    assert all(b.language in ("python", "sh") for b in markers), [b.name for b in markers]


def test_the_changelog_is_by_release_one_short_line_per_change() -> None:
    """Keep a Changelog: released versions with dates, the newest the package's version, and
    no entry over two lines (figures live in benchmarks/results/)."""
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", text, flags=re.M)
    assert releases, "no released version"
    with (ROOT / "pyproject.toml").open("rb") as f:
        assert releases[0][0] == tomllib.load(f)["project"]["version"]
    entries = re.split(r"^- ", text, flags=re.M)[1:]
    for entry in entries:
        body = entry.split("\n\n")[0].split("\n#")[0].rstrip("\n")
        assert len(body.splitlines()) <= 2, f"a changelog entry over two lines: {body[:120]}"
    headings = set(re.findall(r"^### (.+)$", text, flags=re.M))
    assert headings <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
