"""The offline evaluation suite: task builders over installed data, and evaluators that score them.

Builders (:mod:`.builders`) turn installed sources (:mod:`.sources`) into deterministic
:class:`~.items.TaskSpec`\\ s; evaluators (:mod:`.scoring`, and :mod:`.lmeval` through
lm-evaluation-harness) score them zero-shot by log-likelihood. Heavy imports stay in the modules.
"""

from autocompress_opt.tasks.items import Item, TaskSpec

__all__ = ["Item", "TaskSpec"]
