"""``autocompress distill``: recover a pruned checkpoint's quality by logit distillation from its parent."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autocompress_opt.cli._common import add_data_arg, add_verb, check_output_dir, check_positive, print_json
from autocompress_opt.errors import ConfigError


def add_parser(sub: Any) -> None:
    from autocompress_opt.recover.recipe import DistillRecipe

    d = DistillRecipe(steps=1)
    p = add_verb(
        sub,
        "distill",
        "Distil a teacher into a pruned student on a fixed token budget (resumable).",
        """
  autocompress distill --student pruned/smollm2-0.6 --teacher smollm2-135m --steps 200
  autocompress distill --student pruned/smollm2-0.6 --teacher smollm2-135m --steps 2000 --batch-size 8 \\
      --seq-len 256 --lr 2e-4 --warmup-steps 100 --save-every 200 --out distilled/smollm2-0.6 --json
  autocompress distill --student pruned/hetero --teacher smollm2-135m --steps 1000 --device cuda --bf16
  torchrun --nproc_per_node 8 $(which autocompress) distill --student pruned/llama-6b --teacher llama-3.1-8b \\
      --steps 2000 --device cuda --compute-dtype bf16 --fsdp --gradient-checkpointing --kl-chunk 32

Precision: --compute-dtype bf16 computes in bf16 over float32 master weights (the student's
weights, gradients and AdamW moments; the teacher is held in bf16); --pure-bf16 keeps the student
in bf16 too (half the memory, updates under ~0.4% of a weight are lost).
Memory (see 'autocompress memory --mode distill'): --pure-bf16; --gradient-checkpointing recomputes
each layer's activations in backward; --kl-chunk N computes the KL N positions at a time; --fsdp
shards the student and the teacher over the processes torchrun starts (NCCL on GPUs; the student
is built on the meta device and only rank 0 reads the weights and the output directory, so --out
need only be on rank 0's disk); --sharded-checkpoints has each process write its own shards of
every checkpoint but the last (then --out must be on storage every process sees).

The loss is T^2 * KL(teacher || student) of next-token distributions on calibration text (never the
held-out split); the run is exactly steps x batch-size x seq-len tokens, and that recipe is written
into the output's model card. The rows stream from the calibration documents of --data (else the
built-in text, which holds ~70k prose tokens: give long runs your own corpus), tokenised as they
are reached; no token is trained on twice until all of the text has been, after which it is read
again in a new order with a warning, and the passes are reported (data_passes) and recorded.
The output directory is a checkpoint in the student's own format (load_model(out) loads it) and is
rewritten every --save-every steps: running the same command again after an interruption continues
from the last checkpoint (the stream's position included) and ends with the same weights. A
checkpoint made with other settings is refused naming the setting, unless --restart.""",
    )
    p.add_argument(
        "--student", required=True, metavar="DIR", help="student checkpoint directory (e.g. from autocompress prune)"
    )
    p.add_argument(
        "--teacher",
        required=True,
        metavar="MODEL",
        help="teacher: a known name (smollm2-135m), an HF directory or a .gguf; same vocabulary as the student",
    )
    p.add_argument(
        "--steps", type=int, required=True, help="optimizer updates (the token budget is steps x batch x seq-len)"
    )
    p.add_argument("--out", metavar="DIR", help="output checkpoint directory (default: <student>-distilled)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"rows per update (default {d.batch_size})")
    p.add_argument("--seq-len", type=int, default=d.seq_len, help=f"tokens per row (default {d.seq_len})")
    add_data_arg(p, "distillation (its calibration split; the KL before/after on its test split)")
    p.add_argument("--lr", type=float, default=d.lr, help=f"peak AdamW learning rate (default {d.lr:g})")
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=d.warmup_steps,
        help=f"linear warmup updates before the cosine decay (default {d.warmup_steps})",
    )
    p.add_argument(
        "--weight-decay", type=float, default=d.weight_decay, help=f"AdamW weight decay (default {d.weight_decay:g})"
    )
    p.add_argument(
        "--temperature", type=float, default=d.temperature, help=f"softmax temperature (default {d.temperature:g})"
    )
    p.add_argument(
        "--grad-clip", type=float, default=d.grad_clip, help=f"max gradient L2 norm, 0 = off (default {d.grad_clip:g})"
    )
    p.add_argument(
        "--load-balance",
        type=float,
        default=d.load_balance,
        metavar="W",
        help="weight of a MoE student's router load-balance loss (Switch Transformer's; 1 = balanced) added to "
        f"the distillation loss; 0 = none (default {d.load_balance:g})",
    )
    p.add_argument(
        "--seed", type=int, default=d.seed, help=f"data sampling, data order and RNG seed (default {d.seed})"
    )
    p.add_argument(
        "--save-every", type=int, default=d.save_every, help=f"checkpoint every K updates (default {d.save_every})"
    )
    p.add_argument(
        "--eval-rows",
        type=int,
        default=d.n_eval_rows,
        help=f"held-out rows for the KL before/after (default {d.n_eval_rows})",
    )
    p.add_argument(
        "--device",
        default="auto",
        help="where the student trains: auto (default: the first CUDA GPU, else the CPU), cpu, cuda, cuda:N",
    )
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA only); weights stay float32")
    p.add_argument(
        "--compute-dtype",
        default="fp32",
        help="compute dtype: fp32 (default), bf16 (bf16 compute over fp32 master weights), or auto "
        "(bf16 on a CUDA GPU with native bf16, else fp32)",
    )
    p.add_argument(
        "--pure-bf16",
        action="store_true",
        help="with --compute-dtype bf16: keep the student's weights, gradients and AdamW moments in bf16 too",
    )
    p.add_argument(
        "--gradient-checkpointing", action="store_true", help="recompute activations in backward (less memory)"
    )
    p.add_argument(
        "--kl-chunk", type=int, metavar="N", help="compute the KL N positions at a time (default: all at once)"
    )
    p.add_argument(
        "--fsdp", action="store_true", help="shard the student with FSDP2 over the processes torchrun starts"
    )
    p.add_argument(
        "--sharded-checkpoints",
        action="store_true",
        help="with --fsdp: each process writes its own shards of every checkpoint before the last "
        "(torch.distributed.checkpoint) instead of gathering the whole model on rank 0; --out must be on "
        "storage every process sees; resumes under any number of processes",
    )
    p.add_argument("--restart", action="store_true", help="discard a checkpoint in --out and start over")
    p.add_argument(
        "--force", action="store_true", help="replace a non-empty --out that is not a distillation checkpoint"
    )
    p.add_argument("--json", action="store_true", help="print the result record as JSON")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autocompress_opt.recover.distill import DistillRecipe, distill

    recipe = DistillRecipe(
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        temperature=args.temperature,
        seed=args.seed,
        save_every=args.save_every,
        grad_clip=args.grad_clip,
        n_eval_rows=args.eval_rows,
        load_balance=args.load_balance,
    )
    out = args.out if args.out is not None else f"{str(Path(args.student)).rstrip('/')}-distilled"
    _check_before_loading(args, recipe, out)
    check_positive(args, "--kl-chunk")  # positions per KL chunk
    if args.sharded_checkpoints and not args.fsdp:
        raise ConfigError(
            "--sharded-checkpoints splits each checkpoint over the processes of an --fsdp run: add --fsdp "
            "and launch under torchrun, e.g. torchrun --nproc_per_node 8 $(which autocompress) distill ... "
            "--fsdp --sharded-checkpoints"
        )
    rank = _start_processes(args) if args.fsdp else 0
    _warn_unsharded_processes(args)
    result = distill(
        args.student,
        args.teacher,
        out,
        recipe,
        progress=not args.no_progress,
        restart=args.restart,
        force=args.force,
        data=tuple(args.data or ()),
        device=args.device,
        bf16=args.bf16,
        compute_dtype=args.compute_dtype,
        pure_bf16=args.pure_bf16,
        gradient_checkpointing=args.gradient_checkpointing,
        kl_chunk=args.kl_chunk,
        fsdp=args.fsdp,
        sharded_checkpoints=args.sharded_checkpoints,
    )
    if args.fsdp:
        import torch.distributed as dist

        dist.destroy_process_group()
    if rank:
        return 0  # rank 0 reports
    if args.json:
        print_json(result.to_dict())
    else:
        start = result.resumed_from_step
        verb = (
            "already complete"
            if start == recipe.steps
            else f"distilled (resumed from step {start})"
            if start
            else "distilled"
        )
        print(f"{verb}: {result.summary()}")
    return 0


def _start_processes(args: argparse.Namespace) -> int:
    """Join the process group torchrun set up (nccl on CUDA, gloo on the CPU); returns this rank.

    Under NCCL this process's GPU (``LOCAL_RANK``) is made current first and bound to the group, so
    NCCL never guesses a device (every collective then runs on it: recover/fsdp.py). The group's
    timeout covers rank 0 writing a checkpoint of this student while the others wait
    (:func:`~autocompress_opt.recover.fsdp.collective_timeout`)."""
    import os
    from datetime import timedelta

    import torch.distributed as dist

    from autocompress_opt.recover.fsdp import collective_timeout
    from autocompress_opt.recover.preflight import resolve_student_dir

    if "WORLD_SIZE" not in os.environ:
        raise ConfigError(
            "--fsdp runs one process per GPU under torchrun: "
            "torchrun --nproc_per_node N $(which autocompress) distill ... --fsdp"
        )
    import torch

    timeout = timedelta(seconds=collective_timeout(resolve_student_dir(args.student)))
    if args.device != "cpu" and torch.cuda.is_available():
        gpu = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(gpu)
        dist.init_process_group("nccl", device_id=gpu, timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    return dist.get_rank()


def _warn_unsharded_processes(args: argparse.Namespace) -> None:
    """Under torchrun without --fsdp every process trains a whole student of its own, each on its local
    GPU (``LOCAL_RANK``): say so once per process, since they also share --out."""
    import os
    import sys

    world = os.environ.get("WORLD_SIZE", "1")
    if not args.fsdp and world.isdigit() and int(world) > 1:
        print(
            f"distill: {world} processes without --fsdp: each trains its own student on its local GPU "
            "(LOCAL_RANK) and they share --out; add --fsdp to shard one student over them",
            file=sys.stderr,
        )


def _check_before_loading(args: argparse.Namespace, recipe: Any, out: str) -> None:
    """What can be checked without a model, before either loads: --out can receive a checkpoint,
    both models' files are complete (config, safetensors headers, tokenizer), the vocabularies
    match and --seq-len fits both contexts (from the configs or GGUF metadata)."""
    from autocompress_opt.hf.loading import check_model_files, model_limits

    check_output_dir(out)
    student = Path(args.student).expanduser()
    if not student.is_dir():
        raise ConfigError(
            f"--student {args.student!r} is not a directory; pass a checkpoint directory "
            "(e.g. the --out of `autocompress prune`)"
        )
    limits = {"student": model_limits(check_model_files(student))}
    limits["teacher"] = model_limits(check_model_files(args.teacher))
    (vocab_s, _), (vocab_t, _) = limits["student"], limits["teacher"]
    if vocab_s is not None and vocab_t is not None and vocab_s != vocab_t:
        raise ConfigError(
            f"--teacher {args.teacher!r} has a vocabulary of {vocab_t:,} tokens but --student "
            f"{args.student!r} has {vocab_s:,}; both must share one tokenizer"
        )
    for who, (_, context) in limits.items():
        if context is not None and recipe.seq_len > context:
            raise ConfigError(f"--seq-len {recipe.seq_len} exceeds the {who}'s context of {context} positions")
