"""The two registries, problems and algorithms, and how plugins enter them (docs/extending.md).

A registry maps the name a config writes (``problem.name``, ``algorithm.name``) to a spec: the frozen
parameter class of the section, the implementation as ``"module:Class"`` and the traits validation
reads. Built-ins and plugins enter it by the same function, :meth:`Registry.register`; a plugin is found

* by an **entry point** of the user's installed package, in the group ``fednest_mpi.problems`` or
  ``fednest_mpi.algorithms`` (``hyper_cleaning = "my_package.cleaning:HyperCleaning"``): its name is
  the entry point's name; or
* by a config naming the class itself, ``name = "my_module:MyProblem"`` (the module must be importable
  on every rank: installed, or on ``PYTHONPATH``).

Built-in classes written on the public API (the single-round algorithms, ``hyper_cleaning``) enter the same way, by
:meth:`Registry.provide` (a name and its ``"module:Class"``, no import): they are loaded like an entry point
when a config names them or :meth:`Registry.load_all` asks, so reading a config stays free of torch.

All of them load the class, read its ``Params`` (a frozen dataclass: every field with a default, its help from
:func:`fednest_mpi.config.spec`) and its trait attributes, and register a spec built from them
(:func:`problem_spec_of`, :func:`algorithm_spec_of`). Every failure -- an import error, a name already
taken, a broken parameter class -- is one :class:`~fednest_mpi.errors.ConfigError` naming the plugin and
the fix, raised while the config is read, so every rank stops with the same line before any collective.
No torch and no MPI here (a plugin's own module may import torch when it is loaded).
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any, Generic, TypeVar

from fednest_mpi.errors import ConfigError

S = TypeVar("S")
GROUPS = {"problem": "fednest_mpi.problems", "algorithm": "fednest_mpi.algorithms"}
FIELD_TYPES = (bool, int, float, str)  # what a config field may be (TOML scalars)


class Registry(dict[str, S], Generic[S]):
    """name -> spec of one kind (``"problem"`` or ``"algorithm"``); the plugins of the kind's entry-point
    group are loaded when a name is looked up that is not registered yet, or when :meth:`load_all` asks."""

    def __init__(self, kind: str, spec_of: Callable[[str, type], S], required: tuple[str, ...]):
        super().__init__()
        self.kind, self.group, self.spec_of, self.required = kind, GROUPS[kind], spec_of, required
        self.provided: dict[str, str] = {}  # built-in name -> "module:Class", registered when first looked up

    def provide(self, name: str, target: str) -> None:
        """Make the built-in class ``target`` (``"module:Class"``) available as ``name`` without importing
        it: it is loaded and registered (:meth:`register`) when ``name`` is first resolved."""
        if name in self or name in self.provided:
            first = self[name].implementation if name in self else self.provided[name]  # type: ignore[attr-defined]
            raise ConfigError(
                f"{self.kind}.name: {name!r} is registered twice (by {first} and by {target}); rename one of them"
            )
        self.provided[name] = target

    def register(self, spec: S) -> S:
        """Add ``spec`` (a ``ProblemSpec`` or ``AlgorithmSpec``) under its name; the name must be free and its
        parameter class well formed."""
        name = spec.name  # type: ignore[attr-defined]
        if name in self:
            raise ConfigError(
                f"{self.kind}.name: {name!r} is registered twice (by {self[name].implementation} and by "  # type: ignore[attr-defined]
                f"{spec.implementation}); rename one of them"  # type: ignore[attr-defined]
            )
        check_params(self.kind, name, spec.params, self.required)  # type: ignore[attr-defined]
        self[name] = spec
        return spec

    def entry_points(self) -> dict[str, metadata.EntryPoint]:
        """The installed plugins of this kind by name (not loaded)."""
        return {ep.name: ep for ep in metadata.entry_points(group=self.group)}

    def names(self) -> list[str]:
        """Every name a config may use: registered and installed-but-not-loaded ones."""
        return list(dict.fromkeys([*self, *self.provided, *self.entry_points()]))

    def resolve(self, name: str) -> S | None:
        """The spec of ``name``, loading it from an entry point or a ``"module:Class"`` name if needed;
        None when there is no such name."""
        eps = self.entry_points()
        known = self[name].implementation if name in self else self.provided.get(name)  # type: ignore[attr-defined]
        if known is not None and name in eps and eps[name].value != known:
            raise ConfigError(
                f"{self.kind}.name: {name!r} is registered twice (by {known} and by the "
                f"entry point {eps[name].value} of group {self.group}); rename the plugin's entry point"
            )
        if name in self:
            return self[name]
        if name in self.provided:
            cls = _load(self.kind, name, self.provided[name], f"built-in {self.kind} {name!r}")
        elif name in eps:
            cls = _load(self.kind, name, eps[name].value, f"entry point {name!r} of group {self.group}")
        elif ":" in name:
            cls = _load(self.kind, name, name, f"{self.kind}.name = {name!r}")
        else:
            return None
        return self.register(self.spec_of(name, cls))

    def with_builtins(self) -> list[S]:
        """Every registered spec, the provided built-ins loaded first (installed plugins stay unloaded)."""
        for name in self.provided:
            self.resolve(name)
        return list(self.values())

    def load_all(self) -> Iterator[S]:
        """Every spec, the installed plugins loaded (``fednest-mpi config-doc``)."""
        for name in self.names():
            spec = self.resolve(name)
            if spec is not None:
                yield spec


def import_class(target: str) -> Any:
    """The object ``"module:Qual.Name"`` names (a spec's ``implementation``)."""
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _load(kind: str, name: str, target: str, where: str) -> type:
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise ConfigError(f"{kind}.name: {where} is not of the form 'module:Class'; write e.g. 'my_module:MyClass'")
    try:
        obj = import_class(target)
    except ImportError as exc:
        raise ConfigError(
            f"{kind}.name: {where}: cannot import module {module!r} ({type(exc).__name__}: {exc}); install the "
            "plugin's package on every node, or put its folder on PYTHONPATH"
        ) from None
    except AttributeError:
        raise ConfigError(f"{kind}.name: {where}: module {module!r} has no {attr!r}; check the name") from None
    except Exception as exc:  # noqa: BLE001 -- a plugin's module failing at import is the user's to fix
        raise ConfigError(
            f"{kind}.name: {where}: importing module {module!r} failed ({type(exc).__name__}: {exc}); fix the plugin"
        ) from None
    if not isinstance(obj, type):
        raise ConfigError(f"{kind}.name: {where}: {target} is not a class; name the {kind} class")
    return obj


def check_params(kind: str, name: str, params: Any, required: tuple[str, ...]) -> None:
    """A ConfigError naming what is wrong when ``params`` cannot be a config section: not a frozen
    dataclass, a field without a default or of a type a config cannot hold, or a required field missing."""
    where = f"{kind} {name!r}: its parameter class {getattr(params, '__qualname__', params)!r}"
    if not (isinstance(params, type) and dataclasses.is_dataclass(params)):
        raise ConfigError(f"{where} is not a dataclass; give the class a Params = @dataclass(frozen=True) class")
    if not params.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise ConfigError(f"{where} is not frozen; declare it @dataclass(frozen=True)")
    try:
        hints = typing.get_type_hints(params)
    except Exception as exc:  # noqa: BLE001 -- an unresolvable annotation
        raise ConfigError(f"{where}: its annotations cannot be resolved ({exc}); use bool, int, float or str") from None
    fields = {f.name: f for f in dataclasses.fields(params)}
    for field_name in required:
        if field_name not in fields:
            raise ConfigError(f"{where} lacks the field {field_name!r} every {kind} has; add it")
    for f in fields.values():
        if hints.get(f.name) not in FIELD_TYPES:
            raise ConfigError(
                f"{where}: field {f.name!r} is of type {hints.get(f.name)!r}; use bool, int, float or str"
            )
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}: field {f.name!r} has no default; give it one with config.spec(default, help)")
