"""Reading a lowering descriptor: YAML or JSON, checked against ``descriptor.schema.json``.

A descriptor that does not parse is a ``DescriptorError`` naming the file and every field that
is wrong (bad YAML, a duplicated key, a wrong type, an unknown ``descriptor_version``, an
unknown field), never a traceback and never a class: what cannot be read is not evidence.
PyYAML and jsonschema are imported here, on first use only, so ``import agentclaims`` stays light.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
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
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DescriptorError(str(path), [("(file)", f"cannot read: {exc}")]) from None
    if path.suffix == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno}, column {exc.colno}"
            raise DescriptorError(str(path), [(where, f"bad JSON: {exc.msg}")]) from None
    else:
        doc = _load_yaml(text, str(path))
    return parse_descriptor(doc, source=str(path), base_dir=path.parent)


def parse_descriptor(doc: object, *, source: str, base_dir: Path | None = None) -> Descriptor:
    """Validate an already-parsed document (``source`` names it in errors)."""
    problems = _problems(doc)
    if problems:
        raise DescriptorError(source, problems)
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


# ---------------------------------------------------------------------- YAML
def _load_yaml(text: str, source: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_strict_loader())  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = "(yaml)" if mark is None else f"line {mark.line + 1}, column {mark.column + 1}"
        why = " ".join(p for p in (exc.context, exc.problem) if p)
        raise DescriptorError(source, [(where, f"bad YAML: {why}")]) from None
    except yaml.YAMLError as exc:
        raise DescriptorError(source, [("(yaml)", f"bad YAML: {exc}")]) from None


@functools.cache
def _strict_loader() -> type[yaml.SafeLoader]:
    """A SafeLoader that refuses a key given twice (YAML would keep the last one silently: a
    later ``met: true`` could overrule an earlier ``met: false``)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate field {key!r}", key_node.start_mark
                )
            seen.add(key)
        return loader.construct_mapping(node)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return StrictLoader


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
    if "descriptor_version" not in doc:
        return [("descriptor_version", f"missing: this checker reads version {DESCRIPTOR_VERSION}")]
    version = doc["descriptor_version"]
    if isinstance(version, bool) or version != DESCRIPTOR_VERSION:
        why = f"unknown version {version!r}: this checker reads version {DESCRIPTOR_VERSION}"
        return [("descriptor_version", why)]
    found = (p for error in _validator().iter_errors(doc) for p in _describe(error))
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
    return [(_field(path), error.message)]


# ---------------------------------------------------------------------- versions
_CLAUSE = re.compile(r"(==|!=|>=|<=|>|<) ?([0-9]+(?:\.[0-9]+)*)(\.\*)?")
_RELEASE = re.compile(r"[0-9]+(?:\.[0-9]+)*")


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
