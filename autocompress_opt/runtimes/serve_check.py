"""Does a real serving engine compute what transformers computes for an export?

:func:`serve_check` loads an export (a plain family checkpoint, or a heterogeneous one converted to
the engines' DeciLM form), runs a fixed set of token sequences through transformers (float32, the
reference) and through the engine, and compares each position's next-token log-probabilities:
``top1_agreement`` (the engine's most likely token is the reference's) and
``max_abs_logprob_diff`` (over each position's engine top-``k`` tokens: ``|log p_engine - log p_ref|``).

Sequences: :data:`PROMPTS` tokenised with the export's tokenizer, each cut to ``length`` tokens
(``positions / length`` of them, cycling); without a tokenizer, seeded random token ids. The same ids
go to both sides, so tokenisation plays no part in the comparison.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.block_configs import architecture_from_block_configs
from autocompress_opt.errors import ConfigError
from autocompress_opt.prune.loadability import loadable_problems

__all__ = ["GGUF_TYPES", "PROMPTS", "ServeCheck", "check_sequences", "compare", "serve_check"]

# What --gguf accepts: the converter's own output types and llama-quantize's.
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "iq4_xs")
PROMPTS = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based ink and a wooden screw press into a system that could produce books "
    "quickly and cheaply. Within fifty years presses were working in more than two hundred European cities.",
    "To bake a simple loaf of bread, mix flour, water, salt and yeast into a dough, knead it for about ten "
    "minutes until it is smooth and elastic, let it rise in a warm place for an hour, shape it, let it rise "
    "again and bake it in a hot oven until the crust is golden brown and the loaf sounds hollow.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "for i in range(10):\n    print(i, fibonacci(i))\n# The loop prints the first ten Fibonacci numbers.",
    "Photosynthesis converts light energy into chemical energy. In the chloroplasts of plant cells, "
    "chlorophyll absorbs sunlight, water is split into oxygen and hydrogen, and carbon dioxide from the "
    "air is fixed into sugars through the Calvin cycle, which the plant uses to grow.",
)


@dataclass(frozen=True)
class ServeCheck:
    """The result of one engine check."""

    engine: str
    model: str
    fmt: str  # what the engine ran: "hf-float32", "gguf-f16", ...
    positions: int
    top1_agreement: float  # fraction of positions whose engine top-1 is the reference's
    max_abs_logprob_diff: float  # over each position's engine top-k tokens
    mean_abs_logprob_diff: float
    top_k: int
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        return (
            f"{self.engine} ({self.fmt}): top-1 agreement {self.top1_agreement:.2%} on {self.positions} positions, "
            f"max |Δ log p| {self.max_abs_logprob_diff:.4g} (mean {self.mean_abs_logprob_diff:.3g}) over each "
            f"position's top-{self.top_k}"
        )


def check_sequences(tokenizer: Any, vocab_size: int, positions: int = 256, length: int = 64) -> list[list[int]]:
    """The fixed token sequences: ``positions / length`` sequences of ``length`` tokens (see module)."""
    if positions < 1 or length < 2:
        raise ConfigError(f"positions ({positions}) must be >= 1 and length ({length}) >= 2")
    count = -(-positions // length)
    sizes = [length] * (positions // length) + ([positions % length] if positions % length else [])
    out: list[list[int]] = []
    if tokenizer is not None:
        for i, size in enumerate(sizes[:count]):
            ids = list(tokenizer(PROMPTS[i % len(PROMPTS)] * 4, add_special_tokens=False)["input_ids"])
            out.append([int(t) % vocab_size for t in ids[:size]])
        return out
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab_size, size).tolist() for size in sizes]


def _tokenizer(model_dir: Path) -> Any:
    """The export's tokenizer as ``text -> {"input_ids": [...]}``, or None. A ``tokenizer.json`` is
    read with ``tokenizers`` directly: a DeciLM export's ``auto_map`` would make transformers' Auto
    classes ask whether to run its configuration code."""
    if (model_dir / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        return lambda text, add_special_tokens=False: {
            "input_ids": backend.encode(text, add_special_tokens=add_special_tokens).ids
        }
    if (model_dir / "tokenizer.model").is_file():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    return None


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare(
    reference: Sequence[np.ndarray], engine: Sequence[Sequence[dict[int, float]]]
) -> tuple[float, float, float, int]:
    """(top-1 agreement, max and mean |Δ log p| over the engine's tokens, positions) of reference
    log-probabilities (one (len, vocab) array per sequence) against the engine's ``{id: log p}`` rows."""
    agree, diffs, n = 0, [], 0
    for ref, rows in zip(reference, engine):
        if len(rows) != len(ref):
            raise ValueError(f"engine gave {len(rows)} positions for a {len(ref)}-position sequence")
        for t, row in enumerate(rows):
            ids = np.fromiter(row.keys(), dtype=np.int64)
            lps = np.fromiter(row.values(), dtype=np.float64)
            agree += int(ids[np.argmax(lps)] == int(np.argmax(ref[t])))
            diffs.append(np.abs(lps - ref[t][ids]))
            n += 1
    all_diffs = np.concatenate(diffs) if diffs else np.zeros(1)
    return agree / max(n, 1), float(all_diffs.max()), float(all_diffs.mean()), n


def _top_rows(logprobs: np.ndarray, k: int) -> list[dict[int, float]]:
    """An engine's full log-probabilities as ``{id: log p}`` rows of its top ``k`` tokens."""
    top = np.argpartition(-logprobs, k - 1, axis=-1)[:, :k]
    return [{int(i): float(row[i]) for i in ids} for row, ids in zip(logprobs, top)]


def _reference(model_dir: Path, sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
    import torch

    from autocompress_opt.prune.export import load_exported

    model = load_exported(model_dir, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for ids in sequences:
            logits = model(torch.tensor([list(ids)])).logits[0]
            out.append(_log_softmax(logits.numpy()))
    return out


def _architecture(config: dict[str, Any]) -> Architecture:
    """The architecture of an export's ``config.json`` (plain, package heterogeneous, DeciLM, or
    Nemotron-H's Puzzle form, which its family's reader takes per layer)."""
    if config.get("block_configs") is not None and config.get("model_type") != "nemotron_h_puzzle":
        return architecture_from_block_configs(config)
    return Architecture.from_hf_config(config)


def _engine_dir(model_dir: Path, tmp: Path, decilm_out: Path | None) -> Path:
    """The directory the engines read: a plain checkpoint as it is, a package heterogeneous export
    in DeciLM form (written to ``decilm_out`` when given)."""
    from autocompress_opt.prune.export import to_decilm

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") != "autocompress_decilm":
        return model_dir
    return to_decilm(model_dir, decilm_out or tmp / "decilm", force=decilm_out is not None)


def serve_check(
    model_dir: str | Path,
    engine: str,
    *,
    gguf: str = "f16",
    positions: int = 256,
    length: int = 64,
    top_k: int = 20,
    decilm_out: str | Path | None = None,
    keep_gguf: str | Path | None = None,
    vllm_eager: bool = False,
) -> ServeCheck:
    """Run the export ``model_dir`` in ``engine`` (``"vllm"`` or ``"llamacpp"``) and compare it with
    transformers on :func:`check_sequences` (see the module docstring).

    llama.cpp runs the GGUF of type ``gguf`` (:data:`GGUF_TYPES`: the converter's own, or quantised
    from f32 with ``llama-quantize``); ``keep_gguf`` keeps it there. vLLM runs float32, compiled as
    vLLM does by default, or with ``enforce_eager`` when ``vllm_eager`` (a faster load, no compilation).
    Raises :class:`~autocompress_opt.runtimes.install.EngineMissing` when the engine is not installed,
    :class:`ConfigError` for an export no engine can read.
    """
    from autocompress_opt.runtimes import install

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"{str(model_dir)!r} is not a checkpoint directory (no config.json)")
    if engine not in install.ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; one of {', '.join(install.ENGINES)}")
    if gguf not in GGUF_TYPES:
        raise ConfigError(f"unknown GGUF type {gguf!r}; one of {', '.join(GGUF_TYPES)}")
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    problems = loadable_problems(_architecture(config), engine)
    if problems:
        raise ConfigError(f"{engine} cannot load {str(model_dir)!r}: " + "; ".join(problems))
    probe = install.llamacpp if engine == "llamacpp" else install.vllm
    probe()  # EngineMissing before any work
    tokenizer = _tokenizer(model_dir)
    sequences = check_sequences(tokenizer, int(config["vocab_size"]), positions, length)
    reference = _reference(model_dir, sequences)
    details: dict[str, Any] = {"sequences": len(sequences)}
    with tempfile.TemporaryDirectory(prefix="serve-check-") as tmp_name:
        tmp = Path(tmp_name)
        served = _engine_dir(model_dir, tmp, Path(decilm_out) if decilm_out else None)
        details["served_model_type"] = json.loads((served / "config.json").read_text(encoding="utf-8"))["model_type"]
        if engine == "vllm":
            from autocompress_opt.runtimes.vllm import vllm_logprobs

            rows, info = vllm_logprobs(served, sequences, top_k=top_k, enforce_eager=vllm_eager)
            details.update(info)
            fmt = "hf-float32"
        else:
            from autocompress_opt.runtimes.llamacpp import CONVERTER_TYPES, convert_to_gguf, gguf_logits, quantize

            first = gguf if gguf in CONVERTER_TYPES else "f32"
            path = convert_to_gguf(served, tmp / f"model-{first}.gguf", first)
            if gguf != first:
                path = quantize(path, tmp / f"model-{gguf}.gguf", gguf)
            details["gguf_bytes"] = path.stat().st_size
            rows = [_top_rows(_log_softmax(x), top_k) for x in gguf_logits(path, sequences)]
            if keep_gguf:
                Path(keep_gguf).parent.mkdir(parents=True, exist_ok=True)
                Path(keep_gguf).write_bytes(path.read_bytes())
            fmt = f"gguf-{gguf}"
    agreement, worst, mean, n = compare(reference, rows)
    return ServeCheck(engine, str(model_dir), fmt, n, agreement, worst, mean, top_k, details)
