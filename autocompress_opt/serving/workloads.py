"""Workloads: the request shape a model is served under, and the limits it must meet.

A :class:`Constraint` bounds one cost metric, absolutely (``tpot_ms <= 20``) or relative to the
parent model in the same scenario (``tpot_ms <= 0.6x``), so the same workload makes sense for a
135M model and a 120B one. Its *violation* is normalised (``(value - limit) / limit`` for an upper
bound), so ``<= 0`` means feasible — the convention of Optuna's constraints.

The three built-in workloads follow DESIGN.md §1.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from autocompress_opt.errors import ConfigError, suggest
from autocompress_opt.registry import Registry
from autocompress_opt.serving.costmodel import METRICS, Scenario

__all__ = ["WORKLOADS", "Constraint", "Workload", "get_workload", "parse_constraint"]

# Metrics where bigger is better; every other constrained metric is an upper bound.
_HIGHER_IS_BETTER = {"output_throughput_tok_s", "max_concurrency"}
_CONSTRAINABLE = tuple(m for m in METRICS if not m.endswith("_floor_ms") and m != "kv_bytes_per_token")


@dataclass(frozen=True)
class Constraint:
    """``metric <= limit`` (or ``>=`` for throughput/concurrency); ``relative`` scales the parent's value."""

    metric: str
    limit: float
    relative: bool = False

    def __post_init__(self) -> None:
        if self.metric not in _CONSTRAINABLE:
            raise ConfigError(
                f"cannot constrain {self.metric!r}{suggest(self.metric, _CONSTRAINABLE)}; "
                f"valid: {', '.join(_CONSTRAINABLE)}"
            )
        if not self.limit > 0:
            raise ConfigError(f"constraint on {self.metric}: limit must be > 0, got {self.limit!r}")

    @property
    def upper(self) -> bool:
        return self.metric not in _HIGHER_IS_BETTER

    def resolve(self, parent: Mapping[str, float] | None) -> float:
        """The absolute limit; a relative one needs the parent's metrics."""
        if not self.relative:
            return self.limit
        if parent is None:
            raise ConfigError(f"constraint {self} is relative to the parent; parent metrics are needed")
        return self.limit * float(parent[self.metric])

    def violation(self, metrics: Mapping[str, Any], parent: Mapping[str, float] | None = None) -> Any:
        """Normalised violation, ``<= 0`` when satisfied (works on floats and arrays)."""
        limit = self.resolve(parent)
        value = metrics[self.metric]
        return (value - limit) / limit if self.upper else (limit - value) / limit

    def __str__(self) -> str:
        op = "<=" if self.upper else ">="
        return f"{self.metric} {op} {self.limit:g}{'x' if self.relative else ''}"


def parse_constraint(metric: str, text: str | float) -> Constraint:
    """``("tpot_ms", "0.6x")`` → relative; ``("tpot_ms", "20")`` → absolute."""
    raw = str(text).strip()
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*(x?)", raw)
    if not match:
        raise ConfigError(f"constraint on {metric}: {raw!r} is neither a number (20) nor a parent ratio (0.6x)")
    return Constraint(metric, float(match.group(1)), relative=bool(match.group(2)))


@dataclass(frozen=True)
class Workload:
    """A serving situation: request shape, default engine and limits."""

    name: str
    description: str
    input_len: int
    output_len: int
    concurrency: int | str
    engine: str
    dtype: str
    constraints: tuple[Constraint, ...]
    targets: tuple[str, ...]

    def scenario(
        self,
        *,
        dtype: str | None = None,
        tp: int = 1,
        input_len: int | None = None,
        output_len: int | None = None,
        concurrency: int | str | None = None,
    ) -> Scenario:
        """The :class:`Scenario` of this workload, with optional overrides."""
        return Scenario(
            dtype=dtype or self.dtype,
            input_len=input_len or self.input_len,
            output_len=output_len or self.output_len,
            concurrency=concurrency or self.concurrency,
            tp=tp,
        )

    def with_constraints(self, overrides: Mapping[str, str | float]) -> Workload:
        """Replace or add constraints, e.g. ``{"tpot_ms": "0.5x", "peak_memory_gib": 4}``."""
        kept = {c.metric: c for c in self.constraints}
        for metric, text in overrides.items():
            kept[metric] = parse_constraint(metric, text)
        return replace(self, constraints=tuple(kept.values()))

    def violations(self, metrics: Mapping[str, Any], parent: Mapping[str, float] | None = None) -> dict[str, Any]:
        return {str(c): c.violation(metrics, parent) for c in self.constraints}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_len": self.input_len,
            "output_len": self.output_len,
            "concurrency": self.concurrency,
            "engine": self.engine,
            "dtype": self.dtype,
            "constraints": [str(c) for c in self.constraints],
            "targets": list(self.targets),
        }


WORKLOADS: Registry[Workload] = Registry("workload")

WORKLOADS.register(
    "local-coding",
    Workload(
        name="local-coding",
        description="long-context coding on a consumer card: batch 1, 32K prompt; model and KV must fit",
        input_len=32768,
        output_len=512,
        concurrency=1,
        engine="llamacpp",
        dtype="bf16",
        constraints=(
            Constraint("ttft_ms", 0.6, True),
            Constraint("tpot_ms", 0.7, True),
            Constraint("peak_memory_gib", 0.8, True),
        ),
        targets=("rtx5070", "rtx5080"),
    ),
)
WORKLOADS.register(
    "datacenter",
    Workload(
        name="datacenter",
        description="batched serving: as many concurrent 1K-in/256-out requests as fit, per-token SLO",
        input_len=1024,
        output_len=256,
        concurrency="max",
        engine="vllm",
        dtype="bf16",
        constraints=(Constraint("output_throughput_tok_s", 1.5, True), Constraint("tpot_ms", 1.0, True)),
        targets=("h100-sxm", "h200", "b200"),
    ),
)
WORKLOADS.register(
    "in-game",
    Workload(
        name="in-game",
        description="latency-bound chat beside a game: batch 1, short context, strict TTFT/TPOT and memory",
        input_len=512,
        output_len=64,
        concurrency=1,
        engine="vllm",
        dtype="bf16",
        # Fixed per-step costs dominate small models at batch 1, so latency limits are relative and
        # moderate; the memory budget is absolute: the game keeps the rest of the card.
        constraints=(
            Constraint("ttft_ms", 0.7, True),
            Constraint("tpot_ms", 0.8, True),
            Constraint("peak_memory_gib", 4.0),
        ),
        targets=("rtx5070", "rtx5080"),
    ),
)


def get_workload(name: str) -> Workload:
    return WORKLOADS.get(name)
