"""A generic name → object registry with duplicate checks and helpful lookup errors.

Plugin points (hardware profiles, serving engines, workloads, model families) are registries so that
YAML and the CLI name plugins by registry name, never by import path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from autocompress_opt.errors import UnknownNameError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps lower-case names (and aliases) to objects of one kind.

    Registering a name twice raises ``ValueError`` unless ``replace=True``; looking up an unknown
    name raises :class:`UnknownNameError` listing what is available.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, item: T, *, aliases: tuple[str, ...] = (), replace: bool = False) -> T:
        key = name.lower()
        if not replace and (key in self._items or key in self._aliases):
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[key] = item
        for alias in aliases:
            self._aliases[alias.lower()] = key
        return item

    def decorator(self, name: str, **kwargs: object) -> Callable[[T], T]:
        """``@registry.decorator("name")`` registers the decorated object under ``name``."""
        return lambda item: self.register(name, item, **kwargs)  # type: ignore[arg-type]

    def get(self, name: str) -> T:
        key = name.lower()
        key = self._aliases.get(key, key)
        if key not in self._items:
            raise UnknownNameError(self.kind, name, self._items)
        return self._items[key]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name.lower() in self._items or name.lower() in self._aliases)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)
