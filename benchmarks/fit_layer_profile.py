"""The quality estimate's layer profiles (``autocompress_opt/quality/estimate.py``, **Layers**) from
the block library's measured per-layer sensitivities.

    .venv/bin/python benchmarks/fit_layer_profile.py            # writes the shipped estimate's profiles
    .venv/bin/python benchmarks/fit_layer_profile.py --check    # exits 1 if the shipped ones differ

``benchmarks/results/block_library.json`` (``benchmarks/bench_block_library.py``) holds, for every
layer of SmolLM2-135M, the KL to the parent when that layer alone is replaced by a narrower variant
(replace-one KL on the choice rows). Two pairs of its variants give the profiles, each layer's curve
``KL(c) = value · (c / cut) ** exponent``: for the FFN and expert axes ``ffn_768`` (the layer's FFN at
half its width: the value, cut 0.5) and ``drop_ffn`` (no FFN: the exponent, ``log(drop / value) /
log(1 / cut)``); for the mixer's heads ``kv_1x3`` (one KV group of three: cut 2/3) and
``drop_attention``. Exponents are kept within [1.1, 8]. The values are as measured (4 rows of 64 tokens
each: noisy layer by layer, but the spread, 26x for the FFN and 28x for the KV groups between the
most and least sensitive layer, is far above that noise); the estimate reads them by relative depth
and uses their ratios only. Nothing is measured here.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "benchmarks" / "results" / "block_library.json"
ESTIMATE = ROOT / "autocompress_opt" / "data" / "quality_estimate.json"
# side: (the partial cut's variant, the fraction it cuts, the variant that removes the sub-block)
SIDES = {"ffn": ("ffn_768", 0.5, "drop_ffn"), "mixer": ("kv_1x3", 2 / 3, "drop_attention")}
EXPONENT_RANGE = (1.1, 8.0)


def profiles(library: dict) -> dict[str, dict]:
    """``{side: {"values": [...], "source": "..."}}`` from a block library result."""
    rows = library["library"]
    out = {}
    low, high = EXPONENT_RANGE
    for side, (variant, cut, drop) in SIDES.items():
        values = [float(v) for v in library["spread"][variant]["per_layer"]]
        whole = [float(v) for v in library["spread"][drop]["per_layer"]]
        exponents = [min(high, max(low, math.log(d / v) / math.log(1 / cut))) for v, d in zip(values, whole)]
        out[side] = {
            "values": [round(v, 5) for v in values],
            "exponents": [round(e, 4) for e in exponents],
            "cut": round(cut, 6),
            "source": (
                f"{library['model']}: replace-one KL of each of its {len(values)} layers with variant {variant} "
                f"(the value) and {drop} (the exponent) ({rows['rows']} rows x {rows['seq_len']} tokens; "
                f"benchmarks/results/block_library.json, {library['date'][:10]})"
            ),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the shipped profiles, write nothing")
    args = parser.parse_args(argv)
    fitted = profiles(json.loads(LIBRARY.read_text(encoding="utf-8")))
    shipped = json.loads(ESTIMATE.read_text(encoding="utf-8"))
    if args.check:
        same = shipped.get("layer_profiles") == fitted
        print("shipped layer profiles match block_library.json" if same else "shipped layer profiles differ")
        return 0 if same else 1
    shipped["layer_profiles"] = fitted
    ESTIMATE.write_text(json.dumps(shipped, indent=1) + "\n", encoding="utf-8")
    for side, prof in fitted.items():
        values = prof["values"]
        exponents = sorted(prof["exponents"])
        print(
            f"{side}: {len(values)} layers, values max/min {max(values) / min(values):.1f}x, exponents "
            f"{exponents[0]:.2f}..{exponents[-1]:.2f} (median {exponents[len(exponents) // 2]:.2f}) -> "
            f"{ESTIMATE.relative_to(ROOT)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
