"""The cost model's arrival regimes: burst, steady and poisson timings from the phase roofline.

Private machinery of :mod:`autocompress_opt.serving.costmodel` (whose module doc gives the
equations of each regime): :func:`_burst`, :func:`_steady` and :func:`_poisson` turn
:func:`~autocompress_opt.serving.roofline._phase_ms` into a :class:`_Timing` (mean TTFT, TPOT, E2E,
throughput) for ``N`` architectures at once, on numpy or torch arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

from autocompress_opt.serving.arch_arrays import Array
from autocompress_opt.serving.roofline import _Phase, _phase_ms, _Rates, _Setup


@dataclass(frozen=True)
class _Timing:
    """One regime's result for ``N`` architectures, ``(N,)`` each: mean TTFT, TPOT and E2E per
    request (ms), output tokens/s over the run, sequences decoding at once, and the prompts
    prefilled together in one wave with the time that took (the prefill-throughput numerator and
    denominator)."""

    ttft: Array
    tpot: Array
    e2e: Array
    throughput: Array
    running: Array
    prefilled: Array
    wave_ttft: Array


def _wave(setup: _Setup, rates: _Rates, b: Array) -> tuple[Array, Array, Array]:
    """(prefill time, mean TTFT, TPOT) of ``b`` prompts prefilled together in ``chunk_tokens``
    steps, logits for the last token (or all), then decoded together at the mean context.

    With chunked prefill the scheduler takes the prompts first come first served, so prompt j
    (0-based) has its first token after (j + 1)/b of the wave's prefill: the mean TTFT is
    (b + 1)/(2b) of it (all of it at b = 1, or when an engine prefills the batch in one step)."""
    ops, eng = setup.ops, setup.engine
    prompt_tokens = b * setup.p_len
    steps = 1.0 + b * 0 if eng.chunk_tokens == 0 else ops.ceil(prompt_tokens / eng.chunk_tokens)
    prefill = _Phase(
        tokens=prompt_tokens,
        logits_tokens=prompt_tokens if eng.logits_all_tokens else b,
        steps=steps,
        sequences=b + steps - 1,  # (prompt, step) pairs: each chunk boundary splits at most one prompt
        prompt=b,
    )
    decode = _Phase(tokens=b, logits_tokens=b, steps=b * 0 + 1.0, sequences=b, context=b, read=b)
    prefill_ms = _phase_ms(setup, rates, prefill)
    staggered = 1.0 if eng.chunk_tokens == 0 else (b + 1) / (2 * b)
    return prefill_ms, prefill_ms * staggered, _phase_ms(setup, rates, decode)


def _burst(setup: _Setup, rates: _Rates, batch: Array, requests: Array) -> _Timing:
    """``requests`` arrive at once; waves of ``b = min(requests, batch)`` (module doc)."""
    ops, o_len = setup.ops, setup.o_len
    b = ops.min(requests, batch)
    full = ops.floor(requests / b)
    rest = requests - full * b
    prefill_b, ttft_b, tpot_b = _wave(setup, rates, b)
    prefill_r, ttft_r, tpot_r = _wave(setup, rates, ops.max(rest, 1.0))
    wave_b = prefill_b + (o_len - 1) * tpot_b
    wave_r = ops.where(rest > 0, prefill_r + (o_len - 1) * tpot_r, 0.0)
    share_b, share_r = b * full / requests, rest / requests
    # Requests of wave j (0-based) wait j·T_w(b) for the waves before theirs; the last wave n·T_w(b).
    waiting = (b * wave_b * full * (full - 1) / 2 + rest * full * wave_b) / requests
    ttft = share_b * ttft_b + share_r * ttft_r + waiting
    tpot = share_b * tpot_b + share_r * tpot_r
    makespan = full * wave_b + wave_r
    return _Timing(
        ttft=ttft,
        tpot=tpot,
        e2e=ttft + (o_len - 1) * tpot,
        throughput=requests * o_len / (makespan / 1e3),
        running=b,
        prefilled=b,
        wave_ttft=prefill_b,
    )


def _steady(setup: _Setup, rates: _Rates, batch: Array) -> _Timing:
    """``batch`` requests always in flight, chunked prefill interleaved with decode (module doc)."""
    ops, eng = setup.ops, setup.engine
    p_len, o_len = setup.p_len, setup.o_len
    others = batch - 1.0
    # Each step's token budget goes to the running decodes first (vLLM's scheduler), the rest to a
    # prompt chunk; no chunking (0) prefills a whole prompt in one step.
    chunk = batch * 0 + p_len if eng.chunk_tokens == 0 else ops.min(ops.max(eng.chunk_tokens - others, 1.0), p_len)
    k = ops.ceil(p_len / chunk)
    life = k + o_len - 1  # engine steps of one request: its prefill chunks, then O − 1 decodes
    beside = others * (o_len - 1) / life  # others decoding in any one step
    share = ops.min(others * p_len / life / chunk, 1.0)  # of my decode steps, those carrying a chunk
    logits_per_prompt = p_len if eng.logits_all_tokens else 1.0
    carried = k * beside  # other sequences' decode tokens riding on the prompt's chunks
    prefill = _Phase(
        tokens=p_len + k * beside,
        logits_tokens=logits_per_prompt + k * beside,
        steps=k,
        sequences=k * (1.0 + beside),
        prompt=1.0,
        context=carried,
        read=carried,
    )
    running = 1.0 + beside
    one = batch * 0 + 1.0
    decode = _Phase(tokens=running, logits_tokens=running, steps=one, sequences=running, context=running, read=running)
    mixed = _Phase(
        tokens=running + chunk,
        logits_tokens=running + (chunk if eng.logits_all_tokens else 1.0),
        steps=one,
        sequences=running + 1.0,
        prompt=1.0,
        prompt_div=k,  # one chunk of the prompt's pairs
        context=running,
        read=running,
    )
    ttft = _phase_ms(setup, rates, prefill)
    tpot = share * _phase_ms(setup, rates, mixed) + (1 - share) * _phase_ms(setup, rates, decode)
    e2e = ttft + (o_len - 1) * tpot
    return _Timing(ttft, tpot, e2e, batch * o_len / (e2e / 1e3), running=batch, prefilled=one, wave_ttft=ttft)


# Fixed-point iterations of Little's law; B rises monotonically from 1 toward the smallest solution.
_POISSON_ITERATIONS = 60


def _littles_fixed_point(setup: _Setup, rates: _Rates, rate: float, capacity: Array) -> Array:
    """B = min(1 + λ·E2E(B), capacity), iterated from 1. On torch it runs without a graph: the
    gradient flows through the steady-state cost at the fixed point, not through the iterations
    (60 unrolled steady-state evaluations would dominate a fit's time)."""
    ops = setup.ops

    def iterate() -> Array:
        batch = capacity * 0 + 1.0
        for _ in range(_POISSON_ITERATIONS):
            batch = ops.min(1.0 + rate * _steady(setup, rates, batch).e2e / 1e3, capacity)
        return batch

    if not ops.torch:
        return iterate()
    with ops._t.no_grad():
        return iterate().detach()


def _poisson(setup: _Setup, rates: _Rates, rate: float, capacity: Array) -> _Timing:
    """Arrivals at ``rate`` requests/s (module doc). An arriving request finds λ·E2E others in
    flight on average (Poisson arrivals see time averages), so ``B = 1 + λ·E2E(B)``."""
    ops, o_len = setup.ops, setup.o_len
    one = capacity * 0 + 1.0
    if setup.engine.single_user:  # M/D/1: service S = single-stream E2E, wait ρS / (2(1 − ρ))
        alone = _steady(setup, rates, one)
        rho = rate * alone.e2e / 1e3
        stable = rho < 1
        wait = ops.where(stable, rho * alone.e2e / (2 * (1 - ops.where(stable, rho, 0.0))), float("inf"))
        return _Timing(
            ttft=alone.ttft + wait,
            tpot=alone.tpot,
            e2e=alone.e2e + wait,
            throughput=ops.where(stable, one * rate * o_len, alone.throughput),
            running=ops.min(rho, 1.0),
            prefilled=one,
            wave_ttft=alone.ttft,
        )
    batch = _littles_fixed_point(setup, rates, rate, capacity)
    timing = _steady(setup, rates, batch)
    overloaded = 1.0 + rate * timing.e2e / 1e3 > capacity * (1 + 1e-6)
    inf = float("inf")
    return _Timing(
        ttft=ops.where(overloaded, inf, timing.ttft),
        tpot=timing.tpot,
        e2e=ops.where(overloaded, inf, timing.e2e),
        throughput=ops.where(overloaded, timing.throughput, one * rate * o_len),
        running=ops.where(overloaded, capacity, rate * timing.e2e / 1e3),
        prefilled=one,
        wave_ttft=timing.ttft,
    )
