"""A large ``--data`` JSONL file: time and peak memory of reading, hashing and splitting it, and of a
second process that reuses the first one's index (issue: a 2 GB file read and SHA-256'd in full by
every process that touches it).

Generates a JSONL file of ``--size-gb`` GB (default 2) under ``/tmp`` (never in the repository; kept
for reruns), then runs two fresh processes one after the other, each doing what a verb does with
``--data FILE``: load the source (the first process makes the one pass: parse, hash, index; the
second reads the index kept under the file's path, size and mtime), split it into calibration /
selection / test, and draw 64 calibration rows of 512 tokens. Each reports its seconds per step and
its peak RSS (``ru_maxrss``, imports included, and the imports' own). Writes
``results/data_stream.json``.

Run (slow: minutes; keep it off a busy machine): ``nice -n 19 .venv/bin/python benchmarks/bench_data_stream.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROW_CHARS = 2000  # about a page of text per row: ~1M rows in 2 GB
DEFAULT_PATH = Path(tempfile.gettempdir()) / "autocompress-bench" / "data_stream.jsonl"
MEMORY_LIMIT_GIB = 1.0  # the bound on peak RSS


def generate(path: Path, size_gb: float, seed: int = 0) -> int:
    """Write rows ``{"id": i, "text": ...}`` until the file holds ``size_gb`` GB; returns the rows.
    Each row's text is a slice of a fixed pool of words at a seeded offset, plus its number (distinct)."""
    rng = random.Random(seed)
    words = [f"{a}{b}" for a in ("data", "row", "text", "model", "token", "split") for b in range(200)]
    pool = " ".join(rng.choice(words) for _ in range(400_000))
    path.parent.mkdir(parents=True, exist_ok=True)
    target, written, rows = int(size_gb * 1e9), 0, 0
    with open(path, "w", encoding="utf-8") as handle:
        while written < target:
            start = rng.randrange(len(pool) - ROW_CHARS)
            line = json.dumps({"id": rows, "text": f"row {rows}: {pool[start : start + ROW_CHARS]}"}) + "\n"
            handle.write(line)
            written += len(line)
            rows += 1
    return rows


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _byte_tokenizer() -> Any:
    """A byte-level fast tokenizer (token = byte): the rows' tokenising costs like a real one's, no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    backend = Tokenizer(models.BPE(vocab={c: b for b, c in bytes_to_unicode().items()}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def child(path: Path) -> dict[str, Any]:
    """What one process does with ``--data FILE`` (module doc), timed."""
    start = time.perf_counter()
    from autocompress_opt.data.textdata import data_split
    from autocompress_opt.data.user import data_batches, load_source

    tokenizer = _byte_tokenizer()
    imports_s, imports_rss = time.perf_counter() - start, _peak_rss_mib()
    t = time.perf_counter()
    source = load_source(str(path))
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    split = data_split([source])
    split_s = time.perf_counter() - t
    t = time.perf_counter()
    rows = data_batches(tokenizer, data=[str(path)], role="calibration", n_samples=64, seq_len=512, seed=0)
    draw_s = time.perf_counter() - t
    return {
        "imports_s": round(imports_s, 2),
        "load_s": round(load_s, 2),
        "split_s": round(split_s, 2),
        "draw_64x512_s": round(draw_s, 2),
        "total_s": round(load_s + split_s + draw_s, 2),
        "peak_rss_mib": round(_peak_rss_mib(), 1),
        "imports_rss_mib": round(imports_rss, 1),
        "documents": len(source.keys()),
        "roles": {r: len(split.documents(r)) for r in ("calibration", "selection", "test")},
        "sha256": source.content_sha256(),
        "rows_drawn": int(rows.tokens.shape[0]),
    }


def run_child(path: Path, cache: Path) -> dict[str, Any]:
    env = dict(os.environ, AUTOCOMPRESS_TOKEN_CACHE=str(cache / "tokens"))  # index beside it: cache/row-index
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(path)], env=env, capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--path", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="data_stream", help="results/<OUT>.json")
    parser.add_argument("--results", type=Path, default=None, help="folder of the result (default: results/)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    t = time.perf_counter()
    if not args.path.is_file() or args.path.stat().st_size < args.size_gb * 1e9:
        generate(args.path, args.size_gb)
    generate_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory(prefix="autocompress-bench-cache-") as cache:
        first = run_child(args.path, Path(cache))
        print("first process:", first)
        second = run_child(args.path, Path(cache))
        print("second process:", second)
    from _util import provenance, write

    write(
        args.out,
        {
            "file": {"bytes": args.path.stat().st_size, "rows": first["documents"], "row_chars": ROW_CHARS},
            "generate_s": round(generate_s, 1),
            "first_process": first,
            "second_process_reusing_the_index": second,
            "same_digest": first["sha256"] == second["sha256"],
            "peak_rss_under_limit": max(first["peak_rss_mib"], second["peak_rss_mib"]) < MEMORY_LIMIT_GIB * 1024,
            "memory_limit_gib": MEMORY_LIMIT_GIB,
            **provenance(seed=0),
        },
        args.results,
    )


if __name__ == "__main__":
    main()
