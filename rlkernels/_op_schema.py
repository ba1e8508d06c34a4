"""Op schemas from named argument groups (docs/design.md, "Options of an op").

An op's arguments are written once, in Python, as argument groups: NamedTuple classes whose annotations
are the schema types (`Tensor`, `Tensor | None`, `str`, `bool`, `int`, `float`, `float | None`). A group
is a tuple, so `op(*inputs, *config)` passes it in schema order with no conversion, and `Group._make`
reads it back from a call's arguments. From the groups come:

- the schema of the Triton op (`Signature.schema`) and, through the generated headers of
  rlkernels/cxx_headers.py, the schema fragments of csrc/rlkernels.cpp and the C++ kernels' parameter
  lists;
- the unpacking of a call's positional arguments into its groups by name (`Signature.unpack`), for the
  Python implementations, fake kernels and autograd formulas.

A field that the C++ kernels parse into another type (a name into an enum code) says so with
`Annotated[str, Parsed(cxx_type, parser)]`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from typing import Annotated, NamedTuple

import torch

_tuple_new = tuple.__new__
# Python annotation -> schema type (an optional one adds "?").
_SCHEMA_TYPES = {torch.Tensor: "Tensor", str: "str", bool: "bool", int: "int", float: "float"}
# Schema type -> the C++ parameter type torch passes a kernel registered with m.impl.
_CXX_PARAMS = {
    "Tensor": "const at::Tensor&",
    "Tensor?": "const std::optional<at::Tensor>&",
    "str": "c10::string_view",
    "bool": "bool",
    "int": "int64_t",
    "float": "double",
    "float?": "std::optional<double>",
}
# Schema type -> the C++ member type of a field kept as it is (a parsed field names its own).
_CXX_MEMBERS = {"bool": "bool", "int": "int64_t", "float": "double", "float?": "std::optional<double>"}


class Parsed(NamedTuple):
    """A field the C++ kernels parse: its member type and the host function that parses (and checks) it."""

    cxx_type: str
    parser: str


class Field(NamedTuple):
    """One argument: its name, its schema type ("float?") and, if parsed in C++, how."""

    name: str
    schema_type: str
    parsed: Parsed | None = None

    @property
    def cxx_param(self) -> str:
        return _CXX_PARAMS[self.schema_type]

    @property
    def cxx_member(self) -> str:
        return self.parsed.cxx_type if self.parsed else _CXX_MEMBERS[self.schema_type]

    @property
    def cxx_parsed(self) -> str:
        """The C++ expression giving the member from the parameter of the same name."""
        return f"{self.parsed.parser}({self.name})" if self.parsed else self.name


def _field(name: str, hint) -> Field:
    parsed = None
    if typing.get_origin(hint) is Annotated:
        hint, *extras = typing.get_args(hint)
        parsed = next((e for e in extras if isinstance(e, Parsed)), None)
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(members) < len(typing.get_args(hint))
        (hint,) = members
    if hint not in _SCHEMA_TYPES:
        raise TypeError(f"argument {name!r}: no schema type for the annotation {hint!r}")
    return Field(name, _SCHEMA_TYPES[hint] + ("?" if optional else ""), parsed)


def fields(group: type[tuple]) -> tuple[Field, ...]:
    """The fields of an argument group (a NamedTuple class), in order."""
    hints = typing.get_type_hints(group, include_extras=True)
    return tuple(_field(name, hints[name]) for name in group._fields)


def schema_fragment(group: type[tuple]) -> str:
    """The group's part of a schema: "str objective, bool seq_level, float? dual_clip, ..."."""
    return ", ".join(f"{f.schema_type} {f.name}" for f in fields(group))


class Signature:
    """The arguments of one op: argument groups (NamedTuple classes) and single arguments ((name, type)),
    in schema order, and its returns ("(Tensor, Tensor)")."""

    def __init__(self, name: str, params: Sequence[type[tuple] | tuple[str, type]], returns: str) -> None:
        self.name = name
        self.returns = returns
        self.fields: tuple[Field, ...] = ()
        # Per parameter: (its position, its slice of the arguments, its group class or None for a single
        # argument), what unpack reads.
        self._parts = []
        for param in params:
            group = None if isinstance(param, tuple) else param
            new = (_field(*param),) if group is None else fields(group)
            start = len(self.fields)
            self.fields += new
            self._parts.append((start, slice(start, len(self.fields)), group))
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"{name}: an argument name appears twice in {names}")
        self._index = {n: i for i, n in enumerate(names)}

    def schema(self) -> str:
        """The schema without the op's name, as torch.library.custom_op(schema=...) takes it."""
        return "(" + ", ".join(f"{f.schema_type} {f.name}" for f in self.fields) + f") -> {self.returns}"

    def index(self, name: str) -> int:
        """The position of argument `name` (e.g. in ctx.needs_input_grad)."""
        return self._index[name]

    def part(self, group: type[tuple]) -> slice:
        """The slice of the arguments that holds `group`: the eager autograd formulas (setup_context runs
        on every call) keep their groups with one slicing each instead of unpack."""
        return next(part for _, part, g in self._parts if g is group)

    def unpack(self, args: Sequence) -> tuple:
        """A call's positional arguments as (group or single value, ...), one per parameter: the Triton ops'
        implementations and the fake kernels. tuple.__new__ skips _make's length check (the slices have the
        groups' lengths)."""
        if len(args) != len(self.fields):
            raise TypeError(f"{self.name}: expected {len(self.fields)} arguments, got {len(args)}")
        return tuple(
            [args[i] if group is None else _tuple_new(group, args[part]) for i, part, group in self._parts]
        )
