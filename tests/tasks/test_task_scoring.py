"""tasks.scoring: lm-eval-equivalent log-likelihood scoring on a tiny random model, the suite report,
the paired bootstrap, the lm-eval evaluator's agreement and the ``eval --tasks`` CLI."""

from __future__ import annotations

import json
import math
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from tiny_families import BUILDERS as ADAPTER_MODELS
from tiny_lm import byte_tokenizer, save_hf_dir, tiny_model

import autocompress_opt.tasks as tasks_package
from autocompress_opt.cli import main
from autocompress_opt.errors import ConfigError, UnknownNameError
from autocompress_opt.tasks.items import Item, TaskSpec
from autocompress_opt.tasks.scoring import (
    EVALUATORS,
    ItemResult,
    SuiteReport,
    encode_pair,
    evaluate_tasks,
    loglikelihoods,
    paired_bootstrap,
    score_task,
    seeded_bootstrap,
)

PAIRS = [
    ("The cat sat on the", " mat"),
    ("A", " b"),
    ("Once upon a time there was a", " little prince who"),
    ("x = 1 +", " 2"),
    ("trailing space ", "word"),
    ("", "empty context"),
    ("def f(x):\n", "    return x"),
]


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_model("llama", seed=0)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """Byte-level, no BOS added (like SmolLM2's), with an EOS that stands in for an empty context."""
    tok = byte_tokenizer()
    tok.add_special_tokens({"eos_token": "<|endoftext|>"})  # id 256, inside the model's 260 ids
    return tok


@pytest.fixture(scope="module")
def bos_tokenizer() -> Any:
    """Byte-level, prepends ``<s>`` (id 256) to every encoding, like Llama-2's."""
    return byte_tokenizer(bos=True)


def by_hand(model: Any, tokenizer: Any, context: str, continuation: str) -> tuple[float, bool]:
    """One unbatched forward of ctx + cont; sum log-probs of the continuation tokens; greedy check."""
    ctx, cont = encode_pair(tokenizer, context, continuation)
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        log_probs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)  # (T, V)
    positions = range(len(ctx) - 1, len(ctx) + len(cont) - 1)  # position t predicts token t + 1
    ll = sum(float(log_probs[p, t]) for p, t in zip(positions, cont))
    return ll, all(int(log_probs[p].argmax()) == t for p, t in zip(positions, cont))


def mc_items(n: int = 6) -> tuple[Item, ...]:
    return tuple(
        Item(
            task="numbers",
            id=f"n{k}",
            context=f"The number {k} is",
            choices=(" odd", " even", " a prime number"),
            gold=k % 3,
        )
        for k in range(n)
    )


# ---------------------------------------------------------------- tokenising
def test_encode_pair_moves_trailing_whitespace_onto_the_continuation(tokenizer: Any) -> None:
    """lm-eval's _encode_pair: "a b " + "c" scores " c" after "a b" (byte ids: a=97, space=32)."""
    assert encode_pair(tokenizer, "a b ", "c") == ([97, 32, 98], [32, 99])
    assert encode_pair(tokenizer, "a\n", "b") == ([97], [10, 98])


def test_encode_pair_keeps_the_tokenizers_bos_on_the_context_only(bos_tokenizer: Any) -> None:
    assert encode_pair(bos_tokenizer, "ab", " c") == ([256, 97, 98], [32, 99])


def test_empty_context_is_replaced_by_bos_or_eos(tokenizer: Any, bos_tokenizer: Any) -> None:
    assert encode_pair(tokenizer, "", "hi") == ([256], [104, 105])  # EOS: this tokenizer has no BOS
    assert encode_pair(bos_tokenizer, "", "hi") == ([256], [104, 105])


def test_a_continuation_without_tokens_is_refused(tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match="has no tokens"):
        encode_pair(tokenizer, "abc", "")


# ----------------------------------------------------------- log-likelihoods
@pytest.mark.parametrize("tok", ["tokenizer", "bos_tokenizer"])
def test_loglikelihoods_equal_a_plain_forward_and_log_softmax(model: Any, tok: str, request: Any) -> None:
    tokenizer = request.getfixturevalue(tok)
    got = loglikelihoods(model, tokenizer, PAIRS, batch_size=3, progress=False)
    for (ctx, cont), (ll, greedy) in zip(PAIRS, got):
        want_ll, want_greedy = by_hand(model, tokenizer, ctx, cont)
        assert ll == pytest.approx(want_ll, rel=1e-5), (ctx, cont)
        assert greedy == want_greedy


def test_padded_batches_equal_unbatched(model: Any, tokenizer: Any) -> None:
    """Right padding is invisible to a causal model: batch 4 (ragged) gives batch 1's numbers."""
    single = loglikelihoods(model, tokenizer, PAIRS, batch_size=1, progress=False)
    batched = loglikelihoods(model, tokenizer, PAIRS, batch_size=4, progress=False)
    torch.testing.assert_close(
        torch.tensor([ll for ll, _ in batched], dtype=torch.float64),
        torch.tensor([ll for ll, _ in single], dtype=torch.float64),
        rtol=1e-5,
        atol=1e-5,
    )
    assert [g for _, g in batched] == [g for _, g in single]


class _ModuloTokenizer:
    """One token per character, ids 1..96 (inside test_adapters' vocabulary of 97); EOS 0, no BOS."""

    bos_token_id, eos_token_id = None, 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1 + ord(c) % 96 for c in text]

    def decode(self, ids: int | list[int]) -> str:
        return "</s>" if ids == 0 else "".join(chr(i) for i in ids)


@pytest.mark.parametrize("family", sorted(ADAPTER_MODELS))
def test_shared_context_equals_whole_requests_in_every_family(family: str) -> None:
    """The choices of an item run their context once through a KV cache: same numbers as running each
    (context, choice) whole, and as the hand computation, in every supported family — Gemma 3's
    4-token sliding window and the heterogeneous export (attention-free layers) included."""
    model, tokenizer = ADAPTER_MODELS[family]().eval(), _ModuloTokenizer()
    pairs = [
        (f"Question {k}: what is it? The answer is", choice)
        for k in range(2)
        for choice in (" a", " bb", " a much longer answer")
    ] + [("one", " x"), ("one", " y")]
    whole = loglikelihoods(model, tokenizer, pairs, share_context=False, batch_size=3, progress=False)
    shared = loglikelihoods(model, tokenizer, pairs, share_context=True, progress=False)
    for (ctx, cont), (ll_whole, greedy_whole), (ll_shared, greedy_shared) in zip(pairs, whole, shared):
        hand_ll, hand_greedy = by_hand(model, tokenizer, ctx, cont)
        assert ll_shared == pytest.approx(hand_ll, rel=1e-5) and ll_whole == pytest.approx(hand_ll, rel=1e-5)
        assert greedy_shared == greedy_whole == hand_greedy


def test_long_inputs_are_cut_from_the_left(model: Any, tokenizer: Any) -> None:
    """lm-eval: the input is (ctx + cont)[-(max_length + 1):][:-1], so only the last 16 tokens matter."""
    context, continuation = "0123456789" * 5, " tail"
    ll, _ = loglikelihoods(model, tokenizer, [(context, continuation)], max_length=16, progress=False)[0]
    ids = (tokenizer.encode(context) + tokenizer.encode(continuation))[-17:]
    kept_context = tokenizer.decode(ids[:-5])  # 12 context tokens then the 5 continuation tokens
    assert ll == pytest.approx(by_hand(model, tokenizer, kept_context, continuation)[0], rel=1e-5)
    assert model.config.max_position_embeddings == 128  # the default limit: a 300-token input still scores
    assert math.isfinite(loglikelihoods(model, tokenizer, [("z" * 300, " end")], progress=False)[0][0])


def test_scoring_leaves_the_training_flag_alone(tokenizer: Any) -> None:
    fresh = tiny_model("llama", seed=0).train()
    loglikelihoods(fresh, tokenizer, PAIRS[:2], progress=False)
    assert fresh.training


# ------------------------------------------------------------------- metrics
def test_acc_and_acc_norm_are_argmaxes_of_the_logliks(model: Any, tokenizer: Any) -> None:
    spec = TaskSpec(name="numbers", metric="acc", items=mc_items(), chance=1 / 3)
    result = score_task(model, tokenizer, spec, batch_size=5, progress=False)
    for item, got in zip(spec.items, result.items):
        lls = [by_hand(model, tokenizer, item.context, c)[0] for c in item.choices]
        per_byte = [ll / len(c.encode("utf-8")) for ll, c in zip(lls, item.choices)]
        assert got.logliks_nats == pytest.approx(lls, rel=1e-5)
        assert (got.pred, got.pred_norm) == (int(np.argmax(lls)), int(np.argmax(per_byte)))
        assert (got.acc, got.acc_norm) == (got.pred == item.gold, got.pred_norm == item.gold)
    n_right = sum(r.acc for r in result.items)
    assert result.score == n_right / 6 and result.n == 6
    assert result.stderr == pytest.approx(math.sqrt(result.score * (1 - result.score) / 6))
    assert result.correct == [r.acc for r in result.items]


def test_acc_norm_can_disagree_with_acc() -> None:
    """-3 nats over 2 bytes (-1.5/byte) beats -4 nats in total but loses per byte to -4/9 (-0.44/byte)."""
    item = Item(task="t", id="i", context="c", choices=(" a", " abcdefgh"), gold=1)
    result = ItemResult.from_scores(item, [-3.0, -4.0], [False, False])
    assert (result.pred, result.pred_norm) == (0, 1)
    assert (result.acc, result.acc_norm) == (False, True)
    assert (result.correct("acc"), result.correct("acc_norm")) == (False, True)


def test_ties_go_to_the_lowest_index() -> None:
    item = Item(task="t", id="i", context="c", choices=(" x", " y", " z"), gold=2)
    assert ItemResult.from_scores(item, [-1.0, -1.0, -1.0], [False] * 3).pred == 0
    tied_late = ItemResult.from_scores(item, [-2.0, -1.0, -1.0], [False] * 3)
    assert (tied_late.pred, tied_late.pred_norm, tied_late.acc) == (1, 1, False)


def _greedy_continuation(model: Any, tokenizer: Any, context: str, n_tokens: int) -> str:
    """The model's own greedy continuation of ``context``, ``n_tokens`` bytes long."""
    ids = tokenizer.encode(context)
    with torch.no_grad():
        for _ in range(n_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return tokenizer.decode(ids[-n_tokens:])


def test_cloze_is_correct_exactly_when_greedy_decoding_reproduces_it(tokenizer: Any) -> None:
    model = tiny_model("llama", seed=0)
    with torch.no_grad():  # zero logits for every byte but a-z: the argmax is a letter (some letter's logit > 0)
        keep = torch.zeros(model.config.vocab_size, dtype=torch.bool)
        keep[ord("a") : ord("z") + 1] = True
        model.lm_head.weight[~keep] = 0.0
    greedy_a = _greedy_continuation(model, tokenizer, "ctx a:", 2)
    greedy_b = _greedy_continuation(model, tokenizer, "ctx b:", 2)
    assert greedy_a.isalpha() and greedy_b.isalpha() and len(greedy_b) == 2
    wrong_b = greedy_b[0] + ("A" if greedy_b[1] != "A" else "B")  # the last token is not the argmax
    items = (
        Item(task="c", id="a", context="ctx a:", choices=(greedy_a,), gold=0, kind="cloze"),
        Item(task="c", id="b", context="ctx b:", choices=(wrong_b,), gold=0, kind="cloze"),
    )
    result = score_task(model, tokenizer, TaskSpec(name="c", metric="greedy", items=items), progress=False)
    assert [r.is_greedy for r in result.items] == [True, False]
    assert result.score == 0.5 and result.correct == [True, False]


# ------------------------------------------------------------ the evaluators
def _lmeval_or_skip(name: str) -> None:
    if name == "lm-eval":
        pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'lm-eval>=0.4.13')")


@pytest.mark.parametrize("evaluator", EVALUATORS.names())
@pytest.mark.parametrize("tok", ["tokenizer", "bos_tokenizer"])
def test_every_evaluator_reproduces_the_hand_computed_scores(
    model: Any, evaluator: str, tok: str, request: Any
) -> None:
    """Conformance: each evaluator's per-choice log-likelihoods, greedy flags and verdicts equal the
    hand computation, on multiple-choice and cloze items; so lm-eval agrees with the built-in scorer."""
    _lmeval_or_skip(evaluator)
    tokenizer = request.getfixturevalue(tok)
    mc = TaskSpec(name="numbers", metric="acc_norm", items=mc_items(), chance=1 / 3)
    cloze = TaskSpec(
        name="cloze",
        metric="greedy",
        items=tuple(
            Item(task="cloze", id=f"c{k}", context=ctx, choices=(cont,), gold=0, kind="cloze")
            for k, (ctx, cont) in enumerate(PAIRS[:4])
        ),
    )
    for spec in (mc, cloze):
        got = EVALUATORS.get(evaluator)(model, tokenizer, spec, batch_size=4, progress=False)
        want = score_task(model, tokenizer, spec, batch_size=1, progress=False)
        assert got.evaluator == evaluator and got.n == len(spec.items)
        for item, mine, ref in zip(spec.items, got.items, want.items):
            hand = [by_hand(model, tokenizer, item.context, c) for c in item.choices]
            assert mine.logliks_nats == pytest.approx([ll for ll, _ in hand], rel=1e-5)
            assert mine.greedy == tuple(g for _, g in hand)
            assert (mine.acc, mine.acc_norm, mine.is_greedy) == (ref.acc, ref.acc_norm, ref.is_greedy)
        assert got.score == want.score


def test_lm_eval_evaluator_says_how_to_install_it(model: Any, tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # makes `import lm_eval` raise ImportError
    spec = TaskSpec(name="numbers", metric="acc", items=mc_items(1))
    with pytest.raises(ConfigError, match="pip install 'lm-eval"):
        EVALUATORS.get("lm-eval")(model, tokenizer, spec, progress=False)


# ----------------------------------------------------------------- the suite
class _FakeBuilders:
    """Stand-in for tasks.builders: "numbers" builds, "absent" lacks its source."""

    TASK_NAMES = ("numbers", "absent", "heldout-perplexity")
    TASK_METRICS: ClassVar[dict[str, str]] = {"numbers": "acc", "absent": "acc_norm"}

    def __init__(self) -> None:
        self.built: list[str] = []

    def build_task(self, name: str, *, n_items: int = 200, seed: int = 0, data_dir: Any = None) -> TaskSpec:
        from autocompress_opt.tasks.sources import MissingSourceError

        self.built.append(name)
        if name == "absent":
            raise MissingSourceError("fake-corpus", "not installed here", "apt-get install fake-corpus")
        return TaskSpec(
            name=name,
            metric="acc",
            items=mc_items(n_items),
            chance=1 / 3,
            seed=seed,
            source={"package": "numbers-data", "version": "1.0"},
        )

    def task_available(self, name: str, data_dir: Any = None) -> tuple[bool, str]:
        return (False, "apt-get install fake-corpus") if name == "absent" else (True, "")


@pytest.fixture()
def fake_builders(monkeypatch: pytest.MonkeyPatch) -> Iterator[_FakeBuilders]:
    fake = _FakeBuilders()
    module = types.ModuleType("autocompress_opt.tasks.builders")
    module.TASK_NAMES, module.TASK_METRICS = fake.TASK_NAMES, fake.TASK_METRICS
    module.build_task, module.task_available = fake.build_task, fake.task_available
    monkeypatch.setitem(sys.modules, "autocompress_opt.tasks.builders", module)
    monkeypatch.setattr(tasks_package, "builders", module, raising=False)
    yield fake


def test_a_missing_source_is_skipped_with_its_hint_and_never_scored(
    model: Any, tokenizer: Any, fake_builders: _FakeBuilders
) -> None:
    report = evaluate_tasks(model, tokenizer, ["absent", "numbers"], n_items=4, progress=False)
    assert [t.name for t in report.tasks] == ["numbers"] and report.averaged_tasks == ("numbers",)
    assert "apt-get install fake-corpus" in report.skipped["absent"]
    assert report.average_accuracy == report.tasks[0].score
    assert report.tasks[0].source == {"package": "numbers-data", "version": "1.0"}


def test_an_unknown_task_name_is_refused_with_a_suggestion(
    model: Any, tokenizer: Any, fake_builders: _FakeBuilders
) -> None:
    with pytest.raises(UnknownNameError, match="did you mean 'numbers'"):
        evaluate_tasks(model, tokenizer, ["numbrs"], progress=False)
    assert fake_builders.built == []


def test_suite_report_survives_a_json_round_trip(model: Any, tokenizer: Any, fake_builders: _FakeBuilders) -> None:
    report = evaluate_tasks(
        model,
        tokenizer,
        ["numbers", "absent", "heldout-perplexity"],
        n_items=3,
        progress=False,
        ppl_samples=1,
        ppl_seq_len=16,
    )
    assert report.heldout is not None and report.heldout.ppl_code > 0
    text = json.dumps(report.to_dict())
    back = SuiteReport.from_dict(json.loads(text))
    assert back.tasks == report.tasks and back.skipped == report.skipped
    assert json.dumps(back.to_dict()) == text
    assert json.loads(text)["tasks"][0]["correct"] == report.correct["numbers"]


# ------------------------------------------------------------- the bootstrap
def test_paired_bootstrap_interval_contains_the_true_difference() -> None:
    """Task 1: A right 70%, B 50% (true +20 points); task 2: both 40%: the average gains 10 points."""
    rng = np.random.default_rng(1)
    a = {"t1": list(rng.random(400) < 0.7), "t2": list(rng.random(300) < 0.4)}
    b = {"t1": list(rng.random(400) < 0.5), "t2": list(rng.random(300) < 0.4)}
    diff, lo, hi = paired_bootstrap(a, b, n_boot=2000, seed=0)
    by_hand = 100 * (np.mean(a["t1"]) - np.mean(b["t1"]) + np.mean(a["t2"]) - np.mean(b["t2"])) / 2
    assert diff == pytest.approx(by_hand) and lo < 10 < hi and lo < diff < hi
    assert paired_bootstrap(a, b, n_boot=2000, seed=0) == (diff, lo, hi)  # deterministic given the seed


def test_paired_bootstrap_of_identical_inputs_is_zero_width() -> None:
    a = {"t1": [True, False, True, True], "t2": [False, False, True]}
    assert paired_bootstrap(a, a, n_boot=500) == (0.0, 0.0, 0.0)


def test_paired_bootstrap_refuses_unpaired_inputs() -> None:
    with pytest.raises(ConfigError, match="different items"):
        paired_bootstrap({"t": [True, False]}, {"t": [True]})
    with pytest.raises(ConfigError, match="same non-empty set of tasks"):
        paired_bootstrap({"t": [True]}, {"u": [True]})


def test_seeded_bootstrap_with_one_run_each_is_the_paired_bootstrap() -> None:
    rng = np.random.default_rng(3)
    a = {"t1": list(rng.random(80) < 0.6), "t2": list(rng.random(50) < 0.5)}
    b = {"t1": list(rng.random(80) < 0.5), "t2": list(rng.random(50) < 0.5)}
    diff, lo, hi = seeded_bootstrap([a], [b], n_boot=4000, seed=0)
    pdiff, plo, phi = paired_bootstrap(a, b, n_boot=4000, seed=0)
    assert diff == pytest.approx(pdiff)
    assert (lo, hi) == pytest.approx((plo, phi), abs=1.5)  # same estimator, different random draws


def test_seeded_bootstrap_widens_with_the_spread_between_seeds() -> None:
    """A's three recovery seeds disagree (60/80/70 % on different items); with the same mean, the
    interval over items and seeds is wider than the one of A's pooled... single run."""
    rng = np.random.default_rng(5)
    n = 200
    b = {"t": list(rng.random(n) < 0.5)}
    a_runs = [{"t": list(rng.random(n) < p)} for p in (0.6, 0.8, 0.7)]
    diff, lo, hi = seeded_bootstrap(a_runs, [b], n_boot=4000, seed=0)
    expected = 100 * (np.mean([np.mean(r["t"]) for r in a_runs]) - np.mean(b["t"]))
    assert diff == pytest.approx(expected)
    assert lo < diff < hi
    one = [{"t": a_runs[2]["t"]}]
    _, lo1, hi1 = seeded_bootstrap(one, [b], n_boot=4000, seed=0)
    assert hi - lo > hi1 - lo1  # seed spread adds to the item spread
    same = seeded_bootstrap(a_runs, a_runs, n_boot=500, seed=0)
    assert same[0] == 0.0 and same[1] < 0 < same[2]  # runs resampled independently: not zero width


def test_seeded_bootstrap_pairs_continuous_values_over_rows() -> None:
    """Per-row KL (nats) of two models on the same rows, scale 1: the difference of the mean over
    domains (equal weights), by hand; a per-row shift shared by both models (hard rows) cancels, so
    the paired interval is far narrower than the spread of the rows and excludes zero."""
    rng = np.random.default_rng(7)
    hard = {d: rng.gamma(2.0, 1.0, size=64) for d in ("code", "prose")}  # row difficulty, sd ~1.4 nats
    b = {d: list(hard[d] + 0.5) for d in hard}
    a = {d: list(hard[d] + 0.4 + rng.normal(0, 0.05, size=64)) for d in hard}  # ~0.1 nats better
    diff, lo, hi = seeded_bootstrap([a], [b], n_boot=2000, seed=0, scale=1.0)
    expected = np.mean([np.mean(a[d]) - np.mean(b[d]) for d in hard])
    assert diff == pytest.approx(expected)
    assert -0.12 < lo < diff < hi < -0.08
    points = seeded_bootstrap([a], [b], n_boot=2000, seed=0)
    assert points == pytest.approx((100 * diff, 100 * lo, 100 * hi))  # the default scale is points


def test_seeded_bootstrap_refuses_mismatched_runs() -> None:
    with pytest.raises(ConfigError, match="at least one run"):
        seeded_bootstrap([], [{"t": [True]}])
    with pytest.raises(ConfigError, match="same non-empty set of tasks"):
        seeded_bootstrap([{"t": [True]}], [{"u": [True]}])
    with pytest.raises(ConfigError, match="different items"):
        seeded_bootstrap([{"t": [True, False]}], [{"t": [True]}])


# ------------------------------------------------------------------- the CLI
def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_eval_help_shows_the_task_options_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["eval", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "examples:" in out
    assert all(flag in out for flag in ("--tasks", "--items", "--evaluator", "--data-dir", "--list-tasks"))


def test_eval_list_tasks_shows_metric_and_install_hint(
    capsys: pytest.CaptureFixture[str], fake_builders: _FakeBuilders
) -> None:
    code, out, _ = run_cli(capsys, "eval", "--list-tasks")
    lines = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert code == 0 and set(lines) == set(fake_builders.TASK_NAMES)
    assert lines["numbers"].split()[1:3] == ["acc", "yes"]
    assert "no" in lines["absent"].split() and "apt-get install fake-corpus" in lines["absent"]
    assert fake_builders.built == []  # the metrics came from TASK_METRICS: nothing was built


def test_eval_list_tasks_with_the_real_builders(capsys: pytest.CaptureFixture[str]) -> None:
    builders = pytest.importorskip("autocompress_opt.tasks.builders")
    code, out, _ = run_cli(capsys, "eval", "--list-tasks")
    assert code == 0 and all(name in out for name in builders.TASK_NAMES)


def test_eval_tasks_prints_a_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_builders: _FakeBuilders
) -> None:
    directory = save_hf_dir(tiny_model("llama", seed=0), tmp_path / "tiny")
    out_file = tmp_path / "report.json"
    code, out, _ = run_cli(
        capsys,
        "eval",
        "--model",
        str(directory),
        "--tasks",
        "numbers,absent",
        "--items",
        "3",
        "--no-progress",
        "--out",
        str(out_file),
    )
    assert code == 0 and "skipped: data source 'fake-corpus'" in out
    assert "average accuracy:" in out and "over 1 tasks (numbers)" in out and "numbers-data 1.0" in out
    saved = json.loads(out_file.read_text())
    assert saved["averaged_tasks"] == ["numbers"] and len(saved["tasks"][0]["correct"]) == 3
    code, _, err = run_cli(capsys, "eval", "--tasks", "numbers")
    assert code == 2 and "--model is required" in err


def test_the_bootstrap_p_value_agrees_with_the_interval_and_holm_corrects_a_family() -> None:
    """``seeded_bootstrap_p`` is below 0.05 exactly when the 95 % interval (same replicates) excludes 0;
    Holm's step-down: the smallest of m values times m, then m-1, ..., never decreasing, capped at 1."""
    from autocompress_opt.tasks.scoring import holm, seeded_bootstrap, seeded_bootstrap_p

    rng = np.random.default_rng(0)
    base = rng.normal(1.0, 0.3, size=40)
    for shift, resolved in ((0.2, True), (0.0, False)):
        a = [{"kl": list(base - shift + rng.normal(0, 0.05, size=40))}]
        b = [{"kl": list(base)}]
        _, lo, hi = seeded_bootstrap(a, b, n_boot=2000, seed=3, scale=1.0)
        p = seeded_bootstrap_p(a, b, n_boot=2000, seed=3)
        assert (hi < 0 or lo > 0) is resolved and (p < 0.05) is resolved
        assert 0 < p <= 1
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.5})
    assert adjusted == pytest.approx({"a": 0.04, "b": 0.09, "c": 0.09, "d": 0.5})
    assert list(adjusted) == ["a", "b", "c", "d"]  # the caller's order
    assert holm({}) == {} and holm({"x": 0.9}) == {"x": 0.9}
