"""``autocompress calibrate``: fit the torch-eager cost profile of this machine to real timings."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autocompress_opt.cli._common import add_verb, check_output_file, check_positive, print_json


def add_parser(sub: Any) -> None:
    p = add_verb(
        sub,
        "calibrate",
        "Time transformers' eager forward over a sweep of synthetic heterogeneous "
        "architectures, fit the torch-eager profile, report held-out error, save the profile.",
        """
  autocompress calibrate --hardware cpu
  autocompress calibrate --hardware cpu --archs 24 --out my-cpu.yaml --json
  autocompress calibrate --hardware h200            # on a GPU host: times on cuda, keeps datasheet figures""",
    )
    p.add_argument("--hardware", default="cpu", help="'cpu' (figures measured here) or a catalog GPU (default cpu)")
    p.add_argument("--archs", type=int, default=48, help="architectures in the sweep (default 48)")
    p.add_argument("--prompt-len", type=int, default=128, help="prefill tokens timed (default 128)")
    p.add_argument("--decode-context", type=int, default=128, help="context length of timed decode steps (default 128)")
    p.add_argument("--batch", type=int, default=1, help="sequences per forward (default 1)")
    p.add_argument("--seed", type=int, default=0, help="sweep and split seed (default 0)")
    p.add_argument("--passes", type=int, default=2, help="timing passes per architecture, fastest kept (default 2)")
    p.add_argument(
        "--device", default=None, help="torch device: cpu, cuda, cuda:N (default: cpu for --hardware cpu, else cuda)"
    )
    p.add_argument(
        "--compute-dtype",
        default="auto",
        help="dtype the sweep's models are built and timed in: auto (default: bf16 on CUDA, fp32 on the CPU), "
        "fp32, bf16, fp16",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="profile YAML to write (default ~/.cache/autocompress_opt/profiles/)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autocompress_opt.serving.calibration import calibrate

    _check_arguments(args)
    result = calibrate(
        args.hardware,
        n_archs=args.archs,
        prompt_len=args.prompt_len,
        decode_context=args.decode_context,
        batch=args.batch,
        seed=args.seed,
        passes=args.passes,
        device=args.device,
        compute_dtype=args.compute_dtype,
        out=args.out,
        progress=not args.json,
    )
    if args.json:
        print_json(
            {
                "hardware": result.hardware.to_dict(),
                "profile": result.profile.to_dict(),
                "path": str(result.path),
                "rows": result.rows,
            }
        )
        return 0
    hw, prof = result.hardware, result.profile
    print(f"{hw.name}: peak {dict(hw.peak_tflops)} TFLOP/s, bandwidth {hw.bandwidth_gb_s:g} GB/s")
    print(
        f"fitted torch-eager profile: mfu {prof.mfu:.3f}, mbu {prof.mbu:.3f}, "
        f"kernel launch {prof.kernel_launch_us:.2f} us, step overhead {prof.step_overhead_ms:.3f} ms"
    )
    print(f"MdAPE train:    prefill {result.train_mdape['prefill']:.1%}, decode {result.train_mdape['decode']:.1%}")
    print(f"MdAPE held-out: prefill {result.heldout_mdape['prefill']:.1%}, decode {result.heldout_mdape['decode']:.1%}")
    print(f"saved {result.path}")
    return 0


def _check_arguments(args: argparse.Namespace) -> None:
    """Everything checked before the timing sweep (which takes minutes): counts, the hardware
    name, the torch device and where the profile goes."""
    from autocompress_opt.serving.profiles import user_profile_dir

    check_positive(args, "--prompt-len", "--decode-context", "--batch", "--passes")
    check_positive(args, "--archs", minimum=2)  # one architecture at least is held out
    check_positive(args, "--seed", minimum=0)
    if args.hardware != "cpu":
        from autocompress_opt.serving.hardware import get_hardware

        get_hardware(args.hardware)
    from autocompress_opt.hf.device import check_compute_dtype, resolve_device

    resolve_device(args.device or ("cpu" if args.hardware == "cpu" else "cuda"))  # CUDA asked for, absent: an error
    check_compute_dtype(args.compute_dtype)
    check_output_file(args.out if args.out is not None else user_profile_dir() / "profile.yaml")
