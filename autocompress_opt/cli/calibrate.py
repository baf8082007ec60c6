"""``autocompress calibrate``: fit a cost profile of this machine to real timings: transformers' eager
forward (``--engine torch-eager``, the default) or a real serving engine (``--engine llamacpp|vllm``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autocompress_opt.cli._common import add_verb, check_output_file, check_positive, print_json
from autocompress_opt.errors import check_fraction, check_int


def add_parser(sub: Any) -> None:
    p = add_verb(
        sub,
        "calibrate",
        "Time pruned architectures in transformers' eager forward (default) or in a real serving engine "
        "(llama.cpp, vLLM), fit that engine's profile for this machine, report held-out error, save the profile.",
        """
  autocompress calibrate --hardware cpu
  autocompress calibrate --hardware cpu --archs 24 --out my-cpu.yaml --json
  autocompress calibrate --hardware h200            # on a GPU host: times on cuda, keeps datasheet figures

real engines (installed by `make engines`; pruned SmolLM2 models with random weights, uniform and
heterogeneous, exported as the engine reads them; half of them held out of the fit):
  autocompress calibrate --engine llamacpp --archs 32                  # llama-bench pp/tg, f16 GGUF
  autocompress calibrate --engine llamacpp --gguf-type q4_k_m --threads 2
  autocompress calibrate --engine vllm --archs 32 --concurrency 1 --concurrency 8
  autocompress calibrate --engine vllm --vllm-python /opt/vllm-cuda/bin/python --hardware h100-sxm
then `autocompress cost --hardware cpu --engine llamacpp ...` uses the fitted profile.

no --data: calibrate times synthetic random-weight architectures on fixed random token ids, and a dense
decoder does the same work whichever tokens it reads; what sets a timing is the shape, which
--prompt-len, --decode-context and --batch (--gen-len, --concurrency for the engines) choose.
Your text matters where quality is measured: --data on prune, distill, eval and study run.""",
    )
    # not in --help (the description says why): a --data given anyway is told why, not "unrecognized"
    p.add_argument("--data", action=_NoData, help=argparse.SUPPRESS)
    p.add_argument(
        "--engine",
        default="torch-eager",
        choices=["torch-eager", "llamacpp", "vllm"],
        help="what is timed: transformers' eager forward (torch-eager, default), or the real llama.cpp or vLLM "
        "(`make engines`)",
    )
    p.add_argument("--hardware", default="cpu", help="'cpu' (figures measured here) or a catalog GPU (default cpu)")
    p.add_argument(
        "--archs", type=int, default=None, help="architectures in the sweep (default 48; 32 with a real --engine)"
    )
    p.add_argument("--prompt-len", type=int, default=128, help="prefill tokens timed (default 128)")
    p.add_argument("--decode-context", type=int, default=128, help="context length of timed decode steps (default 128)")
    p.add_argument("--batch", type=int, default=1, help="sequences per forward (default 1)")
    p.add_argument("--seed", type=int, default=0, help="sweep and split seed (default 0)")
    p.add_argument(
        "--passes",
        type=int,
        default=2,
        help="timing passes over every architecture (alternating order), fastest kept (default 2)",
    )
    p.add_argument(
        "--device", default=None, help="torch device: cpu, cuda, cuda:N (default: cpu for --hardware cpu, else cuda)"
    )
    p.add_argument(
        "--compute-dtype",
        default="auto",
        help="dtype the sweep's models are built and timed in: auto (default: bf16 on CUDA, fp32 on the CPU), "
        "fp32, bf16, fp16",
    )
    engine = p.add_argument_group("real engines (--engine llamacpp|vllm)")
    engine.add_argument(
        "--model", default="smollm2-135m", help="parent the timed models are pruned from (default smollm2-135m)"
    )
    engine.add_argument(
        "--heldout-fraction", type=float, default=0.5, help="share of the models held out of the fit (default 0.5)"
    )
    engine.add_argument("--gen-len", type=int, default=32, help="tokens generated per timed run (default 32)")
    engine.add_argument(
        "--repetitions", type=int, default=3, help="timed runs per model and measurement, median kept (default 3)"
    )
    engine.add_argument(
        "--gguf-type",
        default="f16",
        help="llama.cpp: GGUF type timed (f32, f16, bf16, q8_0, q6_k, q5_k_m, q4_k_m, q4_0, iq4_xs; default f16)",
    )
    engine.add_argument("--threads", type=int, default=None, help="llama.cpp: threads (default: the usable cores)")
    engine.add_argument(
        "--vllm-dtype", default="bfloat16", help="vLLM: --dtype served (bfloat16, float32, float16; default bfloat16)"
    )
    engine.add_argument(
        "--vllm-eager",
        action="store_true",
        help="vLLM: time it with enforce_eager (no compilation; faster to load, not vLLM's default)",
    )
    engine.add_argument(
        "--vllm-python",
        metavar="PATH",
        help="vLLM: a Python that imports vllm, e.g. a CUDA vLLM environment's bin/python "
        "(env AUTOCOMPRESS_VLLM_PYTHON; default: the one `make engines` installs)",
    )
    engine.add_argument(
        "--llamacpp-dir",
        metavar="DIR",
        help="llama.cpp: a built llama.cpp (convert_hf_to_gguf.py, build/bin/llama-*) "
        "(env LLAMACPP_DIR; default: the tools on PATH, else the one `make engines` builds)",
    )
    engine.add_argument(
        "--concurrency",
        type=int,
        action="append",
        default=None,
        help="vLLM: concurrent sequences timed; repeat for several (default 1 and 8)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="profile YAML to write (default ~/.cache/autocompress_opt/profiles/)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(run=run)


class _NoData(argparse.Action):
    """``calibrate --data``: a one-line usage error saying why timings take no text."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        parser.error(
            f"calibrate takes no --data (got {values!r}): it times synthetic random-weight architectures on "
            "fixed random token ids, and a dense decoder does the same work whichever tokens it reads; set the "
            "timed shape with --prompt-len, --decode-context and --batch. --data applies to prune, distill, "
            "eval and study run"
        )


def run(args: argparse.Namespace) -> int:
    if args.engine != "torch-eager":
        return _run_engine(args)
    from autocompress_opt.serving.calibration import calibrate

    _check_arguments(args)
    result = calibrate(
        args.hardware,
        n_archs=args.archs or 48,
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
    check_positive(args, "--prompt-len", "--decode-context", "--batch", "--passes")
    check_positive(args, "--archs", minimum=2)  # one architecture at least is held out
    check_positive(args, "--seed", minimum=0)
    _check_hardware_and_out(args)
    from autocompress_opt.hf.device import check_compute_dtype, resolve_device

    resolve_device(args.device or ("cpu" if args.hardware == "cpu" else "cuda"))  # CUDA asked for, absent: an error
    check_compute_dtype(args.compute_dtype)


def _check_hardware_and_out(args: argparse.Namespace) -> None:
    """The hardware name (unless ``cpu``, measured here) and where the profile goes (default: the
    user profile folder), for every engine."""
    from autocompress_opt.serving.profiles import user_profile_dir

    if args.hardware != "cpu":
        from autocompress_opt.serving.hardware import get_hardware

        get_hardware(args.hardware)
    check_output_file(args.out if args.out is not None else user_profile_dir() / "profile.yaml")


def _run_engine(args: argparse.Namespace) -> int:
    """``--engine llamacpp|vllm``: :func:`~autocompress_opt.runtimes.calibration.calibrate_engine`."""
    from autocompress_opt.runtimes.calibration import calibrate_engine
    from autocompress_opt.runtimes.install import use_engines

    use_engines(args.vllm_python, args.llamacpp_dir)
    check_positive(args, "--prompt-len", "--repetitions", "--passes", "--threads")
    check_positive(args, "--archs", "--gen-len", minimum=2)  # one model held out and one fitted; a decode step
    check_positive(args, "--seed", minimum=0)
    for c in args.concurrency or ():
        check_int(c, "--concurrency")
    check_fraction(args.heldout_fraction, "--heldout-fraction", one=False)
    _check_hardware_and_out(args)  # before the engine is looked for
    result = calibrate_engine(
        args.engine,
        model=args.model,
        hardware=args.hardware,
        n_models=args.archs if args.archs is not None else 32,
        heldout_fraction=args.heldout_fraction,
        seed=args.seed,
        gguf_type=args.gguf_type,
        vllm_dtype=args.vllm_dtype,
        vllm_eager=args.vllm_eager,
        prompt_len=args.prompt_len,
        gen_len=args.gen_len,
        concurrencies=tuple(args.concurrency) if args.concurrency else (1, 8),
        repetitions=args.repetitions,
        passes=args.passes,
        threads=args.threads,
        out=args.out,
        progress=not args.json,
    )
    if args.json:
        print_json(result.to_dict())
        return 0
    hw, prof = result.hardware, result.profile
    print(f"{hw.name}: peak {dict(hw.peak_tflops)} TFLOP/s, bandwidth {hw.bandwidth_gb_s:g} GB/s (measured now)")
    print(
        f"fitted {args.engine} profile: mfu {prof.mfu:.3f}, mbu {prof.mbu:.3f}, "
        f"kernel launch {prof.kernel_launch_us:.2f} us, step overhead {prof.step_overhead_ms:.3f} ms"
    )
    n_held = sum(row["split"] == "heldout" for row in result.rows)
    for name, errors in (
        ("fit", result.train_mdape),
        ("held-out", result.heldout_mdape),
        ("before", result.before_mdape),
    ):
        parts = ", ".join(f"{k} {v:.1%}" for k, v in errors.items() if k != "all")
        print(f"MdAPE {name + ':':<10}{errors['all']:.1%} ({parts})")
    print(f"({n_held} of {len(result.rows)} models held out; 'before': the profile in use until now)")
    print(f"saved {result.path}")
    return 0
