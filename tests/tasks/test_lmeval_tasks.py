"""tasks.lmeval_tasks and ``eval --tasks lm-eval:NAMES``: lm-eval's own tasks by name, users' task
YAMLs (``--lm-eval-include``), scores checked against a hand computation on a tiny random model,
and the one-line errors for an unknown name and a dataset that cannot be fetched offline."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from tiny_lm import byte_tokenizer, save_hf_dir, tiny_model

import autocompress_opt.hf.hub as hub
from autocompress_opt.cli import main
from autocompress_opt.errors import ConfigError

# lm-eval is imported only by the tests that need it: the import alone takes 5-25 s
needs_lmeval = pytest.mark.skipif(
    importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed (pip install 'lm-eval>=0.4.13')"
)

# a, b -> "a plus b is" with the sum among three choices; the gold index varies
QUESTIONS = [(1, 2, 0), (3, 4, 1), (2, 2, 2), (5, 1, 0), (6, 3, 1), (4, 4, 2)]


def _rows(shift: int = 0) -> list[dict[str, Any]]:
    rows = []
    for a, b, gold in QUESTIONS:
        a += shift
        wrong = [str(a * b + 3), str(a + b + 11)]
        choices = wrong[:gold] + [str(a + b)] + wrong[gold:]
        rows.append({"question": f"{a} plus {b} is", "choices": choices, "answer": gold})
    return rows


def _write_task(folder: Path, name: str, rows: list[dict[str, Any]], **extra: Any) -> None:
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}, "cache_dir": str(folder / "hf-cache")},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "{{question}}",
        "doc_to_choice": "choices",
        "doc_to_target": "answer",
        "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}],
        **extra,
    }
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    tok = byte_tokenizer()
    tok.add_special_tokens({"eos_token": "<|endoftext|>"})  # id 256, inside the model's 260 ids
    return tok


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_model("llama", seed=0)


def by_hand(model: Any, tokenizer: Any, rows: list[dict[str, Any]]) -> tuple[list[bool], list[bool]]:
    """(acc, acc_norm) per document, independently of lm-eval: the context is the question, each
    continuation " " + choice (lm-eval's default target_delimiter); the log-likelihood is the sum of
    log-softmax over the continuation's tokens; acc_norm divides it by the choice's characters."""
    acc, acc_norm = [], []
    for row in rows:
        context = tokenizer.encode(row["question"])
        lls = []
        for choice in row["choices"]:
            cont = tokenizer.encode(" " + choice)
            ids = torch.tensor([context + cont])
            with torch.no_grad():
                logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)  # (time, vocab)
            lls.append(sum(logprobs[len(context) - 1 + k, t].item() for k, t in enumerate(cont)))
        norm = [ll / len(c) for ll, c in zip(lls, row["choices"])]
        acc.append(max(range(len(lls)), key=lls.__getitem__) == row["answer"])
        acc_norm.append(max(range(len(norm)), key=norm.__getitem__) == row["answer"])
    return acc, acc_norm


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub unreachable, whatever this machine's network: the probe says so at once."""
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=hub.HUB_PROBE_TIMEOUT_S: False)


# ------------------------------------------------------------------------------ the CLI, end to end
@needs_lmeval
@pytest.mark.slow  # imports lm-eval (5-25 s) and runs it
def test_an_included_task_is_scored_as_computed_by_hand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: Any, tokenizer: Any
) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    rows = _rows()
    _write_task(tasks, "my_task", rows)
    directory = save_hf_dir(model, tmp_path / "tiny", tokenizer=tokenizer)
    out_file = tmp_path / "report.json"
    common = ("eval", "--model", str(directory), "--tasks", "lm-eval:my_task", "--lm-eval-include", str(tasks))
    code, _, _ = run_cli(capsys, *common, "--no-progress", "--out", str(out_file))
    assert code == 0
    report = json.loads(out_file.read_text())["lm_eval"]
    scores = {s["metric"]: s for s in report["scores"]}
    acc, acc_norm = by_hand(model, tokenizer, rows)
    assert scores["acc"]["value"] == pytest.approx(sum(acc) / 6) and scores["acc"]["n"] == 6
    assert scores["acc_norm"]["value"] == pytest.approx(sum(acc_norm) / 6)
    p = sum(acc) / 6
    assert scores["acc"]["stderr"] == pytest.approx((p * (1 - p) / 5) ** 0.5)  # lm-eval: sample stderr, n - 1
    assert scores["acc"]["task"] == "my_task" and scores["acc"]["requested"] and scores["acc"]["num_fewshot"] == 0
    assert report["requested"] == ["my_task"] and report["limit"] is None
    assert "my_task" not in json.loads(out_file.read_text())  # no built-in suite ran


@needs_lmeval
@pytest.mark.slow  # imports lm-eval: 5-25 s
def test_a_dataset_that_cannot_be_fetched_offline_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task on a Hub dataset that is not cached: exit 2 at once (no retries), before any model loads."""
    offline(monkeypatch)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    _write_task(tasks, "hub_task", [], dataset_path="autocompress-tests/no-such-dataset", dataset_kwargs=None)
    directory = save_hf_dir(tiny_model("llama"), tmp_path / "tiny")
    capsys.readouterr()  # the save's progress bars
    code, _, err = run_cli(
        capsys,
        "eval",
        "--model",
        str(directory),
        "--tasks",
        "lm-eval:hub_task",
        "--lm-eval-include",
        str(tasks),
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "lm-eval task 'hub_task': could not fetch its dataset 'autocompress-tests/no-such-dataset'" in err
    assert "cannot be reached" in err


@needs_lmeval
@pytest.mark.slow  # indexes lm-eval's ~15k bundled task YAMLs: 20-30 s on 2 shared cores
def test_a_bundled_benchmark_offline_names_its_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    offline(monkeypatch)
    from datasets import config
    from huggingface_hub import constants

    monkeypatch.setattr(config, "HF_DATASETS_CACHE", tmp_path / "datasets")  # empty caches, whatever this machine has
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    directory = save_hf_dir(tiny_model("llama"), tmp_path / "tiny")
    capsys.readouterr()
    code, _, err = run_cli(capsys, "eval", "--model", str(directory), "--tasks", "lm-eval:mmlu,arc_easy")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "lm-eval task 'mmlu': could not fetch its dataset 'cais/mmlu'" in err


@needs_lmeval
@pytest.mark.slow  # indexes lm-eval's ~15k bundled task YAMLs
def test_an_unknown_lmeval_task_suggests_the_closest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = save_hf_dir(tiny_model("llama"), tmp_path / "tiny")
    code, _, err = run_cli(capsys, "eval", "--model", str(directory), "--tasks", "lm-eval:hellaswg")
    assert code == 2 and "unknown lm-eval task 'hellaswg' — did you mean 'hellaswag'?" in err
    assert "lm-eval ls tasks" in err


# -------------------------------------------------------------------------------- the library
@needs_lmeval
@pytest.mark.slow  # imports and runs lm-eval
def test_a_group_reports_its_members_and_their_weighted_mean(tmp_path: Path, model: Any, tokenizer: Any) -> None:
    from autocompress_opt.tasks.lmeval_tasks import evaluate_lmeval_tasks, load_lmeval_tasks

    _write_task(tmp_path, "part_a", _rows())
    _write_task(tmp_path, "part_b", _rows(shift=10))
    group = {
        "group": "my_group",
        "task": ["part_a", "part_b"],
        "aggregate_metric_list": [{"metric": "acc", "weight_by_size": True}],
    }
    (tmp_path / "my_group.yaml").write_text(yaml.safe_dump(group), encoding="utf-8")
    loaded = load_lmeval_tasks(["my_group"], include=[tmp_path])
    assert loaded.names == ("my_group",) and loaded.top == ("my_group",) and loaded.include == (str(tmp_path),)
    report = evaluate_lmeval_tasks(model, tokenizer, loaded, limit=4, batch_size=5)
    acc = {(s.task, s.metric): s for s in report.scores}
    by_a, _ = by_hand(model, tokenizer, _rows()[:4])
    by_b, _ = by_hand(model, tokenizer, _rows(shift=10)[:4])
    assert acc["part_a", "acc"].value == pytest.approx(sum(by_a) / 4) and acc["part_a", "acc"].n == 4
    assert acc["part_b", "acc"].value == pytest.approx(sum(by_b) / 4)
    g = acc["my_group", "acc"]
    assert (g.kind, g.n, g.requested) == ("group", 8, True) and g.value == pytest.approx((sum(by_a) + sum(by_b)) / 8)
    assert not acc["part_a", "acc"].requested and report.limit == 4


@needs_lmeval
@pytest.mark.slow  # imports lm-eval: 5-25 s
def test_an_unknown_name_among_included_tasks_suggests_the_closest(tmp_path: Path) -> None:
    from lm_eval.tasks import TaskManager

    from autocompress_opt.tasks.lmeval_tasks import _resolve

    _write_task(tmp_path, "my_task", _rows())
    _write_task(tmp_path, "my_other_task", _rows())
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    with pytest.raises(ConfigError, match="unknown lm-eval task 'my_tsk' — did you mean 'my_task'\\?"):
        _resolve(["my_tsk"], manager)
    assert _resolve(["my_*", "my_task"], manager) == ["my_other_task", "my_task"]  # globs, duplicates once
    with pytest.raises(ConfigError, match="pattern 'zz_\\*' matches none"):
        _resolve(["zz_*"], manager)


def test_an_include_that_is_not_a_folder_is_refused(tmp_path: Path) -> None:
    from autocompress_opt.tasks.lmeval_tasks import load_lmeval_tasks

    with pytest.raises(ConfigError, match="--lm-eval-include .*missing.* is not a directory"):
        load_lmeval_tasks(["x"], include=[tmp_path / "missing"])


# ------------------------------------------------------------------------------ --tasks parsing
@pytest.mark.parametrize(
    ("text", "ours", "theirs"),
    [
        ("lm-eval:mmlu,arc_challenge,hellaswag", [], ["mmlu", "arc_challenge", "hellaswag"]),
        ("bible-cloze, lm-eval:arc_easy", ["bible-cloze"], ["arc_easy"]),
        ("lm-eval:mmlu_*", [], ["mmlu_*"]),
    ],
)
def test_tasks_split_into_ours_and_lmevals(text: str, ours: list[str], theirs: list[str]) -> None:
    from autocompress_opt.cli.eval import _split_tasks

    assert _split_tasks(text) == (ours, theirs)


def test_all_and_lmeval_tasks_mix(tmp_path: Path) -> None:
    from autocompress_opt.cli.eval import _split_tasks
    from autocompress_opt.tasks.builders import TASK_NAMES

    assert _split_tasks("all,lm-eval:arc_easy") == (list(TASK_NAMES), ["arc_easy"])
    with pytest.raises(ConfigError, match="'lm-eval:' needs a task name"):
        _split_tasks("lm-eval:")


def test_lmeval_include_without_lmeval_tasks_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = save_hf_dir(tiny_model("llama"), tmp_path / "tiny")
    code, _, err = run_cli(capsys, "eval", "--model", str(directory), "--lm-eval-include", str(tmp_path))
    assert code == 2 and "--lm-eval-include applies to --tasks lm-eval:NAME" in err
    code, _, err = run_cli(
        capsys, "eval", "--model", str(directory), "--tasks", "bible-cloze", "--lm-eval-include", str(tmp_path)
    )
    assert code == 2 and "name them in --tasks lm-eval:NAME" in err


# --------------------------------------------------------------------------------------- the Hub
def test_the_hub_probe_says_unreachable_at_once_and_offline_mode_is_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    from datasets import config as datasets_config
    from huggingface_hub import constants

    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets_config, "HF_HUB_OFFLINE", False)
    assert hub.hub_reachable(timeout_s=1.0) is False
    with hub.hub_offline_unless_reachable(timeout_s=1.0) as is_offline:
        assert is_offline and constants.HF_HUB_OFFLINE and datasets_config.HF_HUB_OFFLINE
    assert not constants.HF_HUB_OFFLINE and not datasets_config.HF_HUB_OFFLINE
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert hub.hub_reachable() is True  # through a proxy: a direct probe would say nothing
