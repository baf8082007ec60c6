"""Argument helpers shared by the verbs."""

from __future__ import annotations

import argparse
import json
from typing import Any

from autocompress_opt.errors import ConfigError

EXAMPLES = argparse.RawDescriptionHelpFormatter


def add_verb(sub: Any, name: str, help_text: str, examples: str) -> argparse.ArgumentParser:
    return sub.add_parser(
        name, help=help_text, description=f"{help_text}\n\nexamples:\n{examples}", formatter_class=EXAMPLES
    )


def add_hardware_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--hardware-file",
        metavar="YAML",
        action="append",
        default=[],
        help="extra hardware profiles (YAML list of {name, memory_gib, bandwidth_gb_s, peak_tflops})",
    )


def load_hardware_files(args: argparse.Namespace) -> None:
    from autocompress_opt.serving.hardware import load_hardware_file

    for path in getattr(args, "hardware_file", []):
        load_hardware_file(path)


def concurrency(text: str) -> int | str:
    if text == "max":
        return "max"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"concurrency must be a positive integer or 'max', got {text!r}") from None
    return value


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(
        str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
    )
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def engine_options(pairs: list[str]) -> dict[str, Any]:
    """``["memory_fraction=0.5"]`` → ``{"memory_fraction": 0.5}``."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--engine-option expects KEY=VALUE, got {pair!r}")
        out[key.strip()] = _number(key.strip(), value)
    return out


def _number(key: str, text: str) -> int | float:
    """``"64"`` → 64, ``"0.5"`` / ``"1e-1"`` → a float; anything else a :class:`ConfigError`."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"--engine-option {key} must be a number, got {text!r}") from None
