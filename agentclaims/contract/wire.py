"""Every wire type's JSON form: a frozen dataclass <-> its JSON object.

The field annotations are the schema. pydantic v2 reads them (one ``TypeAdapter`` per class,
built on first use, so importing ``agentclaims`` does not load pydantic) and states their JSON
Schema (``/openapi.json``): enums travel as their values, tuples as lists, nested wire types as
objects. Scalars are as strict as JSON's own types: an integer field takes an integer (not
``true``, ``3.0`` or ``"3"``), a number field an integer or a float, a string field a string.
A bad body is a ``UsageError`` naming the field (``events[0].seq``) in the codec's words
(``expected an integer, got 'x'``), never a pydantic ``ValidationError``. Types with rules
beyond their field types (``ClaimSpec``) check them in ``__post_init__``, which runs on every
construction, decoded or not; its ``UsageError`` reaches the caller as raised.

Writing is :func:`to_wire`, a few lines over ``dataclasses.fields``: for these plain
dataclasses it costs a fifth of pydantic's serializer (``benchmarks/bench_wire.py``).

A class opts in by inheriting :class:`Wire`; its class variables say what the annotations
cannot: the name errors use for the whole object, a field that takes every unknown key, fields
left out while ``None``, read-only properties written for readers, fields with a default that
must still be present.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import operator
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from agentclaims.errors import UnknownNameError, UsageError

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler, TypeAdapter, ValidationError
    from pydantic_core import CoreSchema

__all__ = ["Wire", "from_wire", "json_schema", "to_wire"]

T = TypeVar("T")


class Wire:
    """Mixin for frozen dataclasses that travel as JSON objects."""

    __slots__ = ()
    wire_name: ClassVar[str] = ""
    """The field name errors use for the whole object (defaults to the class name)."""
    wire_prefix: ClassVar[str] = ""
    """Prefix of field names in errors when decoded at top level (``event`` -> ``event.seq``)."""
    wire_computed: ClassVar[tuple[str, ...]] = ()
    """Properties written by ``to_dict`` for readers, ignored by ``from_dict``."""
    wire_open: ClassVar[str | None] = None
    """A ``Mapping`` field that takes every unknown key (``ClaimEvent.data``); else unknown
    keys are an error."""
    wire_omit_none: ClassVar[tuple[str, ...]] = ()
    """Optional fields left out of ``to_dict`` while they are ``None``."""
    wire_required: ClassVar[tuple[str, ...]] = ()
    """Fields with a default that must still be present in the JSON form."""
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = to_wire(self)
        return out

    @classmethod
    def from_dict(cls, data: Any, *, where: str | None = None) -> Self:
        return from_wire(cls, data, where=where)

    # ------------------------------------------------------------------ pydantic's hooks
    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        from pydantic_core import core_schema

        schema: CoreSchema = _strict_scalars(handler(source))
        if cls.wire_open or cls.wire_required or cls.wire_computed:
            schema = core_schema.no_info_before_validator_function(cls._wire_read, schema)
        return schema

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        out: dict[str, Any] = handler(schema)
        target = handler.resolve_ref_schema(out)
        props = target.setdefault("properties", {})
        if cls.wire_open:
            props.pop(cls.wire_open, None)
            target["additionalProperties"] = True
        else:
            target["additionalProperties"] = False
        for name in cls.wire_computed:
            props[name] = {"readOnly": True}
        required = target.setdefault("required", [])
        required += [n for n in cls.wire_required if n not in required]
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        target["description"] = " ".join(doc.split())
        return out

    @classmethod
    def _wire_read(cls, data: Any) -> Any:
        """The JSON object as the dataclass takes it: computed properties dropped, unknown keys
        gathered into the open field, fields that must be present checked."""
        if not isinstance(data, Mapping):
            return data  # pydantic names it: "expected an object"
        # in field order, as pydantic names a missing field
        for name in _present(cls):  # type: ignore[arg-type]
            if name not in data:
                from pydantic_core import PydanticCustomError

                raise PydanticCustomError("wire_missing", "missing", {"field": name})
        if not (cls.wire_open or cls.wire_computed):
            return data
        data = {k: v for k, v in data.items() if k not in cls.wire_computed}
        if cls.wire_open:
            known = _field_names(cls)  # type: ignore[arg-type]
            data[cls.wire_open] = {k: data.pop(k) for k in sorted(set(data) - known)}
        return data


@functools.cache
def _present(cls: Any) -> tuple[str, ...]:
    """The fields that must be in ``cls``'s JSON form: those without a default, and
    ``wire_required``."""
    required = getattr(cls, "wire_required", ())
    return tuple(
        f.name
        for f in dataclasses.fields(cls)
        if f.name in required
        or (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    )


@functools.cache
def _field_names(cls: Any) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def _strict_scalars(schema: T) -> T:
    """``schema`` with every integer, number, boolean and string check strict (JSON's types),
    while enums, tuples and nested objects are still read from their JSON forms."""
    if isinstance(schema, dict):
        if schema.get("type") in ("int", "float", "bool", "str"):
            schema["strict"] = True
        for value in schema.values():
            if isinstance(value, dict | list):
                _strict_scalars(value)
    elif isinstance(schema, list):
        for value in schema:
            _strict_scalars(value)
    return schema


@functools.cache
def _adapter(cls: Any) -> TypeAdapter[Any]:
    from pydantic import TypeAdapter

    return TypeAdapter(cls)


_SCALARS = frozenset({str, int, float, bool, type(None)})


@functools.cache
def _layout(
    cls: type,
) -> (
    tuple[
        tuple[str, ...],
        Callable[[Any], tuple[Any, ...]],
        str | None,
        frozenset[str],
        tuple[str, ...],
    ]
    | None
):
    """How a class is written: its fields and one getter of all their values, its open
    field, fields omitted while ``None`` and computed properties (``None``: not a dataclass).
    Read once per class."""
    if not dataclasses.is_dataclass(cls):
        return None
    names = tuple(f.name for f in dataclasses.fields(cls))
    getter = (
        operator.attrgetter(*names) if len(names) > 1 else lambda obj: (getattr(obj, names[0]),)
    )
    return (
        names,
        getter,
        getattr(cls, "wire_open", None),
        frozenset(getattr(cls, "wire_omit_none", ())),
        tuple(getattr(cls, "wire_computed", ())),
    )


def to_wire(obj: Any) -> Any:
    """The JSON form of a wire value (dataclass, enum, tuple, mapping or scalar).

    Every agent's call writes a few of these, so a dataclass is read in one call and its
    scalar and enum fields are written in place."""
    cls = type(obj)
    if cls in _SCALARS:
        return obj
    if isinstance(obj, enum.Enum):
        return obj._value_
    layout = None if isinstance(obj, type) else _layout(cls)  # type: ignore[arg-type]
    if layout is not None:
        names, values, open_field, omit, computed = layout
        out: dict[str, Any] = {}
        for name, value in zip(names, values(obj), strict=True):
            if type(value) in _SCALARS:
                if value is None and name in omit:
                    continue
                out[name] = value
            elif isinstance(value, enum.Enum):
                out[name] = value._value_
            elif name != open_field:
                out[name] = to_wire(value)
        for name in computed:
            out[name] = to_wire(getattr(obj, name))
        if open_field is not None:
            out.update({k: to_wire(v) for k, v in getattr(obj, open_field).items()})
        return out
    if isinstance(obj, list | tuple):
        return [v if type(v) in _SCALARS else to_wire(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_wire(v) for k, v in obj.items()}
    return obj


def from_wire(cls: type[T], data: Any, *, where: str | None = None) -> T:
    """Read ``cls`` back from its JSON form; every problem is a ``UsageError`` naming it."""
    from pydantic import ValidationError

    where = where or getattr(cls, "wire_prefix", "") or None
    whole = where or getattr(cls, "wire_name", "") or cls.__name__
    try:
        out: T = _adapter(cls).validate_python(data)  # type: ignore[arg-type]
        return out
    except ValidationError as exc:
        raise _usage_error(exc, where, whole) from None
    except TypeError as exc:  # a rule of __post_init__ not phrased as a UsageError
        raise UsageError(whole, str(exc)) from None


_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "tuple_type": "a list",
    "list_type": "a list",
    "iterable_type": "a list",
    "dict_type": "an object",
    "mapping_type": "an object",
    "dataclass_type": "an object",
}
_UNKNOWN_FIELD = frozenset({"unexpected_keyword_argument", "extra_forbidden"})
_MISSING = frozenset({"missing", "wire_missing"})
_QUOTED = re.compile(r"'([^']*)'")


def _usage_error(exc: ValidationError, where: str | None, whole: str) -> UsageError:
    """The first problem pydantic found, as the ``UsageError`` the codec always raised."""

    def path(loc: tuple[Any, ...]) -> str:
        out = where or ""
        for part in loc:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
        return out or whole

    errors = exc.errors(include_url=False)
    unknown = [e for e in errors if e["type"] in _UNKNOWN_FIELD]
    if unknown:  # unknown keys first, every one of the shallowest object's
        parent = min((e["loc"][:-1] for e in unknown), key=len)
        names = sorted(str(e["loc"][-1]) for e in unknown if e["loc"][:-1] == parent)
        return UsageError(path(parent), f"unknown fields {names}")
    # a value given and wrong says more than a field left out: it is named first
    first = next((e for e in errors if e["type"] not in _MISSING), errors[0])
    kind, loc, value, ctx = first["type"], first["loc"], first.get("input"), first.get("ctx", {})
    if kind == "value_error" and isinstance(ctx.get("error"), UsageError):
        error: UsageError = ctx["error"]  # a rule of the type's own, named by it
        return error
    if kind == "missing":
        return UsageError(path(loc), "missing")
    if kind == "wire_missing":
        return UsageError(path((*loc, ctx["field"])), "missing")
    if kind in ("enum", "literal_error"):
        return UnknownNameError(path(loc), value, _QUOTED.findall(str(ctx.get("expected", ""))))
    if kind in _EXPECTED:
        return UsageError(path(loc), f"expected {_EXPECTED[kind]}, got {value!r}")
    return UsageError(path(loc), first["msg"])


def json_schema(
    cls: type, defs: dict[str, Any], ref: str = "#/components/schemas/"
) -> dict[str, Any]:
    """The JSON Schema of a wire type's JSON form, as a ``$ref`` to ``ref + name``; its
    definition, and those of the wire types it holds, are added to ``defs``. It is pydantic's,
    from the same annotations that read the JSON form, so it says what ``from_wire`` accepts."""
    schema = _adapter(cls).json_schema(ref_template=ref + "{model}")
    defs.update(schema.pop("$defs", {}))
    if "$ref" not in schema:
        defs[cls.__name__] = schema
        return {"$ref": f"{ref}{cls.__name__}"}
    return schema
