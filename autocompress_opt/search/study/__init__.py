"""The outer study: a persistent Optuna study whose global choices Ray Tune trials evaluate.

One module per concern, the public names re-exported here: :mod:`.config` (what defines a study
group), :mod:`.storage` (where it is stored), :mod:`.coordination` (several drivers on one study),
:mod:`.records` (trial records, Pareto fronts), :mod:`.seeding` (baselines and the proxy's points),
:mod:`.schedulers` (early stopping), :mod:`.ray_runtime` (Ray and the trainable), :mod:`.signals`
(Ctrl-C), :mod:`.progress` (what trials report, the progress bars), :mod:`.run` (the run loop) and
:mod:`.export` (a trial's model, exported). Each weights trial calls the inner search
(:mod:`autocompress_opt.search.inner`); nothing here is imported by it.

Importing this package loads neither torch, Ray nor Optuna: the modules that need them
(:mod:`.searcher`, :mod:`.weights_trial`, :mod:`.export`'s work) import them when used.
"""

from autocompress_opt.search.study.config import (
    SCHEDULERS,
    SEEDED_BASELINES,
    Objective,
    StudyConfig,
    check_config,
    inner_settings,
    sampler_seed,
)
from autocompress_opt.search.study.coordination import Coordination, driver_identity, open_study, repair_orphans
from autocompress_opt.search.study.export import ExportedTrial, export_trial, trial_model, trial_parent
from autocompress_opt.search.study.progress import ProgressBar, finished_trials
from autocompress_opt.search.study.ray_runtime import init_ray
from autocompress_opt.search.study.records import (
    TargetOutcome,
    TrialRecord,
    best_feasible,
    binding_constraints,
    constraint_misses,
    first_line,
    pareto_front,
    shared_answers,
)
from autocompress_opt.search.study.run import run_study
from autocompress_opt.search.study.schedulers import make_scheduler, per_target_scheduler
from autocompress_opt.search.study.seeding import baseline_seeds, enqueue_proxy_points, seed_study
from autocompress_opt.search.study.signals import StudyInterrupted
from autocompress_opt.search.study.storage import (
    default_storage,
    delete_studies,
    group_members,
    load_records,
    make_storage,
    resolve_storage,
)
from autocompress_opt.search.study.testsplit import trial_test_quality

__all__ = [
    "SCHEDULERS",
    "SEEDED_BASELINES",
    "Coordination",
    "ExportedTrial",
    "Objective",
    "ProgressBar",
    "StudyConfig",
    "StudyInterrupted",
    "TargetOutcome",
    "TrialRecord",
    "baseline_seeds",
    "best_feasible",
    "binding_constraints",
    "check_config",
    "constraint_misses",
    "default_storage",
    "delete_studies",
    "driver_identity",
    "enqueue_proxy_points",
    "export_trial",
    "finished_trials",
    "first_line",
    "group_members",
    "init_ray",
    "inner_settings",
    "load_records",
    "make_scheduler",
    "make_storage",
    "open_study",
    "pareto_front",
    "per_target_scheduler",
    "repair_orphans",
    "resolve_storage",
    "run_study",
    "sampler_seed",
    "seed_study",
    "shared_answers",
    "trial_model",
    "trial_parent",
    "trial_test_quality",
]
