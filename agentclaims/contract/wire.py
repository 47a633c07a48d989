"""One codec for every wire type: a frozen dataclass <-> its JSON object.

The field annotations are the schema. ``to_wire`` writes enums as their values, tuples as
lists, nested wire types as objects; ``from_wire`` reads the same form back and checks every
field against its annotation, so a bad body is a ``UsageError`` naming the field, never an
``AttributeError`` three calls later. Types with rules beyond their field types (``ClaimSpec``)
check them in ``__post_init__``, which runs on every construction, decoded or not.

A class opts in by inheriting :class:`Wire`; ``wire_computed`` names read-only properties that
are written for readers (``served``) and ignored when read back.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Self, TypeVar, Union

from agentclaims.errors import UnknownNameError, UsageError

__all__ = ["Wire", "from_wire", "json_schema", "to_wire"]

T = TypeVar("T")
_MISSING = dataclasses.MISSING


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
    wire_readers: ClassVar[Mapping[str, Any]] = {}
    """Field name -> a reader for a field its annotation cannot describe (a tagged union)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = to_wire(self)
        return out

    @classmethod
    def from_dict(cls, data: Any, *, where: str | None = None) -> Self:
        return from_wire(cls, data, where=where)


_SCALARS = frozenset({str, int, float, bool, type(None)})


@functools.cache
def _layout(
    cls: type,
) -> tuple[tuple[str, ...], str | None, frozenset[str], tuple[str, ...]] | None:
    """How a class is written: its fields, open field, fields omitted while ``None`` and
    computed properties (``None``: not a dataclass). Read once per class."""
    if not dataclasses.is_dataclass(cls):
        return None
    return (
        tuple(f.name for f in dataclasses.fields(cls)),
        getattr(cls, "wire_open", None),
        frozenset(getattr(cls, "wire_omit_none", ())),
        tuple(getattr(cls, "wire_computed", ())),
    )


def to_wire(obj: Any) -> Any:
    """The JSON form of a wire value (dataclass, enum, tuple, mapping or scalar)."""
    cls = type(obj)
    if cls in _SCALARS:
        return obj
    if isinstance(obj, enum.Enum):
        return obj.value
    layout = None if isinstance(obj, type) else _layout(cls)  # type: ignore[arg-type]
    if layout is not None:
        names, open_field, omit, computed = layout
        out: dict[str, Any] = {}
        for name in names:
            value = getattr(obj, name)
            if name == open_field or (value is None and name in omit):
                continue
            out[name] = value if type(value) in _SCALARS else to_wire(value)
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


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_wire(cls: type[T], data: Any, *, where: str | None = None) -> T:
    """Read ``cls`` back from its JSON form; every problem is a ``UsageError`` naming it."""
    where = where or getattr(cls, "wire_prefix", "") or None
    whole = where or getattr(cls, "wire_name", "") or cls.__name__
    prefix = f"{where}." if where else ""
    if not isinstance(data, Mapping):
        raise UsageError(whole, f"expected an object, got {data!r}")
    assert dataclasses.is_dataclass(cls), cls
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    open_field: str | None = getattr(cls, "wire_open", None)
    readers: Mapping[str, Any] = getattr(cls, "wire_readers", {})
    required = set(getattr(cls, "wire_required", ()))
    ignored = set(getattr(cls, "wire_computed", ()))
    unknown = set(data) - set(fields) - ignored
    kwargs: dict[str, Any] = {}
    if open_field is not None:
        kwargs[open_field] = {k: data[k] for k in sorted(unknown)}
        unknown = set()
    if unknown:
        raise UsageError(whole, f"unknown fields {sorted(unknown)}")
    for name, f in fields.items():
        if name == open_field:
            continue
        if name not in data:
            if name in required or (f.default is _MISSING and f.default_factory is _MISSING):
                raise UsageError(f"{prefix}{name}", "missing")
            continue
        value = data[name]
        reader = readers.get(name)
        if reader is not None:
            kwargs[name] = None if value is None else reader(value)
        else:
            kwargs[name] = _read(hints[name], value, f"{prefix}{name}")
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a rule of __post_init__ not phrased as a UsageError
        raise UsageError(whole, str(exc)) from None


def _read(hint: Any, value: Any, where: str) -> Any:
    """``value`` checked and converted to ``hint``."""
    supertype = getattr(hint, "__supertype__", None)
    if supertype is not None:  # a NewType
        return _read(supertype, value, where)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _read(option, value, where)
            except UsageError as exc:
                errors.append(exc)
        raise errors[0]
    if hint is Any:
        return value
    if origin is typing.Literal:
        if value not in args:
            raise UnknownNameError(where, value, [str(a) for a in args])
        return value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            raise UnknownNameError(where, value, [str(m.value) for m in hint]) from None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        reader = getattr(hint, "from_dict", None)
        if reader is None:
            return from_wire(hint, value, where=where)
        try:
            return reader(value, where=where)
        except TypeError:  # a from_dict without ``where``
            return reader(value)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise UsageError(where, f"expected a list, got {value!r}")
        item = args[0] if args else Any
        return tuple(_read(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise UsageError(where, f"expected an object, got {value!r}")
        item = args[1] if len(args) == 2 else Any
        return {str(k): _read(item, v, f"{where}.{k}") for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise UsageError(where, f"expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(where, f"expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UsageError(where, f"expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise UsageError(where, f"expected a string, got {value!r}")
        return value
    raise TypeError(f"{where}: no wire reader for {hint!r}")


def json_schema(
    cls: type, defs: dict[str, Any], ref: str = "#/components/schemas/"
) -> dict[str, Any]:
    """The JSON Schema of a wire type's JSON form, as a ``$ref`` to ``ref + name``; its
    definition, and those of the wire types it holds, are added to ``defs``. It says what
    ``from_wire`` accepts: the same annotations read the same way."""
    name = cls.__name__
    if name not in defs:
        defs[name] = {}  # taken, for a type that holds itself
        assert dataclasses.is_dataclass(cls), cls
        hints = _hints(cls)
        open_field = getattr(cls, "wire_open", None)
        readers: Mapping[str, Any] = getattr(cls, "wire_readers", {})
        required = set(getattr(cls, "wire_required", ()))
        props: dict[str, Any] = {}
        needed = []
        for f in dataclasses.fields(cls):
            if not f.init or f.name == open_field:
                continue
            props[f.name] = {} if f.name in readers else _schema(hints[f.name], defs, ref)
            if f.name in required or (f.default is _MISSING and f.default_factory is _MISSING):
                needed.append(f.name)
        for computed in getattr(cls, "wire_computed", ()):
            props[computed] = {"readOnly": True}
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        defs[name] = {
            "type": "object",
            "description": " ".join(doc.split()),
            "properties": props,
            "required": needed,
            "additionalProperties": open_field is not None,
        }
    return {"$ref": f"{ref}{name}"}


def _schema(hint: Any, defs: dict[str, Any], ref: str) -> dict[str, Any]:
    supertype = getattr(hint, "__supertype__", None)
    if supertype is not None:
        return _schema(supertype, defs, ref)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema(a, defs, ref) for a in args]}
    if hint is type(None):
        return {"type": "null"}
    if hint is Any:
        return {}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [m.value for m in hint]}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return json_schema(hint, defs, ref)
    if origin is tuple:
        return {"type": "array", "items": _schema(args[0], defs, ref) if args else {}}
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        item = _schema(args[1], defs, ref) if len(args) == 2 else {}
        return {"type": "object", "additionalProperties": item}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if hint in simple:
        return {"type": simple[hint]}
    raise TypeError(f"no JSON Schema for {hint!r}")
