"""The package's exception hierarchy.

Every error that reaches a user names the offending value and, where the set of valid values is
known, lists it (with a "did you mean" suggestion for near misses).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "AutocompressError",
    "ConfigError",
    "UnknownNameError",
    "check_int",
    "check_number",
    "one_line",
    "reject_unknown_keys",
    "suggest",
    "yaml_problem",
]


class AutocompressError(Exception):
    """Base class of every error raised on purpose by autocompress_opt."""


class ConfigError(AutocompressError, ValueError):
    """A configuration value is invalid; the message names the field and the value."""


class UnknownNameError(AutocompressError, KeyError):
    """A name was looked up in a registry that does not hold it."""

    def __init__(self, kind: str, name: str, available: Iterable[str]):
        self.kind, self.name, self.available = kind, name, sorted(available)
        super().__init__(
            f"unknown {kind} {name!r}{suggest(name, self.available)}; "
            f"available: {', '.join(self.available) or '(none)'}"
        )

    def __str__(self) -> str:  # KeyError would repr() the message otherwise
        return str(self.args[0])


def suggest(name: str, candidates: Iterable[str]) -> str:
    """Return " — did you mean 'x'?" for the closest candidate, or "" when nothing is close."""
    close = difflib.get_close_matches(name.lower(), [c.lower() for c in candidates], n=1, cutoff=0.6)
    if not close:
        return ""
    original = next(c for c in candidates if c.lower() == close[0])
    return f" — did you mean {original!r}?"


def reject_unknown_keys(data: Mapping[str, Any], valid: Iterable[str], where: str) -> None:
    """Raise :class:`ConfigError` for the first key of ``data`` not in ``valid``, with a suggestion.

    The message reads "unknown key 'x' in <where> — did you mean 'y'?; valid keys: ...".
    """
    valid = sorted(valid)
    for key in data:
        if key not in valid:
            raise ConfigError(
                f"unknown key {key!r} in {where}{suggest(str(key), valid)}; valid keys: {', '.join(valid)}"
            )


def check_int(value: Any, where: str, minimum: int = 1) -> int:
    """Return ``value`` when it is an ``int`` (not a ``bool``) of at least ``minimum``.

    Otherwise raise :class:`ConfigError` "<where> must be a positive int, got <value!r>" (a
    "non-negative int" for ``minimum=0``, "an int >= <minimum>" for any other minimum).
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        kind = {0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
        raise ConfigError(f"{where} must be {kind}, got {value!r}")
    return value


def check_number(value: Any, where: str, *, positive: bool = True) -> float:
    """Return ``value`` as a float when it is a finite real number (not a ``bool``) that is
    positive (``positive=True``) or non-negative.

    Otherwise raise :class:`ConfigError` "<where> must be a finite number > 0, got <value!r>"
    (">= 0" for ``positive=False``): NaN, infinities, strings, lists and booleans are all refused.
    """
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        raise ConfigError(f"{where} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def one_line(text: str) -> str:
    """``text`` with its lines joined by "; " (blank lines and surrounding space dropped), so an
    error message prints as one line whatever a library put in it."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def yaml_problem(exc: Exception) -> str:
    """One line for a PyYAML error: "line L, column C: <problem>" (the mark is 1-based), or the
    error's text flattened by :func:`one_line` when it carries no mark."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return one_line(str(exc))
