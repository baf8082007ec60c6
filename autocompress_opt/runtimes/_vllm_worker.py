"""Runs inside vLLM's own environment (``.venv-vllm``); not imported by the package.

``python _vllm_worker.py REQUEST.json RESULT.json``: loads ``request["model"]`` in vLLM
(``trust_remote_code``, so a DeciLM checkpoint's ``configuration_decilm.py`` is used), runs the
token sequences as prompts with ``prompt_logprobs`` and one greedy step, and writes for every
sequence and position the top-``k`` next-token log-probabilities (``{token id: log p}``): position
``t`` is the distribution of the token after ``ids[: t + 1]``. ``request["enforce_eager"]`` skips
vLLM's compilation (vLLM's own default is to compile).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    # run with python -P: this folder holds a module named vllm
    with open(sys.argv[1], encoding="utf-8") as f:
        request = json.load(f)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    k = int(request.get("top_k", 20))
    sequences = request["sequences"]
    start = time.perf_counter()
    llm = LLM(
        model=request["model"],
        tokenizer=request.get("tokenizer") or request["model"],
        skip_tokenizer_init=not request.get("tokenizer"),
        trust_remote_code=True,
        dtype=request.get("dtype", "float32"),
        max_model_len=max(len(s) for s in sequences) + 1,
        max_logprobs=k,
        seed=0,
        enforce_eager=bool(request.get("enforce_eager", False)),
    )
    load_s = time.perf_counter() - start
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=k, prompt_logprobs=k, detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in sequences], params)
    result = []
    for ids, out in zip(sequences, outputs):
        rows = []
        # prompt_logprobs[t] (t >= 1) is the distribution of ids[t] given ids[:t]: position t - 1's next token.
        for entry in out.prompt_logprobs[1:]:
            rows.append({str(tok): lp.logprob for tok, lp in entry.items()})
        step = out.outputs[0].logprobs[0]  # the distribution after the whole prompt
        rows.append({str(tok): lp.logprob for tok, lp in step.items()})
        if len(rows) != len(ids):
            raise RuntimeError(f"vLLM returned {len(rows)} positions for a {len(ids)}-token prompt")
        result.append(rows)
    import vllm

    partial = sys.argv[2] + ".part"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump({"vllm": vllm.__version__, "load_s": load_s, "logprobs": result}, f)
    os.replace(partial, sys.argv[2])  # complete or absent


if __name__ == "__main__":
    main()
