"""SmolLM2-135M: parent perplexities, importance time, and the Minitron-style baseline at 80/60/40 %.

For each parameter target the practitioner's uniform baseline
(``autocompress_opt.prune.baselines.uniform_baseline``: drop the least important layers up to 25 %,
then the widest FFN in multiples of 64 that fits) is pruned by importance and evaluated on
held-out stdlib code and pydoc prose (never calibration documents): KL to the parent and
perplexities. No distillation recovery (that is the head-to-head issue).

    .venv/bin/python benchmarks/bench_pruning.py [--samples 16] [--seq-len 256]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import write


def main() -> None:
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.prune.baselines import uniform_baseline
    from autocompress_opt.prune.importance import estimate_importance
    from autocompress_opt.prune.plan import plan_pruning
    from autocompress_opt.prune.slicing import materialize
    from autocompress_opt.quality.metrics import evaluate
    from autocompress_opt.quality.textdata import calibration_batches

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--calib-samples", type=int, default=32)
    args = parser.parse_args()

    t0 = time.perf_counter()
    parent = load_model("smollm2-135m")
    load_s = time.perf_counter() - t0
    calib = calibration_batches(parent.tokenizer, n_samples=args.calib_samples, seq_len=args.seq_len, seed=0)
    t0 = time.perf_counter()
    importance = estimate_importance(
        parent.model,
        calib,
        model_id="smollm2-135m",
        data_id=f"bench-{args.calib_samples}x{args.seq_len}",
        seed=0,
        cache_dir=Path(tempfile.mkdtemp()),
        progress=True,
    )
    importance_s = time.perf_counter() - t0
    base = evaluate(
        parent.model, parent.tokenizer, n_samples=args.samples, seq_len=args.seq_len, seed=0, progress=False
    )
    print(
        f"parent: ppl code {base.ppl_code:.2f}, prose {base.ppl_prose:.2f}; "
        f"load {load_s:.1f} s, importance {importance_s:.1f} s"
    )
    rows = []
    for fraction in (0.8, 0.6, 0.4):
        arch = uniform_baseline(parent.architecture, fraction)
        pruned = materialize(parent.model, plan_pruning(parent.architecture, importance, arch))
        q = evaluate(
            pruned,
            parent.tokenizer,
            parent=parent.model,
            n_samples=args.samples,
            seq_len=args.seq_len,
            seed=0,
            progress=False,
        )
        rows.append(
            {
                "params_fraction": fraction,
                "architecture": arch.active().summary(),
                "params": arch.num_params,
                "kl_to_parent": q.kl_to_parent,
                "ppl_code": q.ppl_code,
                "ppl_prose": q.ppl_prose,
            }
        )
        print(
            f"{fraction:.0%}: {arch.active().summary()}: KL {q.kl_to_parent:.3f}, "
            f"ppl code {q.ppl_code:.2f}, prose {q.ppl_prose:.2f}"
        )
    write(
        "pruning_smollm2",
        {
            "command": "python benchmarks/bench_pruning.py",
            "eval": {"samples_per_domain": args.samples, "seq_len": args.seq_len, "data": base.data},
            "calibration": {"samples": args.calib_samples, "seq_len": args.seq_len},
            "parent": {
                "ppl_code": base.ppl_code,
                "ppl_prose": base.ppl_prose,
                "params": parent.architecture.num_params,
            },
            "load_s": round(load_s, 1),
            "importance_s": round(importance_s, 1),
            "baseline": rows,
        },
    )


if __name__ == "__main__":
    main()
