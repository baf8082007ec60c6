"""A generic name → object registry with duplicate checks and helpful lookup errors.

Plugin points (hardware profiles, serving engines, workloads, model families, trial modes,
evaluators) are registries so that YAML and the CLI name plugins by registry name, never by import
path. An entry may be registered lazily as ``"package.module:attribute"`` (as lm-evaluation-harness'
registry does): the module is imported on first lookup, so a registry in a low layer can name an
implementation in a higher one without importing it (no import cycle, nothing heavy at import time).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib import import_module
from typing import Generic, TypeVar, cast

from autocompress_opt.errors import UnknownNameError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps lower-case names (and aliases) to objects of one kind.

    Registering a name twice raises ``ValueError`` unless ``replace=True``; looking up an unknown
    name raises :class:`UnknownNameError` listing what is available.
    """

    def __init__(self, kind: str, *, builtins: Callable[[Registry[T]], None] | None = None):
        """``builtins(registry)``, if given, registers the built-in entries on first use (so that
        importing the module defining the registry reads no file and builds nothing)."""
        self.kind = kind
        self._builtins = builtins
        self._items: dict[str, T] = {}
        self._lazy: dict[str, str] = {}  # name -> "module:attribute", resolved on first get()
        self._aliases: dict[str, str] = {}

    def register(self, name: str, item: T, *, aliases: tuple[str, ...] = (), replace: bool = False) -> T:
        key = self._claim(name, replace)
        self._items[key] = item
        for alias in aliases:
            self._aliases[alias.lower()] = key
        return item

    def register_lazy(self, name: str, target: str, *, aliases: tuple[str, ...] = (), replace: bool = False) -> None:
        """Register ``name`` as ``"package.module:attribute"``, imported on first :meth:`get`."""
        module, sep, attribute = target.partition(":")
        if not sep or not module or not attribute:
            raise ValueError(f"lazy {self.kind} {name!r}: expected 'package.module:attribute', got {target!r}")
        key = self._claim(name, replace)
        self._lazy[key] = target
        for alias in aliases:
            self._aliases[alias.lower()] = key

    def _load_builtins(self) -> None:
        if self._builtins is not None:
            builtins, self._builtins = self._builtins, None
            builtins(self)

    def _claim(self, name: str, replace: bool) -> str:
        self._load_builtins()
        key = name.lower()
        if not replace and (key in self._items or key in self._lazy or key in self._aliases):
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items.pop(key, None)
        self._lazy.pop(key, None)
        return key

    def decorator(self, name: str, **kwargs: object) -> Callable[[T], T]:
        """``@registry.decorator("name")`` registers the decorated object under ``name``."""
        return lambda item: self.register(name, item, **kwargs)  # type: ignore[arg-type]

    def get(self, name: str) -> T:
        self._load_builtins()
        key = name.lower()
        key = self._aliases.get(key, key)
        if key in self._lazy:
            module, _, attribute = self._lazy.pop(key).partition(":")
            self._items[key] = cast(T, getattr(import_module(module), attribute))
        if key not in self._items:
            raise UnknownNameError(self.kind, name, self.names())
        return self._items[key]

    def names(self) -> list[str]:
        self._load_builtins()
        return sorted({*self._items, *self._lazy})

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        self._load_builtins()
        key = name.lower()
        return key in self._items or key in self._lazy or key in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())
