"""Argument helpers shared by the verbs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from autocompress_opt.errors import ConfigError, check_int

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


def add_data_arg(parser: argparse.ArgumentParser, what: str) -> None:
    """``--data SPEC[#OPTION...]`` (repeatable): the user's text instead of the built-in sources
    (:mod:`autocompress_opt.data.user` has the grammar)."""
    parser.add_argument(
        "--data",
        action="append",
        default=None,
        metavar="SPEC",
        help=f"your text for {what}, repeatable with row weights "
        "(code.jsonl#weight=0.7 --data chat.parquet#weight=0.3): "
        "a .jsonl/.json/.parquet file (a text field, chat messages or ShareGPT conversations, prompt/completion), "
        "a save_to_disk folder, a folder of text/code files, hf:NAME, or a built-in source; options "
        "#field=A,B #weight=W #config=C #split=S #template=model|plain (sft.jsonl#field=instruction,output); "
        "checked before the model loads; split by row text into calibration / selection / test "
        "(default: the built-in Python code and prose)",
    )


def add_compute_args(parser: argparse.ArgumentParser, *, note: str = "") -> None:
    """``--device`` and ``--compute-dtype`` (resolved by :func:`compute_of`)."""
    parser.add_argument(
        "--device",
        default=None,
        help="where the model computes: auto (default: the first CUDA GPU, else the CPU), cpu, cuda, cuda:N",
    )
    parser.add_argument(
        "--compute-dtype",
        default=None,
        help="dtype of the forward passes: auto (default: bf16 on CUDA, fp32 on the CPU), fast (auto, and bf16 "
        "on a CPU with AVX512-BF16 or AMX: about 2x faster there), fp32, bf16, fp16 "
        f"(not the serving format --dtype){note}",
    )


def compute_of(args: argparse.Namespace) -> dict[str, Any]:
    """``load_model``'s ``device`` and ``dtype`` from ``--device`` / ``--compute-dtype``, resolved
    before anything loads (CUDA asked for but absent is a :class:`ConfigError`, never a fallback)."""
    from autocompress_opt.hf.device import resolve_compute_dtype, resolve_device

    device = resolve_device(args.device or "auto")
    return {"device": device, "dtype": resolve_compute_dtype(args.compute_dtype or "auto", device)}


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


def dropped_rows_note(records: dict[str, Any]) -> str:
    """``"; 3 code rows dropped (...)"`` from rows' records (:meth:`TextBatches.to_dict` by domain): the
    held-out rows left out for sharing a long n-gram with another role's text, or "" when none were."""
    dropped = {
        dom: r["overlap_check"]
        for dom, r in records.items()
        if isinstance(r, dict) and (r.get("overlap_check") or {}).get("rows_dropped")
    }
    if not dropped:
        return ""
    check = next(iter(dropped.values()))
    counts = ", ".join(f"{c['rows_dropped']} {dom}" for dom, c in dropped.items())
    return (
        f"; rows dropped for sharing {check['ngram_tokens']} consecutive words with "
        f"{' or '.join(check['against'])} text: {counts}"
    )


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


def setting_options(pairs: list[str], flag: str) -> dict[str, Any]:
    """``["steps=24", "checkpoint_activations=true", "device=cuda"]`` → ``{"steps": 24,
    "checkpoint_activations": True, "device": "cuda"}``: numbers, ``true``/``false``, else the text
    (the config the values go to checks each one and names the bad key)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} expects KEY=VALUE, got {pair!r}")
        text = value.strip()
        if text.lower() in ("true", "false"):
            out[key.strip()] = text.lower() == "true"
            continue
        try:
            out[key.strip()] = _number(key.strip(), text)
        except ConfigError:
            out[key.strip()] = text
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


# ------------------------------------------------------------ cheap checks, before any real work
def check_positive(args: argparse.Namespace, *flags: str, minimum: int = 1) -> None:
    """:class:`ConfigError` (:func:`~autocompress_opt.errors.check_int`, naming the flag) for the
    first ``--flag`` whose int value is set and below ``minimum`` (an explicit ``--batch-size 0`` is
    an error, not "the default")."""
    for flag in flags:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            check_int(value, flag, minimum)


def _writable_folder(path: Path, flag: str, given: Path | None = None) -> None:
    """:class:`ConfigError` unless the nearest existing folder at or above ``path`` is a folder this
    process can create entries in (probed by creating and removing a folder there, so a read-only
    filesystem is caught for root too); messages name ``given`` (default ``path``)."""
    import shutil
    import tempfile

    given = given or path
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{flag} {str(given)!r}: {str(existing)!r} is not a directory")
    try:
        shutil.rmtree(tempfile.mkdtemp(prefix=".autocompress-probe.", dir=existing))
    except OSError as exc:
        raise ConfigError(f"{flag} {str(given)!r}: cannot write in {str(existing)!r} ({exc.strerror})") from None


def check_output_dir(path: Path | str, flag: str = "--out") -> Path:
    """``path`` as a Path when a folder can be written there: an existing folder, or a new one under
    a writable folder; a file in the way is a :class:`ConfigError`. Nothing is created."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} exists and is not a directory")
    _writable_folder(path, flag)
    return path


def check_output_file(path: Path | str, flag: str = "--out") -> Path:
    """``path`` as a Path when a file can be written there: not a folder, and its folder exists or
    can be created under a writable folder. Nothing is created."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} is a directory; expected a file path")
    _writable_folder(path.parent, flag, given=path)
    return path
