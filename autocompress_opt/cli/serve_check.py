"""``autocompress serve-check``: load an export in a real serving engine and compare its next-token
log-probabilities with transformers."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autocompress_opt.cli._common import add_verb, print_json


def add_parser(sub: Any) -> None:
    p = add_verb(
        sub,
        "serve-check",
        "Load an exported checkpoint in vLLM or llama.cpp (installed by `make engines`), run a fixed set "
        "of token sequences, and compare each position's next-token log-probabilities with transformers: "
        "top-1 agreement and max |Δ log p|. A heterogeneous export is served in DeciLM form.",
        """
  autocompress serve-check out/smollm2-pruned --engine vllm
  autocompress serve-check out/smollm2-pruned --engine vllm --vllm-python /opt/vllm-cuda/bin/python
  autocompress serve-check out/smollm2-pruned --engine llamacpp --gguf q8_0 --json
  autocompress serve-check out/hetero --engine llamacpp --decilm-out out/hetero-decilm --keep-gguf out/hetero.gguf""",
    )
    p.add_argument(
        "model", type=Path, metavar="DIR", help="an export of `autocompress prune` (config.json + safetensors)"
    )
    p.add_argument("--engine", required=True, choices=("vllm", "llamacpp"), help="the serving engine")
    p.add_argument(
        "--gguf",
        default="f16",
        help="llama.cpp: GGUF type (f32, f16, bf16, q8_0 from the converter; q6_k, q5_k_m, q4_k_m, q4_0, "
        "iq4_xs via llama-quantize; default f16)",
    )
    p.add_argument("--positions", type=int, default=256, help="positions compared (default 256)")
    p.add_argument("--length", type=int, default=64, help="tokens per sequence (default 64)")
    p.add_argument("--top-k", type=int, default=20, help="engine tokens compared per position (default 20)")
    p.add_argument("--decilm-out", type=Path, default=None, help="also keep the DeciLM form served (a directory)")
    p.add_argument("--keep-gguf", type=Path, default=None, help="llama.cpp: keep the GGUF served (a file)")
    p.add_argument(
        "--vllm-eager",
        action="store_true",
        help="vLLM: run with enforce_eager (no compilation; faster to load, not vLLM's default)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--vllm-python",
        metavar="PATH",
        help="vLLM: a Python that imports vllm, e.g. a CUDA vLLM environment's bin/python "
        "(env AUTOCOMPRESS_VLLM_PYTHON; default: the one `make engines` installs)",
    )
    p.add_argument(
        "--llamacpp-dir",
        metavar="DIR",
        help="llama.cpp: a built llama.cpp (convert_hf_to_gguf.py, build/bin/llama-*) "
        "(env LLAMACPP_DIR; default: the tools on PATH, else the one `make engines` builds)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autocompress_opt.runtimes.install import use_engines
    from autocompress_opt.runtimes.serve_check import serve_check

    use_engines(args.vllm_python, args.llamacpp_dir)
    result = serve_check(
        args.model,
        args.engine,
        gguf=args.gguf,
        positions=args.positions,
        length=args.length,
        top_k=args.top_k,
        decilm_out=args.decilm_out,
        keep_gguf=args.keep_gguf,
        vllm_eager=args.vllm_eager,
    )
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.line())
    return 0
