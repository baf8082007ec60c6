"""Tiny random Llama exports for the engine tests: uniform and heterogeneous, within DeciLM's rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autocompress_opt.arch.architecture import Architecture, LayerSpec

# hidden 128, 4 query heads of 32 channels (head_dim = hidden / heads, as llama.cpp's deci needs; vLLM's CPU
# attention takes head sizes 32, 64, 80, ...),
# FFN widths multiples of 256 (DeciLM's ffn_mult rounding); vocabulary of the SmolLM2 tokenizer.
HIDDEN, HEADS, HEAD_DIM, VOCAB = 128, 4, 32, 49152


def uniform_arch(layers: int = 3) -> Architecture:
    return Architecture(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        layers=(LayerSpec(True, HEADS, 2, HEAD_DIM, True, 256),) * layers,
        family="llama",
    )


def hetero_arch() -> Architecture:
    """Layer 0 full (2 KV heads, FFN 512), layer 1 dropped, layer 2 attention-free (FFN 256), layer 3
    attention kept with 1 KV head and no FFN (llama.cpp's mishandled case), layer 4 4 KV heads, FFN 768."""
    return Architecture(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        layers=(
            LayerSpec(True, HEADS, 2, HEAD_DIM, True, 512),
            LayerSpec.dropped(),
            LayerSpec(False, 0, 0, 0, True, 256),
            LayerSpec(True, HEADS, 1, HEAD_DIM, False, 0),
            LayerSpec(True, HEADS, 4, HEAD_DIM, True, 768),
        ),
        family="llama",
    )


def random_model(arch: Architecture, seed: int = 0) -> Any:
    """A random-weight model of ``arch``: the plain LlamaForCausalLM when uniform, else the package's class."""
    import torch
    from tiny_families import randomize
    from transformers import LlamaConfig, LlamaForCausalLM

    from autocompress_opt.hf.hetero_model import AutocompressDeciLMConfig, AutocompressDeciLMForCausalLM

    torch.manual_seed(seed)
    settings = dict(max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
    if arch.active().is_uniform:
        layer = arch.layers[0]
        config = LlamaConfig(
            vocab_size=arch.vocab_size,
            hidden_size=arch.hidden_size,
            num_hidden_layers=arch.num_layers,
            num_attention_heads=layer.num_heads,
            num_key_value_heads=layer.num_kv_heads,
            intermediate_size=layer.ffn_width,
            tie_word_embeddings=False,
            **settings,
        )
        return randomize(LlamaForCausalLM(config), seed)
    config = AutocompressDeciLMConfig.from_architecture(arch.active(), **settings)
    return randomize(AutocompressDeciLMForCausalLM(config), seed)


def export(arch: Architecture, out: Path, tokenizer: Any = None, decilm: bool = True, seed: int = 0) -> Path:
    from autocompress_opt.prune.export import export_model

    return export_model(random_model(arch, seed), arch, out, tokenizer=tokenizer, decilm=decilm)
