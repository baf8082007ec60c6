"""Profile a weights study's driver preparing its targets (seeds and proxy), cold then warm, in CPU seconds.

Before a target's trials may start, the study driver prepares it (``search.study.run._prepare_target``):
with :class:`~autocompress_opt.search.study.seeding.SeedScoring` it loads the parent, estimates
its importance on the workload's calibration rows, chooses the depth / Minitron / best-uniform
baselines among candidates scored by KL to the parent (the seeds), ranks the search space with
the plan-mode proxy and builds the target's searcher. This benchmark runs exactly that function,
for the targets of ``studies/smollm2-weights.yaml`` named by ``--targets`` (default: the first
target and the first one with another workload, then one that shares the first one's data), one
after another in one process as the driver does, without Ray Tune running any trial:

* **cold**: a fresh cache folder (the study's ``cache_dir``: importance, seed scores, parents) and a
  fresh token cache (``AUTOCOMPRESS_TOKEN_CACHE``), in a new process;
* **warm**: a new process and a new study storage on the caches the cold run filled (a second
  ``make demo`` on the same machine);
* **warm_again**: the same once more (a third ``make demo``). It differs from **warm** when an entry
  written cold is keyed differently from the one a later process looks for. It did until 1bafac7:
  the cold run loads the GGUF parent and writes its dequantised copy, later runs read the copy, whose
  tokenizer has another ``name_or_path``, which the rows' record (and so the importance and
  seed-score keys) included; the record now names the tokenizer by its fingerprint. The results keep
  the run before that fix under ``unprofiled_before``.

Each run records, per target, the CPU seconds (``time.process_time``, all threads) of each phase,
inclusive and exclusive of the phases nested in it (load parent, build rows and tokenise documents,
importance, the scorer's teacher logits, each candidate scored, each baseline's choice, proxy,
searcher), every candidate scored (its architecture, rows x tokens, CPU seconds, KL, whether the disk
cache answered), the seeds and proxy points chosen, and the top functions by cumulative and own CPU
time (cProfile, clock ``time.process_time``). Torch runs ``--threads`` threads (default 1: CPU
seconds then hardly depend on the machine's load; the real driver prepares its first target with
all of the process's threads and the later ones with one). Run it niced when the machine is shared::

    nice -n 19 .venv/bin/python benchmarks/bench_prepare_profile.py
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from _util import RESULTS, provenance, top_functions, write  # noqa: E402

CONFIG = ROOT / "studies" / "smollm2-weights.yaml"
TARGETS = "rtx5070:in-game,rtx5080:local-coding,h100-sxm:datacenter"
TOP = 20


class Phases:
    """CPU seconds of named calls, inclusive and exclusive of the named calls nested in them."""

    def __init__(self) -> None:
        self.inclusive: dict[str, float] = defaultdict(float)
        self.exclusive: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[float] = []  # per open call: CPU seconds of the named calls nested in it

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.process_time()
            self._stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.process_time() - began
                nested = self._stack.pop()
                self.inclusive[name] += spent
                self.exclusive[name] += spent - nested
                self.calls[name] += 1
                if self._stack:
                    self._stack[-1] += spent

        return timed

    def snapshot(self) -> dict[str, dict[str, float]]:
        return {
            name: {
                "calls": self.calls[name],
                "cpu_s": round(self.inclusive[name], 2),
                "own_cpu_s": round(self.exclusive[name], 2),
            }
            for name in self.inclusive
        }

    def reset(self) -> None:
        self.inclusive.clear()
        self.exclusive.clear()
        self.calls.clear()


def instrument(phases: Phases, candidates: list[dict[str, Any]]) -> None:
    """Wrap the functions preparation calls (by the module attribute each caller looks up at call
    time) so that ``phases`` times them and ``candidates`` lists every candidate score."""
    import autocompress_opt.data.textdata as textdata
    import autocompress_opt.data.tokens as tokens
    import autocompress_opt.data.user as user
    import autocompress_opt.hf.loading as loading
    import autocompress_opt.prune.baselines as baselines
    import autocompress_opt.quality.metrics as metrics
    import autocompress_opt.search.study.proxy as proxy
    import autocompress_opt.search.study.run as run
    import autocompress_opt.search.study.searcher as searcher
    import autocompress_opt.search.study.seeding as seeding
    import autocompress_opt.search.study.trial_context as trial_context

    w = phases.wrap
    trial_context.parent_parts = w("load parent", trial_context.parent_parts)
    loading.load_model = w("load parent: load_model", loading.load_model)
    trial_context.parent_importance = w("importance", trial_context.parent_importance)
    trial_context.estimate_importance = w("importance: estimate", trial_context.estimate_importance)
    trial_context.search_rows = w("search rows", trial_context.search_rows)
    if hasattr(user, "text_batches"):
        user.text_batches = w("rows: text_batches", user.text_batches)
    textdata.text_batches = w("rows: text_batches", textdata.text_batches)
    tokens.encode = w("rows: tokenise (encode)", tokens.encode)
    metrics.cache_teacher_logits = w("scorer: parent logits", metrics.cache_teacher_logits)
    run.seed_study = w("seeds", run.seed_study)
    seeding.baseline_seeds = w("seeds: choose baselines", seeding.baseline_seeds)
    run.make_proxy = w("proxy: build", run.make_proxy)
    proxy.Proxy.rank = w("proxy: rank", proxy.Proxy.rank)
    searcher.StudySearcher.__init__ = w("searcher", searcher.StudySearcher.__init__)

    make_baseline = baselines.make_baseline
    current = [""]  # the baseline whose candidates are being scored

    def timed_baseline(name: str, *args: Any, **kwargs: Any) -> Any:
        current[0] = name
        try:
            result = w(f"seeds: baseline {name}", make_baseline)(name, *args, **kwargs)
        finally:
            current[0] = ""
        chosen = None if result.choice is None else result.choice.architecture.summary()
        candidates.append({"baseline_result": name, "chosen": chosen, "finding": result.finding})
        return result

    baselines.make_baseline = timed_baseline

    feasibility = baselines.target_feasibility

    def timed_feasibility(*args: Any, **kwargs: Any) -> Any:
        return w("seeds: feasibility checks", feasibility(*args, **kwargs))

    baselines.target_feasibility = timed_feasibility

    scorer = baselines.masked_kl_scorer

    def timed_scorer(model: Any, importance: Any, rows: Any, **kwargs: Any) -> Any:
        score = w("scorer: build", scorer)(model, importance, rows, **kwargs)
        seen: set[Any] = set()

        def one(arch: Any) -> float:
            began = time.process_time()
            value = w("candidate scores (forward + KL)", score)(arch)
            candidates.append(
                {
                    "baseline": current[0],
                    "architecture": arch.summary(),
                    "rows": int(rows.shape[0]),
                    "tokens": int(rows.shape[1]),
                    "cpu_s": round(time.process_time() - began, 3),
                    "kl": round(float(value), 5),
                    "repeat": arch in seen,  # answered by the scorer's own memo
                }
            )
            seen.add(arch)
            return value

        return one

    baselines.masked_kl_scorer = timed_scorer

    stored_scores = seeding._stored_scores

    def timed_stored(score: Any, *args: Any) -> Any:
        stored = stored_scores(score, *args)

        def one(arch: Any) -> float:
            before = len(candidates)
            value = w("candidate scores (incl. disk cache)", stored)(arch)
            if len(candidates) == before:  # the disk cache answered: no forward pass
                candidates.append(
                    {
                        "baseline": current[0],
                        "architecture": arch.summary(),
                        "kl": round(float(value), 5),
                        "disk_cache": True,
                    }
                )
            return value

        return one

    seeding._stored_scores = timed_stored


def _folder_sizes(cache: Path) -> dict[str, dict[str, int]]:
    out = {}
    for sub in sorted(p for p in cache.iterdir() if p.is_dir()) if cache.is_dir() else []:
        files = [f for f in sub.rglob("*") if f.is_file()]
        out[sub.name] = {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}
    return out


def prepare_targets(targets: list[str], cache: Path, storage: Path, threads: int, profile: bool) -> dict[str, Any]:
    """One run (this process): open each target's study and prepare it as the driver does."""
    began_cpu = time.process_time()
    import torch

    torch.set_num_threads(threads)
    import ray.tune  # noqa: F401  # the driver has Ray up before it prepares; not preparation's cost

    import autocompress_opt.search.study.run as run
    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.cli.study.config import build_config, merged
    from autocompress_opt.search.study.seeding import SeedScoring

    imports_cpu = time.process_time() - began_cpu
    values = merged(
        argparse.Namespace(
            config=CONFIG, targets=",".join(targets), storage=f"sqlite:///{storage}", cache_dir=str(cache)
        )
    )
    config = build_config(values)
    parent = load_architecture(config.model)
    phases, candidates = Phases(), []
    instrument(phases, candidates)
    scoring, memos = SeedScoring(config), {}
    out: list[dict[str, Any]] = []
    for index, target in enumerate(config.targets):
        phases.reset()
        first = len(candidates)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        opened = run._open_target(config, target, parent, None, False, index, None)
        cpu_open = time.process_time() - cpu0
        profiler = cProfile.Profile(time.process_time)
        cpu1, wall1 = time.process_time(), time.perf_counter()
        if profile:
            profiler.enable()
        run._prepare_target(opened, parent=parent, layer_order=None, scoring=scoring, memos=memos, progress=False)
        profiler.disable()
        cpu2, wall2 = time.process_time(), time.perf_counter()
        opened.coordination.close()
        opened.bar.close()
        stats = pstats.Stats(profiler) if profile else None
        results = [c for c in candidates[first:] if "baseline_result" in c]
        mine = [c for c in candidates[first:] if "baseline_result" not in c]
        scored = [c for c in mine if "cpu_s" in c and not c["repeat"]]
        proxy_points = opened.study.user_attrs.get("proxy_points") or []
        seeds = opened.study.user_attrs.get("baseline_seeds") or {}
        out.append(
            {
                "target": str(target.hardware) + ":" + str(target.workload),
                "data_key": scoring.data_key(target),
                "open_study_cpu_s": round(cpu_open, 2),
                "prepare_cpu_s": round(cpu2 - cpu1, 2),
                "prepare_wall_s": round(wall2 - wall1, 2),
                "open_wall_s": round(wall1 - wall0, 2),
                "phases": phases.snapshot(),
                "candidates": {
                    "asked": len(mine),
                    "forward_passes": len(scored),
                    "disk_cache_hits": sum(1 for c in mine if c.get("disk_cache")),
                    "memo_repeats": sum(1 for c in mine if c.get("repeat")),
                    "rows_x_tokens": sorted({f"{c['rows']}x{c['tokens']}" for c in scored}),
                    "cpu_s_each_mean": round(sum(c["cpu_s"] for c in scored) / len(scored), 3) if scored else None,
                    "by_baseline": {
                        r["baseline_result"]: {
                            "scored": sum(1 for c in mine if c["baseline"] == r["baseline_result"]),
                            "chosen": r["chosen"],
                            "finding": r["finding"],
                        }
                        for r in results
                    },
                    "list": mine,
                },
                "seeds": {
                    name: {k: s[k] for k in ("point", "baseline_point", "skipped") if k in s}
                    for name, s in seeds.items()
                },
                "proxy_points": proxy_points,
                "top_cumulative": top_functions(stats, "cumulative", ROOT, TOP) if stats else None,
                "top_tottime": top_functions(stats, "tottime", ROOT, TOP) if stats else None,
            }
        )
        print(
            f"  {out[-1]['target']}: prepare CPU {out[-1]['prepare_cpu_s']} s (wall {out[-1]['prepare_wall_s']} s), "
            f"{len(scored)} candidates forward-scored",
            flush=True,
        )
    return {"imports_cpu_s": round(imports_cpu, 2), "targets": out, "cache_after": _folder_sizes(cache)}


def _child(args: argparse.Namespace) -> int:
    record = prepare_targets(args.targets.split(","), args.cache, args.storage, args.threads, args.profile)
    args.child_out.write_text(json.dumps(record))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default=TARGETS, help="hardware:workload of the config's targets, in order")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run under cProfile (top functions); --no-profile: phase CPU seconds without its overhead",
    )
    parser.add_argument("--name", default="prepare_profile", help="results/<name>.json")
    # the child (one run in a fresh process)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--storage", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_out:
        return _child(args)
    load_start = os.getloadavg()
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="prepare-profile-") as tmp:
        base = Path(tmp)
        env = {**os.environ, "AUTOCOMPRESS_TOKEN_CACHE": str(base / "tokens")}
        for label in ("cold", "warm", "warm_again"):
            print(f"{label}:", flush=True)
            out = base / f"{label}.json"
            command = [sys.executable, __file__, "--targets", args.targets, "--threads", str(args.threads)]
            command += ["--profile" if args.profile else "--no-profile"]
            command += ["--child-out", str(out), "--cache", str(base / "cache")]
            command += ["--storage", str(base / f"{label}.db")]
            wall = time.perf_counter()
            subprocess.run(command, env=env, check=True)
            runs[label] = {**json.loads(out.read_text()), "process_wall_s": round(time.perf_counter() - wall, 1)}
    # one key per mode ("profiled": under cProfile, "unprofiled": without it); the other mode's is kept
    path = RESULTS / f"{args.name}.json"
    kept = json.loads(path.read_text()) if path.is_file() else {}
    mode = "profiled" if args.profile else "unprofiled"
    runs_by_mode = {k: kept[k] for k in ("profiled", "unprofiled") if k in kept and k != mode}
    runs_by_mode[mode] = {
        "command": " ".join(["python", "benchmarks/bench_prepare_profile.py", *(argv or sys.argv[1:])]),
        "config": str(CONFIG.relative_to(ROOT)),
        "targets": args.targets.split(","),
        "torch_threads": args.threads,
        "clock": "time.process_time (CPU seconds of the whole process, all threads)",
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "provenance": provenance(seed=0),
        **runs,
    }
    write(args.name, runs_by_mode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
