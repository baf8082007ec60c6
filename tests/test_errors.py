"""The package's validators (``autocompress_opt.errors``): one function per idea, each message
naming the field (or CLI flag), the bad value and what would be valid."""

from __future__ import annotations

import math
import re

import pytest

from autocompress_opt.errors import (
    ConfigError,
    check_bool,
    check_choice,
    check_fraction,
    check_int,
    check_number,
)


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (0, {}, "n must be a positive int, got 0"),
        (3, {"maximum": 2}, "n must be an int in [1, 2], got 3"),
        (0, {"minimum": 1, "maximum": 2}, "n must be an int in [1, 2], got 0"),
        ("4", {"minimum": None}, "n must be an int, got '4'"),
        (False, {"minimum": None}, "n must be an int, got False"),
        (0, {"also": (None,)}, "n must be a positive int or None, got 0"),
        ("lots", {"also": ("max",)}, "n must be a positive int or 'max', got 'lots'"),
        (-2, {"minimum": 0, "also": ("max",)}, "n must be a non-negative int or 'max', got -2"),
    ],
)
def test_check_int_bounds_and_extra_values(value: object, kwargs: dict, message: str) -> None:
    """Bounds are inclusive, ``minimum=None`` accepts any int, ``also`` values are named in the message."""
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        check_int(value, "n", **kwargs)


def test_check_int_passes_good_values_and_the_extra_ones_unchanged() -> None:
    assert check_int(2, "n", maximum=2) == 2
    assert check_int(-7, "seed", minimum=None) == -7
    assert check_int(None, "n", also=(None,)) is None
    assert check_int("max", "concurrency", also=("max",)) == "max"
    # 'max' is a string: the int 0 is not mistaken for it, nor is False for None
    with pytest.raises(ConfigError):
        check_int(False, "n", also=(None,))


@pytest.mark.parametrize("bad", [0, -1.5, math.nan, math.inf, True, "3", [1]])
def test_check_number_refuses_what_is_not_a_positive_finite_number(bad: object) -> None:
    with pytest.raises(ConfigError, match=f"^x must be a finite number > 0, got {re.escape(repr(bad))}$"):
        check_number(bad, "x")


def test_check_number_non_negative_and_none() -> None:
    assert check_number(0, "x", positive=False) == 0.0 and isinstance(check_number(3, "x"), float)
    assert check_number(None, "x", also=(None,)) is None
    with pytest.raises(ConfigError, match=r"^x must be a finite number >= 0 or None, got -1$"):
        check_number(-1, "x", positive=False, also=(None,))


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (0, {}, "f must be a number in (0, 1], got 0"),
        (1, {"one": False}, "f must be a number in (0, 1), got 1"),
        (1, {"zero": True, "one": False}, "f must be a number in [0, 1), got 1"),
        (-0.1, {"zero": True}, "f must be a number in [0, 1], got -0.1"),
        (math.nan, {}, "f must be a number in (0, 1], got nan"),
        (True, {}, "f must be a number in (0, 1], got True"),
        (2, {"one": False, "hint": "e.g. 0.9"}, "f must be a number in (0, 1) (e.g. 0.9), got 2"),
    ],
)
def test_check_fraction_names_the_interval(value: object, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        check_fraction(value, "f", **kwargs)


def test_check_fraction_accepts_its_ends_only_when_asked() -> None:
    assert check_fraction(1, "f") == 1.0 and check_fraction(0, "f", zero=True) == 0.0
    assert check_fraction(0.5, "f", one=False) == 0.5
    assert check_fraction(None, "f", also=(None,)) is None


def test_check_choice_suggests_a_near_miss() -> None:
    assert check_choice("burst", "arrival", ("burst", "steady")) == "burst"
    with pytest.raises(
        ConfigError, match=r"^arrival must be one of burst, steady, got 'bursty' — did you mean 'burst'\?$"
    ):
        check_choice("bursty", "arrival", ("burst", "steady"))
    with pytest.raises(ConfigError, match=r"^arrival must be one of burst, steady, got 'zzz'$"):
        check_choice("zzz", "arrival", ("burst", "steady"))
    with pytest.raises(ConfigError, match=r"^arrival must be one of burst, steady, got 3$"):
        check_choice(3, "arrival", ("burst", "steady"))


@pytest.mark.parametrize("bad", [0, 1, "yes", None])
def test_check_bool_refuses_ints_and_strings(bad: object) -> None:
    assert check_bool(True, "flag") is True
    with pytest.raises(ConfigError, match=f"^flag must be true or false, got {re.escape(repr(bad))}$"):
        check_bool(bad, "flag")


def test_validators_raise_value_errors() -> None:
    """ConfigError is a ValueError: callers that catch ValueError keep working."""
    with pytest.raises(ValueError):
        check_int(0, "n")
