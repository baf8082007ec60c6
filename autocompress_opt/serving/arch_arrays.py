"""A batch of architectures as arrays: the cost model's input (:class:`ArchArrays`).

:func:`~autocompress_opt.serving.costmodel.estimate_batch` takes architectures as numpy arrays
(thousands at once) or torch tensors (differentiable in the widths and keep gates); this module
packs :class:`~autocompress_opt.arch.architecture.Architecture` objects into that form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autocompress_opt.arch.architecture import Architecture, LayerSpec
from autocompress_opt.arch.families import family
from autocompress_opt.arch.moe import MambaSpec
from autocompress_opt.errors import ConfigError

__all__ = ["FULL_WINDOW", "ArchArrays", "Array"]

Array = Any  # numpy.ndarray or torch.Tensor

# The window of a full-attention layer in ArchArrays: larger than any context, yet finite, so that
# min(tokens, window) and the windowed pair count stay plain arithmetic (finite values and gradients)
# in numpy and torch alike.
FULL_WINDOW = float(2**40)


@dataclass(frozen=True)
class ArchArrays:
    """A batch of ``N`` architectures padded to ``L`` layers, as numpy arrays or torch tensors.

    Per-architecture fields have shape ``(N,)``; per-layer fields ``(N, L)``. ``attn`` and ``ffn``
    are keep gates (1 = present, 0 = dropped; fractions are allowed in the differentiable path);
    padding layers have both gates at 0. Widths may be non-integer in the torch path. ``window``
    is each layer's attention window in tokens (:data:`FULL_WINDOW` for full attention; a
    constant, not a search variable); None means every layer attends to the whole context.

    Mixture-of-experts and Mamba-2 layers (issue 30) have their own per-layer columns, zero in a
    dense layer (so a dense cost is bit-identical to one computed without them); a caller building
    dense arrays by hand may leave them None (filled with zeros on construction):

    * ``moe`` — the layer's FFN is a mixture of experts (keep gate); ``experts`` routed experts
      ``E``, ``experts_per_token`` ``k``, ``expert_params`` one routed expert's parameters,
      ``moe_shared_params`` what every token runs (router, latent projections, shared expert, the
      pre-FFN norm), ``moe_act`` the block's per-token activation elements (``k`` experts' hidden
      activations plus the shared expert's), ``expert_io`` the activation elements one routed
      (token, expert) pair moves through memory outside its GEMMs' weights: the token's input
      (latent) vector gathered (read, write), the expert's output written and read back by the
      weighted combine (``4·W``, ``W`` the latent width or ``D``), its hidden activations written
      by the first GEMM, read and written by the activation and read by the second (``6·F`` gated,
      ``4·F`` not).
    * ``mamba`` — the layer's mixer is a Mamba-2 (keep gate); ``mamba_params`` its parameters (its
      pre-norm included), ``mamba_state`` the elements one sequence keeps in it
      (:meth:`MambaSpec.state_elements`), ``mamba_scan_flops`` its non-GEMM FLOPs per token (the
      scan and the depthwise convolution), ``mamba_act`` its ``in_proj`` output width per token.

    Two per-architecture columns describe family details: ``ffn_matrices`` (3 for a gated dense
    FFN, 2 for Nemotron-H's relu² one; None fills 3) and ``attention_sinks`` (1 when each head
    has a sink logit, gpt-oss; None fills 0). Gemma's post-norms (one RMSNorm(D) per dense
    sub-block) are not counted, as before MoE: the cost model's weights and ``active_params`` fall
    short of :attr:`Architecture.num_params` by ``D`` per dense sub-block there (0.01 % of Gemma 3
    270M).
    """

    vocab: Array
    hidden: Array
    tied: Array
    attn: Array
    heads: Array
    kv_heads: Array
    head_dim: Array
    ffn: Array
    ffn_width: Array
    qkv_bias: Array
    o_bias: Array
    mlp_bias: Array
    qk_norm: Array
    window: Array | None = None
    moe: Array = None  # None: filled on construction (class doc)
    experts: Array = None  # None: filled on construction (class doc)
    experts_per_token: Array = None  # None: filled on construction (class doc)
    expert_params: Array = None  # None: filled on construction (class doc)
    expert_io: Array = None  # None: filled on construction (class doc)
    moe_shared_params: Array = None  # None: filled on construction (class doc)
    moe_act: Array = None  # None: filled on construction (class doc)
    mamba: Array = None  # None: filled on construction (class doc)
    mamba_params: Array = None  # None: filled on construction (class doc)
    mamba_state: Array = None  # None: filled on construction (class doc)
    mamba_scan_flops: Array = None  # None: filled on construction (class doc)
    mamba_act: Array = None  # None: filled on construction (class doc)
    ffn_matrices: Array = None  # None: filled on construction (class doc)
    attention_sinks: Array = None  # None: filled on construction (class doc)

    def __post_init__(self) -> None:
        """Fill the optional columns a caller left None (a dense batch built by hand, e.g. the inner
        search's) with their dense value in their shape and backend: 0, or 3 for ``ffn_matrices``."""
        zeros: dict[str, Array] = {}  # one zero array per shape, shared by the columns left None (never written)
        for name in _PER_ARCH_COLUMNS + _MOE_COLUMNS + _MAMBA_COLUMNS:
            if getattr(self, name) is None:
                shape = "hidden" if name in _PER_ARCH_COLUMNS else "attn"
                if shape not in zeros:
                    like = getattr(self, shape)
                    like = like.detach() if hasattr(like, "detach") else like  # a constant: no gradient
                    zeros[shape] = like * 0 + 0.0
                default = _DEFAULTS.get(name)
                object.__setattr__(self, name, zeros[shape] if default is None else zeros[shape] + default)

    @classmethod
    def from_architectures(cls, archs: Sequence[Architecture], backend: str = "numpy") -> ArchArrays:
        """Pack architectures into arrays (``backend`` = ``"numpy"`` or ``"torch"``, float64).

        MoE and Mamba-2 layers fill their columns (class doc); every column is zero in a dense layer.
        """
        if not archs:
            raise ConfigError("need at least one architecture")
        n, depth = len(archs), max(a.num_layers for a in archs)
        per_layer = {k: np.zeros((n, depth)) for k in ("attn", "heads", "kv_heads", "head_dim", "ffn", "ffn_width")}
        per_layer |= {k: np.zeros((n, depth)) for k in _MOE_COLUMNS + _MAMBA_COLUMNS}
        per_layer["window"] = np.full((n, depth), FULL_WINDOW)
        for i, arch in enumerate(archs):
            for j, layer in enumerate(arch.layers):
                _fill_moe_mamba(per_layer, i, j, arch, layer)
                per_layer["window"][i, j] = layer.window or FULL_WINDOW
                per_layer["attn"][i, j] = layer.attention
                per_layer["heads"][i, j] = layer.num_heads if layer.attention else 0
                per_layer["kv_heads"][i, j] = layer.num_kv_heads if layer.attention else 0
                per_layer["head_dim"][i, j] = layer.head_dim
                per_layer["ffn"][i, j] = layer.ffn
                per_layer["ffn_width"][i, j] = layer.ffn_width if layer.ffn else 0
        per_arch = {
            k: np.array([float(getattr(a, attr)) for a in archs])
            for k, attr in (
                ("vocab", "vocab_size"),
                ("hidden", "hidden_size"),
                ("tied", "tie_embeddings"),
                ("qkv_bias", "qkv_bias"),
                ("o_bias", "o_bias"),
                ("mlp_bias", "mlp_bias"),
                ("qk_norm", "qk_norm"),
            )
        }
        per_arch["ffn_matrices"] = np.array([3.0 if family(a.family).gated_ffn else 2.0 for a in archs])
        per_arch["attention_sinks"] = np.array([float(family(a.family).attention_sinks) for a in archs])
        arrays = {**per_arch, **per_layer}
        if backend == "torch":
            import torch

            arrays = {k: torch.from_numpy(v) for k, v in arrays.items()}  # type: ignore[misc]
        elif backend != "numpy":
            raise ConfigError(f"backend must be 'numpy' or 'torch', got {backend!r}")
        return cls(**arrays)


_PER_ARCH_COLUMNS = ("ffn_matrices", "attention_sinks")
_DEFAULTS = {"ffn_matrices": 3.0}
_MOE_COLUMNS = (
    "moe",
    "experts",
    "experts_per_token",
    "expert_params",
    "expert_io",
    "moe_shared_params",
    "moe_act",
)
_MAMBA_COLUMNS = ("mamba", "mamba_params", "mamba_state", "mamba_scan_flops", "mamba_act")


def _mamba_scan_flops(spec: MambaSpec) -> int:
    """Non-GEMM FLOPs of one token through a Mamba-2 mixer, in its recurrent form (Dao & Gu 2024,
    "Transformers are SSMs", eq. 2 with scalar A per head): per head the state update
    ``h ← exp(Δ·A)·h + Δ·x·Bᵀ`` costs 3·P·N (scale, outer product, add) and the read-out
    ``y = h·C`` 2·P·N; the depthwise causal convolution 2·K per channel. Prefill's chunked SSD
    kernel does this work in matrix form; the count is the same order, timed at the BF16 rate."""
    return 5 * spec.inner_width * spec.state_size + 2 * spec.conv_channels * spec.conv_width


def _fill_moe_mamba(cols: dict[str, np.ndarray], i: int, j: int, arch: Architecture, layer: LayerSpec) -> None:
    """Layer ``j`` of architecture ``i``'s MoE and Mamba-2 columns (class doc); a dense layer's stay 0.

    Each parameter column counts the sub-block's pre-norm too (``norms_per_block`` RMSNorms of
    ``D``), so the weights sum to :attr:`Architecture.num_params` exactly."""
    d_model = arch.hidden_size
    norms = d_model * (2 if family(arch.family).post_norms else 1)
    if layer.moe is not None:
        moe, per_expert = layer.moe, layer.moe.expert_params(d_model)
        widths = 2 if moe.gated else 1  # hidden activations per channel: gate and up, or up alone
        cols["moe"][i, j] = 1.0
        cols["experts"][i, j] = moe.num_experts
        cols["experts_per_token"][i, j] = moe.experts_per_token
        cols["expert_params"][i, j] = per_expert
        cols["moe_shared_params"][i, j] = norms + moe.params(d_model, arch.mlp_bias) - moe.num_experts * per_expert
        cols["moe_act"][i, j] = widths * (moe.experts_per_token * moe.expert_width + moe.shared_width)
        cols["expert_io"][i, j] = 4 * (moe.latent_width or d_model) + (2 * widths + 2) * moe.expert_width
    if layer.mamba is not None:
        mamba = layer.mamba
        cols["mamba"][i, j] = 1.0
        cols["mamba_params"][i, j] = norms + mamba.params(d_model)
        cols["mamba_state"][i, j] = mamba.state_elements()
        cols["mamba_scan_flops"][i, j] = _mamba_scan_flops(mamba)
        cols["mamba_act"][i, j] = mamba.inner_width + mamba.conv_channels + mamba.num_heads
