"""The result of ``make demo`` as a small JSON: what ran, how long each phase took, what it found.

Two commands:

* ``run --config studies/smollm2-weights.yaml`` runs the demo's three phases as ``make demo`` does
  (``autocompress study run --config ...``, ``study show NAME``, ``plot NAME --out plots/``), times
  each, and then records the finished study (below). A phase that fails stops the run with its exit
  code and nothing is written: a failed demo is not a result.
* ``record --study NAME [--storage URL] [--timing PHASE=SECONDS ...]`` records an already finished
  study group with the given phase timings.
* ``clean-clone --config studies/smollm2-weights.yaml`` does what a new user does: clones this
  checkout's HEAD into a temporary directory (no venv, no caches, no studies), runs ``make install``
  there (timed as the ``install`` phase) and then ``run`` in the clone, writing the JSON here
  (``--out``); ``--keep`` leaves the clone in place.

The JSON (``benchmarks/results/demo.json`` by default, ``--out`` for another path) holds: the
timings per phase in seconds; per target the trial counts by state (and how many PRUNED trials the
scheduler stopped early or the proxy kept from running), the feasible count and the best feasible
trial (architecture summary, parameters, quality and, in weights mode, its held-out KL to the
parent, which is ``-ln(quality)`` there); the machine (cores, CPU model, memory); the code version
(``git describe --always --dirty``, or the package version outside a git checkout). A ``run`` also
records when things happened, in seconds from the start of ``study run``: ``first_trial_s``, when the
first trial of the run completed (the first-trial latency), and per target ``prepared_s`` (when its
seeds and proxy points were in its study, its trials could start: ``study run`` prepares targets
while the earlier ones' trials run), ``preparation_s`` (how long that took) and ``first_trial_s``.
``benchmarks/render.py`` renders ``docs/results/demo.md`` and the README's demo line from it.

The study is read through the package's public study-reading API
(:func:`autocompress_opt.search.study.studyio.load_group`), so the recorded trials are the ones
``autocompress study show`` prints.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "demo.json"


# ------------------------------------------------------------------------------ where and what
def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (Linux), else what :mod:`platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> float | None:
    """Physical memory in GiB (``sysconf``), None where the platform does not say."""
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_gib": memory_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def code_version(root: Path = ROOT) -> str:
    """``git describe --always --dirty`` of ``root``; outside a git checkout (or without git), the
    installed package's version as ``autocompress-opt <version>``."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=root, capture_output=True, text=True, check=True
        )
        if done.stdout.strip():
            return done.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    from importlib import metadata

    try:
        return f"autocompress-opt {metadata.version('autocompress-opt')}"
    except metadata.PackageNotFoundError:
        return "unknown"


# ------------------------------------------------------------------------------- the study
def target_summary(view: Any) -> dict[str, Any]:
    """One target's study (a :class:`~autocompress_opt.search.study.studyio.StudyView`): trial counts
    and its best feasible trial."""
    records = view.records
    states = Counter(r.state for r in records)
    summary: dict[str, Any] = {
        "study": view.name,
        "hardware": view.target.get("hardware"),
        "workload": view.target.get("workload"),
        "trials": dict(sorted(states.items())),
        "stopped_early": sum(1 for r in records if r.stopped_early),
        "proxy_infeasible": sum(1 for r in records if r.proxy_infeasible),
        "feasible": sum(1 for r in records if r.feasible),
        "quality": view.quality_label,
        "best": None,
    }
    best = view.best_feasible()
    if best is not None:
        arch = best.arch()
        # weights mode: quality = exp(-KL) (trials.QUALITY_LABELS), so the KL is -ln(quality)
        kl = -math.log(best.quality) if best.quality_kind == "exp_neg_kl" and best.quality else None
        summary["best"] = {
            "trial": best.number,
            "architecture": arch.summary() if arch else None,
            "params": arch.num_params if arch else None,
            "quality": best.quality,
            "quality_kind": best.quality_kind,
            "kl_to_parent": kl,
            "baseline": best.baseline,
            "candidate": (best.selection or {}).get("chosen"),
            "spread": width_spread(arch) if arch else None,
        }
    return summary


def width_spread(arch: Any) -> dict[str, Any]:
    """How far an architecture's per-layer widths spread: the kept layers, those with attention and
    with an FFN, the FFN widths' least and largest and how many distinct ones, and the query heads'."""
    layers = [layer for layer in arch.layers if layer.attention or layer.ffn]
    ffn = sorted({layer.ffn_width for layer in layers if layer.ffn})
    heads = sorted({layer.num_heads for layer in layers if layer.attention})
    return {
        "layers": len(layers),
        "attention_layers": sum(1 for layer in layers if layer.attention),
        "ffn_layers": sum(1 for layer in layers if layer.ffn),
        "ffn_min": ffn[0] if ffn else 0,
        "ffn_max": ffn[-1] if ffn else 0,
        "ffn_distinct": len(ffn),
        "heads_distinct": len(heads),
        "ffn_widths": [layer.ffn_width if layer.ffn else 0 for layer in arch.layers],
    }


def record(
    study: str,
    storage: str | None,
    timings_s: Mapping[str, float],
    command: str,
    started: datetime | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The result of a finished demo study group ``study`` (in ``storage``; default
    ``sqlite:///studies/<study>.db``) with the given phase timings; with ``started`` (the local time
    ``study run`` began), when its targets were prepared and its first trials completed (module doc).
    ``extra`` goes into the result as is."""
    from autocompress_opt.search.study.studyio import load_group

    views = load_group(study, storage)
    targets = [target_summary(v) for v in views]
    latency: dict[str, Any] = {}
    if started is not None:
        for view, target in zip(views, targets):
            target.update(target_times(view, storage or default_storage(study), started))
        firsts = [t["first_trial_s"] for t in targets if t["first_trial_s"] is not None]
        latency["first_trial_s"] = min(firsts) if firsts else None
    return {
        "benchmark": "demo",
        "date": f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}",
        "command": command,
        "study": study,
        "code_version": code_version(),
        "machine": machine(),
        "timings_s": {**{k: round(v, 1) for k, v in timings_s.items()}, "total": round(sum(timings_s.values()), 1)},
        **latency,
        **extra,
        "targets": targets,
    }


def default_storage(study: str) -> str:
    from autocompress_opt.search.study.storage import default_storage as default

    return default(study.split(".")[0])


def target_times(view: Any, storage: str, started: datetime) -> dict[str, float | None]:
    """Seconds from ``started`` (local time, as Optuna stores its trials' times) to the end of
    ``view``'s preparation (``prepared_s``; the study's ``prepared`` attribute, which ``study run``
    writes), its length (``preparation_s``) and the first COMPLETE trial of this run (``first_trial_s``);
    None where the run did not do it (a study already done, or prepared by an earlier run)."""
    import optuna

    from autocompress_opt.search.study.storage import make_storage

    out: dict[str, float | None] = {"prepared_s": None, "preparation_s": None, "first_trial_s": None}
    prepared = view.attrs.get("prepared")
    if prepared:
        at = datetime.fromisoformat(prepared["at"])
        if at >= started:
            out["prepared_s"] = round((at - started).total_seconds() + prepared["seconds"], 1)
            out["preparation_s"] = round(prepared["seconds"], 1)
    study = optuna.load_study(study_name=view.name, storage=make_storage(storage))
    done = [
        t.datetime_complete
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.datetime_complete is not None and t.datetime_complete >= started
    ]
    if done:
        out["first_trial_s"] = round((min(done) - started).total_seconds(), 1)
    return out


def write(result: Mapping[str, Any], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return out


# ------------------------------------------------------------------------------- the phases
def autocompress() -> str:
    """The ``autocompress`` script of this interpreter's environment (where ``make`` installed it)."""
    beside = Path(sys.executable).parent / "autocompress"
    return str(beside) if beside.exists() else "autocompress"


def study_of(config: Path) -> tuple[str, str | None]:
    """The study name and storage (None: the default) a study YAML names."""
    import yaml

    data = yaml.safe_load(config.read_text()) or {}
    if not isinstance(data, dict) or not data.get("name"):
        raise SystemExit(f"{config}: a study YAML with a 'name' is needed (got {data!r:.80})")
    return str(data["name"]), data.get("storage")


def clean_clone(config: Path, out: Path, keep: bool) -> int:
    """``clean-clone`` (module doc): the exit code of the first step that failed, else 0."""
    import shutil
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="autocompress-demo-"))
    clone = where / ROOT.name
    try:
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True)
        print(f"demo: clean clone of {code_version()} in {clone}", file=sys.stderr)
        timings, code = run_phases([("install", ["make", "-C", str(clone), "install"])])
        if code != 0:
            return code
        argv = [str(clone / ".venv" / "bin" / "python"), "benchmarks/demo_result.py", "run"]
        argv += ["--config", str(config), "--out", str(out.resolve()), "--timing", f"install={timings['install']}"]
        return subprocess.call([*argv, "--clean-clone"], cwd=clone)
    finally:
        if keep:
            print(f"demo: the clone stays in {clone}", file=sys.stderr)
        else:
            shutil.rmtree(where, ignore_errors=True)


def run_phases(phases: Sequence[tuple[str, list[str]]]) -> tuple[dict[str, float], int]:
    """Run each ``(phase, argv)`` in turn with the terminal's stdout/stderr; the seconds of each
    phase that ran and the exit code of the first that failed (0: all done)."""
    timings: dict[str, float] = {}
    for phase, argv in phases:
        began = time.perf_counter()
        code = subprocess.call(argv)
        timings[phase] = time.perf_counter() - began
        if code != 0:
            print(f"demo: {phase} exited {code}; no result written", file=sys.stderr)
            return timings, code
    return timings, 0


def parse_timing(text: str) -> tuple[str, float]:
    phase, sep, seconds = text.partition("=")
    try:
        value = float(seconds)
    except ValueError:
        value = math.nan
    if not sep or not phase or not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"--timing takes PHASE=SECONDS (e.g. study_run=812.5), got {text!r}")
    return phase, value


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = p.add_subparsers(dest="verb", required=True)
    run = verbs.add_parser("run", help="run the demo's phases, time them, record the study")
    run.add_argument("--config", type=Path, default=Path("studies/smollm2-weights.yaml"), help="study YAML")
    run.add_argument("--plots", default="plots/", help="where `autocompress plot` writes")
    run.add_argument("--out", type=Path, default=DEFAULT_OUT, help="result JSON")
    run.add_argument(
        "--timing", type=parse_timing, action="append", default=[], help="PHASE=SECONDS measured before, repeatable"
    )
    run.add_argument("--clean-clone", action="store_true", help=argparse.SUPPRESS)  # set by clean-clone
    clone = verbs.add_parser("clean-clone", help="clone HEAD to a temporary directory, `make install`, run there")
    clone.add_argument("--config", type=Path, default=Path("studies/smollm2-weights.yaml"), help="study YAML")
    clone.add_argument("--out", type=Path, default=DEFAULT_OUT, help="result JSON (here, not in the clone)")
    clone.add_argument("--keep", action="store_true", help="leave the clone in place")
    rec = verbs.add_parser("record", help="record a finished study group")
    rec.add_argument("--study", required=True, help="study group name (e.g. smollm2-weights)")
    rec.add_argument("--storage", default=None, help="study storage (default sqlite:///studies/NAME.db)")
    rec.add_argument("--timing", type=parse_timing, action="append", default=[], help="PHASE=SECONDS, repeatable")
    rec.add_argument("--out", type=Path, default=DEFAULT_OUT, help="result JSON")
    args = p.parse_args(argv)

    if args.verb == "record":
        result = record(args.study, args.storage, dict(args.timing), command="record --study " + args.study)
        write(result, args.out)
        return 0
    if args.verb == "clean-clone":
        return clean_clone(args.config, args.out, args.keep)
    name, storage = study_of(args.config)
    exe = autocompress()
    where = ["--storage", storage] if storage else []
    started = datetime.now()  # local, as Optuna stores trial times
    timings, code = run_phases(
        [
            ("study_run", [exe, "study", "run", "--config", str(args.config)]),
            ("study_show", [exe, "study", "show", name, *where]),
            ("plot", [exe, "plot", name, "--out", args.plots, *where]),
        ]
    )
    if code != 0:
        return code
    command = f"autocompress study run --config {args.config}"
    extra = {"clean_clone": True} if args.clean_clone else {}
    write(record(name, storage, {**dict(args.timing), **timings}, command, started, **extra), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
