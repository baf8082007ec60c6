"""The two non-dense sub-blocks a decoder layer may hold: a mixture of experts (:class:`MoESpec`, in
place of the dense FFN) and a Mamba-2 mixer (:class:`MambaSpec`, in place of attention).

Both are frozen data with exact parameter counts, as the transformers modeling code allocates them
(``D`` = hidden size; transformers 5 stores each layer's routed experts as stacked 3-D tensors):

* MoE (Mixtral, Qwen3-MoE, gpt-oss, Nemotron-H, Granite-MoE-Hybrid): a router ``(E, D)`` (+ ``E``
  bias in gpt-oss); ``E`` routed experts of width ``F`` over an input of width ``L`` (``L = D``, or
  the latent width in Nemotron 3 Super's latent MoE, whose ``fc1_latent_proj`` ``(L, D)`` and
  ``fc2_latent_proj`` ``(D, L)`` wrap the experts), each ``(2 if gated else 1)·F·L + F·L`` (+ gpt-oss's
  ``2F + L`` biases); an optional shared expert of width ``S`` on the full ``D`` that every token
  runs (Nemotron-H, Granite). The latent projections and the shared expert are biased iff the
  architecture's ``mlp_bias`` (Nemotron-H's ``mlp_bias``; Granite never).
* Mamba-2 (Nemotron-H, Granite-MoE-Hybrid): ``H`` heads of ``P`` channels (inner width
  ``I = H·P``), state size ``N`` in ``G`` groups, a depthwise causal conv of width ``K`` over
  ``C = I + 2·G·N`` channels; ``in_proj`` ``(I + C + H, D)``, ``conv1d`` ``(C, 1, K)`` (+ ``C``
  bias), ``dt_bias``, ``A_log``, ``D`` ``(H,)`` each, a gated RMSNorm ``(I,)``, ``out_proj``
  ``(D, I)``; the two projections biased iff ``proj_bias``.

*Active* parameters are the ones a token touches: the router, ``experts_per_token`` of the ``E``
routed experts, the latent projections and the shared expert (:meth:`MoESpec.active_params`); a
Mamba-2 mixer is dense (all of it, every token).
"""

from __future__ import annotations

from dataclasses import dataclass

from autocompress_opt.errors import ConfigError, check_bool, check_int

__all__ = ["MambaSpec", "MoESpec"]


@dataclass(frozen=True)
class MoESpec:
    """A layer's mixture of experts (its FFN).

    Attributes:
        num_experts: routed experts ``E``.
        experts_per_token: experts each token is routed to, ``k <= E``.
        expert_width: each routed expert's intermediate size ``F``.
        shared_width: the shared expert's intermediate size ``S`` (0: none).
        latent_width: the experts' input/output width ``L`` when a latent projection wraps them
            (Nemotron 3 Super: 1024); 0: the experts read the hidden state directly (``L = D``).
        gated: experts (and the shared expert) are gated, ``down(act(gate(x)) * up(x))``; false:
            ``down(act(up(x)))`` (Nemotron-H's relu² experts).
        router_bias: the router has a bias vector (gpt-oss).
        expert_bias: the routed experts' projections have biases (gpt-oss).
    """

    num_experts: int
    experts_per_token: int
    expert_width: int
    shared_width: int = 0
    latent_width: int = 0
    gated: bool = True
    router_bias: bool = False
    expert_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("num_experts", "experts_per_token", "expert_width"):
            check_int(getattr(self, name), f"MoESpec.{name}")
        for name in ("shared_width", "latent_width"):
            check_int(getattr(self, name), f"MoESpec.{name}", minimum=0)
        for name in ("gated", "router_bias", "expert_bias"):
            check_bool(getattr(self, name), f"MoESpec.{name}")
        if self.experts_per_token > self.num_experts:
            raise ConfigError(
                f"MoESpec.experts_per_token={self.experts_per_token} exceeds num_experts={self.num_experts}; "
                f"valid: 1..{self.num_experts}"
            )

    def expert_params(self, hidden_size: int) -> int:
        """One routed expert: gate (if gated), up and down over the expert input ``L``, with biases."""
        width, io = self.expert_width, self.latent_width or hidden_size
        projections = (3 if self.gated else 2) * width * io
        return projections + (((2 if self.gated else 1) * width + io) if self.expert_bias else 0)

    def _always_params(self, hidden_size: int, mlp_bias: bool) -> int:
        """What every token runs: router, latent projections, shared expert."""
        d, total = hidden_size, self.num_experts * hidden_size + (self.num_experts if self.router_bias else 0)
        if self.latent_width:
            total += 2 * d * self.latent_width + ((self.latent_width + d) if mlp_bias else 0)  # fc1, fc2
        if self.shared_width:
            s = self.shared_width
            total += (3 if self.gated else 2) * d * s + (((2 if self.gated else 1) * s + d) if mlp_bias else 0)
        return total

    def params(self, hidden_size: int, mlp_bias: bool = False) -> int:
        """Exact parameters of the block (every routed expert), norms excluded."""
        return self.num_experts * self.expert_params(hidden_size) + self._always_params(hidden_size, mlp_bias)

    def active_params(self, hidden_size: int, mlp_bias: bool = False) -> int:
        """Parameters one token touches: router, latent projections, shared expert and
        ``experts_per_token`` routed experts."""
        return self.experts_per_token * self.expert_params(hidden_size) + self._always_params(hidden_size, mlp_bias)


@dataclass(frozen=True)
class MambaSpec:
    """A layer's Mamba-2 mixer (in place of attention).

    Attributes:
        num_heads: SSM heads ``H``.
        head_dim: channels per head ``P`` (inner width ``I = H·P``).
        state_size: SSM state size ``N`` per group.
        groups: groups ``G`` sharing B and C; must divide ``num_heads``.
        conv_width: the causal depthwise convolution's kernel width ``K``.
        conv_bias: the convolution has a bias (transformers' default).
        proj_bias: ``in_proj`` and ``out_proj`` have biases.
    """

    num_heads: int
    head_dim: int
    state_size: int
    groups: int
    conv_width: int
    conv_bias: bool = True
    proj_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("num_heads", "head_dim", "state_size", "groups", "conv_width"):
            check_int(getattr(self, name), f"MambaSpec.{name}")
        for name in ("conv_bias", "proj_bias"):
            check_bool(getattr(self, name), f"MambaSpec.{name}")
        if self.num_heads % self.groups:
            valid = [g for g in range(1, self.num_heads + 1) if self.num_heads % g == 0]
            raise ConfigError(
                f"MambaSpec.groups={self.groups} does not divide num_heads={self.num_heads}; "
                f"valid groups: {', '.join(map(str, valid))}"
            )

    @property
    def inner_width(self) -> int:
        """``I = H·P``, the width the SSM scans."""
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """``C = I + 2·G·N``: x, B and C go through the convolution."""
        return self.inner_width + 2 * self.groups * self.state_size

    def params(self, hidden_size: int) -> int:
        """Exact parameters of the mixer, its pre-norm excluded."""
        inner, conv, heads = self.inner_width, self.conv_channels, self.num_heads
        in_out = inner + conv + heads  # in_proj rows: z (gate), xBC, dt
        total = hidden_size * in_out + (in_out if self.proj_bias else 0)  # in_proj
        total += conv * self.conv_width + (conv if self.conv_bias else 0)  # conv1d (depthwise)
        total += 3 * heads  # dt_bias, A_log, D
        total += inner  # gated RMSNorm
        total += inner * hidden_size + (hidden_size if self.proj_bias else 0)  # out_proj
        return total

    def state_elements(self) -> int:
        """Elements one sequence keeps between decode steps, whatever its length: the SSM state
        ``H·P·N`` plus the convolution's last ``K - 1`` inputs ``C·(K - 1)``."""
        return self.inner_width * self.state_size + self.conv_channels * (self.conv_width - 1)
