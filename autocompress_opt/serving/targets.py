"""Targets: where and how a pruned model will be served (hardware x workload x engine x
constraints), the parent's cost there, and the device-memory fit check.

One Optuna study per target; the target's constraints come from its workload, overridden or extended
by the target's own (``{"tpot_ms": "0.6x"}``, relative to the parent).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import reject_unknown_keys
from autocompress_opt.serving.costmodel import Scenario, estimate_cost
from autocompress_opt.serving.engines import get_engine
from autocompress_opt.serving.hardware import get_hardware
from autocompress_opt.serving.workloads import Workload, get_workload

__all__ = ["FITS_DEVICE", "Target", "device_fit_violation", "parent_metrics"]


@dataclass(frozen=True)
class Target:
    """Where and how the pruned model will be served; one Optuna study per target.

    ``constraints`` overrides or adds to the workload's (``{"tpot_ms": "0.6x"}``); ``None``
    fields take the workload's defaults.
    """

    hardware: str
    workload: str
    engine: str | None = None
    dtype: str | None = None
    tp: int = 1
    input_len: int | None = None
    output_len: int | None = None
    concurrency: int | str | None = None
    constraints: Mapping[str, str] = field(default_factory=dict)
    engine_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        get_hardware(self.hardware)
        self.resolved_workload()  # validates names and constraint strings
        self.scenario()

    def resolved_workload(self) -> Workload:
        return get_workload(self.workload).with_constraints(dict(self.constraints))

    @property
    def engine_name(self) -> str:
        return self.engine or get_workload(self.workload).engine

    def scenario(self) -> Scenario:
        return get_workload(self.workload).scenario(
            dtype=self.dtype,
            tp=self.tp,
            input_len=self.input_len,
            output_len=self.output_len,
            concurrency=self.concurrency,
        )

    def engine_obj(self) -> Any:
        return get_engine(self.engine_name).with_options(**dict(self.engine_options))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["constraints"] = dict(self.constraints)
        data["engine_options"] = dict(self.engine_options)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Target:
        reject_unknown_keys(data, cls.__dataclass_fields__, "a target")
        return cls(**data)


FITS_DEVICE = "fits device memory"


def device_fit_violation(metrics: Mapping[str, float], target: Target) -> float:
    """Normalised violation of "the model, its KV cache and activations fit the device":
    ``peak_memory_gib / (device memory · engine memory fraction) - 1`` (<= 0 fits); also
    violated (+1) when not one sequence fits."""
    engine = target.engine_obj()
    budget = get_hardware(target.hardware).memory_gib * (
        engine.memory_fraction if engine.memory_policy != "dynamic" else 1.0
    )
    over = metrics["peak_memory_gib"] / budget - 1
    return max(over, 1.0) if metrics["max_concurrency"] < 1 else over


def parent_metrics(parent: Architecture, target: Target) -> dict[str, float]:
    """The parent's cost in the target scenario: the reference of relative constraints."""
    return estimate_cost(parent, target.hardware, target.engine_obj(), target.scenario()).to_dict()
