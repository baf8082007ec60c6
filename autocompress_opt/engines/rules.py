"""What each serving engine can load: engine-legal shapes, as data, and the check that names what is not.

A **uniform** export is a plain family checkpoint; each engine loads the families listed. A
**heterogeneous** export is served in DeciLM form (:func:`~autocompress_opt.prune.export.decilm_problems`
lists what that form cannot express: a Llama-family model, the same query heads in every attention
layer, FFN widths that are multiples of 256). On top of that, per engine (from their sources):

* ``vllm``: ``nemotron_nas.py``, query heads ``num_attention_heads`` in every layer, KV heads
  ``num_attention_heads / n_heads_in_group``, ``head_dim`` from the config; on CPU its attention
  kernel takes head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512 only
  (``CPUAttentionBackend.get_supported_head_sizes``), for uniform and heterogeneous models alike.
  A heterogeneous model's first layer must keep its attention: ``DeciLMDecoderLayer.forward`` calls
  ``post_attention_layernorm(hidden_states, residual)`` with ``residual = None`` in an attention-free
  first layer, which returns one tensor where two are unpacked (run: vLLM 0.32.0 fails at start-up
  with "too many values to unpack (expected 2)").
* ``sglang``: the same DeciLM reader as vLLM.
* ``trtllm``: the PyTorch backend reads DeciLM (and ``replace_with_linear``, which pruning never writes).
* ``llamacpp``: ``deci`` in ``convert_hf_to_gguf.py`` takes ``head_dim = hidden / num_attention_heads``,
  so a model whose head size is not that cannot be written; a layer keeping attention without an
  FFN is mishandled by ``deci.cpp`` and is padded at conversion
  (:func:`~autocompress_opt.engines.llamacpp.llamacpp_ready_copy`), so it is allowed.
* ``transformers``: every supported family, any shape (the package's own heterogeneous class).

Using these rules in the search space (``--serve-as ENGINE``) is not wired yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from autocompress_opt.arch.architecture import SUPPORTED_FAMILIES, Architecture
from autocompress_opt.errors import ConfigError, suggest
from autocompress_opt.prune.export import DECILM_FFN_MULTIPLE, decilm_problems

__all__ = ["ENGINE_RULES", "EngineRules", "loadable_problems"]

_VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@dataclass(frozen=True)
class EngineRules:
    """What one engine loads.

    ``families``: plain (uniform) checkpoints it serves; ``heterogeneous``: whether per-layer shapes
    load at all (through DeciLM); ``ffn_multiple``: the FFN width multiple of a heterogeneous model;
    ``head_sizes``: the head sizes its attention kernels take (None: any);
    ``head_dim_from_hidden``: it derives ``head_dim = hidden / num_attention_heads``;
    ``first_layer_attention``: a heterogeneous model's first layer must keep its attention.
    """

    name: str
    families: tuple[str, ...]
    heterogeneous: bool
    ffn_multiple: int = 1
    head_sizes: tuple[int, ...] | None = None
    head_dim_from_hidden: bool = False
    first_layer_attention: bool = False
    note: str = ""


ENGINE_RULES: dict[str, EngineRules] = {
    rules.name: rules
    for rules in (
        EngineRules(
            "vllm",
            SUPPORTED_FAMILIES,
            True,
            DECILM_FFN_MULTIPLE,
            _VLLM_CPU_HEAD_SIZES,
            first_layer_attention=True,
            note="head sizes are the CPU backend's",
        ),
        EngineRules("sglang", SUPPORTED_FAMILIES, True, DECILM_FFN_MULTIPLE, first_layer_attention=True),
        EngineRules("trtllm", SUPPORTED_FAMILIES, True, DECILM_FFN_MULTIPLE),
        EngineRules("llamacpp", SUPPORTED_FAMILIES, True, DECILM_FFN_MULTIPLE, head_dim_from_hidden=True),
        EngineRules("transformers", SUPPORTED_FAMILIES, True),
    )
}


def loadable_problems(arch: Architecture, engine: str) -> list[str]:
    """Why ``engine`` cannot load an export of ``arch`` (its active layers); empty when it can.

    Raises :class:`ConfigError` for an unknown engine name (with a suggestion).
    """
    if engine not in ENGINE_RULES:
        raise ConfigError(f"unknown engine {engine!r}{suggest(engine, ENGINE_RULES)}; one of {', '.join(ENGINE_RULES)}")
    rules, arch = ENGINE_RULES[engine], arch.active()
    problems = []
    if arch.family not in rules.families:
        problems.append(f"{engine} does not serve the {arch.family!r} family")
    attn = [layer for layer in arch.layers if layer.attention]
    head_dims = sorted({layer.head_dim for layer in attn})
    if rules.head_sizes is not None:
        bad = [d for d in head_dims if d not in rules.head_sizes]
        if bad:
            problems.append(
                f"head size {', '.join(map(str, bad))} is not one {engine}'s attention takes "
                f"({', '.join(map(str, rules.head_sizes))}{'; ' + rules.note if rules.note else ''})"
            )
    if arch.is_uniform or engine == "transformers":
        return problems
    if not rules.heterogeneous:
        return [*problems, f"{engine} loads no per-layer shapes"]
    problems += decilm_problems(arch)
    if rules.first_layer_attention and arch.layers and not arch.layers[0].attention:
        problems.append(f"{engine}'s DeciLM reader needs attention in the first layer")
    if rules.head_dim_from_hidden and attn:
        heads = attn[0].num_heads
        if heads * attn[0].head_dim != arch.hidden_size:
            problems.append(
                f"{engine} takes head_dim = hidden / query heads = {arch.hidden_size}/{heads}, "
                f"but the heads have {attn[0].head_dim} channels"
            )
    return problems
