"""How much each MoE axis hurts on a real-weights MoE (issue 44 item 3, the measurements a plan-mode
quality estimate would be fitted on).

The recovered real-weights MoE (``benchmarks/build_moe.py --distill-steps 200``: SmolLM2-135M, 8
experts of 192 channels, top-4) is cut along one axis at a time and along several, with the weights
path a study's expert trial uses (importance on calibration rows, :func:`~autocompress_opt.prune.experts.expert_masks`,
:func:`~autocompress_opt.prune.experts.slice_experts`): experts kept, experts per token, expert width.
Each child's KL to the MoE parent is measured on test-split rows (half code, half prose, documents no
calibration step reads), before any recovery, per row so that two children compare with a paired
95 % bootstrap interval. Reported per child with its total and active parameters, and the published
ordering it can be checked against: on Qwen3-30B-A3B before distillation (ModelOpt's Minitron PR
#467, MMLU, base 0.787) experts 128→96 kept 0.740, expert width 768→512 0.630, i.e. cutting a quarter
of the experts hurt less than cutting a third of each expert's width.

    .venv/bin/python benchmarks/bench_moe_axes.py    # ~3 min on 2 cores once the MoE is built

Writes ``results/moe_axes.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import provenance, write
from bench_moe_llamacpp import POINTS
from build_moe import add_checkpoint_argument

# Pairs compared with a paired interval: each axis cut to about the same active parameters.
PAIRS = (
    ("moe-6x4-w192", "moe-8x4-w128"),  # a quarter of the experts vs a third of each expert's width
    ("moe-8x2-w192", "moe-8x4-w96"),  # half the experts per token vs half the width (same active params)
    ("moe-4x2-w192", "moe-8x2-w96"),
)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_argument(parser, "recovered")
    parser.add_argument("--test-rows", type=int, default=32, help="test-split rows (half code, half prose)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--results", type=Path, default=None)
    return parser.parse_args(argv)


def _row_kl(model: Any, parent_lp: Any, ids: Any, batch: int = 4) -> Any:
    """Mean KL(parent ‖ model) per test row, in nats per token."""
    import torch

    from autocompress_opt.quality.metrics import log_probs, teacher_kl

    rows = []
    with torch.inference_mode():
        for s in range(0, ids.shape[0], batch):
            lp = log_probs(model(input_ids=ids[s : s + batch], use_cache=False).logits)
            rows.append(teacher_kl(lp, parent_lp[s : s + batch]).mean(dim=-1))
    return torch.cat(rows)


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    import torch

    from autocompress_opt.data.textdata import calibration_batches, test_batches
    from autocompress_opt.hf.adapters import moe_adapter
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.prune.experts import expert_masks, slice_experts
    from autocompress_opt.prune.importance import estimate_importance
    from autocompress_opt.quality.metrics import log_probs

    args = _parse(argv)
    if not (args.moe / "config.json").is_file():
        raise SystemExit(f"{args.moe} is not a checkpoint: run python benchmarks/build_moe.py --distill-steps 200")
    began = time.perf_counter()
    torch.manual_seed(0)
    loaded = load_model(str(args.moe), cache=False)
    model, tokenizer = loaded.model, loaded.tokenizer
    calib = calibration_batches(tokenizer, n_samples=16, seq_len=args.seq_len, seed=0)
    importance = estimate_importance(model, calib, adapter=moe_adapter(model), progress=False)
    half = args.test_rows // 2
    ids = torch.cat(
        [test_batches(tokenizer, n_samples=half, seq_len=args.seq_len, seed=0, domain=d) for d in ("code", "prose")]
    )
    with torch.inference_mode():
        parent_lp = torch.cat(
            [log_probs(model(input_ids=ids[s : s + 4], use_cache=False).logits) for s in range(0, len(ids), 4)]
        )
    children: dict[str, dict[str, Any]] = {}
    per_row: dict[str, np.ndarray] = {}
    for name, point in POINTS.items():
        if not point:
            continue  # the parent itself
        child = slice_experts(model, expert_masks(model, importance, point))
        arch = moe_adapter(child).architecture(child)
        per_row[name] = _row_kl(child, parent_lp, ids).numpy()
        children[name] = {
            "point": point,
            "params": arch.num_params,
            "active_params": arch.active_params(),
            "kl_to_moe": round(float(per_row[name].mean()), 4),
        }
        print(f"{name}: KL {children[name]['kl_to_moe']:.4f}  active {arch.active_params() / 1e6:.1f}M", flush=True)
        del child
    rng = np.random.default_rng(0)
    draws = rng.integers(0, len(ids), size=(args.resamples, len(ids)))
    pairs = []
    for a, b in PAIRS:
        diff = per_row[a] - per_row[b]
        boot = diff[draws].mean(axis=1)
        low, high = np.quantile(boot, [0.025, 0.975])
        pairs.append({"a": a, "b": b, "diff": round(float(diff.mean()), 4), "low": round(float(low), 4),
                      "high": round(float(high), 4)})  # fmt: skip
        print(f"{a} - {b}: {diff.mean():+.4f} [{low:+.4f}, {high:+.4f}]")
    record = {
        "command": "python benchmarks/bench_moe_axes.py",
        "moe": str(args.moe),
        "test_rows": len(ids),
        "seq_len": args.seq_len,
        "children": children,
        "pairs": pairs,
        "seconds": round(time.perf_counter() - began, 1),
        "provenance": provenance(seed=0),
    }
    path = write("moe_axes", record, args.results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
