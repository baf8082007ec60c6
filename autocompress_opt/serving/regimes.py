"""The cost model's arrival regimes: burst, steady and poisson timings from the phase roofline.

Private machinery of :mod:`autocompress_opt.serving.costmodel` (whose module doc gives the
equations of each regime): :func:`_burst`, :func:`_steady` and :func:`_poisson` turn
:func:`~autocompress_opt.serving.roofline._phase_ms` into a :class:`_Timing` (mean TTFT, TPOT, E2E,
throughput) for ``N`` architectures at once, on numpy or torch arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

from autocompress_opt.serving.arch_arrays import Array
from autocompress_opt.serving.roofline import _Ops, _Phase, _phase_ms, _Rates, _Setup


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


@dataclass(frozen=True)
class _Wave:
    """One wave of ``b`` prompts (module doc, burst), ``(N,)`` each in ms: its prefill steps with the
    decodes they carry, the mean first-token time and TPOT of its requests, and its makespan (until
    its last token)."""

    prefill: Array
    ttft: Array
    tpot: Array
    makespan: Array


def _carried_decodes(b: Array, steps: Array, decodes: float, ops: _Ops) -> Array:
    """Decode tokens the requests of a wave produce inside its prefill steps: Σ_i min(i·K/b, O − 1)
    over i = 0..b − 1, the prefill steps still to run when the wave's (b − i)-th prompt has its first
    token (prompts finish first come first served, ``K/b`` steps apart, as the wave's TTFT assumes); a
    request stops carrying decodes once it has all ``O − 1`` of them."""
    per_prompt = steps / b
    uncapped = ops.min(b - 1.0, ops.floor(decodes / per_prompt))  # the last i with i·K/b <= O − 1
    return per_prompt * uncapped * (uncapped + 1.0) / 2.0 + (b - 1.0 - uncapped) * decodes


def _wave(setup: _Setup, rates: _Rates, b: Array) -> _Wave:
    """``b`` prompts prefilled together in ``chunk_tokens`` steps, logits for the last token (or all),
    then decoded together.

    With chunked prefill the scheduler takes the prompts first come first served, so prompt j
    (0-based) has its first token after (j + 1)/b of the wave's prefill: the mean TTFT is
    (b + 1)/(2b) of it (all of it at b = 1, or when an engine prefills the batch in one step). A
    request that has its first token decodes in every later step, so the rest of the wave's prefill
    steps carry ``M`` decode tokens (:func:`_carried_decodes`): the ``K`` prefill steps process the
    prompts and those decodes (weights read once per step), and the ``O − 1`` steps after them decode
    the remaining ``b(O − 1) − M`` tokens, ``b − M/(O − 1)`` sequences a step on average (the
    earliest requests finish first). A request's TPOT, (E2E − TTFT)/(O − 1) as benchmark tools
    measure it, averages the prefill steps it decoded in (``M/b`` of its steps, each the wave's mean
    prefill step) with the decode-only ones. Without chunking (or at b = 1) ``M = 0``: TPOT is one
    decode step of ``b``."""
    ops, eng = setup.ops, setup.engine
    decodes = setup.o_len - 1.0
    prompt_tokens = b * setup.p_len
    if eng.chunk_tokens == 0:
        steps, staggered, carried = 1.0 + b * 0, 1.0, b * 0.0
    else:
        steps = ops.ceil(prompt_tokens / eng.chunk_tokens)
        staggered, carried = (b + 1) / (2 * b), _carried_decodes(b, steps, decodes, ops)
    prefill = _Phase(
        tokens=prompt_tokens + carried,
        logits_tokens=(prompt_tokens if eng.logits_all_tokens else b) + carried,
        steps=steps,
        # (prompt, step) pairs: each chunk boundary splits at most one prompt; and the carried decodes
        sequences=b + steps - 1 + carried,
        prompt=b,
        context=carried,
        read=carried,
    )
    running = b - carried / max(decodes, 1.0)  # sequences in a decode-only step, on average
    decode = _Phase(
        tokens=running, logits_tokens=running, steps=b * 0 + 1.0, sequences=running, context=running, read=running
    )
    prefill_ms, step_ms = _phase_ms(setup, rates, prefill), _phase_ms(setup, rates, decode)
    in_prefill = carried / b  # of a request's O − 1 decode steps, those inside the wave's prefill
    tpot = step_ms + in_prefill * (prefill_ms / steps - step_ms) / max(decodes, 1.0)
    return _Wave(prefill_ms, prefill_ms * staggered, tpot, prefill_ms + decodes * step_ms)


def _burst(setup: _Setup, rates: _Rates, batch: Array, requests: Array) -> _Timing:
    """``requests`` arrive at once; waves of ``b = min(requests, batch)`` (module doc)."""
    ops, o_len = setup.ops, setup.o_len
    b = ops.min(requests, batch)
    full = ops.floor(requests / b)
    rest = requests - full * b
    wave, last = _wave(setup, rates, b), _wave(setup, rates, ops.max(rest, 1.0))
    wave_b = wave.makespan
    wave_r = ops.where(rest > 0, last.makespan, 0.0)
    share_b, share_r = b * full / requests, rest / requests
    # Requests of wave j (0-based) wait j·T_w(b) for the waves before theirs; the last wave n·T_w(b).
    waiting = (b * wave_b * full * (full - 1) / 2 + rest * full * wave_b) / requests
    ttft = share_b * wave.ttft + share_r * last.ttft + waiting
    tpot = share_b * wave.tpot + share_r * last.tpot
    makespan = full * wave_b + wave_r
    return _Timing(
        ttft=ttft,
        tpot=tpot,
        e2e=ttft + (o_len - 1) * tpot,
        throughput=requests * o_len / (makespan / 1e3),
        running=b,
        prefilled=b,
        wave_ttft=wave.prefill,
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
