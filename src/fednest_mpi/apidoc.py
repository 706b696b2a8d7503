"""docs/api.md, generated from the code: every name of :mod:`fednest_mpi.api` with its signature, the first
paragraph of its docstring, a class's required attributes and its public methods with their signatures.

    python -m fednest_mpi.apidoc > docs/api.md     # tests/unit/test_public_names.py keeps the file current
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import types

HEADER = """# API reference (generated)

Every public name, from `fednest_mpi.api` (`from fednest_mpi.api import ...`); everything else is private.
How to use them: [extending.md](extending.md). Generated from the code by `python -m fednest_mpi.apidoc >
docs/api.md`; a test fails when this file is stale.
"""


def _first_paragraph(obj) -> str:
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def _signature(obj) -> str:
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    return re.sub(r" object at 0x[0-9a-f]+>", ">", text)  # default objects: the same text on every run


def _methods(cls: type) -> list[str]:
    """The public methods and properties a class defines itself, with their signatures and first lines."""
    lines = []
    for name, member in cls.__dict__.items():
        if name.startswith("_"):
            continue
        if isinstance(member, (classmethod, staticmethod)):
            member = member.__func__
        if isinstance(member, property):
            lines.append(f"  * `{name}` (property): {_first_paragraph(member)}")
        elif inspect.isfunction(member):
            lines.append(f"  * `{name}{_signature(member)}`: {_first_paragraph(member)}")
    return lines


def _required(cls: type) -> list[str]:
    """Annotated class attributes without a value: what a subclass must set (``dim_x`` and the like)."""
    notes = cls.__dict__.get("__annotations__", {})
    return [name for name in notes if not name.startswith("_") and name not in cls.__dict__]


def _attributes(cls: type) -> list[str]:
    """Annotated class attributes with a value (``diagnostics``, ``primary_metric``): what a subclass may
    extend or set; an enumeration's members. A dataclass's fields are in its signature instead."""
    if issubclass(cls, enum.Enum):
        return [f"Members: {', '.join(f'`{m.name}` ({m.value})' for m in cls)}."]
    if dataclasses.is_dataclass(cls) or issubclass(cls, tuple):  # fields: in the signature
        return []
    notes = cls.__dict__.get("__annotations__", {})
    shown = []
    for attr in notes:
        value = cls.__dict__.get(attr, inspect.Parameter.empty)
        if attr.startswith("_") or value is inspect.Parameter.empty or callable(value):
            continue
        text = repr(sorted(value)) if isinstance(value, dict) else repr(value)
        shown.append(f"`{attr}` = `{text if len(text) < 100 else text[:97] + '...'}`")
    return [f"Class attributes: {', '.join(shown)}."] if shown else []


def _entry(name: str, obj) -> list[str]:
    if isinstance(obj, types.ModuleType):
        out = [f"### `{name}` (module)", "", _first_paragraph(obj), ""]
        for attr in getattr(obj, "__all__", None) or sorted(vars(obj)):
            member = getattr(obj, attr)
            if not attr.startswith("_") and inspect.isfunction(member) and member.__module__ == obj.__name__:
                out.append(f"* `{name}.{attr}{_signature(member)}`: {_first_paragraph(member)}")
        return [*out, ""]
    if inspect.isclass(obj):
        bases = ", ".join(b.__qualname__ for b in obj.__bases__ if b is not object)
        out = [f"### `class {name}{f'({bases})' if bases else ''}`", ""]
        if obj.__init__ is not object.__init__:
            out += [f"`{name}{_signature(obj)}`", ""]
        out += [_first_paragraph(obj), ""]
        required = _required(obj)
        if required:
            out += [f"Required attributes: {', '.join(f'`{r}`' for r in required)}.", ""]
        out += [line for attribute in _attributes(obj) for line in (attribute, "")]
        methods = _methods(obj)
        return [*out, *methods, *([""] if methods else [])]
    if callable(obj):
        return [f"### `{name}{_signature(obj)}`", "", _first_paragraph(obj), ""]
    text = repr(sorted(obj)) if isinstance(obj, (set, frozenset)) else repr(obj)
    return [f"### `{name}`", "", f"`{type(obj).__name__}`: `{text if len(text) < 100 else text[:97] + '...'}`", ""]


def markdown() -> str:
    """The text of docs/api.md."""
    from fednest_mpi import api

    lines = [HEADER]
    for section, names in api.SECTIONS.items():
        lines += [f"## {section[0].upper()}{section[1:]}", ""]
        for name in names:
            lines += _entry(name, getattr(api, name))
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
