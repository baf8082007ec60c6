"""Old import path of the trial-mode registry, kept for ``--plugin`` modules written against it
(``from autocompress_opt.trials import TRIAL_MODES``). The code lives in
:mod:`autocompress_opt.search.study.trials` and :mod:`autocompress_opt.serving.targets`.

``quality_proxy`` is the old name of :func:`~autocompress_opt.search.study.trials.retained_fraction`
(plan mode's quality: the retained-parameter fraction)."""

from autocompress_opt.search.study.trials import TRIAL_MODES, plan_trial, retained_fraction
from autocompress_opt.serving.targets import Target

quality_proxy = retained_fraction  # the old name; new code uses retained_fraction

__all__ = ["TRIAL_MODES", "Target", "plan_trial", "quality_proxy", "retained_fraction"]
