"""Arrival regimes: a burst of N requests in waves, steady concurrency with chunked prefill
interleaved with decode, Poisson arrivals, and single-stream latency as their common limit."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest
import torch
from golden_cost import GOLD_ARCH, GOLD_ENGINE, GOLD_HW, GOLD_PROFILE

from autocompress_opt.arch.catalog import known_architectures
from autocompress_opt.cli import main
from autocompress_opt.errors import ConfigError
from autocompress_opt.serving.costmodel import ArchArrays, Scenario, describe_regime, estimate_batch, estimate_cost
from autocompress_opt.serving.profiles import get_profile
from autocompress_opt.serving.regimes import _carried_decodes
from autocompress_opt.serving.roofline import _Ops

# The wave primitives of the golden model (tests/serving/test_costmodel.py works batch 1 by hand):
#   batch 1: TTFT 0.02002624 ms, TPOT 0.02008 ms.
#   batch 2, decode at context 110.5: GEMM/layer max(2·2·36864/5e12, 73728 B/5e10) = 1.47456e-6;
#     attention/layer max(4·221·64/5e12, 2·2·(221 + 2)·32 B/5e10 = 5.7088e-7); head 2.56e-6;
#     fixed 4e-6 + 1e-5 → 2·2.04544e-6 + 1.656e-5 = 2.065088e-5 s.
#   batch 2 prefill (200 tokens, one step): GEMM/layer 2·200·36864/5e12 = 2.94912e-6; attention pairs
#     2·5050: max(4·10100·64/5e12 = 5.1712e-7, 2·2·200·32/5e10 = 5.12e-7); head 2.56e-6; fixed 1.4e-5
#     → 2·3.46624e-6 + 1.656e-5 = 2.349248e-5 s.
TTFT1, TPOT1 = 0.02002624, 0.02008
TTFT2, TPOT2 = 0.02349248, 0.02065088
OUT = 21


def gold(scenario: Scenario) -> Any:
    return estimate_cost(GOLD_ARCH, GOLD_HW, GOLD_ENGINE, scenario, GOLD_PROFILE)


def test_wave_primitives_match_the_hand_computation() -> None:
    two = gold(Scenario("bf16", 100, OUT, 2))
    assert two.ttft_ms == pytest.approx(TTFT2, rel=1e-9) and two.tpot_ms == pytest.approx(TPOT2, rel=1e-9)


def test_burst_of_five_in_waves_of_two_matches_the_hand_computation() -> None:
    """5 requests at once, 2 at a time: waves of 2, 2 and 1, each prefilled then decoded."""
    c = gold(Scenario("bf16", 100, OUT, 2, arrival="burst", requests=5))
    wave2 = TTFT2 + 20 * TPOT2  # 0.43651008 ms
    wave1 = TTFT1 + 20 * TPOT1  # 0.42162624 ms
    makespan = 2 * wave2 + wave1  # 1.2946464 ms
    assert c.output_throughput_tok_s == pytest.approx(5 * OUT / (makespan / 1e3), rel=1e-9)  # ≈ 81,103 tok/s
    # First tokens: wave 1 at TTFT2 (x2), wave 2 at wave2 + TTFT2 (x2), wave 3 at 2·wave2 + TTFT1.
    mean_ttft = (2 * TTFT2 + 2 * (wave2 + TTFT2) + (2 * wave2 + TTFT1)) / 5  # 0.372007296 ms
    assert c.ttft_ms == pytest.approx(mean_ttft, rel=1e-9)
    assert c.tpot_ms == pytest.approx((4 * TPOT2 + TPOT1) / 5, rel=1e-9)
    assert c.e2e_latency_ms == pytest.approx(mean_ttft + 20 * (4 * TPOT2 + TPOT1) / 5, rel=1e-9)


def test_default_burst_is_one_wave_of_the_concurrency() -> None:
    """Without --requests a burst is the concurrency itself: the results the model always gave."""
    plain = gold(Scenario("bf16", 100, OUT, 2))
    assert plain == gold(Scenario("bf16", 100, OUT, 2, arrival="burst", requests=2))
    assert plain.output_throughput_tok_s == pytest.approx(2 * OUT / ((TTFT2 + 20 * TPOT2) / 1e3), rel=1e-9)


def test_every_regime_at_one_request_is_single_stream_latency() -> None:
    arch = known_architectures()["llama-3.1-8b"]
    burst = estimate_cost(arch, "h100-sxm", "vllm", Scenario("bf16", 20000, 100, 1))
    steady = estimate_cost(arch, "h100-sxm", "vllm", Scenario("bf16", 20000, 100, 1, arrival="steady"))
    assert burst == steady  # a 20K prompt in 3 chunks of 8192 either way
    light = estimate_cost(arch, "h100-sxm", "vllm", Scenario("bf16", 20000, 100, arrival="poisson", rate=1e-6))
    assert light.ttft_ms == pytest.approx(burst.ttft_ms, rel=1e-3) and light.tpot_ms == pytest.approx(
        burst.tpot_ms, rel=1e-4
    )


def test_steady_interleaving_moves_ttft_and_tpot() -> None:
    """With 64 in flight a new prompt shares its steps with 60-odd decodes (TTFT up from single
    stream) and decode steps carry others' prompt chunks (TPOT above a pure batch-64 decode step);
    a burst of 64 prompts prefilled together waits for all of them (TTFT far above steady's)."""
    arch = known_architectures()["llama-3.1-8b"]
    sc = dict(dtype="bf16", input_len=2000, output_len=200)
    single = estimate_cost(arch, "h100-sxm", "vllm", Scenario(**sc, concurrency=1))
    steady = estimate_cost(arch, "h100-sxm", "vllm", Scenario(**sc, concurrency=64, arrival="steady"))
    burst = estimate_cost(arch, "h100-sxm", "vllm", Scenario(**sc, concurrency=64))
    assert steady.ttft_ms > single.ttft_ms and steady.tpot_ms > single.tpot_ms
    assert steady.tpot_ms > burst.tpot_ms  # a burst carries only the later prompts of its own wave
    assert burst.ttft_ms > 10 * steady.ttft_ms
    # closed loop: each of the 64 slots completes a request per lifetime
    assert steady.output_throughput_tok_s == pytest.approx(64 * 200 / (steady.e2e_latency_ms / 1e3))
    longer = estimate_cost(
        arch, "h100-sxm", "vllm", Scenario(**{**sc, "input_len": 8000}, concurrency=64, arrival="steady")
    )
    assert longer.tpot_ms > steady.tpot_ms  # more prefill per request rides on the decode steps


def test_poisson_obeys_littles_law_and_saturates() -> None:
    arch = known_architectures()["llama-3.1-8b"]
    sc = dict(dtype="bf16", input_len=1000, output_len=100, arrival="poisson")
    low = estimate_cost(arch, "h100-sxm", "vllm", Scenario(**sc, rate=2.0))
    high = estimate_cost(arch, "h100-sxm", "vllm", Scenario(**sc, rate=20.0))
    assert low.output_throughput_tok_s == pytest.approx(2.0 * 100) and high.output_throughput_tok_s == pytest.approx(
        2000
    )
    assert high.tpot_ms > low.tpot_ms and high.ttft_ms > low.ttft_ms
    # the fixed point: an arrival finds rate·E2E others in flight; their steady cost is the answer
    in_flight = 20.0 * high.e2e_latency_ms / 1e3
    values = estimate_batch(
        ArchArrays.from_architectures([arch]), "h100-sxm", "vllm", Scenario(**sc, rate=20.0), bounds=True
    )
    assert float(values["running"][0]) == pytest.approx(in_flight)
    over = estimate_cost(arch, "h100-sxm", "vllm", Scenario(**sc, rate=1e4))
    assert over.ttft_ms == over.e2e_latency_ms == float("inf")
    assert over.output_throughput_tok_s < 1e4 * 100  # capped at the capacity
    assert "beyond the capacity" in describe_regime(Scenario(**sc, rate=1e4), over)


def test_online_requests_pay_the_front_end_latency_in_ttft_and_e2e_only() -> None:
    arch = known_architectures()["qwen3-8b"]
    overhead = get_profile("vllm", "h100-sxm").request_overhead_ms
    assert overhead > 0  # fitted to the online rows of measurements.csv
    for scenario in (Scenario("bf16", 1000, 100, 8, arrival="steady"), Scenario("bf16", 1000, 100, 64)):
        offline = estimate_cost(arch, "h100-sxm", "vllm", scenario)
        online = estimate_cost(arch, "h100-sxm", "vllm", dataclasses.replace(scenario, online=True))
        assert online.ttft_ms == pytest.approx(offline.ttft_ms + overhead)
        assert online.e2e_latency_ms == pytest.approx(offline.e2e_latency_ms + overhead)
        assert online.tpot_ms == offline.tpot_ms and online.output_throughput_tok_s == offline.output_throughput_tok_s
        assert online.ttft_floor_ms == offline.ttft_floor_ms


def test_poisson_on_a_single_user_engine_is_an_md1_queue() -> None:
    arch = known_architectures()["qwen3-8b"]
    alone = estimate_cost(arch, "rtx5090", "llamacpp", Scenario("q4_k_m", 512, 128, 1))
    rate = 0.5 / (alone.e2e_latency_ms / 1e3)  # utilisation 0.5
    queued = estimate_cost(arch, "rtx5090", "llamacpp", Scenario("q4_k_m", 512, 128, arrival="poisson", rate=rate))
    wait = 0.5 * alone.e2e_latency_ms / (2 * (1 - 0.5))  # Pollaczek-Khinchine, deterministic service
    assert queued.ttft_ms == pytest.approx(alone.ttft_ms + wait, rel=1e-9)
    assert queued.tpot_ms == pytest.approx(alone.tpot_ms, rel=1e-12)


def test_regimes_run_on_torch_with_gradients() -> None:
    arch = known_architectures()["smollm2-135m"]
    for scenario in (
        Scenario("bf16", 512, 64, 16, arrival="steady"),
        Scenario("bf16", 512, 64, arrival="poisson", rate=5.0),
        Scenario("bf16", 512, 64, 8, arrival="burst", requests=20),
    ):
        arrays = ArchArrays.from_architectures([arch], backend="torch")
        arrays = dataclasses.replace(arrays, ffn_width=arrays.ffn_width.clone().requires_grad_(True))
        out = estimate_batch(arrays, "h100-sxm", "vllm", scenario)
        numpy_out = estimate_batch(ArchArrays.from_architectures([arch]), "h100-sxm", "vllm", scenario)
        assert float(out["tpot_ms"].detach()[0]) == pytest.approx(float(numpy_out["tpot_ms"][0]), rel=1e-9)
        out["e2e_latency_ms"].sum().backward()
        assert arrays.ffn_width.grad is not None and torch.isfinite(arrays.ffn_width.grad).all()
        assert float(arrays.ffn_width.grad.sum()) > 0  # wider FFNs are slower


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(arrival="bursty"), "arrival must be one of burst, steady, poisson, got 'bursty'"),
        (dict(arrival="poisson"), "arrival 'poisson' needs one) must be a finite number > 0"),
        (dict(arrival="poisson", rate=-1.0), "arrival 'poisson' needs one) must be a finite number > 0"),
        (dict(arrival="steady", rate=2.0), "a rate is for arrival 'poisson'"),
        (dict(arrival="steady", requests=5), "requests (a burst's size)"),
        (dict(requests=0), "got 0"),
    ],
)
def test_bad_regimes_name_the_value(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        Scenario("bf16", 100, 10, **kwargs)
    assert needle in str(info.value)


BASE = ["cost", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--engine", "vllm", "--dtype", "bf16"]
BASE += ["--input-len", "1000", "--output-len", "100"]


def test_cost_says_which_regime_it_computed(capsys: Any) -> None:
    assert main([*BASE, "--concurrency", "max", "--arrival", "burst", "--requests", "1000"]) == 0
    out = capsys.readouterr().out
    assert "burst: 1,000 requests arrive at once and run in 4 wave(s) of up to 256" in out
    assert main([*BASE, "--concurrency", "32", "--arrival", "steady", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["arrival"] == "steady" and data["regime"].startswith("steady concurrency: 32 requests")
    assert main([*BASE, "--arrival", "poisson", "--rate", "1e4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ttft_ms"] is None and "beyond the capacity" in data["regime"]
    assert main(BASE) == 0
    assert "single stream" in capsys.readouterr().out


def test_cost_rejects_a_rate_without_poisson(capsys: Any) -> None:
    assert main([*BASE, "--arrival", "steady", "--rate", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a rate is for arrival 'poisson'" in err
    assert main([*BASE, "--arrival", "poisson"]) == 2
    assert "arrival 'poisson' needs one) must be a finite number > 0" in capsys.readouterr().err


# A chunked-prefill wave (module doc, burst), worked by hand on the golden model with 1000-token
# prompts and chunk_tokens = 1000: b = 2 prompts in K = 2 steps; request 0 has its first token after
# step 1 and decodes in step 2, which carries M = 1 decode token beside prompt 1's chunk.
#   Prefill, 2 steps of 2001 tokens (3 logits rows), context 1010.5 for the carried decode:
#     GEMM/layer max(2·2001·36864/5e12 = 2.95059456e-5, 2·73728 B/5e10); attention/layer pairs
#     2·500500 + 1010.5: max(4·1002010.5·64/5e12 = 5.13029376e-5, 2·2·(1010.5 + 2001)·32 B/5e10);
#     head 2·2.56e-6; fixed 2·1.4e-5 → 2·8.08088832e-5 + 5.12e-6 + 2.8e-5 = 1.947377664e-4 s.
#   Decode-only steps, 2 − M/20 = 1.95 sequences: GEMM/layer 1.47456e-6; attention/layer
#     max(4·1.95·1010.5·64/5e12, 2·2·(1.95·1010.5 + 1.95)·32 B/5e10 = 5.049408e-6); head 2.56e-6;
#     fixed 1.4e-5 → 2·6.523968e-6 + 1.656e-5 = 2.9607936e-5 s.
CHUNKED_PREFILL, CHUNKED_STEP = 0.1947377664, 0.029607936


def test_chunked_burst_wave_charges_the_later_prompts_prefill_to_tpot() -> None:
    """TPOT is (E2E − TTFT)/(O − 1) per request, as benchmark tools measure it: request 0's 20
    decode steps are one prefill step (prompt 1's chunk) and 19 decode-only steps, request 1's 20
    decode-only steps."""
    engine = dataclasses.replace(GOLD_ENGINE, chunk_tokens=1000)
    c = estimate_cost(GOLD_ARCH, GOLD_HW, engine, Scenario("bf16", 1000, OUT, 2), GOLD_PROFILE)
    first = (CHUNKED_PREFILL / 2, CHUNKED_PREFILL)  # first tokens after step 1 and step 2
    last = (CHUNKED_PREFILL + 19 * CHUNKED_STEP, CHUNKED_PREFILL + 20 * CHUNKED_STEP)  # 20 more tokens each
    assert c.ttft_ms == pytest.approx(sum(first) / 2, rel=1e-9)  # 0.1460533248 ms = (b + 1)/(2b)·prefill
    assert c.e2e_latency_ms == pytest.approx(sum(last) / 2, rel=1e-9)  # 0.7720925184 ms
    tpot = sum((e - t) / 20 for e, t in zip(last, first)) / 2  # 0.03130195968 ms
    assert c.tpot_ms == pytest.approx(tpot, rel=1e-9)
    assert c.tpot_ms > 1.05 * CHUNKED_STEP  # a prefill step inside the decode of request 0
    # The makespan runs to request 1's last token: 2 prefill steps and 20 decode-only ones.
    assert c.output_throughput_tok_s == pytest.approx(2 * OUT / (last[1] / 1e3), rel=1e-9)  # ≈ 53,374 tok/s
    # Without chunking both prompts are prefilled in one step: no first token comes early.
    whole = gold(Scenario("bf16", 100, OUT, 2))
    assert (whole.ttft_ms, whole.tpot_ms) == pytest.approx((TTFT2, TPOT2), rel=1e-9)


@pytest.mark.parametrize(
    ("b", "steps", "decodes"), [(1, 3, 20), (2, 2, 20), (8, 2, 20), (64, 16, 5), (5, 40, 3), (7, 3, 0)]
)
def test_carried_decodes_count_each_requests_decode_tokens_inside_the_prefill(b: int, steps: int, decodes: int) -> None:
    """The closed form equals the sum over the wave's prompts of the prefill steps left after their
    first token (steps/b apart), each capped at the request's O − 1 decode tokens."""
    by_hand = sum(min(i * steps / b, decodes) for i in range(b))
    ops = _Ops(np.zeros(1))
    got = _carried_decodes(np.array([float(b)]), np.array([float(steps)]), float(decodes), ops)
    assert float(got[0]) == pytest.approx(by_hand, rel=1e-12, abs=1e-12)
