"""quality: perplexity and KL on tiny random models — by-hand values, exact zeros, determinism, the CLI."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from tiny_lm import VOCAB, byte_tokenizer, save_hf_dir, tiny_model

from autocompress_opt.cli import main
from autocompress_opt.errors import ConfigError
from autocompress_opt.quality.metrics import (
    cache_teacher_logits,
    evaluate,
    kl_and_perplexity,
    kl_divergence,
    log_probs,
    perplexity,
    row_scores,
    token_kl,
)

# 5 rows of 12 tokens: batch_size 2 leaves a ragged last batch.
BATCHES = torch.randint(0, VOCAB, (5, 12), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=0)


@pytest.fixture(scope="module")
def perturbed(model):
    """The same model with every weight jittered by 1% noise."""
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=generator))
    return other


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


# ------------------------------------------------------------------ perplexity
def test_perplexity_is_exp_of_mean_cross_entropy(model):
    """By hand: CE of logits[:, :-1] against tokens[:, 1:], averaged over all 5·11 targets."""
    with torch.no_grad():
        logits = model(BATCHES).logits
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), BATCHES[:, 1:].reshape(-1))
    assert perplexity(model, BATCHES, batch_size=2, progress=False) == pytest.approx(math.exp(ce.item()), rel=1e-6)


def test_random_model_is_near_uniform(model):
    """A freshly initialised model predicts almost uniformly: perplexity ≈ vocabulary size."""
    assert perplexity(model, BATCHES, progress=False) == pytest.approx(VOCAB, rel=0.05)


def test_perplexity_is_deterministic_and_batch_size_independent(model):
    first = perplexity(model, BATCHES, batch_size=2, progress=False)
    assert perplexity(model, BATCHES, batch_size=2, progress=False) == first
    assert perplexity(model, BATCHES, batch_size=5, progress=False) == pytest.approx(first, rel=1e-6)


def test_training_flag_is_restored(model):
    model.train()
    try:
        perplexity(model, BATCHES, progress=False)
        assert model.training
    finally:
        model.eval()


# ---------------------------------------------------------------------- per row
def test_row_scores_are_per_row_ce_and_kl_by_hand(model, perturbed):
    """Row r's ce is the mean CE of its 11 targets, its kl the mean KL of its 12 positions, by hand;
    a ragged last batch (batch_size 2 over 5 rows) keeps the row order."""
    with torch.no_grad():
        student, teacher = log_probs(perturbed(BATCHES).logits), log_probs(model(BATCHES).logits)
    ce = F.cross_entropy(student[:, :-1].transpose(1, 2), BATCHES[:, 1:], reduction="none").mean(1)  # (5,)
    kl = token_kl(student, teacher).mean(1)  # (5,)
    rows = row_scores(perturbed, BATCHES, teacher=model, batch_size=2)
    assert rows["ce"] == pytest.approx(ce.tolist(), rel=1e-5)
    assert rows["kl"] == pytest.approx(kl.tolist(), rel=1e-5)
    assert len(set(rows["kl"])) == 5  # rows differ: a paired comparison has something to pair


def test_row_scores_average_to_the_set_metrics(model, perturbed):
    """mean(kl) is kl_divergence and exp(mean(ce)) is perplexity on the same rows; cached teacher
    logits give the live teacher's values; without a teacher there is no kl."""
    logits = cache_teacher_logits(model, BATCHES, batch_size=2, progress=False)
    live = row_scores(perturbed, BATCHES, teacher=model, batch_size=2)
    cached = row_scores(perturbed, BATCHES, teacher_logits=logits, batch_size=2)
    assert cached == live
    kl = kl_divergence(perturbed, model, BATCHES, batch_size=2, progress=False)
    assert sum(live["kl"]) / 5 == pytest.approx(kl, rel=1e-9)
    ppl = perplexity(perturbed, BATCHES, batch_size=2, progress=False)
    assert math.exp(sum(live["ce"]) / 5) == pytest.approx(ppl, rel=1e-9)
    assert set(row_scores(perturbed, BATCHES)) == {"ce"}


# --------------------------------------------------------------------------- KL
def test_kl_of_a_model_to_itself_is_exactly_zero(model):
    assert kl_divergence(model, model, BATCHES, batch_size=2, progress=False) == 0.0


def test_kl_to_a_perturbed_copy_is_positive_and_by_hand(model, perturbed):
    """KL(teacher ‖ student) = mean over all 5·12 positions of Σ_v p_t (log p_t − log p_s)."""
    with torch.no_grad():
        log_t = torch.log_softmax(model(BATCHES).logits, -1)
        log_s = torch.log_softmax(perturbed(BATCHES).logits, -1)
    expected = (log_t.exp() * (log_t - log_s)).sum(-1).mean().item()
    kl = kl_divergence(perturbed, model, BATCHES, batch_size=2, progress=False)
    assert kl > 0 and kl == pytest.approx(expected, rel=1e-5)
    reverse = (log_s.exp() * (log_s - log_t)).sum(-1).mean().item()  # the direction matters
    assert kl_divergence(model, perturbed, BATCHES, progress=False) == pytest.approx(reverse, rel=1e-5)
    assert reverse != pytest.approx(expected, rel=1e-6)


def test_cached_teacher_logits_match_the_live_teacher(model, perturbed):
    cached = cache_teacher_logits(model, BATCHES, batch_size=2, progress=False)
    assert cached.shape == (5, 12, VOCAB)
    live = kl_divergence(perturbed, model, BATCHES, batch_size=2, progress=False)
    assert kl_divergence(perturbed, None, BATCHES, batch_size=2, teacher_logits=cached, progress=False) == live
    assert kl_divergence(model, None, BATCHES, batch_size=2, teacher_logits=cached, progress=False) == 0.0
    log_probs = torch.log_softmax(cached, -1)  # log-probabilities are accepted too
    assert kl_divergence(perturbed, None, BATCHES, teacher_logits=log_probs, progress=False) == pytest.approx(
        live, abs=1e-6
    )
    half = cache_teacher_logits(model, BATCHES, dtype=torch.float16, progress=False)
    cached_half = kl_divergence(perturbed, None, BATCHES, teacher_logits=half, progress=False)
    assert cached_half == pytest.approx(live, abs=1e-3)


def test_kl_errors_name_the_problem(model):
    with pytest.raises(ConfigError, match=r"needs a teacher model or its cached teacher_logits"):
        kl_divergence(model, None, BATCHES, progress=False)
    with pytest.raises(ConfigError, match=r"teacher_logits has shape \(5, 11, 260\); batches \(5, 12\)"):
        kl_divergence(model, None, BATCHES, teacher_logits=torch.zeros(5, 11, VOCAB), progress=False)
    smaller_vocab = tiny_model("llama", vocab_size=VOCAB - 4)
    with pytest.raises(ConfigError, match=r"disagree on the vocabulary.*must share the tokenizer"):
        kl_divergence(smaller_vocab, model, BATCHES % (VOCAB - 4), progress=False)


def test_one_pass_kl_and_perplexity_are_exactly_the_two_metrics(model, perturbed):
    """kl_and_perplexity (the weights trial's one pass) returns, bit for bit, what kl_divergence with
    the same cached teacher logits and perplexity return at the same batch_size."""
    cached = cache_teacher_logits(model, BATCHES, batch_size=2, progress=False)
    kl, ppl = kl_and_perplexity(perturbed, BATCHES, cached, batch_size=2, progress=False)
    assert kl == kl_divergence(perturbed, None, BATCHES, batch_size=2, teacher_logits=cached, progress=False)
    assert ppl == perplexity(perturbed, BATCHES, batch_size=2, progress=False)
    assert kl > 0
    with pytest.raises(ConfigError, match=r"teacher_logits has shape \(5, 11, 260\); batches \(5, 12\)"):
        kl_and_perplexity(perturbed, BATCHES, cached[:, :11], progress=False)


# ---------------------------------------------------------------- tensor level
def test_log_probs_are_float32_and_temperature_divides_the_logits():
    """log_probs = log_softmax(logits / T) in float32, whatever the input dtype; T = 1 is bit-identical to
    no division; T must be positive."""
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0))
    out = log_probs(logits.half())
    assert out.dtype == torch.float32 and out.shape == (2, 3, 7)
    assert torch.equal(log_probs(logits), torch.log_softmax(logits, -1))
    assert torch.equal(log_probs(logits, 1.0), torch.log_softmax(logits / 1.0, -1))
    torch.testing.assert_close(log_probs(logits, 2.0), torch.log_softmax(logits / 2, -1), rtol=0, atol=0)
    torch.testing.assert_close(log_probs(logits).exp().sum(-1), torch.ones(2, 3))
    with pytest.raises(ConfigError, match=r"temperature must be > 0, got 0"):
        log_probs(logits, 0)


def test_token_kl_by_hand_and_differentiable():
    """Per position Σ p_t (log p_t − log p_s): (B, L, V) → (B, L); zero against itself; gradients flow."""
    # One position, V = 2: p_t = (1/2, 1/2), p_s = (1/4, 3/4) → KL = ½ ln 2 + ½ ln(2/3) = ½ ln(4/3)
    teacher = torch.tensor([[[0.5, 0.5]]]).log()
    student = torch.tensor([[[0.25, 0.75]]]).log().requires_grad_()
    kl = token_kl(student, teacher)
    assert kl.shape == (1, 1)
    assert float(kl.detach()) == pytest.approx(0.5 * math.log(4 / 3), rel=1e-6)
    kl.sum().backward()
    torch.testing.assert_close(student.grad, -teacher.exp())  # ∂KL/∂(log p_s) = −p_t
    assert torch.equal(token_kl(teacher, teacher), torch.zeros(1, 1))
    with pytest.raises(ConfigError, match=r"disagree on the vocabulary: log-probabilities \(1, 1, 2\) vs \(1, 1, 3\)"):
        token_kl(teacher, torch.zeros(1, 1, 3))


@pytest.mark.parametrize(
    ("batches", "message"),
    [
        (BATCHES.float(), r"int64 tensor, got torch.float32 tensor of shape \(5, 12\)"),
        (BATCHES[0], r"got torch.int64 tensor of shape \(12,\)"),
        (BATCHES[:, :1], r"at least 1 row of 2 tokens, got shape \(5, 1\)"),
    ],
)
def test_bad_batches_are_named(model, batches, message):
    with pytest.raises(ConfigError, match=message):
        perplexity(model, batches, progress=False)


def test_batch_size_must_be_positive(model):
    with pytest.raises(ConfigError, match=r"batch_size must be a positive int, got 0"):
        perplexity(model, BATCHES, batch_size=0, progress=False)


# --------------------------------------------------------------------- evaluate
def test_evaluate_reports_both_domains_and_kl(model, perturbed, tokenizer):
    alone = evaluate(model, tokenizer, n_samples=3, seq_len=24, seed=0, progress=False)
    assert alone.kl_to_parent is None and alone.kl_code is None
    assert math.isfinite(alone.ppl_code) and math.isfinite(alone.ppl_prose)
    to_self = evaluate(model, tokenizer, parent=model, n_samples=3, seq_len=24, seed=0, progress=False)
    assert (to_self.kl_to_parent, to_self.kl_code, to_self.kl_prose) == (0.0, 0.0, 0.0)
    assert (to_self.ppl_code, to_self.ppl_prose) == (alone.ppl_code, alone.ppl_prose)  # deterministic
    pruned = evaluate(perturbed, tokenizer, parent=model, n_samples=3, seq_len=24, seed=0, progress=False)
    assert pruned.kl_to_parent > 0
    assert min(pruned.kl_code, pruned.kl_prose) <= pruned.kl_to_parent <= max(pruned.kl_code, pruned.kl_prose)


def test_evaluate_record_is_json_and_on_the_test_split(model, tokenizer):
    report = evaluate(model, tokenizer, n_samples=2, seq_len=16, seed=4, progress=False)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["data"]["code"]["role"] == data["data"]["prose"]["role"] == "test"
    assert data["data"]["code"]["n_tokens"] == 32 and data["seed"] == 4
    assert set(data["timings_s"]) == {"data", "code", "prose", "total"}


# -------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def model_dirs(model, perturbed, tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-cli")
    return save_hf_dir(model, root / "parent"), save_hf_dir(perturbed, root / "pruned")


def test_cli_eval_prints_a_table(model_dirs, capsys):
    parent, pruned = model_dirs
    assert (
        main(
            [
                "eval",
                "--model",
                str(pruned),
                "--parent",
                str(parent),
                "--samples",
                "2",
                "--seq-len",
                "16",
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "perplexity" in out and "KL(parent||model)" in out and str(pruned) in out


def test_cli_eval_json_and_out_file(model_dirs, capsys, tmp_path):
    parent, pruned = model_dirs
    out_file = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                "--model",
                str(pruned),
                "--parent",
                str(parent),
                "--samples",
                "2",
                "--seq-len",
                "16",
                "--seed",
                "3",
                "--json",
                "--no-progress",
                "--out",
                str(out_file),
            ]
        )
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out_file.read_text())
    assert printed["kl_to_parent"] > 0 and printed["seed"] == 3 and printed["num_params"] > 0


def test_cli_eval_reports_a_bad_model_as_an_error(capsys):
    assert main(["eval", "--model", "no-such-model", "--no-progress"]) == 2
    assert "unknown model with offline weights 'no-such-model'" in capsys.readouterr().err
