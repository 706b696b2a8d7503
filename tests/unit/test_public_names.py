"""The public API is what docs/extending.md's "Public names" lists: every name there must exist."""

import importlib
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def _table_cells() -> list[str]:
    text = DOC.read_text(encoding="utf-8").split("## Public names", 1)[1]
    return [line.split("|")[1] for line in text.splitlines() if line.startswith("| `")]


def _resolve(dotted: str):
    """The object named ``dotted`` (a module, or an attribute path below the longest importable module)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _names(cell: str) -> list[str]:
    """Fully qualified names of one table cell: the first is absolute, the others relative to the package or
    to the module of the name before; a parenthesised group lists attributes of the name before it."""
    names: list[str] = []
    module = "fednest_mpi"
    for group, name in re.findall(r"\(([^)]*)\)|`([^`]+)`", cell):
        if group:
            names += [f"{names[-1]}.{attr}" for attr in re.findall(r"`([^`]+)`", group)]
            continue
        if name.startswith("fednest_mpi."):
            full = name
            module = name if _is_module(name) else name.rsplit(".", 1)[0]
        elif "." in name and _is_module("fednest_mpi." + name.split(".")[0]):
            full = "fednest_mpi." + name
            module = full if _is_module(full) else full.rsplit(".", 1)[0]
        else:
            full = f"{module}.{name}"
        names.append(full)
    return names


def _is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


NAMES = [name for cell in _table_cells() for name in _names(cell)]


def test_the_list_is_read():
    assert len(NAMES) > 40 and "fednest_mpi.registry.Registry.register" in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_every_public_name_exists(name):
    _resolve(name)
