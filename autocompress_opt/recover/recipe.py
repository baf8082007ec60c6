"""The distillation recipe: everything that determines the trained weights besides the models and
the text, and its learning-rate schedule. Pure data and arithmetic (no torch), so the CLI can show
the defaults in ``--help`` without loading torch; the training loop is :mod:`.distill`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from autocompress_opt.errors import ConfigError, check_int, check_number

__all__ = ["MIN_LR_RATIO", "DistillRecipe", "learning_rate"]

# Cosine decay ends at 10% of the peak learning rate, the floor of the LLaMA / Chinchilla recipes.
MIN_LR_RATIO = 0.1


@dataclass(frozen=True)
class DistillRecipe:
    """Everything that determines the trained weights (besides the student, teacher and text).

    Attributes:
        steps: optimizer updates; the run sees ``steps · batch_size · seq_len`` tokens.
        batch_size: rows per update.
        seq_len: tokens per row.
        lr: peak AdamW learning rate (reached after ``warmup_steps``).
        warmup_steps: updates of linear warmup before the cosine decay (0 = none).
        weight_decay: AdamW decoupled weight decay.
        temperature: softmax temperature of both distributions; the loss is scaled by its square.
        seed: seed of the calibration stream's document order, the held-out rows and the torch RNG.
        save_every: checkpoint every this many updates (and at the end); may change on resume.
        grad_clip: maximum global gradient L2 norm (0 = no clipping).
        load_balance: weight of a MoE student's load-balance loss added to the distillation loss
            (:mod:`.balance`; 0 = none, the default, and the only value for a dense student).
        n_eval_rows: held-out rows (of ``seq_len`` tokens) on which the KL before/after is measured.
    """

    steps: int
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 1e-4
    warmup_steps: int = 0
    weight_decay: float = 0.01
    temperature: float = 1.0
    seed: int = 0
    save_every: int = 100
    grad_clip: float = 1.0
    n_eval_rows: int = 8
    load_balance: float = 0.0

    def __post_init__(self) -> None:
        for name, minimum in (
            ("steps", 1),
            ("batch_size", 1),
            ("seq_len", 2),
            ("warmup_steps", 0),
            ("save_every", 1),
            ("n_eval_rows", 1),
        ):
            check_int(getattr(self, name), f"DistillRecipe.{name}", minimum)
        check_int(self.seed, "DistillRecipe.seed", minimum=None)
        for name, positive in (
            ("lr", True),
            ("temperature", True),
            ("weight_decay", False),
            ("grad_clip", False),
            ("load_balance", False),
        ):
            check_number(getattr(self, name), f"DistillRecipe.{name}", positive=positive)
        if self.warmup_steps > self.steps:
            raise ConfigError(f"DistillRecipe.warmup_steps must be <= steps ({self.steps}), got {self.warmup_steps}")

    @property
    def budget_tokens(self) -> int:
        """Tokens the whole run trains on: ``steps · batch_size · seq_len``."""
        return self.steps * self.batch_size * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        """The recipe's fields; ``load_balance`` only when set, so a run from before it existed resumes."""
        out = asdict(self)
        if not out["load_balance"]:
            del out["load_balance"]
        return out


def learning_rate(recipe: DistillRecipe, step: int) -> float:
    """Learning rate of update ``step`` (0-based): linear warmup to ``lr``, then cosine to ``MIN_LR_RATIO·lr``.

    Pure in ``(recipe, step)``, so the schedule's only state is the step.
    """
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)  # in [0, 1)
    return recipe.lr * (MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * 0.5 * (1.0 + math.cos(math.pi * progress)))
