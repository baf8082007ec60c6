"""Runs inside vLLM's own environment (``.venv-vllm``); not imported by the package.

``python -P _vllm_bench.py REQUEST.json RESULT.json``: loads ``request["model"]`` in vLLM (offline
``LLM``, ``trust_remote_code`` so a DeciLM checkpoint is read as NVIDIA ships it, prefix caching off
so that a repeated run cannot reuse an earlier prompt's KV; ``enforce_eager`` skips vLLM's compilation,
which on this CPU takes about a minute per model) and times, for every concurrency ``c``:

* ``ttft_ms``: the wall time of ``generate`` on ``c`` fresh random prompts of ``prompt_len`` tokens
  with ``max_tokens=1`` (one prefill wave and its first token);
* ``e2e_ms``: the same with ``max_tokens=gen_len`` (``ignore_eos``, every sequence the full length);
* ``tpot_ms``: ``(e2e - ttft) / (gen_len - 1)``, the time of one decode step of the ``c`` sequences.

Each is the median over ``repetitions`` runs after one warm-up run at that concurrency; every run
draws new prompts (token ids uniform in ``[100, vocab)``, seeded).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        request = json.load(f)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompt_len, gen_len = int(request["prompt_len"]), int(request["gen_len"])
    concurrencies = [int(c) for c in request["concurrencies"]]
    repetitions, vocab = int(request["repetitions"]), int(request["vocab_size"])
    start = time.perf_counter()
    llm = LLM(
        model=request["model"],
        skip_tokenizer_init=True,
        trust_remote_code=True,
        dtype=request["dtype"],
        max_model_len=prompt_len + gen_len + 16,
        max_num_seqs=max(concurrencies),
        enable_prefix_caching=False,
        enforce_eager=bool(request.get("enforce_eager", False)),
        seed=0,
    )
    load_s = time.perf_counter() - start
    rng = random.Random(int(request.get("seed", 0)))

    def prompts(c: int) -> list:
        return [TokensPrompt(prompt_token_ids=[rng.randrange(100, vocab) for _ in range(prompt_len)]) for _ in range(c)]

    def timed(c: int, max_tokens: int) -> float:
        params = SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        batch = prompts(c)
        t0 = time.perf_counter()
        outputs = llm.generate(batch, params, use_tqdm=False)
        elapsed = (time.perf_counter() - t0) * 1e3
        produced = [len(o.outputs[0].token_ids) for o in outputs]
        if produced != [max_tokens] * c:
            raise RuntimeError(f"vLLM produced {produced} tokens, {max_tokens} asked per sequence")
        return elapsed

    results = {}
    for c in concurrencies:
        timed(c, gen_len)  # warm-up: shapes of this batch size compiled and cached
        ttft = statistics.median(timed(c, 1) for _ in range(repetitions))
        e2e = statistics.median(timed(c, gen_len) for _ in range(repetitions))
        results[str(c)] = {"ttft_ms": ttft, "e2e_ms": e2e, "tpot_ms": max(e2e - ttft, 1e-3) / (gen_len - 1)}
    import vllm

    partial = sys.argv[2] + ".part"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump({"vllm": vllm.__version__, "load_s": load_s, "timings": results}, f)
    os.replace(partial, sys.argv[2])  # complete or absent


if __name__ == "__main__":
    main()
