"""The hardware catalog: accelerator figures as data, each with its source.

GPU rows come from ``data/hardware.csv`` (copied from the vendors' datasheets and whitepapers; the
``source`` column names the document). ``cpu`` is this machine: its peak FLOP/s and bandwidth are
*measured* by ``autocompress calibrate --hardware cpu`` and read from the calibrated profile.
Users add their own accelerators from a YAML file with :func:`load_hardware_file`.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from autocompress_opt._data import DATA_DIR
from autocompress_opt.errors import ConfigError, check_int, check_number, reject_unknown_keys, yaml_problem
from autocompress_opt.registry import Registry
from autocompress_opt.serving.profiles import calibrated_hardware_blocks

__all__ = [
    "COMPUTE_DTYPES",
    "HARDWARE",
    "Hardware",
    "builtin_hardware_names",
    "cpu_hardware",
    "get_hardware",
    "hardware_aliases",
    "load_hardware_file",
]

_DATA = DATA_DIR

# Tensor-math rates, lowest precision first. A weight format without native math on a device
# computes at the next wider format it has (e.g. FP4 weights on H100 run FP8/BF16 GEMMs).
COMPUTE_DTYPES: tuple[str, ...] = ("fp4", "fp8", "bf16", "fp32")


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or the host CPU).

    Attributes:
        name: catalog key, e.g. ``h100-sxm``.
        memory_gib: device memory. Vendor "GB" for GPU memory is binary (80 GB H100 = 80 GiB).
        bandwidth_gb_s: peak memory bandwidth, 1e9 bytes/s.
        peak_tflops: dense tensor throughput per compute dtype (``bf16`` is the FP32-accumulate
            rate on GeForce cards, which is what BF16 inference runs at; DESIGN.md §3).
        fp16_acc_tflops: dense FP16 tensor throughput with FP16 *accumulation* (cuBLAS
            ``CUBLAS_COMPUTE_16F``), the math llama.cpp's GEMMs run at (:meth:`half_accumulate_flops`).
            GeForce cards run it at twice their FP32-accumulate rate; None where it equals the
            ``bf16`` rate (datacenter parts, which run FP16 at full rate with either accumulator).
        fp32_tflops: peak FP32 rate of the CUDA cores (non-tensor; an FMA counts 2 FLOPs), None where
            not listed. It times the work a weight-only kernel does on those cores: dequantising
            4-bit routed experts for BF16 tensor math (``roofline._layer_s``, issue 44).
        interconnect_gb_s: GPU-to-GPU bandwidth as quoted (both directions together), 0 if none.
        interconnect: the link as quoted in the source.
        source: where the figures come from.
    """

    name: str
    memory_gib: float
    bandwidth_gb_s: float
    peak_tflops: Mapping[str, float]
    interconnect_gb_s: float = 0.0
    interconnect: str = ""
    sms: int | None = None
    l2_mb: float | None = None
    tdp_w: float | None = None
    note: str = ""
    source: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    fp16_acc_tflops: float | None = None
    fp32_tflops: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"a hardware entry's name must be a non-empty string, got {self.name!r}")
        for name in ("memory_gib", "bandwidth_gb_s"):
            check_number(getattr(self, name), f"hardware {self.name!r}: {name}")
        check_number(self.interconnect_gb_s, f"hardware {self.name!r}: interconnect_gb_s", positive=False)
        for name in ("l2_mb", "tdp_w", "fp16_acc_tflops", "fp32_tflops"):
            if getattr(self, name) is not None:
                check_number(getattr(self, name), f"hardware {self.name!r}: {name}")
        if self.sms is not None:
            check_int(self.sms, f"hardware {self.name!r}: sms")
        for name in ("interconnect", "note", "source"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"hardware {self.name!r}: {name} must be a string, got {getattr(self, name)!r}")
        if not isinstance(self.peak_tflops, Mapping):
            raise ConfigError(
                f"hardware {self.name!r}: peak_tflops must be a mapping like {{bf16: 989, fp8: 1979}}, "
                f"got {self.peak_tflops!r}"
            )
        for dtype, rate in self.peak_tflops.items():
            check_number(rate, f"hardware {self.name!r}: peak_tflops[{dtype!r}]")
        unknown = set(self.peak_tflops) - set(COMPUTE_DTYPES)
        if unknown:
            raise ConfigError(
                f"hardware {self.name!r}: unknown compute dtype(s) {sorted(unknown)} in peak_tflops; "
                f"valid: {', '.join(COMPUTE_DTYPES)}"
            )
        if not self.peak_tflops or any(v <= 0 for v in self.peak_tflops.values()):
            raise ConfigError(
                f"hardware {self.name!r}: peak_tflops needs at least one positive rate, got {dict(self.peak_tflops)}"
            )

    def compute_dtype(self, requested: str) -> str:
        """The tensor-math dtype a ``requested`` compute format actually runs at on this device."""
        if requested not in COMPUTE_DTYPES:
            raise ConfigError(f"unknown compute dtype {requested!r}; valid: {', '.join(COMPUTE_DTYPES)}")
        for candidate in COMPUTE_DTYPES[COMPUTE_DTYPES.index(requested) :]:
            if candidate in self.peak_tflops:
                return candidate
        # Only wider-than-available formats are left (e.g. fp32 on a catalogue GPU): use the widest rate.
        return max(self.peak_tflops, key=COMPUTE_DTYPES.index)

    def peak_flops(self, requested: str) -> float:
        """Peak FLOP/s for a compute dtype, after the fallback of :meth:`compute_dtype`."""
        return self.peak_tflops[self.compute_dtype(requested)] * 1e12

    def half_accumulate_flops(self) -> float:
        """Peak FLOP/s of FP16 tensor math with FP16 accumulation: ``fp16_acc_tflops``, else the
        ``bf16`` rate (after :meth:`compute_dtype`'s fallback)."""
        if self.fp16_acc_tflops is not None:
            return self.fp16_acc_tflops * 1e12
        return self.peak_flops("bf16")

    def with_figures(self, reference: Mapping[str, Any]) -> Hardware:
        """This entry with the peak figures of ``reference`` (``peak_tflops``, ``bandwidth_gb_s``,
        optionally ``fp16_acc_tflops``): what a profile's efficiencies are fractions of
        (:attr:`~autocompress_opt.serving.profiles.CostProfile.reference`)."""
        if not reference:
            return self
        return replace(
            self,
            peak_tflops=dict(reference["peak_tflops"]),
            bandwidth_gb_s=float(reference["bandwidth_gb_s"]),
            fp16_acc_tflops=reference.get("fp16_acc_tflops"),
        )

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["peak_tflops"] = dict(self.peak_tflops)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Hardware:
        if not isinstance(data, Mapping):
            raise ConfigError(
                "a hardware entry must be a mapping with name, memory_gib, bandwidth_gb_s and peak_tflops, "
                f"got {data!r}"
            )
        reject_unknown_keys(data, cls.__dataclass_fields__, "a hardware entry")
        missing = [k for k in ("name", "memory_gib", "bandwidth_gb_s", "peak_tflops") if k not in data]
        if missing:
            raise ConfigError(f"hardware entry {data.get('name', '?')!r} is missing {', '.join(missing)}")
        peaks = data["peak_tflops"]
        if isinstance(peaks, Mapping):  # the numbers themselves are checked by __post_init__
            peaks = {str(k): v for k, v in peaks.items()}
        return cls(**{**data, "peak_tflops": peaks})


def _interconnect_gb_s(text: str) -> float:
    """'NVLink4 900 GB/s' → 900; 'NVLink5 1.8 TB/s' → 1800; 'PCIe5 x16' → 128 (64 GB/s each way)."""
    match = re.search(r"([\d.]+)\s*(GB|TB)/s", text)
    if match:
        return float(match.group(1)) * (1000 if match.group(2) == "TB" else 1)
    pcie = re.search(r"PCIe(\d)\s*x(\d+)", text)
    if pcie:  # PCIe gen 3/4/5: ~1/2/4 GB/s per lane per direction
        per_lane = {3: 1.0, 4: 2.0, 5: 4.0, 6: 8.0}.get(int(pcie.group(1)), 1.0)
        return 2 * per_lane * int(pcie.group(2))
    return 0.0


def _load_catalog_csv(path: Path) -> list[Hardware]:
    rows = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            peaks = {
                dtype: float(row[f"{dtype}_dense_tflops"])
                for dtype in ("bf16", "fp8", "fp4")
                if row.get(f"{dtype}_dense_tflops")
            }
            optional = lambda key, kind, row=row: kind(row[key]) if row.get(key) else None
            rows.append(
                Hardware(
                    name=row["name"],
                    memory_gib=float(row["memory_gb"]),
                    bandwidth_gb_s=float(row["bandwidth_gb_s"]),
                    peak_tflops=peaks,
                    interconnect_gb_s=_interconnect_gb_s(row.get("interconnect", "")),
                    interconnect=row.get("interconnect", ""),
                    fp16_acc_tflops=optional("fp16acc_dense_tflops", float),
                    fp32_tflops=optional("fp32_tflops", float),
                    sms=optional("sms", int),
                    l2_mb=optional("l2_mb", float),
                    tdp_w=optional("tdp_w", float),
                    note=row.get("note", ""),
                    source=row.get("source", ""),
                )
            )
    return rows


def load_hardware_file(path: str | Path, *, register: bool = True) -> list[Hardware]:
    """Read user hardware profiles from YAML: a list of mappings (or ``{hardware: [...]}``).

    Each entry needs ``name``, ``memory_gib``, ``bandwidth_gb_s`` and ``peak_tflops``
    (``{bf16: ..., fp8: ...}``). With ``register=True`` they join the catalog, replacing earlier
    user entries of the same name. A name that is a built-in name or alias (``h100``: an alias of
    ``h100-sxm``), or that appears twice in the file, is a :class:`ConfigError` naming both.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"hardware file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"hardware file {str(path)!r} is not UTF-8 text: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"hardware file {str(path)!r} is not valid YAML: {yaml_problem(exc)}") from None
    entries = data.get("hardware", data) if isinstance(data, Mapping) else data
    if isinstance(entries, Mapping):
        entries = [entries]
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: expected a list of hardware entries, got {type(entries).__name__}")
    try:
        items = [Hardware.from_dict(entry) for entry in entries]
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    builtin = builtin_hardware_names()
    seen: set[str] = set()
    for item in items:
        key = item.name.lower()
        if key in builtin:
            owner = builtin[key]
            what = (
                f"the built-in hardware {owner!r}" if owner == key else f"{key!r}, an alias of the built-in {owner!r}"
            )
            raise ConfigError(f"{path}: hardware entry {item.name!r} collides with {what}; choose another name")
        if key in seen:
            raise ConfigError(f"{path}: hardware entry {item.name!r} appears twice")
        seen.add(key)
    if register:
        for item in items:
            HARDWARE.register(item.name, item, replace=True)
    return items


# built-in entry name -> its aliases, filled when the catalog is first used
_BUILTIN_ALIASES: dict[str, tuple[str, ...]] = {}


def _register_builtin(registry: Registry[Hardware]) -> None:
    """The datasheet rows, then ``cpu`` when a calibration measured this host (first use only)."""
    for item in _load_catalog_csv(_DATA / "hardware.csv"):
        aliases = (item.name.replace("-sxm", ""),) if item.name.endswith("-sxm") else ()
        registry.register(item.name, item, aliases=aliases)
        _BUILTIN_ALIASES[item.name.lower()] = aliases
    cpu = cpu_hardware()
    if cpu is not None:
        registry.register("cpu", cpu)
        _BUILTIN_ALIASES["cpu"] = ()


def hardware_aliases(name: str) -> tuple[str, ...]:
    """The aliases of built-in entry ``name`` (``h100-sxm`` → ``("h100",)``); ``()`` for others."""
    HARDWARE.names()  # loads the built-in entries on first use
    return _BUILTIN_ALIASES.get(name.lower(), ())


def builtin_hardware_names() -> dict[str, str]:
    """Every built-in entry name and alias (lower case) → the built-in entry name it denotes."""
    HARDWARE.names()  # loads the built-in entries on first use
    names = {name: name for name in _BUILTIN_ALIASES}
    names.update({alias.lower(): name for name, aliases in _BUILTIN_ALIASES.items() for alias in aliases})
    return names


def cpu_hardware() -> Hardware | None:
    """The host CPU as measured by the newest calibration (the user's first, then the shipped one):
    the ``hardware`` block that ``autocompress calibrate`` writes beside a CPU profile."""
    for block in calibrated_hardware_blocks():
        if block.get("name") == "cpu":
            return Hardware.from_dict(block)
    return None


# Built on first lookup, not at import (reading the CSV and the calibrated profiles).
HARDWARE: Registry[Hardware] = Registry("hardware", builtins=_register_builtin)


def get_hardware(name: str) -> Hardware:
    """Look up a catalog entry by name (``h100`` is an alias of ``h100-sxm``)."""
    return HARDWARE.get(name)
