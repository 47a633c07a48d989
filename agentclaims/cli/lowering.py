"""``agentclaims lowering check FILE... [--json]``: classify lowering descriptors, fail closed.

Each FILE is a descriptor (YAML, or ``.json``), or a folder of them (its ``*.yaml``, ``*.yml``
and ``*.json``, sorted; a folder with none is a failure, status 2). Every mode a descriptor describes is classified (docs/lowering.md); with
``--json`` one object ``{"mappings": [{"runtime", "version", "mode", "claimed", "class",
"reasons"}]}`` is printed, else a table. A file that does not parse is named on stderr with each
field that is wrong. Exit status: 2 when a file did not parse, else 1 when a mapping's class is
below the class its descriptor claims, else 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from agentclaims.errors import DescriptorError
from agentclaims.lowering import DescriptorCheck, Runs, check_descriptor, load_descriptor

__all__ = ["run"]

_PROG = "agentclaims lowering check"


_FORMATS = (".yaml", ".yml", ".json")
"""What a folder is scanned for: every format the checker reads."""


def _files(paths: Sequence[str]) -> tuple[list[Path], list[str]]:
    """The descriptor files named (a folder: its YAML and JSON entries, sorted; one that is
    not a regular file, a FIFO, is named and refused when read, never skipped), and the
    folders that hold none (each a failure: a scan that finds nothing checks nothing)."""
    out: list[Path] = []
    empty: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in _FORMATS and not p.is_dir())
            if not found:
                empty.append(
                    f"{path}: no descriptor in it ({', '.join('*' + f for f in _FORMATS)})"
                )
            out += found
        else:
            out.append(path)
    return out, empty


def _check(path: Path) -> DescriptorCheck:
    descriptor = load_descriptor(path)
    return check_descriptor(descriptor, Runs(base_dir=descriptor.base_dir, self_test=True))


def _table(path: Path, check: DescriptorCheck) -> str:
    d = check.descriptor
    lines = [f"{path}: {d.runtime} {d.versions}"]
    width = max(len(m.mode.value) for m in check.mappings)
    for m in check.described:
        flag = "  BELOW CLAIMED" if m.below_claimed else ""
        lines.append(
            f"  {m.mode.value.ljust(width)}  claimed {m.claimed.value:<23}"
            f"  class {m.lowering_class.value}{flag}"
        )
        lines += [f"      - {why}" for why in m.reasons]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Check ``args.files``; print the mappings (a table, or JSON with ``args.json``)."""
    checks: list[tuple[Path, DescriptorCheck]] = []
    files, empty = _files(args.files)
    for why in empty:
        print(f"{_PROG}: {why}", file=sys.stderr)
    unparsed = len(empty)
    for path in files:
        try:
            checks.append((path, _check(path)))
        except DescriptorError as exc:
            unparsed += 1
            print(f"{_PROG}: {exc}", file=sys.stderr)
    mappings = [m for _, check in checks for m in check.described]
    below = [m for m in mappings if m.below_claimed]
    if args.json:
        print(json.dumps({"mappings": [m.to_dict() for m in mappings]}))
    else:
        for path, check in checks:
            print(_table(path, check))
        print(
            f"{len(checks)} descriptor(s), {len(mappings)} mappings, "
            f"{len(below)} below their claimed class, {unparsed} file(s) did not parse"
        )
    if unparsed:
        return 2
    return 1 if below else 0
