"""What each serving engine can load: engine-legal shapes, as data, and the check that names what is not.

What an engine loads of each family (heterogeneous, uniform only, or nothing) is the family's registry
entry (:attr:`~autocompress_opt.arch.families.Family.serving`). A **uniform** export is a plain family
checkpoint (a family whose config refuses a hidden size that is not a multiple of the query heads,
:attr:`~autocompress_opt.arch.families.Family.heads_divide_hidden`, Llama and Gemma 3, has no plain
checkpoint of such a model: the export is the package's own class, which only ``transformers``
loads). A **heterogeneous** export is served in DeciLM form
(:func:`~autocompress_opt.prune.export.decilm_problems` lists what that form cannot express: a
family that is not Llama-like, different query heads between attention layers, FFN widths that are
not multiples of 256). On top of that, per engine (from their sources):

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
  (:func:`~autocompress_opt.runtimes.llamacpp.llamacpp_ready_copy`), so it is allowed.
* ``transformers``: every supported family, any shape (the package's own heterogeneous class).

The search follows these rules (:class:`ShapeRules`, :func:`shape_rules`): a study's trials are
shapes its target's engine loads (``autocompress study run --serve-as ENGINE`` picks another engine,
``--serve-as any`` lifts the rules). This module is pure data below :mod:`~autocompress_opt.search`;
:mod:`autocompress_opt.prune.loadability` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from autocompress_opt.arch.architecture import Architecture, reference_layer, uniform_child
from autocompress_opt.arch.families import Family, family, family_names
from autocompress_opt.arch.hybrid import PER_LAYER_MOE, is_kind_uniform, is_sparse, per_layer_moe
from autocompress_opt.errors import ConfigError, suggest
from autocompress_opt.prune.export import DECILM_FFN_MULTIPLE, decilm_problems

__all__ = [
    "ENGINE_RULES",
    "SERVE_AS_ANY",
    "SERVE_AS_CHOICES",
    "EngineRules",
    "ShapeRules",
    "check_serve_as",
    "loadable_problems",
    "parent_problems",
    "rules_engine_for",
    "shape_rules",
]

_VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@dataclass(frozen=True)
class EngineRules:
    """What one engine loads (what it loads of each family is the family's entry: :attr:`families`).

    ``heterogeneous``: whether per-layer shapes load at all; ``own_class``: it loads the package's
    own class (any shape of every family; else a heterogeneous export is DeciLM, and a uniform one
    the family's plain checkpoint); ``ffn_multiple``: the FFN width multiple of a heterogeneous model;
    ``head_sizes``: the head sizes its attention kernels take (None: any);
    ``head_dim_from_hidden``: it derives ``head_dim = hidden / num_attention_heads``;
    ``first_layer_attention``: a heterogeneous model's first layer must keep its attention.
    """

    name: str
    heterogeneous: bool
    own_class: bool = False
    ffn_multiple: int = 1
    head_sizes: tuple[int, ...] | None = None
    head_dim_from_hidden: bool = False
    first_layer_attention: bool = False
    note: str = ""

    @property
    def families(self) -> tuple[str, ...]:
        """The registered families it serves at all (uniform or heterogeneous), in registration order."""
        return tuple(name for name in family_names() if family(name).loads(self.name) != "none")


ENGINE_RULES: dict[str, EngineRules] = {
    rules.name: rules
    for rules in (
        EngineRules(
            "vllm",
            True,
            ffn_multiple=DECILM_FFN_MULTIPLE,
            head_sizes=_VLLM_CPU_HEAD_SIZES,
            first_layer_attention=True,
            note="head sizes are the CPU backend's",
        ),
        EngineRules("sglang", True, ffn_multiple=DECILM_FFN_MULTIPLE, first_layer_attention=True),
        EngineRules("trtllm", True, ffn_multiple=DECILM_FFN_MULTIPLE),
        EngineRules("llamacpp", True, ffn_multiple=DECILM_FFN_MULTIPLE, head_dim_from_hidden=True),
        EngineRules("transformers", True, own_class=True),
    )
}


def loadable_problems(arch: Architecture, engine: str) -> list[str]:
    """Why ``engine`` cannot load an export of ``arch`` (its active layers); empty when it can.

    Raises :class:`ConfigError` for an unknown engine name (with a suggestion).
    """
    if engine not in ENGINE_RULES:
        raise ConfigError(f"unknown engine {engine!r}{suggest(engine, ENGINE_RULES)}; one of {', '.join(ENGINE_RULES)}")
    rules, arch = ENGINE_RULES[engine], arch.active()
    fam, problems = family(arch.family), []
    if fam.loads(engine) == "none":
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
    if is_sparse(arch):  # MoE / hybrid: the family's plain config, one size per layer kind, or the Puzzle form
        puzzle, per_layer = PER_LAYER_MOE.get(arch.family, ()), per_layer_moe(arch)
        if per_layer and engine not in puzzle:
            problems.append(
                f"{engine} loads {arch.family} models with one expert width and top-k in every MoE layer; "
                f"the per-layer Puzzle form is read by {', '.join(puzzle)}"
            )
        elif not is_kind_uniform(arch) and not per_layer:
            why = f"MoE layers differing only in expert width and top-k ({', '.join(puzzle)})" if puzzle else "none"
            problems.append(
                f"{engine} loads {arch.family} models with one size per layer kind only (the family's config; "
                f"per-layer forms: {why})"
            )
        if engine == "llamacpp" and arch.family == "nemotron_h":
            problems += _llamacpp_nemotron_h(arch, per_layer)
        return problems
    dense = arch.dense_problem()
    if dense is not None:  # dense layers of an architecture-only family: no export of them exists yet
        return [*problems, f"{dense} are described but not yet exported: issue 30"]
    if rules.own_class:
        return problems if arch.is_uniform else [*problems, *_uniform_only(fam, rules)]
    if arch.is_uniform:
        heads = arch.layers[0].num_heads
        if fam.heads_divide_hidden and heads and arch.hidden_size % heads:
            problems.append(
                f"hidden size {arch.hidden_size} is not a multiple of the {heads} query heads: {arch.family}'s "
                f"config refuses that, so the export is the package's own class, which {engine} does not load"
            )
        return problems
    if not rules.heterogeneous:
        return [*problems, f"{engine} loads no per-layer shapes"]
    problems += _uniform_only(fam, rules) + decilm_problems(arch)
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


def _llamacpp_nemotron_h(arch: Architecture, per_layer: bool) -> list[str]:
    """What llama.cpp's ``nemotron_h`` / ``nemotron_h_moe`` graph cannot hold (``src/models/nemotron-h.cpp``,
    ``conversion/nemotron.py``; each tried in tests/runtimes/test_puzzle_llamacpp.py): biased MLPs or
    Mamba-2 projections (the loader creates no bias tensors), and in the per-layer Puzzle form a dense
    MLP layer (its converter writes feed-forward length 0, which the loader takes for a Mamba-2 layer);
    ``per_layer``: :func:`~autocompress_opt.arch.hybrid.per_layer_moe` of ``arch``."""
    out = []
    if arch.mlp_bias or any(layer.mamba is not None and layer.mamba.proj_bias for layer in arch.layers):
        out.append("llama.cpp's Nemotron-H has no bias tensors (MLP or Mamba-2 projections)")
    if per_layer and any(layer.ffn and layer.moe is None for layer in arch.layers):
        out.append("llama.cpp's Nemotron-H Puzzle reader takes a dense MLP layer for a Mamba-2 one")
    return out


def _uniform_only(fam: Family, rules: EngineRules) -> list[str]:
    """Why the engine loads no per-layer shapes of ``fam`` by the family's entry (``serving``) - unless
    it reads them as DeciLM and :func:`decilm_problems` already refuses a family that is not Llama-like."""
    if fam.loads(rules.name) == "uniform" and (rules.own_class or fam.decilm):
        return [f"{rules.name} loads {fam.name} models of one shape only (the family's serving rule)"]
    return []


# ------------------------------------------------------------------ the search's view
SERVE_AS_ANY = "any"  # no engine's rules: the unrestricted space (the package's own class serves every shape)
SERVE_AS_CHOICES: tuple[str, ...] = (*ENGINE_RULES, SERVE_AS_ANY)
# cost-model engine (serving.engines) -> the engine whose rules it loads by; absent: no rules
_COST_ENGINE_RULES = {"vllm": "vllm", "trtllm": "trtllm", "llamacpp": "llamacpp", "torch-eager": "transformers"}


def check_serve_as(value: str, what: str = "serve_as") -> str:
    """``value`` when it names an engine of :data:`ENGINE_RULES` or is ``any``; else a
    :class:`ConfigError` naming it and the valid values (with a suggestion)."""
    if value not in SERVE_AS_CHOICES:
        raise ConfigError(
            f"{what} {value!r} is not an engine{suggest(str(value), SERVE_AS_CHOICES)}; "
            f"valid: {', '.join(SERVE_AS_CHOICES)} (any: no engine's rules)"
        )
    return value


def rules_engine_for(cost_engine: str) -> str:
    """The rules a target served by ``cost_engine`` (a :mod:`~autocompress_opt.serving.engine_models` name)
    searches under: the engine of the same name, ``transformers`` for ``torch-eager``, ``any`` for
    an engine without rules (e.g. a plugin's)."""
    return _COST_ENGINE_RULES.get(cost_engine, SERVE_AS_ANY)


def _uniform_form(parent: Architecture) -> Architecture:
    """The parent as a uniform model of its reference layer's sizes (every present layer kept); a MoE /
    hybrid parent as itself (its uniform child at its own sizes is itself where its kinds are alike)."""
    if is_sparse(parent):
        return parent
    ref = reference_layer(parent)
    return uniform_child(
        parent,
        kept_layers=[i for i, layer in enumerate(parent.layers) if not layer.is_noop],
        hidden_size=parent.hidden_size,
        num_kv_heads=ref.num_kv_heads,
        q_per_kv=ref.num_heads // ref.num_kv_heads,
        ffn_width=ref.ffn_width,
    )


def parent_problems(parent: Architecture, engine: str) -> list[str]:
    """What no pruned model of ``parent`` can fix for ``engine`` (its family, its head size: pruning
    keeps both): :func:`loadable_problems` of the parent's uniform form. Empty for ``any``."""
    if engine == SERVE_AS_ANY:
        return []
    check_serve_as(engine)
    key = f"parent_problems:{engine}"  # asked once per sampled point by the proxy: kept on the parent
    if key not in parent._cache:
        parent._cache[key] = tuple(loadable_problems(_uniform_form(parent), engine))
    return list(parent._cache[key])


@dataclass(frozen=True)
class ShapeRules:
    """What the inner search may produce for one engine, parent and trial (:func:`shape_rules`).

    ``heterogeneous``: per-layer shapes may be searched (else the result is the uniform model of
    the trial's global choices; ``why_uniform`` says why); ``ffn_multiple``: every kept FFN width is
    a multiple of it; ``query_heads``: every attention layer keeps exactly this many query heads
    (None: any per layer); ``first_layer_attention``: the first kept layer keeps its attention.
    """

    engine: str
    heterogeneous: bool = True
    ffn_multiple: int = 1
    query_heads: int | None = None
    first_layer_attention: bool = False
    why_uniform: str = ""

    def ffn_total(self, num_layers: int, ffn_width: int) -> int:
        """The most FFN channels, summed over the layers, that a shape under these rules keeps within a
        mean FFN width of ``ffn_width`` over ``num_layers`` layers (a trial's budget,
        :class:`~autocompress_opt.search.inner.budget.Budget`).

        The uniform model keeps ``ffn_width`` in every layer: a plain checkpoint loads any width, so
        every value of a search space's FFN axis is realised exactly. A per-layer shape mixes widths
        in multiples of :attr:`ffn_multiple` (256 for the DeciLM readers), so it meets the mean up to
        the total ``num_layers · ffn_width`` rounded down to that multiple: less than
        ``ffn_multiple / num_layers`` channels per layer short (SmolLM2, 30 layers at 1088: 32512 of
        32640 channels, a mean of 1083.7). Without per-layer shapes (:attr:`heterogeneous` False) it
        is the uniform model's total."""
        total = num_layers * ffn_width
        return total // self.ffn_multiple * self.ffn_multiple if self.heterogeneous else total

    def to_dict(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "heterogeneous": self.heterogeneous,
            "ffn_multiple": self.ffn_multiple,
            "query_heads": self.query_heads,
            "first_layer_attention": self.first_layer_attention,
            "why_uniform": self.why_uniform,
        }


def shape_rules(engine: str, parent: Architecture, *, hidden_size: int, query_heads: int) -> ShapeRules | None:
    """The per-layer rules of ``engine`` for a trial of ``parent`` at ``hidden_size`` with
    ``query_heads`` (the global choices ``num_kv_heads · q_per_kv``); None for ``any`` and for
    ``transformers`` (any shape loads) unless the parent's family entry says it loads that family
    uniform only.

    Per-layer shapes are DeciLM (:func:`~autocompress_opt.prune.export.decilm_problems`): they are
    off (uniform only) for an engine that loads none, a parent DeciLM cannot express (not
    Llama-like, biases, QK-norm, sliding windows), a parent FFN narrower than the width multiple,
    and in llama.cpp a point whose ``query_heads · head_dim`` is not ``hidden_size``.
    """
    check_serve_as(engine)
    if engine == SERVE_AS_ANY:
        return None
    rules, fam = ENGINE_RULES[engine], family(parent.family)
    if rules.own_class:  # the package's own class: any shape, where the family's entry allows per-layer ones
        why = _uniform_only(fam, rules)
        return ShapeRules(engine, heterogeneous=False, query_heads=query_heads, why_uniform=why[0]) if why else None
    ref = reference_layer(parent)
    why = _uniform_only(fam, rules)
    if not rules.heterogeneous:
        why.append(f"{engine} loads no per-layer shapes")
    else:
        probe = uniform_child(
            parent,
            kept_layers=[i for i, layer in enumerate(parent.layers) if not layer.is_noop],
            hidden_size=hidden_size,
            num_kv_heads=1,
            q_per_kv=max(query_heads, 1),
            ffn_width=rules.ffn_multiple,
        )
        why += decilm_problems(probe)  # the parent's own: family, biases, QK-norm, windows
        if ref.ffn_width < rules.ffn_multiple:
            why.append(f"the parent's FFN width {ref.ffn_width} is below {engine}'s multiple {rules.ffn_multiple}")
        if rules.head_dim_from_hidden and query_heads * ref.head_dim != hidden_size:
            why.append(
                f"{engine} takes head_dim = hidden / query heads, and {hidden_size}/{query_heads} "
                f"is not the heads' {ref.head_dim}"
            )
    return ShapeRules(
        engine,
        heterogeneous=not why,
        ffn_multiple=rules.ffn_multiple,
        query_heads=query_heads,
        first_layer_attention=rules.first_layer_attention,
        why_uniform="; ".join(why),
    )
