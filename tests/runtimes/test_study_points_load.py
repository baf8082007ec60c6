"""Every best point of a vLLM-target study loads in vLLM: a small plan-mode study of the real
SmolLM2-135M for a vLLM target, each Pareto-best trial exported with ``autocompress prune
--from-study`` and run in real vLLM by serve-check (skipped with `make engines` when vLLM is not
installed; skipped when the SmolLM2 GGUF is not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autocompress_opt.arch.architecture import Architecture
from autocompress_opt.arch.search_space import load_search_space
from autocompress_opt.cli import main
from autocompress_opt.prune.loadability import loadable_problems
from autocompress_opt.search.study import Objective, StudyConfig, load_records, pareto_front, run_study
from autocompress_opt.serving.targets import Target

pytestmark = pytest.mark.slow


def test_every_best_point_of_a_vllm_target_study_loads_in_vllm(
    vllm_engine: Any, smollm2_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autocompress_opt.runtimes.serve_check import serve_check

    monkeypatch.chdir(tmp_path)
    config = StudyConfig(
        name="served",
        model=str(smollm2_gguf),
        targets=(Target("b200", "datacenter"),),  # datacenter: served by vLLM, so vLLM's rules
        space=load_search_space("smollm2-135m"),
        trials=4,
        storage=f"sqlite:///{tmp_path}/served.db",
        concurrency=1,
    )
    try:
        run_study(config, progress=False)
    finally:
        import ray

        ray.shutdown()
    name = config.study_name(config.targets[0])
    records, attrs = load_records(config.storage_url, name)
    assert attrs["serve_as"]["engine"] == "vllm"
    best = pareto_front(records, [Objective.parse(o).direction for o in attrs["objectives"]])
    assert best, "the study has no feasible point"
    for record in best:
        assert loadable_problems(Architecture.from_dict(record.architecture), "vllm") == []
        out = tmp_path / f"trial-{record.number}"
        argv = ["prune", "--from-study", name, "--trial", str(record.number), "--storage", config.storage_url]
        assert (
            main([*argv, "--out", str(out), "--serve-as", "vllm", "--samples", "2", "--seq-len", "32", "--no-progress"])
            == 0
        )
        result = serve_check(out, "vllm", positions=64, vllm_eager=True)
        print(f"trial {record.number}: {result.line()}")
        assert result.top1_agreement >= 0.99, result.line()
