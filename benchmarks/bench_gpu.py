"""One SmolLM2-135M weights trial on a CUDA GPU, in bf16 and in fp32: wall time per phase and peak
device memory (the figures the README's GPU section reports).

Per compute dtype, with fresh caches (a temporary folder) and an empty trial cache:

* a **cold** trial: loading the parent onto the GPU, importance, the teacher's log-probs on the
  calibration rows, the held-out rows' teacher logits, then the inner search (the default
  :class:`TrialConfig`, what ``make demo`` runs), materialising the child and its held-out
  quality;
* a **warm** trial of another point (the parent and its caches already in the process, as in a
  study's trial actor after its first trial): search and quality only.

Recorded for each: ``timings_s`` of the trial (``parent_load``, ``parent_importance``,
``parent_teacher``, ``parent_eval_teacher``, ``search``, ``quality``, ``total``),
``torch.cuda.max_memory_allocated()`` over the trial (the allocator's peak; the CUDA context,
a few hundred MB more, is not in it), and the peak ``autocompress memory`` predicts for the same
shape (:func:`autocompress_opt.hf.memory.predict_memory`, which adds 1 GiB for the context).
Writes ``results/gpu_smollm2.json``. Run on a machine with a CUDA build of torch
(``make install-gpu``): ``.venv/bin/python benchmarks/bench_gpu.py`` (not yet run on a GPU; expected to take a few
minutes at most, much of it dequantising the GGUF on the CPU). Without a CUDA GPU it exits at once,
saying so. ``--smoke`` runs the same steps on the CPU with a 2-step inner search and writes nothing
(a check of this script on a machine without a GPU; its seconds mean nothing).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _util import provenance, write

MODEL = "smollm2-135m"
# Two points of the bundled search space (search_spaces/smollm2-135m.yaml): the cold trial's and the warm one's.
POINTS = (
    {"num_layers": 22, "hidden_size": 512, "ffn_width": 1024, "num_kv_heads": 3, "q_per_kv": 3},
    {"num_layers": 20, "hidden_size": 448, "ffn_width": 896, "num_kv_heads": 3, "q_per_kv": 2},
)
TARGET = ("h100-sxm", "datacenter")


def trial(request: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """One trial, timed, with the allocator's peak over it (None on the CPU)."""
    from autocompress_opt.search.study.weights_trial import run_weights_trial

    cuda = device.type == "cuda"
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    began = time.perf_counter()
    result = run_weights_trial(request)
    if cuda:
        torch.cuda.synchronize(device)
    return {
        "wall_s": time.perf_counter() - began,
        "peak_bytes": int(torch.cuda.max_memory_allocated(device)) if cuda else None,
        "timings_s": result["timings_s"],
        "compute": result["compute"],
        "kl_to_parent": result["kl_to_parent"],
        "quality": result["quality"],
        "architecture": result["architecture"],
        "inner_feasible": result["inner"]["feasible"],
        "selection": result["selection"]["chosen"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="check this script on the CPU (tiny budget, no output)")
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        print(
            f"bench_gpu: needs a CUDA GPU, and torch {torch.__version__} sees none (a CPU build of torch, "
            "or no driver). On a GPU machine: `make install-gpu`, then run this again.",
            file=sys.stderr,
        )
        return 1
    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.hf.memory import WeightsTrialShape, predict_memory
    from autocompress_opt.search.study.weights_trial import TrialConfig, clear_trial_cache
    from autocompress_opt.serving.targets import Target

    device = torch.device("cpu") if args.smoke else torch.device("cuda", 0)
    budget: dict[str, Any] = {
        "steps": 2,
        "n_samples": 4,
        "val_samples": 1,
        "seq_len": 32,
        "eval_samples": 2,
        "eval_seq_len": 32,
        "importance_samples": 2,
        "importance_seq_len": 32,
    }
    if not args.smoke:
        budget = {}
    parent = load_architecture(MODEL)  # the GGUF header: no weights read here
    target = Target(*TARGET)
    config = TrialConfig.from_dict(budget)
    shape = WeightsTrialShape(
        search_batch=config.inner.batch_size,
        search_seq_len=config.inner.seq_len,
        n_samples=config.inner.n_samples,
        importance_seq_len=config.importance_seq_len,
        eval_seq_len=config.eval_seq_len,
    )
    runs: dict[str, Any] = {}
    for dtype in ("bf16", "fp32"):
        clear_trial_cache()
        with tempfile.TemporaryDirectory(prefix="bench-gpu-") as cache:
            base = {
                "parent": parent.to_dict(),
                "target": target.to_dict(),
                "layer_order": None,
                "seed": 0,
                "parent_model": MODEL,
                "cache_dir": cache,
                "inner": {**budget, "device": str(device), "compute_dtype": dtype},
            }
            cold = trial({**base, "params": dict(POINTS[0])}, device)
            warm = trial({**base, "params": dict(POINTS[1])}, device)
        clear_trial_cache()
        predicted = predict_memory(parent, "weights", compute_dtype=dtype, weights=shape)
        runs[dtype] = {"cold": cold, "warm": warm, "predicted_peak_bytes": predicted.peak_bytes}
        peak = f"{cold['peak_bytes'] / 2**30:.2f} GiB" if cold["peak_bytes"] is not None else "-"
        print(
            f"{dtype} on {cold['compute']['device']}: cold trial {cold['wall_s']:.1f} s "
            f"(load {cold['timings_s'].get('parent_load', 0):.1f} s, search {cold['timings_s']['search']:.1f} s), "
            f"peak {peak} (predicted {predicted.peak_bytes / 2**30:.2f} GiB with the CUDA context); "
            f"warm trial {warm['wall_s']:.1f} s; KL {cold['kl_to_parent']:.4f} / {warm['kl_to_parent']:.4f}",
            flush=True,
        )
    if args.smoke:
        print("bench_gpu --smoke: the steps ran on the CPU; nothing written")
        return 0
    props = torch.cuda.get_device_properties(device)
    write(
        "gpu_smollm2",
        {
            "model": MODEL,
            "target": list(TARGET),
            "points": list(POINTS),
            "trial_config": config.to_dict(),
            "gpu": {
                "name": props.name,
                "memory_bytes": props.total_memory,
                "capability": f"{props.major}.{props.minor}",
                "cuda": torch.version.cuda,
            },
            "runs": runs,
            **provenance(trial_seed=0),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
