"""Build the real-weights MoE (issue 44): SmolLM2-135M MoEfied into a Mixtral, and measure it.

    python benchmarks/build_moe.py                     # 8 experts of 192 channels, top-4 (defaults)
    python benchmarks/build_moe.py --distill-steps 200  # then recover it from the dense model

Stages (each cached: a rerun skips what is on disk):

1. **Split** (:func:`~autocompress_opt.prune.moefy.moefy`): every FFN of the dense model's 30 layers is split
   into ``--experts`` experts by balanced k-means on its channels' activation profiles over
   ``--calib-rows`` calibration rows, and a router fitted per layer; saved as a ``MixtralForCausalLM``
   checkpoint with the dense model's tokenizer under ``--out`` (default: the per-user cache,
   ``~/.cache/autocompress_opt/moe/...``; never committed).
2. **Recover** (``--distill-steps`` > 0): :func:`~autocompress_opt.recover.distill.distill` from the dense
   model, the toolkit's streaming, resumable distillation (``--out``/recovered).
3. **Measure**: on ``--test-rows`` test-split rows (code and prose, never calibration text): the dense
   model's perplexity, and each MoE's KL to the dense model and perplexity; the router's recall of
   each token's top-``k`` experts by activation mass. Written to ``benchmarks/results/moe_build.json``.
4. **Serve** (``--llamacpp``): llama.cpp converts the MoE (a Mixtral GGUF), ``serve-check`` compares its
   next tokens with transformers', and ``llama-bench`` times it beside the dense model in the same run
   (prompt and generation tokens per second; compare the ratio, not the seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from _util import RESULTS, provenance, write

DEFAULT_OUT = Path.home() / ".cache" / "autocompress_opt" / "moe"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="the dense parent (a Llama / Mistral model)")
    parser.add_argument("--experts", type=int, default=8, help="experts per layer (divides the FFN width)")
    parser.add_argument("--top-k", type=int, default=4, help="experts routed per token")
    parser.add_argument("--calib-rows", type=int, default=32, help="calibration rows for the split and router")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per calibration / test row")
    parser.add_argument("--test-rows", type=int, default=32, help="test-split rows (half code, half prose)")
    parser.add_argument("--distill-steps", type=int, default=0, help="recovery steps from the dense model (0: none)")
    parser.add_argument("--distill-batch", type=int, default=4, help="rows per recovery step")
    parser.add_argument("--distill-lr", type=float, default=1e-4, help="recovery learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split, the data rows and the recovery")
    parser.add_argument("--llamacpp", action="store_true", help="convert, check and time the MoE in llama.cpp")
    parser.add_argument("--out", type=Path, default=None, help=f"checkpoint folder (default: under {DEFAULT_OUT})")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where moe_build.json goes")
    return parser.parse_args(argv)


def checkpoint_dir(args: argparse.Namespace) -> Path:
    """Where the MoE of ``args`` (its parent, experts, top-k, seed) is built: ``--out``, or the cache."""
    return args.out or DEFAULT_OUT / f"{args.model}-moe{args.experts}x{args.top_k}-s{args.seed}"


def add_checkpoint_argument(parser: argparse.ArgumentParser, stage: str, note: str = "") -> None:
    """``--moe``: a benchmark's MoE checkpoint, by default this script's ``stage`` folder (``split`` or
    ``recovered``) of the MoE its defaults build."""
    default = checkpoint_dir(_parse([])) / stage
    parser.add_argument("--moe", type=Path, default=default, help=f"the MoE checkpoint (default: {default}{note})")


def _measure(model: Any, dense_lp: Any, ids: Any, batch: int = 4) -> dict[str, float]:
    """Mean per-position KL(dense ‖ model) and the model's perplexity on ``ids``."""
    import torch

    from autocompress_opt.quality.metrics import log_probs, teacher_kl

    kl = nll = 0.0
    with torch.inference_mode():
        for s in range(0, ids.shape[0], batch):
            rows = ids[s : s + batch]
            lp = log_probs(model(input_ids=rows, use_cache=False).logits)
            kl += float(teacher_kl(lp, dense_lp[s : s + batch]).sum())
            nll -= float(lp[:, :-1].gather(-1, rows[:, 1:, None]).sum())
    positions = ids.shape[0] * ids.shape[1]
    return {"kl_to_dense": kl / positions, "perplexity": math.exp(nll / (ids.shape[0] * (ids.shape[1] - 1)))}


def _llamacpp(dense_ref: str, models: dict[str, Path], out: Path) -> dict[str, Any]:
    """serve-check of each MoE in llama.cpp (f16 GGUF), and llama-bench of it and the dense model, one run."""
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.runtimes.llamacpp import bench, convert_to_gguf
    from autocompress_opt.runtimes.serve_check import serve_check

    result: dict[str, Any] = {}
    dense_dir = out / "dense-hf"  # the dense parent as a safetensors folder, converted like the MoE (f16 both)
    if not (dense_dir / "config.json").is_file():
        dense = load_model(dense_ref)
        dense.model.save_pretrained(dense_dir)
        dense.tokenizer.save_pretrained(dense_dir)
    ggufs = {"dense": convert_to_gguf(dense_dir, out / "dense-f16.gguf", "f16")}
    for name, path in models.items():
        print(f"[llamacpp] serve-check {name}", flush=True)
        check = serve_check(path, "llamacpp", gguf="f16", keep_gguf=out / f"{name}-f16.gguf")
        result[name] = {"serve_check": check.to_dict()}
        ggufs[name] = out / f"{name}-f16.gguf"
    for name, gguf in ggufs.items():
        print(f"[llamacpp] llama-bench {name}", flush=True)
        result.setdefault(name, {})["bench"] = bench(gguf)
    return result


def main(argv: list[str] | None = None) -> int:
    import torch

    from autocompress_opt.data.textdata import calibration_batches, test_batches
    from autocompress_opt.hf.loading import load_model
    from autocompress_opt.prune.moefy import moefy
    from autocompress_opt.quality.metrics import log_probs

    args = _parse(argv)
    torch.manual_seed(args.seed)
    out = checkpoint_dir(args)
    began = time.perf_counter()
    dense = load_model(args.model)
    tokenizer = dense.tokenizer
    record: dict[str, Any] = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    split_dir = out / "split"
    if not (split_dir / "config.json").is_file():
        print(f"[split] {args.model}: {args.experts} experts, top-{args.top_k}, {args.calib_rows} rows", flush=True)
        calib = calibration_batches(tokenizer, n_samples=args.calib_rows, seq_len=args.seq_len, seed=args.seed)
        t = time.perf_counter()
        result = moefy(dense.model, calib, experts=args.experts, top_k=args.top_k, seed=args.seed)
        result.model.save_pretrained(split_dir)
        tokenizer.save_pretrained(split_dir)
        (split_dir / "moefy.json").write_text(
            json.dumps({**result.summary(), "seconds": time.perf_counter() - t}, indent=2), encoding="utf-8"
        )
    record["split"] = json.loads((split_dir / "moefy.json").read_text(encoding="utf-8"))
    models = {"split": split_dir}
    if args.distill_steps:
        from autocompress_opt.recover.distill import DistillRecipe, distill

        recipe = DistillRecipe(
            steps=args.distill_steps,
            batch_size=args.distill_batch,
            seq_len=args.seq_len,
            lr=args.distill_lr,
            seed=args.seed,
            save_every=max(args.distill_steps // 4, 1),
        )
        print(f"[recover] {args.distill_steps} steps x {args.distill_batch} rows from {args.model}", flush=True)
        done = distill(split_dir, args.model, out / "recovered", recipe, progress=True)
        record["recovery"] = {"recipe": recipe.__dict__, "final_kl": done.final_kl, "train_s": done.train_s}
        models["recovered"] = out / "recovered"
    half = args.test_rows // 2
    ids = torch.cat(
        [
            test_batches(tokenizer, n_samples=half, seq_len=args.seq_len, seed=args.seed, domain=domain)
            for domain in ("code", "prose")
        ]
    )
    with torch.inference_mode():
        dense_lp = torch.cat([log_probs(dense.model(input_ids=ids[s : s + 4]).logits) for s in range(0, len(ids), 4)])
    record["dense"] = _measure(dense.model, dense_lp, ids)
    record["dense"]["num_params"] = sum(p.numel() for p in dense.model.parameters())
    for name, path in models.items():
        print(f"[measure] {name}", flush=True)
        moe = load_model(path).model
        record[name] = {**record.get(name, {}), **_measure(moe, dense_lp, ids)}
        active = moe.config.num_experts_per_tok / moe.config.num_local_experts
        expert = sum(p.numel() for n, p in moe.named_parameters() if ".experts." in n)
        record[name]["num_params"] = sum(p.numel() for p in moe.parameters())
        record[name]["active_params"] = int(record[name]["num_params"] - expert * (1 - active))
    if args.llamacpp:
        record["llamacpp"] = _llamacpp(args.model, models, out)
    record["checkpoints"] = {name: str(path) for name, path in models.items()}
    record["seconds"] = time.perf_counter() - began
    record["provenance"] = provenance(seed=args.seed)
    path = write("moe_build", record, args.results)
    print(json.dumps({k: record[k] for k in ("dense", *models)}, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
