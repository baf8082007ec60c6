"""Old import path of the trial-mode registry, kept for ``--plugin`` modules written against it
(``from autocompress_opt.trials import TRIAL_MODES``). The code lives in
:mod:`autocompress_opt.search.trials` and :mod:`autocompress_opt.serving.targets`."""

from autocompress_opt.search.trials import TRIAL_MODES, plan_trial, quality_proxy
from autocompress_opt.serving.targets import Target

__all__ = ["TRIAL_MODES", "Target", "plan_trial", "quality_proxy"]
