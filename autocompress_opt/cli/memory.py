"""``autocompress memory``: predicted peak GPU memory, stage by stage, of a weights trial or a distillation."""

from __future__ import annotations

import argparse
from typing import Any

from autocompress_opt.cli._common import add_verb, check_positive, print_json, table


def add_parser(sub: Any) -> None:
    p = add_verb(
        sub,
        "memory",
        "Predict peak GPU memory per stage of a weights trial or a distillation, from the architecture alone.",
        """
  autocompress memory --model llama-3.1-8b --mode weights
  autocompress memory --model llama-3.1-8b --mode weights --seq-len 2048 --checkpointing --teacher-budget-gib 4
  autocompress memory --model llama-3.1-8b --mode distill --gpus 8 --checkpointing --kl-chunk 32
  autocompress memory --model smollm2-135m --mode distill --compute-dtype fp32 --json
  autocompress memory --model llama-3.1-8b --mode distill --student pruned/llama-6b/config.json --gpus 4

No weights are read: the figures are arithmetic over the architecture (see autocompress_opt.hf.memory),
checked in tests against measured peaks of small models. Weights trial: the parent in the compute
dtype on one GPU, importance, teacher targets (full vocabulary, or top-k when they exceed
--teacher-budget-gib; their host memory is printed), the inner search's forward and backward, the
child materialised beside the parent, held-out quality. Distill: teacher and student, gradients and AdamW
moments (FSDP-sharded over --gpus), activations, logits and the KL, and the held-out KL before and after
training; the defaults are distill's own (no checkpointing, the KL over the whole sequence: pass the
flags you give distill, --checkpointing for --gradient-checkpointing). Every figure adds 1 GiB for the
CUDA context and allocator slack; the assumptions are printed with the table.""",
    )
    p.add_argument(
        "--model", required=True, help="parent: known name, HF directory, config.json, .gguf or architecture file"
    )
    p.add_argument("--mode", required=True, choices=["weights", "distill"], help="what runs on the GPU")
    p.add_argument("--gpus", type=int, default=1, help="GPUs that shard a distillation with FSDP (default 1)")
    p.add_argument(
        "--compute-dtype",
        default="bf16",
        help="dtype of the forward and backward passes and the parent/teacher weights: bf16, fp16 or fp32 "
        "(default bf16, the CUDA default)",
    )
    p.add_argument("--batch-size", type=int, help="rows per step (default: 2 for the inner search, 8 for distill)")
    p.add_argument("--seq-len", type=int, help="tokens per row (default: 128 for the inner search, 256 for distill)")
    p.add_argument(
        "--teacher-on-device",
        action="store_true",
        help="weights: hold all the teacher's calibration log-probs on the GPU (default: one step's slice)",
    )
    p.add_argument(
        "--teacher-budget-gib",
        type=float,
        help="weights: GiB the calibration teacher targets may take before they are kept as top-k "
        "(default 2, the trial's teacher_budget_gib)",
    )
    p.add_argument(
        "--student", metavar="MODEL", help="distill: the student's architecture (default: the parent's, an upper bound)"
    )
    p.add_argument(
        "--master-dtype", default="fp32", help="distill: dtype of the student's weights, gradients and AdamW moments"
    )
    p.add_argument(
        "--checkpointing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="activation checkpointing: distill's --gradient-checkpointing and the weights trial's inner "
        "search (inner checkpoint_activations); default off, as in both",
    )
    p.add_argument(
        "--kl-chunk",
        type=int,
        default=0,
        help="distill: positions per KL chunk, as distill's --kl-chunk; 0 = the whole sequence (default, as distill)",
    )
    p.add_argument(
        "--eval-rows", type=int, default=8, help="distill: held-out rows of its KL before and after (default 8)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.hf.memory import DistillShape, WeightsTrialShape, predict_memory

    check_positive(args, "--batch-size", "--seq-len", "--eval-rows")
    check_positive(args, "--kl-chunk", minimum=0)  # 0: the whole sequence at once
    arch = load_architecture(args.model)
    sizes = {k: v for k, v in (("batch_size", args.batch_size), ("seq_len", args.seq_len)) if v is not None}
    if args.mode == "weights":
        search: dict[str, Any] = {f"search_{k.removesuffix('_size')}": v for k, v in sizes.items()}
        if args.teacher_budget_gib is not None:
            search["teacher_budget_gib"] = args.teacher_budget_gib
        search["checkpointing"] = bool(args.checkpointing)
        shape: dict[str, Any] = {"weights": WeightsTrialShape(teacher_on_device=args.teacher_on_device, **search)}
    else:
        student = load_architecture(args.student) if args.student else None
        distill = DistillShape(
            master_dtype=args.master_dtype,
            checkpointing=bool(args.checkpointing),
            kl_chunk=args.kl_chunk or None,
            n_eval_rows=args.eval_rows,
            student=student,
            **sizes,
        )
        shape = {"distill": distill}
    prediction = predict_memory(arch, args.mode, gpus=args.gpus, compute_dtype=args.compute_dtype, **shape)
    if args.json:
        print_json(prediction.to_dict())
        return 0
    per_gpu = " per GPU" if args.gpus > 1 else ""
    print(f"{args.mode} on {arch.name or args.model}: {arch.num_params:,} parameters, {args.compute_dtype}")
    rows = [
        [s.name, f"{s.peak_bytes / 1e9:.2f}", ", ".join(f"{k} {v / 1e9:.2f}" for k, v in s.parts.items())]
        for s in prediction.stages
    ]
    print(table(rows, ["stage", "GB", "live at the stage's peak (GB)"]))
    print(
        f"peak{per_gpu}: {prediction.peak_bytes / 1e9:.1f} GB ({prediction.peak_stage.name}, "
        f"with {prediction.overhead_bytes / 2**30:g} GiB CUDA overhead)"
    )
    for what, nbytes in prediction.host_bytes.items():
        print(f"host memory: {what} {nbytes / 1e9:.2f} GB")
    print("assumes: " + "; ".join(prediction.assumptions))
    return 0
