"""Loading onto a device: ``placement_kwargs`` (device and GPU count → ``from_pretrained``'s
``device_map``/``max_memory``) as a pure function, its balanced map on a ``meta`` model, what
``load_model`` passes for a directory, and the CPU path unchanged."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_lm import VOCAB, save_hf_dir, tiny_model, write_qwen2_gguf
from transformers import AutoModelForCausalLM

from autocompress_opt.errors import ConfigError
from autocompress_opt.hf import device as device_module
from autocompress_opt.hf.device import WEIGHT_SHARE, check_gpus, placement_kwargs
from autocompress_opt.hf.loading import load_model

GB = 10**9
CUDA0, CUDA2 = torch.device("cuda", 0), torch.device("cuda", 2)
TOKENS = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_dir(tiny_model("qwen2", seed=2), tmp_path_factory.mktemp("qwen2-devices"))


# ------------------------------------------------------------------ the pure resolution
def test_one_device() -> None:
    """The CPU: from_pretrained's own host load; one GPU: every tensor straight to it."""
    assert placement_kwargs(torch.device("cpu")) == {}
    assert placement_kwargs(CUDA0, free_bytes=[80 * GB]) == {"device_map": {"": "cuda:0"}}
    assert placement_kwargs(torch.device("cuda", 1), free_bytes=[]) == {"device_map": {"": "cuda:1"}}


def test_k_gpus_get_a_balanced_map_within_each_gpus_free_memory() -> None:
    """k GPUs from the device on, each capped at WEIGHT_SHARE of its free bytes; no CPU or disk entry."""
    kwargs = placement_kwargs(CUDA0, 2, free_bytes=[80 * GB, 60 * GB])
    assert kwargs == {
        "device_map": "balanced",
        "max_memory": {0: int(80 * GB * WEIGHT_SHARE), 1: int(60 * GB * WEIGHT_SHARE)},
    }
    spread = placement_kwargs(CUDA2, 2, free_bytes=[GB] * 4, weight_bytes=GB)
    assert set(spread["max_memory"]) == {2, 3}


@pytest.mark.parametrize("gpus", [0, -1, 1.5, True, "2", None])
def test_gpus_must_be_a_whole_number_from_one(gpus: Any) -> None:
    with pytest.raises(
        ConfigError, match=rf"gpus \(the GPUs a model is spread over\) must be a positive int, got {gpus!r}"
    ):
        check_gpus(gpus)
    with pytest.raises(ConfigError, match=r"gpus \(the GPUs a model is spread over\) must be a positive int"):
        placement_kwargs(CUDA0, gpus, free_bytes=[GB] * 8)


def test_bad_spreads_are_named() -> None:
    with pytest.raises(ConfigError, match=r"gpus=2: only CUDA devices spread a model over GPUs, got device 'cpu'"):
        placement_kwargs(torch.device("cpu"), 2)
    with pytest.raises(ConfigError, match=r"gpus=3 from 'cuda:0': this process sees 2 CUDA GPU\(s\)"):
        placement_kwargs(CUDA0, 3, free_bytes=[GB, GB])
    with pytest.raises(ConfigError, match=r"gpus=2 from 'cuda:2': .* sees 3 CUDA GPU\(s\) .*at most 1 from there"):
        placement_kwargs(CUDA2, 2, free_bytes=[GB] * 3)


def test_weights_that_do_not_fit_are_named_with_their_sizes() -> None:
    with pytest.raises(ConfigError, match=r"need 74\.5 GiB but 'cuda:0' has 37\.3 GiB free; spread it"):
        placement_kwargs(CUDA0, free_bytes=[40 * GB], weight_bytes=80 * GB)
    with pytest.raises(ConfigError, match=r"need 74\.5 GiB but 2 GPUs from 'cuda:0' have 67\.1 GiB for them \(90%"):
        placement_kwargs(CUDA0, 2, free_bytes=[40 * GB, 40 * GB], weight_bytes=80 * GB)
    assert placement_kwargs(CUDA0, 2, free_bytes=[50 * GB, 50 * GB], weight_bytes=80 * GB)["device_map"] == "balanced"


def test_the_balanced_map_spreads_a_meta_model_over_the_gpus(tiny_hf_config: Any) -> None:
    """What from_pretrained computes from these kwargs (transformers' own ``_get_device_map``, on a
    ``meta`` model: no memory, no GPU): every module on one of the k GPUs, in layer order, none
    offloaded to the CPU or disk, each GPU holding about 1/k of the weights."""
    from transformers.integrations.accelerate import _get_device_map

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_hf_config("llama", num_hidden_layers=8, vocab_size=64))
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    kwargs = placement_kwargs(CUDA0, 2, free_bytes=[size] * 2, weight_bytes=size)
    device_map = _get_device_map(model, kwargs["device_map"], kwargs["max_memory"], None)
    assert set(device_map.values()) == {0, 1}
    layers = [device_map.get(f"model.layers.{i}", device_map.get("model.layers")) for i in range(8)]
    assert layers == sorted(layers) and layers.count(0) >= 2 and layers.count(1) >= 2


# ------------------------------------------------------------------ load_model
@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """from_pretrained's keyword arguments, recorded; the load itself runs on the CPU."""
    calls: list[dict[str, Any]] = []
    original = AutoModelForCausalLM.from_pretrained

    def record(path: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return original(path, **{k: v for k, v in kwargs.items() if k not in ("device_map", "max_memory")})

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", record)
    return calls


def test_a_directory_streams_to_its_gpu_in_the_compute_dtype(qwen2_dir: Path, captured: list[dict[str, Any]]) -> None:
    loaded = load_model(qwen2_dir, dtype=torch.bfloat16, device="cuda:0", cache=False)
    assert captured[-1]["device_map"] == {"": "cuda:0"} and captured[-1]["dtype"] == torch.bfloat16
    assert "cuda:0" in loaded.source


def test_a_directory_spreads_over_k_gpus(
    qwen2_dir: Path, captured: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    asked: list[list[int]] = []
    monkeypatch.setattr(device_module, "free_gpu_bytes", lambda used: asked.append(list(used)) or {0: GB, 1: GB})
    loaded = load_model(qwen2_dir, device="cuda", cache=False, gpus=2)
    assert captured[-1]["device_map"] == "balanced" and set(captured[-1]["max_memory"]) == {0, 1}
    assert "2 GPUs" in loaded.source and asked == [[0, 1]]  # only the GPUs used are asked (a CUDA context each)


def test_the_cpu_load_is_the_plain_from_pretrained_one(qwen2_dir: Path, captured: list[dict[str, Any]]) -> None:
    """On the CPU nothing changes: no device_map, the same weights and logits as a bare from_pretrained."""
    loaded = load_model(qwen2_dir, cache=False)
    assert "device_map" not in captured[-1]
    plain = AutoModelForCausalLM.from_pretrained(qwen2_dir).eval()
    assert {t.device.type for t in loaded.model.parameters()} == {"cpu"}
    with torch.inference_mode():
        torch.testing.assert_close(loaded.model(TOKENS).logits, plain(TOKENS).logits, rtol=0, atol=0)


def test_bad_gpus_and_a_spread_gguf_are_errors(qwen2_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"gpus \(the GPUs a model is spread over\) must be a positive int, got 0"):
        load_model(qwen2_dir, gpus=0)
    with pytest.raises(ConfigError, match=r"gpus=2: only CUDA devices spread a model over GPUs, got device 'cpu'"):
        load_model(qwen2_dir, gpus=2, cache=False)
    gguf = write_qwen2_gguf(tiny_model("qwen2", seed=2), tmp_path / "tiny.F32.gguf")
    with pytest.raises(ConfigError, match=r"gpus=2: .*tiny\.F32\.gguf' is a GGUF, which loads on one device"):
        load_model(gguf, device="cuda", gpus=2)


# ------------------------------------------------------------------ on real GPUs (skipped without)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


@needs_cuda
def test_a_directory_loads_onto_the_gpu_in_its_dtype(qwen2_dir: Path) -> None:
    """Every parameter and buffer on cuda:0 in the load dtype; fp32 logits equal the CPU load's."""
    bf16 = load_model(qwen2_dir, dtype=torch.bfloat16, device="cuda:0", cache=False).model
    assert {(p.device.type, p.dtype) for p in bf16.parameters()} == {("cuda", torch.bfloat16)}
    fp32 = load_model(qwen2_dir, device="cuda:0", cache=False).model
    assert {b.device.type for b in fp32.buffers()} == {"cuda"}
    cpu = load_model(qwen2_dir, cache=False).model
    with torch.inference_mode():
        torch.testing.assert_close(fp32(TOKENS.cuda()).logits.cpu(), cpu(TOKENS).logits, rtol=1e-4, atol=1e-4)


@needs_two_gpus
def test_a_parent_spread_over_two_gpus_scores_and_prunes_like_one_on_the_cpu(tmp_path: Path) -> None:
    """load_model(gpus=2) puts layers on both GPUs; importance runs on it; the child materialised
    from it is spread the same way and computes the CPU child's logits."""
    from autocompress_opt.hf.adapters import adapter_for
    from autocompress_opt.prune.importance import estimate_importance
    from autocompress_opt.prune.plan import plan_pruning
    from autocompress_opt.prune.slicing import materialize

    path = save_hf_dir(tiny_model("qwen2", seed=4, num_hidden_layers=4), tmp_path / "qwen2-4")
    spread, cpu = load_model(path, device="cuda:0", gpus=2, cache=False), load_model(path, cache=False)
    assert set(spread.model.hf_device_map.values()) == {0, 1}
    scores = estimate_importance(spread.model, TOKENS, model_id="spread", progress=False)
    arch = cpu.architecture
    layer = replace(arch.layers[0], num_heads=2, num_kv_heads=1, ffn_width=24)  # one KV group, 2 heads
    plan = plan_pruning(arch, scores, replace(arch, hidden_size=24, layers=(layer,) * 3))  # 3 of 4 layers
    child = materialize(spread.model, plan)
    assert {p.device.index for p in child.parameters()} == {0, 1}
    reference = materialize(cpu.model, plan)
    with torch.inference_mode():
        torch.testing.assert_close(child(TOKENS.cuda()).logits.cpu(), reference(TOKENS).logits, rtol=1e-4, atol=1e-4)
    assert adapter_for(child).architecture(child) == adapter_for(reference).architecture(reference)
