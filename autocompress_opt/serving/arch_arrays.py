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

from autocompress_opt.arch.architecture import Architecture
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

    @classmethod
    def from_architectures(cls, archs: Sequence[Architecture], backend: str = "numpy") -> ArchArrays:
        """Pack architectures into arrays (``backend`` = ``"numpy"`` or ``"torch"``, float64).

        Raises :class:`ConfigError` for an architecture with MoE or Mamba-2 layers, or of an
        architecture-only family: the arrays have no fields for them, and costing them as dense
        would be wrong (issue 30).
        """
        if not archs:
            raise ConfigError("need at least one architecture")
        for arch in archs:
            arch.require_dense("costed")
        n, depth = len(archs), max(a.num_layers for a in archs)
        per_layer = {k: np.zeros((n, depth)) for k in ("attn", "heads", "kv_heads", "head_dim", "ffn", "ffn_width")}
        per_layer["window"] = np.full((n, depth), FULL_WINDOW)
        for i, arch in enumerate(archs):
            for j, layer in enumerate(arch.layers):
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
        arrays = {**per_arch, **per_layer}
        if backend == "torch":
            import torch

            arrays = {k: torch.from_numpy(v) for k, v in arrays.items()}  # type: ignore[misc]
        elif backend != "numpy":
            raise ConfigError(f"backend must be 'numpy' or 'torch', got {backend!r}")
        return cls(**arrays)
