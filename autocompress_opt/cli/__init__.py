"""``autocompress`` command line: one module per verb; each builds a config and calls the API."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from autocompress_opt import __version__
from autocompress_opt.errors import AutocompressError, one_line

__all__ = ["main"]

_VERBS = (
    "arch",
    "cost",
    "hardware",
    "report",
    "validate",
    "calibrate",
    "study",
    "plot",
    "eval",
    "prune",
    "distill",
    "serve_check",
    "memory",
)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other error of the CLI:
    "autocompress VERB: error: MESSAGE (see 'autocompress VERB --help')", exit code 2. (argparse
    prints the whole usage block first, which buries the line that names the bad value.) Sub-parsers
    are made of this class too, as ``add_subparsers`` uses the parent's class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    from importlib import import_module

    parser = _Parser(
        prog="autocompress",
        description="Hardware-guided pruning of decoder LLMs: describe architectures, predict serving "
        "cost on a GPU catalog, calibrate and validate the cost models.",
        epilog="Run 'autocompress VERB --help' for examples of each verb.",
    )
    parser.add_argument("--version", action="version", version=f"autocompress {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in _VERBS:
        import_module(f"autocompress_opt.cli.{verb}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _check_data(args)
        return int(args.run(args) or 0)
    except AutocompressError as exc:
        print(f"autocompress {args.verb}: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the interpreter's final flush
        return 0


def _check_data(args: argparse.Namespace) -> None:
    """Every ``--data`` spec parsed and its source read once, before the verb loads a model: a bad
    spec is one line and exit 2 with nothing written (the sources stay loaded for the verb)."""
    specs = getattr(args, "data", None)
    if specs and isinstance(specs, list):
        from autocompress_opt.data.user import resolve_data

        resolve_data(specs)


if __name__ == "__main__":
    sys.exit(main())
