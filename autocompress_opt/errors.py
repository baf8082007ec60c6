"""The package's exception hierarchy.

Every error that reaches a user names the offending value and, where the set of valid values is
known, lists it (with a "did you mean" suggestion for near misses).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from typing import Any, overload

__all__ = [
    "AutocompressError",
    "ConfigError",
    "UnknownNameError",
    "check_bool",
    "check_choice",
    "check_fraction",
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


def _or_also(also: Iterable[object]) -> str:
    """The text " or None" / " or 'max'" naming the extra values a check accepts as they are."""
    return "".join(f" or {a!r}" for a in also)


@overload
def check_int(value: Any, where: str, minimum: int | None = 1, *, maximum: int | None = None) -> int: ...
@overload
def check_int(
    value: Any, where: str, minimum: int | None = 1, *, maximum: int | None = None, also: Iterable[object]
) -> Any: ...
def check_int(
    value: Any,
    where: str,
    minimum: int | None = 1,
    *,
    maximum: int | None = None,
    also: Iterable[object] = (),
) -> Any:
    """Return ``value`` when it is an ``int`` (not a ``bool``) in ``[minimum, maximum]`` (a bound of
    None is open), or one of the values in ``also`` (such as None or ``'max'``), which pass as they are.

    Otherwise raise :class:`ConfigError` "<where> must be a positive int, got <value!r>": "a
    non-negative int" for ``minimum=0``, "an int >= <minimum>" for another minimum, "an int in
    [<minimum>, <maximum>]" with a maximum, "an int" with neither; each value of ``also`` is added
    as "... or None". ``where`` names the field or the CLI flag (``--trials``).
    """
    also = tuple(also)
    if any(value is a or (type(value) is type(a) and value == a) for a in also):
        return value
    ok = isinstance(value, int) and not isinstance(value, bool)
    if ok and ((minimum is not None and value < minimum) or (maximum is not None and value > maximum)):
        ok = False
    if not ok:
        if maximum is not None:
            kind = f"an int in [{minimum if minimum is not None else '-inf'}, {maximum}]"
        elif minimum is None:
            kind = "an int"
        else:
            kind = {0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
        raise ConfigError(f"{where} must be {kind}{_or_also(also)}, got {value!r}")
    return value


def _is_real(value: Any) -> bool:
    """A finite int or float that is not a bool (``True`` is not the number 1 in a config)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@overload
def check_number(value: Any, where: str, *, positive: bool = True) -> float: ...
@overload
def check_number(value: Any, where: str, *, positive: bool = True, also: Iterable[object]) -> Any: ...
def check_number(value: Any, where: str, *, positive: bool = True, also: Iterable[object] = ()) -> Any:
    """Return ``value`` as a float when it is a finite real number (not a ``bool``) that is
    positive (``positive=True``) or non-negative, or ``value`` itself when it is one of ``also``.

    Otherwise raise :class:`ConfigError` "<where> must be a finite number > 0, got <value!r>"
    (">= 0" for ``positive=False``; "... or None" for ``also=(None,)``): NaN, infinities,
    strings, lists and booleans are all refused.
    """
    also = tuple(also)
    if any(value is a for a in also):
        return value
    if not _is_real(value) or value < 0 or (positive and value == 0):
        raise ConfigError(
            f"{where} must be a finite number {'> 0' if positive else '>= 0'}{_or_also(also)}, got {value!r}"
        )
    return float(value)


@overload
def check_fraction(value: Any, where: str, *, zero: bool = False, one: bool = True, hint: str = "") -> float: ...
@overload
def check_fraction(
    value: Any, where: str, *, zero: bool = False, one: bool = True, hint: str = "", also: Iterable[object]
) -> Any: ...
def check_fraction(
    value: Any, where: str, *, zero: bool = False, one: bool = True, hint: str = "", also: Iterable[object] = ()
) -> Any:
    """Return ``value`` as a float when it is a real number (not a ``bool``) between 0 and 1, with
    0 allowed only for ``zero=True`` and 1 only for ``one=True`` (default: the interval (0, 1]),
    or ``value`` itself when it is one of ``also``.

    Otherwise raise :class:`ConfigError` "<where> must be a number in (0, 1], got <value!r>", the
    brackets showing which ends are allowed; ``hint`` (e.g. "e.g. 0.9") is added in parentheses.
    """
    also = tuple(also)
    if any(value is a for a in also):
        return value
    ok = _is_real(value) and (value >= 0 if zero else value > 0) and (value <= 1 if one else value < 1)
    if not ok:
        interval = f"{'[' if zero else '('}0, 1{']' if one else ')'}"
        raise ConfigError(
            f"{where} must be a number in {interval}{f' ({hint})' if hint else ''}{_or_also(also)}, got {value!r}"
        )
    return float(value)


def check_choice(value: Any, where: str, valid: Iterable[str]) -> str:
    """Return ``value`` when it is one of ``valid``.

    Otherwise raise :class:`ConfigError` "<where> must be one of a, b, c, got <value!r>", with
    " — did you mean 'b'?" (:func:`suggest`) when a valid name is close to a string ``value``.
    """
    valid = tuple(valid)
    if isinstance(value, str) and value in valid:
        return value
    near = suggest(value, valid) if isinstance(value, str) else ""
    raise ConfigError(f"{where} must be one of {', '.join(valid)}, got {value!r}{near}")


def check_bool(value: Any, where: str) -> bool:
    """Return ``value`` when it is a ``bool``; otherwise raise :class:`ConfigError` "<where> must
    be true or false, got <value!r>" (a 0/1 or a "yes" string is refused: YAML spells it true)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    return value


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
