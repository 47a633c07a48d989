"""Reading a lowering descriptor: YAML or JSON, checked against ``descriptor.schema.json``.

A descriptor that does not parse is a ``DescriptorError`` naming the file and every field that
is wrong (bad YAML, a duplicated key, a wrong type, an unknown ``descriptor_version``, an
unknown field), never a traceback and never a class: what cannot be read is not evidence.
Hostile input fails the same way, in bounded time and memory: a file over ``MAX_BYTES``,
nesting deeper than ``MAX_DEPTH``, a number longer than ``MAX_NUMBER_CHARS`` and YAML aliases
expanding past ``MAX_EXPANDED`` are refused before anything is built from them, a JSON key
given twice as the YAML one is; an error echoes at most ``MAX_SHOWN`` characters of a value
and lists at most ``MAX_PROBLEMS`` problems (docs/lowering.md, "Limits on what is read").
PyYAML and jsonschema are imported here, on first use only, so ``import agentclaims`` stays light.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentclaims.contract import ProtectionMode
from agentclaims.errors import DescriptorError

if TYPE_CHECKING:
    import jsonschema
    import yaml

__all__ = [
    "DESCRIPTOR_VERSION",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_EXPANDED",
    "MAX_NUMBER_CHARS",
    "MAX_PROBLEMS",
    "MAX_SHOWN",
    "SCHEMA_PATH",
    "Descriptor",
    "load_descriptor",
    "parse_descriptor",
    "version_in_range",
]

DESCRIPTOR_VERSION = 1
"""The one ``descriptor_version`` this checker reads."""
SCHEMA_PATH = Path(__file__).with_name("descriptor.schema.json")
"""The published JSON Schema of version 1 (shipped in the package)."""
MAX_BYTES = 256 * 1024
"""The largest descriptor file read, in bytes (a shipped one is under 10 KiB; PyYAML parses
in pure Python, so this also bounds the time a file of tiny nodes takes: about 3 s)."""
MAX_DEPTH = 64
"""The deepest nesting of mappings and lists read (a descriptor's is 7): the parsers and the
schema recurse once per level, so a deeper document could exhaust the stack."""
MAX_NUMBER_CHARS = 100
"""The longest number literal read (``int()`` refuses 4,300 digits; a descriptor has one: 1)."""
MAX_EXPANDED = MAX_BYTES
"""The largest a YAML document may grow with its aliases expanded (one per node plus the
characters of its scalars): aliases share evidence, they do not make a file larger than one
without them could be."""
MAX_SHOWN = 200
"""The most characters of a value (or of a field's path) an error echoes."""
MAX_PROBLEMS = 10
"""The most problems a ``DescriptorError`` lists (then how many more there are)."""
_MAX_MESSAGE = 2 * MAX_SHOWN
"""The longest message of one problem: a value shown, and what the schema says of it."""


@dataclass(frozen=True, slots=True)
class Descriptor:
    """One runtime's lowering descriptor, validated; ``modes`` holds only the described ones."""

    runtime: str
    versions: str
    facts: Mapping[str, Any]
    modes: Mapping[ProtectionMode, Mapping[str, Any]]
    source: str
    """Where it was read from: a file, or e.g. ``kv_side:fake``."""
    base_dir: Path | None
    """Where the paths of its ``conformance_run`` anchors start (the file's folder)."""
    document: Mapping[str, Any]
    """The document as read (what a gateway serves, so clients can check it again)."""


def load_descriptor(path: str | Path) -> Descriptor:
    """Read and validate the descriptor file ``path`` (``.json`` as JSON, anything else as YAML)."""
    path = Path(path)
    load = _load_json if path.suffix == ".json" else _load_yaml
    doc = load(_read(path), str(path))
    return parse_descriptor(doc, source=str(path), base_dir=path.parent)


def parse_descriptor(doc: object, *, source: str, base_dir: Path | None = None) -> Descriptor:
    """Validate an already-parsed document (``source`` names it in errors)."""
    problems = _problems(doc)
    if problems:
        raise _refused(source, problems)
    assert isinstance(doc, Mapping)
    modes = {
        mode: doc["modes"][mode.value] for mode in ProtectionMode if mode.value in doc["modes"]
    }
    return Descriptor(
        runtime=doc["runtime"],
        versions=doc["versions"],
        facts=doc.get("facts", {}),
        modes=modes,
        source=source,
        base_dir=base_dir,
        document=doc,
    )


# ---------------------------------------------------------------------- bounds
def _read(path: Path) -> str:
    """The file's text, refused past ``MAX_BYTES`` (read no further: a hostile "file" may be
    endless), when it is not UTF-8, or when it is not a regular file (a FIFO would block the
    checker on its opening, a device never end)."""
    if path.exists() and not path.is_file():
        raise DescriptorError(str(path), [("(file)", "not a regular file: not read")])
    try:
        with path.open("rb") as file:
            data = file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise DescriptorError(str(path), [("(file)", f"cannot read: {exc}")]) from None
    if len(data) > MAX_BYTES:
        why = f"larger than {MAX_BYTES} bytes (MAX_BYTES): not read"
        raise DescriptorError(str(path), [("(file)", why)])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DescriptorError(str(path), [("(file)", f"cannot read: {exc}")]) from None


def _too_deep() -> str:
    return f"nested deeper than {MAX_DEPTH} levels (MAX_DEPTH)"


def _too_long(number: str) -> str:
    return f"a number of {len(number)} characters: at most {MAX_NUMBER_CHARS} (MAX_NUMBER_CHARS)"


def _at(line: int, column: int) -> str:
    """A position in a file, both counted from 1."""
    return f"line {line}, column {column}"


def _cut(text: str, limit: int = MAX_SHOWN) -> str:
    """``text``, at most ``limit`` characters of it (the end replaced by ``...``)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shown(value: object) -> str:
    """``value`` as an error echoes it: its repr, cut to ``MAX_SHOWN`` characters."""
    return _cut(repr(value))


def _refused(source: str, problems: Sequence[tuple[str, str]]) -> DescriptorError:
    """The error listing ``problems``, bounded: every field and message cut, at most
    ``MAX_PROBLEMS`` of them (then a count of the rest), so that its text never grows with
    the input."""
    listed = [(_cut(field), _cut(why, _MAX_MESSAGE)) for field, why in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        more = f"{len(problems) - MAX_PROBLEMS} more problem(s), not listed (MAX_PROBLEMS)"
        listed.append(("(document)", more))
    return DescriptorError(source, listed)


Link = tuple[Any, ...]
"""A node's path as a chain: ``()`` for the document, else ``(parent's link, key)``."""


def _containers(doc: object) -> Iterator[tuple[Link, int, object]]:
    """Every mapping and list of ``doc`` with its link and depth (the document's is 1), never
    below depth ``MAX_DEPTH + 1``: iterative, and the paths are only built when reported, so
    neither the stack nor memory grows with a hostile document's depth."""
    stack: list[tuple[Link, int, object]] = [((), 1, doc)]
    while stack:
        link, depth, node = stack.pop()
        if isinstance(node, Mapping):
            children: Iterable[tuple[object, object]] = node.items()
        elif isinstance(node, list | tuple):
            children = enumerate(node)
        else:
            continue
        yield link, depth, node
        if depth <= MAX_DEPTH:
            stack += (((link, key), depth + 1, child) for key, child in children)


def _path(link: Link) -> list[object]:
    out: list[object] = []
    while link:
        link, key = link
        out.append(key)
    return out[::-1]


def _depth_problems(doc: object) -> list[tuple[str, str]]:
    """The first container of ``doc`` nested deeper than ``MAX_DEPTH``, if any."""
    for link, depth, _ in _containers(doc):
        if depth > MAX_DEPTH:
            return [(_field(_path(link)), _too_deep())]
    return []


# ---------------------------------------------------------------------- JSON
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]|-?[0-9][-+.0-9eE]*', re.DOTALL)
"""What ``_json_limit`` looks at: a string (skipped whole), a bracket, a number."""


def _load_json(text: str, source: str) -> Any:
    """The JSON document of ``text``: its limits checked before ``json.loads`` (which recurses
    per level), a key given twice refused (``json.loads`` would keep the last one silently)."""
    limit = _json_limit(text)
    if limit is not None:
        raise _refused(source, [limit])
    duplicated: dict[int, tuple[object, list[str]]] = {}
    """Each object with a key given twice, by ``id`` (held, so that no id is reused)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) < len(items):
            counts = Counter(key for key, _ in items)
            duplicated[id(obj)] = (obj, sorted(key for key, n in counts.items() if n > 1))
        return obj

    try:
        doc = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise _refused(source, [(_at(exc.lineno, exc.colno), f"bad JSON: {exc.msg}")]) from None
    if duplicated:
        raise _refused(source, _duplicates(doc, duplicated))
    return doc


def _json_limit(text: str) -> tuple[str, str] | None:
    """Where ``text`` first nests deeper than ``MAX_DEPTH`` or has a number longer than
    ``MAX_NUMBER_CHARS``, and which; found by a flat scan, before anything is parsed."""
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        start, first = token.start(), text[token.start()]
        if first in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return _json_at(text, start), f"bad JSON: {_too_deep()}"
        elif first in "]}":
            depth -= 1
        elif first != '"' and token.end() - start > MAX_NUMBER_CHARS:
            return _json_at(text, start), f"bad JSON: {_too_long(token.group())}"
    return None


def _json_at(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    return _at(line, offset - text.rfind("\n", 0, offset))


def _duplicates(
    doc: object, duplicated: Mapping[int, tuple[object, list[str]]]
) -> list[tuple[str, str]]:
    """Each key given twice in an object of ``doc`` (found by the object's ``id``), by path."""
    found = [
        (_field([*_path(link), key]), f"bad JSON: duplicate field {_shown(key)}")
        for link, _, node in _containers(doc)
        if id(node) in duplicated
        for key in duplicated[id(node)][1]
    ]
    return sorted(found)


# ---------------------------------------------------------------------- YAML
def _load_yaml(text: str, source: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_strict_loader())  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = "(yaml)" if mark is None else _at(mark.line + 1, mark.column + 1)
        why = " ".join(p for p in (exc.context, exc.problem) if p)
        raise _refused(source, [(where, f"bad YAML: {why}")]) from None
    except yaml.YAMLError as exc:
        raise _refused(source, [("(yaml)", f"bad YAML: {exc}")]) from None


@functools.cache
def _strict_loader() -> type[yaml.SafeLoader]:
    """A SafeLoader that refuses, where it stands in the file:

    - a key given twice (YAML would keep the last one silently: a later ``met: true`` could
      overrule an earlier ``met: false``), or a key that is not a string (JSON has none);
    - a node that, its aliases (``*name``) expanded, is larger than ``MAX_EXPANDED``: a few
      aliases of aliases expand to gigabytes (a "billion laughs"), and the schema's messages
      print what they expand to. Sizes are added up as nodes are composed, before anything is
      built or expanded; an alias inside the node it names (a cycle) is refused too;
    - nesting deeper than ``MAX_DEPTH`` (composing recurses per level), a number longer than
      ``MAX_NUMBER_CHARS``, and a value a constructor cannot build (``2026-13-45``)."""
    import yaml

    def refuse(why: str, mark: Any) -> yaml.constructor.ConstructorError:
        return yaml.constructor.ConstructorError(None, None, why, mark)

    class StrictLoader(yaml.SafeLoader):
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.depth = 0
            self.weights: dict[int, int] = {}
            """Each node composed (by ``id``): its size with every alias in it expanded."""

        def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
            event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
            nests = isinstance(event, yaml.CollectionStartEvent)
            if nests and self.depth >= MAX_DEPTH:
                raise refuse(_too_deep(), event.start_mark)
            self.depth += nests
            try:
                node = super().compose_node(parent, index)
            finally:
                self.depth -= nests
            if node is not None:
                self.weigh(node, event)
            return node

        def weigh(self, node: yaml.Node, event: yaml.Event) -> None:
            """Keep ``node``'s expanded size: one per node plus the characters of its scalars,
            an alias counting as all of the node it names; refuse it past ``MAX_EXPANDED``."""
            if isinstance(event, yaml.AliasEvent):
                if id(node) not in self.weights:
                    why = f"the alias *{_cut(str(event.anchor))} is inside the node it names"
                    raise refuse(why, event.start_mark)
                return
            if isinstance(node, yaml.ScalarNode):
                weight = 1 + len(node.value)
            else:
                children = node.value if isinstance(node, yaml.SequenceNode) else _flat(node.value)
                weight = 1 + sum(self.weights[id(child)] for child in children)
            if weight > MAX_EXPANDED:
                why = f"larger than {MAX_EXPANDED} characters with its aliases expanded (MAX_EXPANDED)"
                raise refuse(why, node.start_mark)
            self.weights[id(node)] = weight

        def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep)
            except (ValueError, TypeError, OverflowError) as exc:
                raise refuse(f"cannot read this value: {exc}", node.start_mark) from None

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node)
            if not isinstance(key, str):
                why = f"a field name is a string, not {type(key).__name__} {_shown(key)}"
                raise refuse(why, key_node.start_mark)
            if key in seen:
                raise refuse(f"duplicate field {_shown(key)}", key_node.start_mark)
            seen.add(key)
        return loader.construct_mapping(node)

    def bounded(construct: Any) -> Any:
        def number(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
            if len(node.value) > MAX_NUMBER_CHARS:
                raise refuse(_too_long(node.value), node.start_mark)
            return construct(loader, node)

        return number

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    for kind in ("int", "float"):
        construct = getattr(yaml.constructor.SafeConstructor, f"construct_yaml_{kind}")
        StrictLoader.add_constructor(f"tag:yaml.org,2002:{kind}", bounded(construct))
    return StrictLoader


def _flat(pairs: Iterable[tuple[Any, Any]]) -> Iterator[Any]:
    """The keys and values of a mapping node's ``(key, value)`` pairs."""
    for key, value in pairs:
        yield key
        yield value


# ---------------------------------------------------------------------- schema
@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator: jsonschema.protocols.Validator = cls(schema)
    return validator


def _problems(doc: object) -> list[tuple[str, str]]:
    """Every ``(field, message)`` wrong with ``doc``; empty when it is a valid version 1."""
    if not isinstance(doc, Mapping):
        return [("(document)", f"expected a mapping of fields, got {type(doc).__name__}")]
    too_deep = _depth_problems(doc)  # before the schema, which recurses per level
    if too_deep:
        return too_deep
    if "descriptor_version" not in doc:
        return [("descriptor_version", f"missing: this checker reads version {DESCRIPTOR_VERSION}")]
    version = doc["descriptor_version"]
    if isinstance(version, bool) or version != DESCRIPTOR_VERSION:
        why = f"unknown version {_shown(version)}: this checker reads version {DESCRIPTOR_VERSION}"
        return [("descriptor_version", why)]
    found = [p for error in _validator().iter_errors(doc) for p in _describe(error)]
    versions = doc.get("versions")
    if not found and isinstance(versions, str) and not range_admits_any(versions):
        found.append(("versions", f"{_shown(versions)} matches no version: it describes nothing"))
    return sorted(dict.fromkeys(found))


def _field(path: Iterable[object]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out or "(document)"


def _describe(error: jsonschema.ValidationError) -> list[tuple[str, str]]:
    path = list(error.absolute_path)
    instance = error.instance
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    if error.validator == "additionalProperties" and isinstance(instance, Mapping):
        known = schema.get("properties", {})
        return [(_field([*path, k]), "unknown field") for k in instance if k not in known]
    if error.validator == "required" and isinstance(instance, Mapping):
        required = error.validator_value if isinstance(error.validator_value, list) else []
        missing = [k for k in required if k not in instance]
        return [(_field([*path, k]), "missing (required)") for k in missing]
    return [(_field(path), _schema_message(error))]


def _schema_message(error: jsonschema.ValidationError) -> str:
    """jsonschema's message, which starts with the whole offending instance: that part cut to
    ``MAX_SHOWN`` characters, the rest (what the schema wants) kept."""
    message = error.message
    if len(message) <= MAX_SHOWN:
        return message
    echoed = repr(error.instance)
    if message.startswith(echoed):
        message = _shown(error.instance) + message[len(echoed) :]
    return _cut(message, _MAX_MESSAGE)


# ---------------------------------------------------------------------- versions
_CLAUSE = re.compile(r"(==|!=|>=|<=|>|<) ?([0-9]+(?:\.[0-9]+)*)(\.\*)?")
_RELEASE = re.compile(r"[0-9]+(?:\.[0-9]+)*")


def range_admits_any(versions: str) -> bool:
    """Whether some version is in ``versions``. A range's edges are where its clauses name
    versions, so it is enough to try each named version, one step either side of it at its
    last place and one place further down, and the ends (0 and a very large one)."""
    if versions.strip() == "*":
        return True
    tried: set[tuple[int, ...]] = {(0,), (10**9,)}
    for clause in versions.split(","):
        match = _CLAUSE.fullmatch(clause.strip())
        if match is None:
            continue
        named = tuple(int(p) for p in match.group(2).split("."))
        *head, last = named
        tried |= {named, (*head, last + 1), (*named, 1)}
        if last > 0:
            tried.add((*head, last - 1))
    return any(version_in_range(".".join(map(str, v)), versions) for v in tried)


def version_in_range(version: str, versions: str) -> bool:
    """Whether ``version`` (its release part: ``0.33.0rc1+cpu`` is 0.33.0) is in ``versions``
    (a descriptor's range: ``*``, or clauses like ``>=0.32,<0.34`` or ``==0.5.*``)."""
    if versions.strip() == "*":
        return True
    release = _RELEASE.match(version.strip().removeprefix("v"))
    if release is None:
        return False
    have = tuple(int(p) for p in release.group().split("."))
    for clause in versions.split(","):
        match = _CLAUSE.fullmatch(clause.strip())
        if match is None:
            return False
        op, raw, star = match.groups()
        want = tuple(int(p) for p in raw.split("."))
        if star and op in ("==", "!="):
            if (have[: len(want)] == want) != (op == "=="):
                return False
            continue
        width = max(len(have), len(want))
        a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
        ok = {"==": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}
        if not ok[op]:
            return False
    return True
