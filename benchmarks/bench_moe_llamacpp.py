"""Real MoE timings in llama.cpp on this CPU against the cost model (issue 44 item 4).

The real-weights MoE (``benchmarks/build_moe.py``: SmolLM2-135M split into 8 experts of 192
channels, top-4, a Mixtral checkpoint) and children pruned from it in weights mode
(:func:`~autocompress_opt.prune.experts.expert_masks`: fewer experts, fewer experts per token,
narrower experts, alone and together), each exported as a Mixtral, converted to an f16 GGUF and
timed with ``llama-bench`` (prompt tokens/s of a 128-token prefill, tokens/s generating 32), beside
the dense parent as a control, every model timed in ``--passes`` interleaved passes with the fastest
kept. Predicted by this CPU's llama.cpp profile (``cpu-llamacpp.yaml``, fitted to dense SmolLM2
children only) on this machine's measured peaks, with ``routed_passes``:

* ``none``: 0, the MoE traffic term off (the dense terms alone);
* ``gpu_pooled``: the value pooled over the GPU engines' published MoE rows (what the GPU llama.cpp
  profile uses);
* ``fitted``: fitted to every MoE model's timings here (in-sample);
* ``held_out``: fitted to the other MoE models' timings, leaving each model out in turn.

The profile ships the ``fitted`` value (``routed_passes`` in ``cpu-llamacpp.yaml``).
The dense parent's error is the control: a MoE error near it is the dense model's error, not the
MoE terms'. Writes ``results/moe_llamacpp.json``.

    .venv/bin/python benchmarks/bench_moe_llamacpp.py    # ~10 min on 2 cores; needs `make engines ENGINES=llamacpp`
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import provenance, write
from build_moe import add_checkpoint_argument

# Children of the 8-expert, top-4, 192-channel MoE: each axis alone, then together.
POINTS: dict[str, dict[str, int]] = {
    "moe-8x4-w192": {},
    "moe-6x4-w192": {"num_experts": 6},
    "moe-8x2-w192": {"experts_per_token": 2},
    "moe-8x1-w192": {"experts_per_token": 1},
    "moe-8x4-w128": {"expert_width": 128},
    "moe-8x4-w96": {"expert_width": 96},
    "moe-4x2-w192": {"num_experts": 4, "experts_per_token": 2},
    "moe-6x3-w128": {"num_experts": 6, "experts_per_token": 3, "expert_width": 128},
    "moe-8x2-w96": {"experts_per_token": 2, "expert_width": 96},
}
PROMPT_LEN, GEN_LEN = 128, 32


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_argument(parser, "split", "; built when absent")
    parser.add_argument("--repetitions", type=int, default=3, help="llama-bench runs per number (median)")
    parser.add_argument("--passes", type=int, default=2, help="interleaved timing passes, fastest kept")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", type=Path, default=None)
    return parser.parse_args(argv)


def _children(moe_dir: Path, work: Path) -> dict[str, tuple[Path, Any]]:
    """Each point's child of the MoE, exported (HF folder) with its architecture; and the dense parent."""
    from autocompress_opt.data.textdata import calibration_batches
    from autocompress_opt.hf.adapters import moe_adapter
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.prune.experts import expert_masks, slice_experts
    from autocompress_opt.prune.importance import estimate_importance

    loaded = load_model(str(moe_dir), cache=False)
    model, tokenizer = loaded.model, loaded.tokenizer
    calib = calibration_batches(tokenizer, n_samples=16, seq_len=128, seed=0)
    importance = estimate_importance(model, calib, adapter=moe_adapter(model), progress=False)
    out: dict[str, tuple[Path, Any]] = {}
    for name, point in POINTS.items():
        child = slice_experts(model, expert_masks(model, importance, point))
        folder = work / name
        child.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        out[name] = (folder, moe_adapter(child).architecture(child))
        print(f"[export] {name}: {out[name][1].summary()}", flush=True)
    dense = load_model("smollm2-135m", cache=False)
    folder = work / "dense"
    dense.model.save_pretrained(folder)
    dense.tokenizer.save_pretrained(folder)
    out["dense"] = (folder, dense.architecture)
    return out


def _observations(name: str, arch: Any, hw: Any, measured: dict[str, float]) -> list[Any]:
    from autocompress_opt.runtimes.calibration import GGUF_TO_COST_DTYPE
    from autocompress_opt.serving.costmodel import Scenario
    from autocompress_opt.serving.engine_models import get_engine
    from autocompress_opt.serving.fitting import Observation

    dtype = GGUF_TO_COST_DTYPE["f16"]
    prefill = Scenario(dtype=dtype, input_len=PROMPT_LEN, output_len=1, concurrency=1)
    decode = Scenario(dtype=dtype, input_len=1, output_len=GEN_LEN, concurrency=1)
    engine = get_engine("llamacpp")
    return [
        Observation(arch, hw, engine, prefill, "prefill_throughput_tok_s", measured["pp"], label=name),
        Observation(arch, hw, engine, decode, "decode_throughput_tok_s", measured["tg"], label=name),
    ]


def _errors(observations: list[Any], profile: Any) -> list[float]:
    from autocompress_opt.serving.fitting import relative_errors

    return [float(e) for e in relative_errors(observations, profile)]


def _mdape(errors: list[float]) -> float:
    return round(statistics.median(abs(e) for e in errors), 4)


def main(argv: list[str] | None = None) -> int:
    from autocompress_opt.runtimes.llamacpp import bench, convert_to_gguf
    from autocompress_opt.serving.calibration import interleaved_passes, measure_cpu_figures
    from autocompress_opt.serving.fitting import fit_routed_passes
    from autocompress_opt.serving.hardware import get_hardware
    from autocompress_opt.serving.profiles import get_profile

    args = _parse(argv)
    began = time.perf_counter()
    if not (args.moe / "config.json").is_file():
        import build_moe

        print(f"[build] {args.moe} is absent: building it (benchmarks/build_moe.py)", flush=True)
        with tempfile.TemporaryDirectory() as results:
            build_moe.main(["--out", str(args.moe.parent), "--results", results])
    profile = get_profile("llamacpp", "cpu")
    gpu_pooled = get_profile("llamacpp", "h100-sxm").routed_passes
    hw = get_hardware("cpu").with_figures(measure_cpu_figures())
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="moe-llamacpp-") as tmp:
        models = _children(args.moe, Path(tmp))
        ggufs = {}
        for name, (folder, arch) in models.items():
            ggufs[name] = convert_to_gguf(folder, Path(tmp) / f"{name}.gguf", "f16")
            rows[name] = {
                "architecture": arch.summary(),
                "params": arch.num_params,
                "active_params": arch.active_params(),
                "passes": [],
            }
        names = list(models)
        for step, (_, i) in enumerate(interleaved_passes(len(names), args.passes)):
            name = names[i]
            result = bench(
                ggufs[name], prompt_len=PROMPT_LEN, gen_len=GEN_LEN, repetitions=args.repetitions, threads=args.threads
            )
            rows[name]["passes"].append(result)
            print(
                f"[time {step + 1}/{len(names) * args.passes}] {name}: pp {result['pp']:.1f} tg {result['tg']:.2f}",
                flush=True,
            )
    observations: dict[str, list[Any]] = {}
    for name, (_, arch) in models.items():
        best = {k: max(p[k] for p in rows[name]["passes"]) for k in ("pp", "tg")}
        rows[name]["measured"] = best
        observations[name] = _observations(name, arch, hw, best)
    moe_names = [n for n in names if n != "dense"]
    moe_obs = [o for n in moe_names for o in observations[n]]
    fitted = fit_routed_passes(moe_obs, profile)
    variants = {
        "none": replace(profile, routed_passes=0.0),
        "gpu_pooled": replace(profile, routed_passes=gpu_pooled),
        "fitted": fitted,
    }
    for name in names:
        row = rows[name]
        row["error"] = {v: _errors(observations[name], p) for v, p in variants.items()}  # dense: no MoE term
        if name != "dense":
            rest = [o for n in moe_names if n != name for o in observations[n]]
            fold = fit_routed_passes(rest, profile)
            row["held_out_routed_passes"] = round(fold.routed_passes, 4)
            row["error"]["held_out"] = _errors(observations[name], fold)
    summary = {
        v: {
            "moe_mdape": _mdape([e for n in moe_names for e in rows[n]["error"][v]]),
            "moe_decode_mdape": _mdape([rows[n]["error"][v][1] for n in moe_names]),
            "moe_prefill_mdape": _mdape([rows[n]["error"][v][0] for n in moe_names]),
        }
        for v in (*variants, "held_out")
    }
    record = {
        "command": "python benchmarks/bench_moe_llamacpp.py",
        "settings": {
            "prompt_len": PROMPT_LEN,
            "gen_len": GEN_LEN,
            "repetitions": args.repetitions,
            "passes": args.passes,
            "threads": args.threads,
            "gguf": "f16",
        },
        "hardware": hw.to_dict(),
        "routed_passes": {
            "shipped": profile.routed_passes,
            "none": 0.0,
            "gpu_pooled": gpu_pooled,
            "fitted": round(fitted.routed_passes, 4),
        },
        "dense_control": {"errors": rows["dense"]["error"]["none"]},
        "summary": summary,
        "models": rows,
        "seconds": round(time.perf_counter() - began, 1),
        "provenance": provenance(),
    }
    path = write("moe_llamacpp", record, args.results)
    for v, s in summary.items():
        print(
            f"{v:<10} MoE MdAPE {s['moe_mdape']:.1%} (prefill {s['moe_prefill_mdape']:.1%}, "
            f"decode {s['moe_decode_mdape']:.1%})"
        )
    print(f"dense control errors: {record['dense_control']['errors']}; routed_passes {record['routed_passes']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
