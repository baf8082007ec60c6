"""The quality estimate's layer profiles (``autocompress_opt/quality/estimate.py``, **Layers**) from
the block library's measured per-layer sensitivities.

    .venv/bin/python benchmarks/fit_layer_profile.py            # writes the shipped estimate's profiles
    .venv/bin/python benchmarks/fit_layer_profile.py --check    # exits 1 if the shipped ones differ

``benchmarks/results/block_library.json`` (``benchmarks/bench_block_library.py``) holds, for every
layer of SmolLM2-135M, the KL to the parent when that layer alone is replaced by a narrower variant
(replace-one KL on the choice rows). Two of its variants give the profiles: ``ffn_768`` (the layer's
FFN at half its width) for the FFN and expert axes, ``kv_1x3`` (one KV group of three) for the
mixer's heads. The values are stored as measured (4 rows of 64 tokens each: noisy layer by layer, but
the spread, 26x for the FFN and 28x for the KV groups between the most and least sensitive layer,
is far above that noise); the estimate reads them by relative depth and normalises them, so only
their shape matters. Nothing is measured here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "benchmarks" / "results" / "block_library.json"
ESTIMATE = ROOT / "autocompress_opt" / "data" / "quality_estimate.json"
SIDES = {"ffn": "ffn_768", "mixer": "kv_1x3"}


def profiles(library: dict) -> dict[str, dict]:
    """``{side: {"values": [...], "source": "..."}}`` from a block library result."""
    rows = library["library"]
    out = {}
    for side, variant in SIDES.items():
        values = [round(float(v), 5) for v in library["spread"][variant]["per_layer"]]
        out[side] = {
            "values": values,
            "source": (
                f"{library['model']}: replace-one KL of each of its {len(values)} layers with variant "
                f"{variant} ({rows['rows']} rows x {rows['seq_len']} tokens; benchmarks/results/block_library.json, "
                f"{library['date'][:10]})"
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
        print(f"{side}: {len(values)} layers, max/min {max(values) / min(values):.1f}x -> {ESTIMATE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
