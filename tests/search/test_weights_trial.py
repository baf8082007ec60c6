"""The weights trial mode end to end on a tiny saved Llama: load → importance → inner search →
materialise → held-out quality → exact cost, with the quality cache and the trials.py contract."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tiny_lm import save_hf_dir, tiny_model
from weights_helpers import INNER, PARAMS, TARGET, request

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.errors import ConfigError
from autocompress_opt.search.inner.inner_search import CANDIDATES
from autocompress_opt.search.inner.teacher import clear_teacher_memory
from autocompress_opt.search.study.trials import quality_label, run_trial
from autocompress_opt.search.study.weights_trial import QUALITY_KIND, TrialConfig, clear_trial_cache, run_weights_trial
from autocompress_opt.serving.costmodel import estimate_cost
from autocompress_opt.serving.targets import Target


@pytest.fixture(scope="module")
def parent_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-layer random Llama (hidden 32, 4 heads in 2 KV groups, FFN 48) saved with a byte tokenizer."""
    return save_hf_dir(tiny_model("llama", num_hidden_layers=4), tmp_path_factory.mktemp("tiny") / "llama")


def test_weights_trial_runs_end_to_end_and_caches_quality(parent_dir: Path, tmp_path: Path) -> None:
    """Through the trial-mode registry: a valid sub-architecture, exact cost metrics, quality = exp(-KL)
    in (0, 1]; the second call (same architecture) reads the quality from disk."""
    clear_trial_cache()
    clear_teacher_memory()  # an earlier test's trial on the same rows may have left them in the in-process cache
    req = request(parent_dir, tmp_path)
    first = run_trial(req)
    arch = Architecture.from_dict(first["architecture"])
    parent = Architecture.from_dict(req["parent"])
    assert arch.num_layers == parent.num_layers and arch.hidden_size == PARAMS["hidden_size"]
    assert arch.num_active_layers <= PARAMS["num_layers"]
    assert first["metrics"] == estimate_cost(arch, TARGET.hardware, TARGET.engine_obj(), TARGET.scenario()).to_dict()
    assert first["quality_kind"] == QUALITY_KIND and quality_label(QUALITY_KIND) == "exp(-KL to parent)"
    assert 0 < first["quality"] <= 1 and first["quality"] == pytest.approx(math.exp(-first["kl_to_parent"]))
    # A datacenter target's trials select on prose (workload-matched data): no code rows are scored.
    assert first["kl_to_parent"] == first["kl_prose"] >= 0 and first["ppl_prose"] > 1 and "ppl_code" not in first
    assert not first["quality_cached"]
    assert first["inner"]["feasible"] == all(v <= 0 for v in first["inner"]["violations"].values())
    # Which inner-search candidate came back, and each one's held-out calibration KL.
    selection = first["selection"]
    assert set(selection["val_kl"]) == set(selection["feasible"]) == set(CANDIDATES)
    measured = {n: kl for n, kl in selection["val_kl"].items() if kl is not None}
    assert selection["chosen"] in measured and all(selection["feasible"][n] for n in measured)
    if measured[selection["chosen"]] > min(measured.values()):  # a heterogeneous lead that did not resolve
        assert not selection["paired"]["won"] and selection["paired"]["reference"] == selection["chosen"]
    json.dumps(first)  # the study ships results as JSON

    assert len(list((tmp_path / "quality").glob("*.json"))) == 1
    assert list((tmp_path / "teacher").glob("*.safetensors")) and list((tmp_path / "importance").iterdir())
    second = run_weights_trial(req)
    assert second["quality_cached"]
    assert second["architecture"] == first["architecture"] and second["quality"] == first["quality"]
    assert second["inner"]["steps"] == INNER["steps"]


def test_weights_trial_is_deterministic_given_the_seed(parent_dir: Path, tmp_path: Path) -> None:
    """A fresh process state (cleared caches, new cache folder) and the same seed give the same result."""
    clear_trial_cache()
    a = run_weights_trial(request(parent_dir, tmp_path / "a", seed=7))
    clear_trial_cache()
    b = run_weights_trial(request(parent_dir, tmp_path / "b", seed=7))
    for key in ("architecture", "metrics", "quality", "ppl_prose"):
        assert a[key] == b[key], key


def test_inner_keys_are_validated(parent_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="did you mean 'eval_samples'"):
        run_weights_trial(request(parent_dir, tmp_path, inner={"eval_sample": 2}))
    config = TrialConfig.from_dict({"steps": 5, "eval_samples": 3}, seed=11)
    assert (config.inner.steps, config.inner.seed, config.eval_samples) == (5, 11, 3)


def test_a_parent_that_is_not_the_loaded_model_is_refused(parent_dir: Path, tmp_path: Path) -> None:
    other = Architecture.from_dict(request(parent_dir, tmp_path)["parent"])
    wrong = {**other.to_dict(), "hidden_size": 64}
    with pytest.raises(ConfigError, match="hidden_size"):
        run_weights_trial(request(parent_dir, tmp_path, parent=wrong))


def test_a_trial_records_where_it_computed_and_runs_in_bf16(parent_dir: Path, tmp_path: Path) -> None:
    """``inner: {device, compute_dtype}`` reach the trial; the result says where it ran. A bf16
    parent is another parent for the caches (its importance and teacher differ), and its held-out
    KL stays within 0.05 nats of the fp32 trial's."""
    clear_trial_cache()
    fp32 = run_weights_trial(request(parent_dir, tmp_path / "a", inner={**INNER, "compute_dtype": "fp32"}))
    assert fp32["compute"] == {"device": "cpu", "dtype": "fp32", "devices": ["cpu"]}
    bf16 = run_weights_trial(request(parent_dir, tmp_path / "a", inner={**INNER, "compute_dtype": "bf16"}))
    assert bf16["compute"] == {"device": "cpu", "dtype": "bf16", "devices": ["cpu"]}
    assert not bf16["quality_cached"]  # not the fp32 parent's cache entry
    assert math.isfinite(bf16["kl_to_parent"]) and abs(bf16["kl_to_parent"] - fp32["kl_to_parent"]) < 0.05
    with pytest.raises(ConfigError, match="is not one of auto, cpu, cuda, cuda:N"):
        run_weights_trial(request(parent_dir, tmp_path / "a", inner={**INNER, "device": "gpu"}))


def test_a_small_teacher_budget_gives_top_k_targets_and_the_result_says_so(parent_dir: Path, tmp_path: Path) -> None:
    """``inner: {teacher_budget_gib}`` below the full targets of the 4 x 32 calibration tokens (V = 260:
    520 bytes a token in float16) keeps the largest top-k that fits (6k + 4 bytes a token: 450 → k = 74),
    in its own cache file; the default budget keeps the full vocabulary. A budget too small for
    64 tokens, or not a positive number, is a ConfigError."""
    from autocompress_opt.search.inner.teacher import clear_teacher_memory

    clear_trial_cache()
    clear_teacher_memory()  # else the full targets come from memory and are not written under tmp_path
    full = run_weights_trial(request(parent_dir, tmp_path))
    assert full["teacher"] == {"form": "full", "k": None, "bytes": 128 * 520, "bytes_per_token": 520}
    budget = 128 * 450 / 2**30
    sparse = run_weights_trial(request(parent_dir, tmp_path, inner={**INNER, "teacher_budget_gib": budget}))
    assert sparse["teacher"] == {"form": "top-k", "k": 74, "bytes": 128 * (74 * 6 + 4), "bytes_per_token": 448}
    assert sparse["inner"]["config"]["teacher_budget_gib"] == budget
    assert len(list((tmp_path / "teacher").glob("*.safetensors"))) == 2
    assert 0 < sparse["quality"] <= 1
    with pytest.raises(ConfigError, match="top 64 tokens"):
        run_weights_trial(request(parent_dir, tmp_path, inner={**INNER, "teacher_budget_gib": 128 * 300 / 2**30}))
    with pytest.raises(ConfigError, match="inner.teacher_budget_gib must be a finite number > 0, got -1"):
        TrialConfig.from_dict({"teacher_budget_gib": -1})


def test_contexts_that_differ_only_by_data_share_one_loaded_parent(
    parent_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study group's targets take turns on one trial process: a datacenter target reads prose and a
    local-coding one reads code. Alternating between them loads the parent once, and each data
    context is built once (a later trial of it reports no parent timings); a third data setting evicts
    the oldest context (two are kept) without a reload; another dtype is another parent and reloads."""
    from autocompress_opt.search.study import trial_context

    loads: list[str] = []
    real_load = trial_context.load_parent
    monkeypatch.setattr(trial_context, "load_parent", lambda ref, *args: loads.append(ref) or real_load(ref, *args))
    coding = Target("h100-sxm", "local-coding", constraints=dict(TARGET.constraints))
    prose_req, code_req = request(parent_dir, tmp_path), request(parent_dir, tmp_path, target=coding.to_dict())

    clear_trial_cache()
    runs = [run_weights_trial(r) for r in (prose_req, code_req, prose_req, code_req)]
    assert loads == [str(parent_dir)]
    assert "kl_prose" in runs[0] and "kl_code" not in runs[0] and "kl_code" in runs[1] and "kl_prose" not in runs[1]
    built = [sorted(k for k in r["timings_s"] if k.startswith("parent_")) for r in runs]
    assert built[0] == ["parent_eval_teacher", "parent_importance", "parent_load", "parent_teacher"]
    assert built[1] == ["parent_eval_teacher", "parent_importance", "parent_teacher"]  # new data, same model
    assert built[2] == built[3] == []  # both contexts still held
    assert runs[2]["architecture"] == runs[0]["architecture"] and runs[2]["quality"] == runs[0]["quality"]
    assert runs[2]["selection"]["val_kl"] == runs[0]["selection"]["val_kl"]  # the shared model is unchanged

    mixed = request(parent_dir, tmp_path, inner={**INNER, "data_domain": "mixed"})
    assert "parent_importance" in run_weights_trial(mixed)["timings_s"]
    assert "parent_importance" in run_weights_trial(prose_req)["timings_s"]  # the oldest, evicted
    assert "parent_importance" not in run_weights_trial(mixed)["timings_s"]
    assert loads == [str(parent_dir)]
    run_weights_trial(request(parent_dir, tmp_path, inner={**INNER, "compute_dtype": "bf16"}))
    assert len(loads) == 2
    clear_trial_cache()


def test_the_block_library_answer_is_weighed_as_a_candidate_and_its_library_built_once(
    parent_dir: Path, tmp_path: Path
) -> None:
    """``inner.block_library``: the solver's answer for the trial's budget joins the inner search's
    candidates under ``block-library`` (judged on the choice rows like the others); the library is
    built on the first trial and read from disk by the next; off by default (no such candidate)."""
    clear_trial_cache()
    plain = run_weights_trial(request(parent_dir, tmp_path / "plain"))
    assert "block-library" not in plain["selection"]["feasible"]

    inner = {**INNER, "block_library": True}
    first = run_weights_trial(request(parent_dir, tmp_path / "lib", inner=inner))
    assert first["selection"]["feasible"]["block-library"] is True
    assert first["selection"]["chosen"] in first["selection"]["feasible"]
    libraries = list((tmp_path / "lib" / "block_library").rglob("*.json"))
    assert len(libraries) == 1
    stamp = libraries[0].stat().st_mtime_ns
    second = run_weights_trial(request(parent_dir, tmp_path / "lib", inner=inner, seed=1))
    assert "block-library" in second["selection"]["feasible"]
    assert libraries[0].stat().st_mtime_ns == stamp  # read back, not rebuilt

    with pytest.raises(ConfigError, match="block_library"):
        TrialConfig.from_dict({"block_library": "yes"})


def test_the_inner_search_starts_from_the_block_library_answer_when_asked(parent_dir: Path, tmp_path: Path) -> None:
    """``inner.start_from: block-library``: the masks start at the solver's answer (built as for
    ``block_library``, which it implies), which is then the candidate ``start`` as it is: the start
    candidate's KL on the choice rows equals the block-library candidate's (one architecture). The
    default start is importance's; a bad value is refused naming the valid ones."""
    clear_trial_cache()
    inner = {**INNER, "start_from": "block-library"}
    result = run_weights_trial(request(parent_dir, tmp_path / "lib", inner=inner))
    selection = result["selection"]
    assert selection["start_from"] == "block-library" and selection["feasible"]["block-library"] is True
    assert isinstance(selection["val_kl"]["start"], float)
    assert selection["val_kl"]["start"] == selection["val_kl"]["block-library"]
    record = result["inner"]["selection"]
    assert record["start"]["summary"] == record["block-library"]["summary"]
    plain = run_weights_trial(request(parent_dir, tmp_path / "lib"))
    assert plain["selection"]["start_from"] == "importance"

    with pytest.raises(ConfigError, match="start_from.*importance.*block-library"):
        TrialConfig.from_dict({"start_from": "solver"})
