"""The layer rules of the package docstring (src/fednest_mpi/__init__.py), read from the source with ``ast``:
each module imports from its own layer and the layers below it only; h5py in io, argparse in cli, mpi4py in
comm; problems import nothing of algorithms or federation; problems and algorithms import no communicator;
MPI collectives are called only in the modules the docstring allows, each only the collectives it names.
A broken rule fails with the file, the line and the rule."""

import ast
import re
from pathlib import Path

import pytest

import fednest_mpi

SRC = Path(fednest_mpi.__file__).resolve().parent

# The docstring's layers, lowest first: a layer's modules may import from the layers before it.
LAYERS: dict[str, tuple[str, ...]] = {
    "base": tuple(
        "fednest_mpi errors text pathkind atomic logs stop allocator lock native failure registry numerics exactsum "
        "rng consistency memory callbacks comm bitwise".split()
    ),
    "config": ("config",),
    "io": ("io",),
    "data": ("data",),
    "core": ("problems", "federation", "heterogeneity", "recorder", "algorithms", "contract"),
    "run": ("runner", "checkpoint", "series", "session", "checking", "writers"),
    "api": ("api", "apidoc"),
    "cli": ("cli", "__main__"),
}
# Side layers: what they may import; only cli imports them.
SIDE: dict[str, tuple[str, ...]] = {"post": ("base", "config", "io"), "jobs": ("base", "config", "io")}

# The modules that call MPI collectives, and which ones (the docstring's last paragraph).
COLLECTIVES_ALLOWED: dict[str, set[str]] = {
    "federation": {"Allreduce", "Iallreduce", "Barrier"},
    "runner": {"allgather", "bcast"},
    "checkpoint": {"gather", "Barrier"},
    "session": {"Abort"},
}
# mpi4py's collectives (and Abort). Capitalised names count on any receiver; the lower-case ones, which
# tensors and arrays also have (torch.gather, np.add.reduce), count on a receiver named like a communicator.
UPPER = set("Allreduce Iallreduce Reduce Bcast Ibcast Barrier Ibarrier Gather Allgather Scatter Alltoall Abort".split())
LOWER = set("allreduce reduce bcast barrier gather allgather scatter alltoall".split())
ONLY_IMPORTER = {"h5py": "io", "argparse": "cli", "mpi4py": "comm"}


def _unit(module: str) -> str:
    """The docstring's name of a module: its first part below fednest_mpi (``fednest_mpi`` for the root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _layer_of(unit: str) -> str:
    for layer, units in {**LAYERS, **{side: (side,) for side in SIDE}}.items():
        if unit in units:
            return layer
    raise KeyError(unit)


def _allowed(layer: str) -> set[str]:
    if layer in SIDE:
        return {layer, *SIDE[layer]}
    order = list(LAYERS)
    return set(order[: order.index(layer) + 1])


def _module_name(path: Path, root: Path) -> str:
    parts = ["fednest_mpi", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path, tree: ast.AST):
    """(line, imported module) of every import, at module level or inside a function."""
    package = _module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            yield node.lineno, base
            for alias in node.names:  # ``from fednest_mpi import rng``: the submodule rng
                folder = root.joinpath(*base.split(".")[1:], alias.name)
                if base.startswith("fednest_mpi") and (folder.with_suffix(".py").exists() or folder.is_dir()):
                    yield node.lineno, f"{base}.{alias.name}"


def _is_communicator(node: ast.expr) -> bool:
    if isinstance(node, ast.Call):
        node = node.func
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name == "world" or name.endswith("comm")


def _collectives(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if name in UPPER or (name in LOWER and _is_communicator(node.func.value)):
                yield node.lineno, name


def violations(root: Path = SRC) -> list[str]:
    """One line per broken rule in the package below ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        unit = _unit(_module_name(path, root))
        where = f"src/fednest_mpi/{path.relative_to(root)}"
        try:
            layer = _layer_of(unit)
        except KeyError:
            found.append(f"{where}:1: module {unit!r} is in no layer of the package docstring; name it there")
            continue
        for line, name in _imports(path, root, tree):
            top = name.split(".")[0]
            if top in ONLY_IMPORTER and unit != ONLY_IMPORTER[top] and layer != ONLY_IMPORTER[top]:
                found.append(f"{where}:{line}: imports {top}, which only {ONLY_IMPORTER[top]} may import")
            if top != "fednest_mpi" or name == "fednest_mpi":
                continue
            target = _unit(name)
            target_layer = _layer_of(target)
            if target_layer in SIDE and layer != "cli" and target_layer != layer:
                found.append(f"{where}:{line}: imports {name} (side layer {target_layer}), which only cli may import")
            elif target_layer not in _allowed(layer) and target_layer not in SIDE:
                found.append(f"{where}:{line}: layer {layer} imports {name} of the higher layer {target_layer}")
            if unit == "problems" and target in ("algorithms", "federation"):
                found.append(f"{where}:{line}: problems import {name}; problems import nothing of {target}")
            if unit in ("problems", "algorithms") and target == "comm":
                found.append(f"{where}:{line}: {unit} import {name}; {unit} talk to no communicator")
        for line, name in _collectives(tree):
            if name not in COLLECTIVES_ALLOWED.get(unit, set()):
                found.append(
                    f"{where}:{line}: calls the collective {name}, which the package docstring allows only in "
                    + (", ".join(u for u, names in COLLECTIVES_ALLOWED.items() if name in names) or "no module")
                )
    return found


def test_every_module_keeps_the_layer_rules():
    found = violations()
    assert not found, "\n".join(found)


def test_the_layers_are_the_package_docstrings():
    listed = re.findall(r"^\d+\. (\w+)\s+--", fednest_mpi.__doc__ or "", re.M)
    assert listed == list(LAYERS)
    for side in SIDE:
        assert f":mod:`fednest_mpi.{side}`" in (fednest_mpi.__doc__ or "")
    for unit, names in COLLECTIVES_ALLOWED.items():
        paragraph = (fednest_mpi.__doc__ or "").split("MPI collectives are called in")[1]
        assert unit in paragraph and all(f"``{n}``" in paragraph for n in names), unit


@pytest.mark.parametrize(
    "source, rule",
    [
        ("import h5py\n", "imports h5py, which only io may import"),
        ("import argparse\n", "imports argparse, which only cli may import"),
        (
            "from fednest_mpi.runner import Simulation\n",
            "layer core imports fednest_mpi.runner of the higher layer run",
        ),
        ("from fednest_mpi.algorithms import base\n", "problems import nothing of algorithms"),
        ("from fednest_mpi.comm import world\n", "problems talk to no communicator"),
        ("def f(comm):\n    return comm.allgather(1)\n", "calls the collective allgather, which"),
        ("def f(self, a):\n    self.comm.Allreduce(a, a)\n", "calls the collective Allreduce, which"),
        ("import torch\ndef f(x, i):\n    return torch.gather(x, 1, i)\n", None),
    ],
)
def test_a_broken_rule_names_file_line_and_rule(tmp_path, source, rule):
    """A problem module that breaks one rule: the message names it; a tensor's gather is no collective."""
    fake = tmp_path / "fednest_mpi"
    (fake / "problems").mkdir(parents=True)
    (fake / "problems" / "broken.py").write_text(source)
    found = violations(fake)
    if rule is None:
        assert found == []
    else:
        assert len(found) == 1 and rule in found[0] and found[0].startswith("src/fednest_mpi/problems/broken.py:")
