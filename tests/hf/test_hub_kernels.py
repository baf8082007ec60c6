"""Hub kernels stay off in every model load of the toolkit unless the user turns them on.

transformers kernelizes a model ``from_pretrained`` loads when the ``kernels`` package is installed
(``set_use_kernels(True)``): on a GPU that downloads kernels from the Hub. These tests record what
each load asks of ``PreTrainedModel.set_use_kernels`` on tiny random models built from a config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tiny_lm import save_hf_dir, tiny_model, write_qwen2_gguf
from transformers import PreTrainedModel

from autocompress_opt.hf.hub import hub_kernel_kwargs, hub_kernels_requested
from autocompress_opt.hf.loading import load_model
from autocompress_opt.prune.export import load_exported


@pytest.fixture
def kernel_requests(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every ``use_kernels`` value a load passes to ``set_use_kernels``, with ``USE_HUB_KERNELS`` unset."""
    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    requests: list[bool] = []
    original = PreTrainedModel.set_use_kernels

    def record(self: Any, use_kernels: Any, *args: Any, **kwargs: Any) -> Any:
        requests.append(bool(use_kernels))
        return original(self, use_kernels, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "set_use_kernels", record)
    return requests


@pytest.mark.parametrize("offline", [False, True])
def test_load_model_never_turns_hub_kernels_on(
    kernel_requests: list[bool], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: bool
) -> None:
    """A Hugging Face directory and a GGUF, online or with HF_HUB_OFFLINE: kernels off, the model's flag too."""
    if offline:  # the variable, and the flag huggingface_hub and kernels read once imported
        from huggingface_hub import constants

        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    directory = save_hf_dir(tiny_model("qwen2", seed=3), tmp_path / "qwen2")
    gguf = write_qwen2_gguf(tiny_model("qwen2", seed=3), tmp_path / "tiny.F32.gguf")
    for source in (directory, gguf):
        loaded = load_model(source, cache=False)
        assert loaded.model.use_kernels is False
    assert kernel_requests and not any(kernel_requests)


def test_load_exported_never_turns_hub_kernels_on_unless_asked(kernel_requests: list[bool], tmp_path: Path) -> None:
    """An exported checkpoint loads with kernels off; an explicit ``use_kernels`` keyword still wins."""
    out = save_hf_dir(tiny_model("qwen2", seed=4), tmp_path / "child")
    assert load_exported(out).use_kernels is False
    assert kernel_requests == [False]
    captured: dict[str, Any] = {}

    def capture(directory: Any, **kwargs: Any) -> Any:
        captured.update(kwargs)
        raise RuntimeError("stop")

    with pytest.MonkeyPatch.context() as patch:
        from transformers import AutoModelForCausalLM

        patch.setattr(AutoModelForCausalLM, "from_pretrained", capture)
        with pytest.raises(RuntimeError, match="stop"):
            load_exported(out, use_kernels=True)
    assert captured["use_kernels"] is True


@pytest.mark.parametrize(
    ("value", "on"),
    [(None, False), ("", False), ("0", False), ("no", False), ("off", False), ("1", True), ("YES", True), ("on", True)],
)
def test_only_a_true_use_hub_kernels_leaves_the_choice_to_transformers(
    monkeypatch: pytest.MonkeyPatch, value: str | None, on: bool
) -> None:
    """USE_HUB_KERNELS in transformers' true spelling → no keyword (transformers reads the same variable,
    so the user's setting stands); unset or false → ``use_kernels=False``."""
    if value is None:
        monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    else:
        monkeypatch.setenv("USE_HUB_KERNELS", value)
    assert hub_kernels_requested() is on
    assert hub_kernel_kwargs() == ({} if on else {"use_kernels": False})
