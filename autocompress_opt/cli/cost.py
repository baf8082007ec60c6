"""``autocompress cost``: predicted serving cost of one model on one (hardware, engine)."""

from __future__ import annotations

import argparse
import math
from typing import Any

from autocompress_opt.cli._common import (
    add_hardware_file,
    add_verb,
    concurrency,
    engine_options,
    load_hardware_files,
    print_json,
)
from autocompress_opt.errors import ConfigError, check_fraction

ARRIVAL_CHOICES = ("burst", "steady", "poisson")  # serving.costmodel.ARRIVALS, without importing numpy for --help
BACKEND_CHOICES = ("auto", "own", "aic")  # serving.aic.BACKENDS


def add_parser(sub: Any) -> None:
    p = add_verb(
        sub,
        "cost",
        "Predict latency, throughput and memory of a model served on a device.",
        """
  autocompress cost --model smollm2-135m --hardware rtx5070 --engine vllm --dtype bf16 --input-len 512 --output-len 64
  autocompress cost --model llama-3.3-70b --hardware h100-sxm --engine trtllm --dtype fp8 --tp 2 \\
      --input-len 5000 --output-len 500 --json
  autocompress cost --model llama-3.1-8b --hardware b200 --engine vllm --dtype fp8 --concurrency max \\
      --input-len 1000 --output-len 1000 --engine-option memory_fraction=0.8
  autocompress cost --model llama-3.1-8b --hardware h100-sxm --engine vllm --dtype bf16 --concurrency max \
      --arrival burst --requests 1000 --input-len 1000 --output-len 100      # 1000 prompts at once
  autocompress cost --model llama-3.1-8b --hardware h100-sxm --engine vllm --dtype bf16 --concurrency 32 \
      --arrival steady --input-len 1000 --output-len 100                     # 32 always in flight
  autocompress cost --model qwen3-8b --hardware rtx5090 --engine llamacpp --dtype q8_0 --arrival poisson \
      --rate 0.2 --input-len 512 --output-len 128
  autocompress cost --model nemotron-3-super-120b-a12b --hardware b200 --engine vllm --dtype bf16 \
      --input-len 130048 --output-len 1024   # MoE + Mamba-2: active params, experts read per step, SSM state
  autocompress cost --model llama-3.1-8b --hardware h200 --engine trtllm --dtype fp8 --concurrency 16 \
      --input-len 1000 --output-len 1000 --backend aic  # AIConfigurator's measured kernels, layer by layer""",
    )
    p.add_argument("--model", required=True, help="known name, HF directory, config.json, .gguf or architecture file")
    p.add_argument("--hardware", required=True, help="catalog name (see 'autocompress hardware list')")
    p.add_argument("--engine", required=True, help="vllm, trtllm, llamacpp or torch-eager")
    p.add_argument(
        "--dtype",
        required=True,
        help="weight format: fp32, bf16, fp16, fp8, fp4, or a GGUF file type q8_0, q6_k, q5_k_m, q4_k_m, iq4_xs, q4_0",
    )
    p.add_argument(
        "--kv-dtype",
        default=None,
        help="KV-cache format: bf16, fp16, fp8 (vLLM/TensorRT-LLM), q8_0, q4_0 (llama.cpp); default: the engine's",
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--concurrency", type=concurrency, default=1, help="concurrent sequences, or 'max' (default 1)")
    p.add_argument("--input-len", type=int, required=True, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, required=True, help="generated tokens per request")
    p.add_argument(
        "--arrival",
        choices=ARRIVAL_CHOICES,
        default="burst",
        help="burst: --requests prompts arrive at once (default: --concurrency of them, one wave); steady: "
        "--concurrency requests always in flight, chunked prefill interleaved with decode; poisson: --rate "
        "requests/s at random times",
    )
    p.add_argument(
        "--online",
        action="store_true",
        help="requests come through the engine's HTTP front end (vllm serve, trtllm-serve, Triton, NIM): "
        "TTFT and E2E include the profile's fitted per-request front-end latency",
    )
    p.add_argument("--requests", type=int, default=None, help="with --arrival burst: how many arrive at once")
    p.add_argument("--rate", type=float, default=None, help="with --arrival poisson: mean requests per second")
    p.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine setting, e.g. memory_fraction=0.5 (vLLM gpu_memory_utilization), max_seqs=64, "
        "mmq=0 (llama.cpp builds before June 2024: quantised weights dequantised once per prefill step)",
    )
    p.add_argument(
        "--confidence",
        type=float,
        default=0.9,
        help="level of the intervals around TTFT, TPOT, E2E and throughput, from the engine profile's "
        "held-out residuals (default 0.9: 5th to 95th percentile)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: the metric keys, fits, arrival, regime, then <metric>_low/_high and confidence; "
        "for a MoE or Mamba-2 model also 'sparse' (experts touched per decode step, KV and state per sequence)",
    )
    p.add_argument(
        "--backend",
        choices=BACKEND_CHOICES,
        default="auto",
        help="who prices TTFT/TPOT: own (this toolkit's calibrated model), aic (NVIDIA AIConfigurator's measured "
        "kernels summed per layer; needs pip install 'autocompress-opt[aic]'; H100-SXM, H200, B200 with vllm or "
        "trtllm, a static batch), auto (default: aic when installed and it covers the target, else own)",
    )
    add_hardware_file(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.arch.hybrid import is_sparse
    from autocompress_opt.serving.aic import estimate_cost_backend
    from autocompress_opt.serving.costmodel import Scenario, cost_intervals, describe_regime, estimate_cost
    from autocompress_opt.serving.engine_models import get_engine
    from autocompress_opt.serving.hardware import get_hardware
    from autocompress_opt.serving.profiles import get_profile

    load_hardware_files(args)
    arch = load_architecture(args.model)
    hardware = get_hardware(args.hardware)
    engine = get_engine(args.engine).with_options(**engine_options(args.engine_option))
    scenario = Scenario(
        dtype=args.dtype,
        input_len=args.input_len,
        output_len=args.output_len,
        concurrency=args.concurrency,
        tp=args.tp,
        kv_dtype=args.kv_dtype,
        arrival=args.arrival,
        requests=args.requests,
        rate=args.rate,
        online=args.online,
    )
    _check_tp(arch, args.tp)
    _check_context(arch, args.input_len, args.output_len)
    check_fraction(args.confidence, "--confidence", one=False, hint="e.g. 0.9")
    profile = get_profile(engine.name, hardware.name)
    cost = estimate_cost(arch, hardware.name, engine, scenario, profile)
    fits = cost.peak_memory_gib <= hardware.memory_gib
    regime = describe_regime(scenario, cost)
    bounds = {
        k: None if v is None else float(v)
        for k, v in cost_intervals(cost.to_dict(), scenario, profile, args.confidence, is_sparse(arch)).items()
    }
    cost, backend = estimate_cost_backend(args.backend, arch, hardware.name, engine, scenario, cost)
    if backend == "aic":  # the profile's residuals are this toolkit's errors, not AIConfigurator's: no interval
        bounds = dict.fromkeys(bounds)
    sparse = _sparse_report(arch, engine, scenario, cost) if arch.dense_problem() else None
    if args.json:
        values = {**cost.to_dict(), **bounds}
        finite = {k: (v if v is None or math.isfinite(v) else None) for k, v in values.items()}  # null: unbounded
        metrics = {k: finite[k] for k in cost.to_dict()}
        intervals = {k: finite[k] for k in bounds}
        print_json(
            {
                **metrics,
                "fits": fits,
                "arrival": scenario.arrival,
                "regime": regime,
                "backend": backend,
                **intervals,
                "confidence": args.confidence,
                **({"sparse": sparse} if sparse is not None else {}),
            }
        )
        return 0
    load = f"rate={args.rate:g}/s" if args.arrival == "poisson" else f"concurrency={args.concurrency}"
    print(
        f"{arch.summary()}\non {args.hardware} with {engine.name}, {args.dtype}, tp={args.tp}, "
        f"{load}, {args.input_len} in / {args.output_len} out\n{regime}\npriced by: {_BACKEND_WORDS[backend]}"
    )
    level = f"{args.confidence:.0%}"
    for key, value in cost.to_dict().items():
        low, high = bounds.get(f"{key}_low"), bounds.get(f"{key}_high")
        band = f"   [{low:,.3f} .. {high:,.3f}] at {level}" if low is not None and high is not None else ""
        whole = not isinstance(value, float) or key == "active_params"
        print(f"  {key:<26} {int(value):>14,}" if whole else f"  {key:<26} {value:>14,.3f}{band}")
    if sparse is not None:
        _print_sparse(sparse)
    if backend == "aic":
        print("  (no interval: AIConfigurator's held-out errors are not measured here)")
    elif all(v is None for v in bounds.values()):
        print(f"  (no interval: the {engine.name} profile for {hardware.name} holds no held-out residuals)")
    if not fits:
        print(
            f"warning: does not fit: peak memory {cost.peak_memory_gib:,.1f} GiB per GPU exceeds "
            f"{hardware.name}'s {hardware.memory_gib:g} GiB; the figures above are not reachable"
        )
    return 0


_BACKEND_WORDS = {
    "own": "own (this toolkit's calibrated cost model)",
    "aic": "aic (AIConfigurator's measured kernels summed per layer; memory and concurrency: own)",
}


def _decode_batch(scenario: Any, cost: Any) -> int:
    """Sequences decoding together in the scenario: its concurrency (a burst's wave at most), the
    memory limit for ``max``, and at least 1."""
    if scenario.concurrency == "max":
        batch = cost.max_concurrency
    else:
        batch = min(int(scenario.concurrency), scenario.requests or int(scenario.concurrency))
    return max(int(batch), 1)


def _sparse_report(arch: Any, engine: Any, scenario: Any, cost: Any) -> dict[str, Any]:
    """What a MoE / Mamba-2 model adds to the report: per distinct MoE shape (experts, top-k) the
    expected experts a decode step of the scenario's batch reads
    (:func:`~autocompress_opt.serving.costmodel.experts_touched`), and one sequence's KV cache and
    Mamba-2 state at the scenario's reserved length."""
    from autocompress_opt.serving.costmodel import experts_touched
    from autocompress_opt.serving.dtypes import kv_dtype_bytes

    batch = _decode_batch(scenario, cost)
    shapes: dict[tuple[int, int], int] = {}
    for layer in arch.layers:
        if layer.moe is not None:
            key = (layer.moe.num_experts, layer.moe.experts_per_token)
            shapes[key] = shapes.get(key, 0) + 1
    seq_tokens = engine.kv_tokens_per_sequence(scenario.input_len, scenario.output_len)
    state_bytes = arch.state_elements_per_sequence() * kv_dtype_bytes(engine.mamba_state_dtype)
    return {
        "decode_batch": batch,
        "experts_touched_per_step": [
            {"moe_layers": n, "experts": e, "experts_per_token": k, "touched": float(experts_touched(e, k, batch))}
            for (e, k), n in sorted(shapes.items())
        ],
        "sequence_tokens": seq_tokens,
        "kv_gib_per_sequence": cost.kv_bytes_per_token * seq_tokens / 2**30,
        "state_mib_per_sequence": state_bytes / 2**20,
        "mamba_state_dtype": engine.mamba_state_dtype,
    }


def _print_sparse(sparse: dict[str, Any]) -> None:
    batch = sparse["decode_batch"]
    for row in sparse["experts_touched_per_step"]:
        print(
            f"  experts read per decode step at batch {batch}: {row['touched']:,.2f} of {row['experts']} "
            f"(top-{row['experts_per_token']}) in each of {row['moe_layers']} MoE layers"
        )
    print(
        f"  per sequence of {sparse['sequence_tokens']:,} tokens: KV {sparse['kv_gib_per_sequence']:,.3f} GiB, "
        f"Mamba-2 state {sparse['state_mib_per_sequence']:,.1f} MiB ({sparse['mamba_state_dtype']})"
    )


def _check_tp(arch: Any, tp: int) -> None:
    """:class:`ConfigError` unless ``tp`` divides every layer's query and KV heads (vLLM and
    TensorRT-LLM shard heads evenly across the tensor-parallel ranks)."""
    if tp <= 1:
        return
    attention = [layer for layer in arch.layers if layer.attention]
    heads = sorted({layer.num_heads for layer in attention})
    kv_heads = sorted({layer.num_kv_heads for layer in attention})
    bad = [n for n in (*heads, *kv_heads) if n % tp]
    if bad:
        raise ConfigError(
            f"--tp {tp} must divide the query heads ({', '.join(map(str, heads))}) and the KV heads "
            f"({', '.join(map(str, kv_heads))}) of {arch.name or 'the model'}, as vLLM and TensorRT-LLM require"
        )


def _check_context(arch: Any, input_len: int, output_len: int) -> None:
    """:class:`ConfigError` when a request is longer than the model's context (when it is known)."""
    if arch.max_context is not None and input_len + output_len > arch.max_context:
        raise ConfigError(
            f"--input-len {input_len:,} + --output-len {output_len:,} = {input_len + output_len:,} tokens "
            f"exceeds the context of {arch.name or 'the model'} ({arch.max_context:,} tokens)"
        )
