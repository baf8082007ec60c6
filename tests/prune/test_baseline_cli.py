"""``autocompress prune --baseline minitron|depth|best-uniform``: argument checks before anything loads,
and the whole path on a tiny model (choose under a target, print why, export, record in the card)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from tiny_families import tiny_model

from autocompress_opt.cli import main
from autocompress_opt.hf.adapters import adapter_for
from autocompress_opt.prune.baselines import INFEASIBLE_WITHIN_LIMITS
from autocompress_opt.prune.export import CARD_FILE, load_exported

# The tiny model's costs are fixed overheads; these relative limits leave room for a cut model only.
RELAXED = ["--max-ttft-ms", "0.9x", "--max-tpot-ms", "0.9x", "--max-memory-gib", "1x"]


def prune_argv(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "prune",
        "--model",
        "tiny",
        "--out",
        str(tmp_path / "out"),
        "--samples",
        "2",
        "--seq-len",
        "8",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-progress",
        *extra,
    ]


@pytest.fixture
def no_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model fails the test: the argument checks must come first."""

    def load_model(ref: str, **kw: Any) -> Any:
        raise AssertionError(f"load_model({ref!r}) ran before the arguments were checked")

    monkeypatch.setattr("autocompress_opt.hf.loading.load_model", load_model)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--baseline", "depth"], "--baseline depth needs --hardware and --workload"),
        (["--baseline", "minitron", "--hardware", "rtx5080"], "needs --workload"),
        (["--baseline", "depth", "--hardware", "rtx9090", "--workload", "local-coding"], "unknown hardware 'rtx9090'"),
        (["--baseline", "depth", "--hardware", "rtx5080", "--workload", "chat"], "unknown workload 'chat'"),
        (
            ["--baseline", "depth", "--hardware", "rtx5080", "--workload", "local-coding", "--engine", "ollama"],
            "unknown .*engine 'ollama'",
        ),
        (
            ["--baseline", "best-uniform", "--hardware", "rtx5080", "--workload", "local-coding", "--top-k", "0"],
            "--top-k must be a positive int, got 0",
        ),
        (
            ["--baseline", "minitron", "--hardware", "b200", "--workload", "datacenter", "--score-samples", "-1"],
            "--score-samples must be a non-negative int, got -1",
        ),
        (
            ["--params", "0.6", "--hardware", "rtx5080", "--top-k", "3"],
            "--hardware, --top-k only apply with --baseline",
        ),
    ],
)
def test_bad_baseline_arguments_fail_before_the_model_loads(
    no_loading: None, tmp_path: Path, capsys: Any, extra: list[str], message: str
) -> None:
    assert main(prune_argv(tmp_path, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("autocompress prune: error:")
    assert re.search(message, err), err


def test_baseline_choices_are_checked_by_argparse(no_loading: None, tmp_path: Path, capsys: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        main(prune_argv(tmp_path, "--baseline", "shortgpt", "--hardware", "rtx5080", "--workload", "local-coding"))
    assert exc.value.code == 2 and "invalid choice: 'shortgpt'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one mode at a time
        main(prune_argv(tmp_path, "--baseline", "depth", "--params", "0.6"))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama of :mod:`tiny_families` (3 layers, hidden 48, 6 query heads in 2 KV groups, FFN 48)
    saved with a byte tokenizer: ``--baseline`` reads the study's text (importance, choice rows)."""
    from tiny_lm import VOCAB, save_hf_dir

    model = tiny_model("llama", vocab_size=VOCAB, max_position_embeddings=128)
    return save_hf_dir(model, tmp_path_factory.mktemp("baseline-cli") / "tiny-llama")


def baseline_argv(tmp_path: Path, tiny_dir: Path, *extra: str) -> list[str]:
    """``prune --baseline ...`` of the saved tiny llama, its candidates scored on choice rows of 32 tokens."""
    argv = prune_argv(tmp_path, *extra, "--inner", "seq_len=32", "--inner", "eval_seq_len=32")
    argv[argv.index("tiny")] = str(tiny_dir)
    return argv


def test_depth_baseline_exports_the_deepest_feasible_full_width_model(
    tiny_dir: Path, tmp_path: Path, capsys: Any
) -> None:
    argv = baseline_argv(
        tmp_path, tiny_dir, "--baseline", "depth", "--hardware", "rtx5080", "--workload", "local-coding", *RELAXED
    )
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "target: rtx5080 / local-coding" in out and "depth: chose 1L h48 ffn48 kv2x3" in out and "wrote" in out
    model = load_exported(tmp_path / "out")
    arch = adapter_for(model).architecture(model)
    assert arch.num_layers == 1 and arch.hidden_size == 48 and arch.layers[0].num_heads == 6
    card = json.loads((tmp_path / "out" / CARD_FILE).read_text())
    recipe = card["extra"]["recipe"]
    assert recipe["mode"] == "baseline" and recipe["baseline"] == "depth"
    assert recipe["layer_metric"] == "block_influence" and recipe["target"]["hardware"] == "rtx5080"
    assert recipe["search"]["choice"] == {
        "num_layers": 1,
        "hidden_size": 48,
        "ffn_width": 48,
        "num_kv_heads": 2,
        "q_per_kv": 3,
    }
    assert recipe["search"]["layer_order"] == "block_influence importance"


def test_minitron_baseline_scores_candidates_and_reports_the_lifted_search(
    tiny_dir: Path, tmp_path: Path, capsys: Any
) -> None:
    """The tiny model cannot meet the target inside Minitron's limits (it must lose 2 of 3 layers):
    the CLI prints that finding, searches with the limits lifted, scores the top K by KL and exports
    the lowest."""
    argv = baseline_argv(
        tmp_path,
        tiny_dir,
        "--baseline",
        "minitron",
        "--hardware",
        "rtx5080",
        "--workload",
        "local-coding",
        *RELAXED,
        "--top-k",
        "3",
        "--score-samples",
        "2",
    )
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert INFEASIBLE_WITHIN_LIMITS in out and "searched again with the limits lifted" in out
    assert "the lowest score" in out
    search = json.loads((tmp_path / "out" / CARD_FILE).read_text())["extra"]["recipe"]["search"]
    assert search["lifted_from"].startswith(INFEASIBLE_WITHIN_LIMITS) and search["ranked_by"] == "score"
    scores = [c["score"] for c in search["candidates"]]
    assert len(scores) == 3 and all(s > 0 for s in scores) and search["score"] == min(scores)
    model = load_exported(tmp_path / "out")
    assert adapter_for(model).architecture(model).num_params == search["num_params"]


def test_nothing_feasible_is_reported_and_nothing_is_written(tiny_dir: Path, tmp_path: Path, capsys: Any) -> None:
    """The workload's own limits (TTFT 0.6x the parent's) are out of reach of the tiny model."""
    argv = baseline_argv(
        tmp_path, tiny_dir, "--baseline", "best-uniform", "--hardware", "rtx5080", "--workload", "local-coding"
    )
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "best-uniform: no uniform candidate of the 162 meets the constraints" in captured.out
    assert "nothing exported" in captured.err and not (tmp_path / "out").exists()
