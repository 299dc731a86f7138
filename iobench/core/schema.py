"""A small declarative checker for the JSON documents iobench reads (results, manifests).

A spec is built from `Int`, `Num`, `Str`, `Bool`, `Opt(spec)` (or null),
`Enum(...)`, `List(spec)`, `Map({key: spec}, optional=(...), extra=...)`, `Dict(spec)` and
`ANY`. `check(doc, spec, where)` returns the document or raises a
`SchemaError` naming the first bad field by its path, what was expected and
what was found: `epochs[0].summary.wall_s: expected a number, got 'fast'`.
Documents come from files anyone can edit, so nothing is assumed before it
is checked; numbers must be finite.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from iobench.core.errors import DatasetError


class SchemaError(DatasetError):
    """A document does not have the shape iobench wrote."""


class SchemaTypeError(SchemaError):
    """The value at path `at` is not of the expected kind (the field itself, not one inside it)."""

    def __init__(self, message: str, at: str) -> None:
        super().__init__(message)
        self.at = at


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class Spec:
    """What one value must be."""

    name: str

    def check(self, v: Any, at: str) -> None:
        raise NotImplementedError


def _fail(at: str, expected: str, v: Any) -> SchemaTypeError:
    return SchemaTypeError(f"{at or 'the document'}: expected {expected}, got {_show(v)}", at)


@dataclass(frozen=True)
class _Int(Spec):
    low: int | None = None
    high: int | None = None

    def check(self, v: Any, at: str) -> None:
        if isinstance(v, bool) or not isinstance(v, int):
            raise _fail(at, self.name, v)
        if (self.low is not None and v < self.low) or (self.high is not None and v > self.high):
            raise _fail(at, self.name, v)


@dataclass(frozen=True)
class _Num(Spec):
    low: float | None = None

    def check(self, v: Any, at: str) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _fail(at, self.name, v)
        if self.low is not None and v < self.low:
            raise _fail(at, self.name, v)


@dataclass(frozen=True)
class _Type(Spec):
    types: tuple[type, ...] = ()

    def check(self, v: Any, at: str) -> None:
        if isinstance(v, bool) != (bool in self.types) or not isinstance(v, self.types):
            raise _fail(at, self.name, v)


@dataclass(frozen=True)
class Opt(Spec):
    """`inner`, or null."""

    inner: Spec = field(default_factory=lambda: ANY)

    def __init__(self, inner: Spec) -> None:
        object.__setattr__(self, "name", f"{inner.name} or null")
        object.__setattr__(self, "inner", inner)

    def check(self, v: Any, at: str) -> None:
        if v is not None:
            self.inner.check(v, at)


@dataclass(frozen=True)
class Enum(Spec):
    """One of the given values."""

    values: tuple[Any, ...] = ()

    def __init__(self, *values: Any) -> None:
        object.__setattr__(self, "name", "one of " + ", ".join(map(repr, values)))
        object.__setattr__(self, "values", values)

    def check(self, v: Any, at: str) -> None:
        if isinstance(v, (dict, list)) or v not in self.values:
            raise _fail(at, self.name, v)


@dataclass(frozen=True)
class List(Spec):
    """A list whose every item is `item` (at least `min_len` of them)."""

    item: Spec = field(default_factory=lambda: ANY)
    min_len: int = 0

    def __init__(self, item: Spec, min_len: int = 0) -> None:
        object.__setattr__(self, "name", "a list" + (" (not empty)" if min_len else ""))
        object.__setattr__(self, "item", item)
        object.__setattr__(self, "min_len", min_len)

    def check(self, v: Any, at: str) -> None:
        if not isinstance(v, list) or len(v) < self.min_len:
            raise _fail(at, self.name, v)
        for i, x in enumerate(v):
            self.item.check(x, f"{at}[{i}]")


@dataclass(frozen=True)
class Map(Spec):
    """A mapping with `keys` (all required except `optional`); other keys allowed with
    `extra`, else an error naming them."""

    keys: Mapping[str, Spec] = field(default_factory=dict)
    optional: tuple[str, ...] = ()
    extra: bool = True

    def __init__(self, keys: Mapping[str, Spec], optional: Iterable[str] = (),
                 extra: bool = True) -> None:
        object.__setattr__(self, "name", "a mapping")
        object.__setattr__(self, "keys", dict(keys))
        object.__setattr__(self, "optional", tuple(optional))
        object.__setattr__(self, "extra", extra)

    def check(self, v: Any, at: str) -> None:
        if not isinstance(v, dict):
            raise _fail(at, self.name, v)
        missing = [k for k in self.keys if k not in v and k not in self.optional]
        if missing:
            raise SchemaError(f"{at or 'the top level'}: the key {missing[0]!r} is required")
        if not self.extra:
            unknown = sorted(str(k) for k in v if k not in self.keys)
            if unknown:
                raise SchemaError(f"{at or 'the top level'}: unknown key(s) "
                                  f"{', '.join(map(repr, unknown))}; allowed: "
                                  f"{', '.join(sorted(self.keys))}")
        for k, spec in self.keys.items():
            if k in v:
                spec.check(v[k], f"{at}.{k}" if at else k)


@dataclass(frozen=True)
class Dict(Spec):
    """A mapping from strings to values that are each `value`."""

    value: Spec = field(default_factory=lambda: ANY)

    def __init__(self, value: Spec) -> None:
        object.__setattr__(self, "name", "a mapping")
        object.__setattr__(self, "value", value)

    def check(self, v: Any, at: str) -> None:
        if not isinstance(v, dict):
            raise _fail(at, self.name, v)
        for k, x in v.items():
            self.value.check(x, f"{at}.{k}" if at else str(k))


class _Any(Spec):
    def check(self, v: Any, at: str) -> None:
        return None


ANY: Spec = _Any("anything")
Int = _Int("an integer")
Count = _Int("an integer >= 0", low=0)
Num = _Num("a number")
NonNeg = _Num("a number >= 0", low=0.0)
Str = _Type("a string", types=(str,))
Bool = _Type("true or false", types=(bool,))


def check(doc: Any, spec: Spec, where: str) -> Any:
    """`doc` if it matches `spec`; else a SchemaError prefixed with `where` (a file name)."""
    try:
        spec.check(doc, "")
    except SchemaError as e:
        raise SchemaError(f"{where}: {e}") from None
    return doc
