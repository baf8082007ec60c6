"""The one-shot verbs load the parent once and keep no cached copy beside it (``load_model(cache=False)``):
``prune`` and ``eval`` (with ``--parent``) hold one copy of each model, not two."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tiny_lm import save_hf_dir, tiny_model

from autocompress_opt.cli import main
from autocompress_opt.hf import loading


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf_dir(tiny_model("qwen2", seed=3), tmp_path_factory.mktemp("one-copy") / "qwen2")


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """load_model's keyword arguments, recorded (the load itself runs)."""
    calls: list[dict[str, Any]] = []
    original = loading.load_model

    def record(ref: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return original(ref, **kwargs)

    monkeypatch.setattr(loading, "load_model", record)
    loading.clear_model_cache()
    return calls


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "--model", "{dir}", "--parent", "{dir}", "--samples", "2", "--seq-len", "16", "--no-progress"],
        [
            "prune",
            "--model",
            "{dir}",
            "--params",
            "0.9",
            "--samples",
            "2",
            "--seq-len",
            "16",
            "--out",
            "{tmp}/out",
            "--cache-dir",
            "{tmp}/cache",
            "--no-progress",
        ],
    ],
    ids=["eval", "prune"],
)
def test_one_shot_verbs_keep_no_cached_copy(
    argv: list[str], model_dir: Path, tmp_path: Path, loads: list[dict[str, Any]]
) -> None:
    assert main([a.format(dir=model_dir, tmp=tmp_path) for a in argv]) == 0
    assert loads and all(call.get("cache") is False for call in loads)
    assert loading._load_cached.cache_info().currsize == 0
