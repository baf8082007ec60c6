"""The inner search's settings (:class:`InnerConfig`): steps, rows, learning rates, the relaxation's
temperature and how often the held-out KL is measured. Split from
:mod:`~autocompress_opt.search.inner.inner_search`, which re-exports it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from autocompress_opt.errors import ConfigError, check_bool, check_choice, check_int, check_number, suggest

__all__ = ["WIDTH_STEPS", "InnerConfig"]

# InnerConfig.width_step's choices.
WIDTH_STEPS = ("adam", "shared")


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class InnerConfig:
    """Budget and knobs of one inner search (YAML/dict form: :meth:`from_dict`).

    The defaults are sized for SmolLM2-135M on a 2-core CPU: ~1.3 s per step (2 × 128 tokens,
    forward and backward through the frozen parent), ~30-40 s per search in all (measured by
    ``benchmarks/bench_inner_search.py``); 32 steps or twice the learning rates did not do better.

    Attributes:
        steps: Adam steps (0: no training; the start point is discretised and repaired).
        batch_size / seq_len / n_samples: rows per step, tokens per calibration row (the caller
            builds the rows), calibration rows.
        val_samples: the leading rows held out of training to choose between the candidates (0:
            always the trained one); a study trial's are selection-split rows, disjoint from the
            rows of its objective. The choice compares candidates row by row (paired), so 16 rows
            resolve differences of a few hundredths of a nat where the per-row spread is ~0.3.
        choice_margin: a heterogeneous candidate replaces the best uniform one (the trial's
            uniform allocation, a seeded baseline's model) only when the upper end of the 95 %
            interval of their paired per-row KL difference is below ``-choice_margin`` nats.
        rung_rows: the measurements during training (:attr:`report_every`, a study's ASHA rungs)
            read the first ``rung_rows`` choice rows, twice as many at each later measurement, up
            to ``val_samples``; per-row KLs are kept, so the final choice measures only the rows
            not read yet (a trial stopped at a low rung pays for few rows).
        lr: Adam step on the width keep-fractions (fractions of the parent layer's units).
        width_step: the step rule of the width keep-fractions: ``adam`` (elementwise: every layer
            moves about ``lr`` a step, in lockstep across layers of one shape) or ``shared``
            (:class:`~autocompress_opt.search.inner.optim.SharedScaleAdam`: one second moment per
            tensor, so each layer moves in proportion to its own gradient).
        gate_lr: Adam step on the gates' log α.
        tau_start / tau_end: softness of the width steps, in units, annealed geometrically.
        dual_lr: η of the dual ascent on the multipliers.
        penalty: ρ of the quadratic term on violations.
        margin: hardware constraints are pushed to ``v <= -margin`` during training.
        init_log_alpha: |log α| of the initial gates.
        init: ``"budget"`` starts from the trial's uniform allocation, ``"parent"`` from the parent.
        ffn_unit: FFN granularity in channels (None: 64 or the largest power of two the parent
            allows; with ``engine_relaxation`` under an engine's rules, the engine's FFN multiple).
        engine_relaxation: under a serving engine's rules (:func:`search`'s ``rules``), train only
            what those rules let vary, in their units: the FFN keep-fractions in steps of the
            engine's FFN multiple (256 for the DeciLM readers) when ``ffn_unit`` is None and the
            multiple divides every parent FFN width, and, where the rules fix the query heads of
            every attention layer, no head or KV-group masks (they stay at the start point's legal
            heads). False: the masks train over every shape and are snapped to the rules only when
            discretised (what the search did before; the ablation's ``engine_relaxation=false``).
        straight_through: penalise the cost of the rounded masks (gradients of the relaxation).
        fill: after repair, add back units while every constraint still holds.
        seed: batch sampling and gate noise.
        checkpoint_activations: recompute each decoder layer's activations during the backward
            pass instead of keeping them (non-reentrant ``torch.utils.checkpoint`` around every
            layer, with the masks its forward pass drew): the step keeps one layer's activations
            and every layer's input instead of all of them, for about one more forward pass of
            time; same gradients, same result.
        report_every: with an ``on_step`` listener (:func:`search`), measure the held-out
            calibration KL and the constraint violation of the current masks every this many steps
            (0: every eighth of ``steps``, the study's first ASHA rung): a discretisation
            and a forward pass over the ``val_samples`` rows (two more, once, for the start point and
            the uniform allocation), no gradients, no random draws, so the search's result does not
            depend on it. On SmolLM2-135M (1 CPU thread) a forward pass over the 4 rows costs about
            one training step.
    """

    steps: int = 24
    batch_size: int = 2
    seq_len: int = 128
    n_samples: int = 32
    val_samples: int = 16
    lr: float = 0.05
    width_step: str = "adam"
    gate_lr: float = 0.25
    tau_start: float = 0.5
    tau_end: float = 0.05
    dual_lr: float = 2.0
    penalty: float = 10.0
    margin: float = 0.01
    choice_margin: float = 0.0
    rung_rows: int = 4
    init_log_alpha: float = 3.0
    init: str = "budget"
    ffn_unit: int | None = None
    engine_relaxation: bool = True
    straight_through: bool = True
    fill: bool = True
    seed: int = 0
    report_every: int = 0
    checkpoint_activations: bool = False

    def __post_init__(self) -> None:
        for name, minimum in (
            ("steps", 0),
            ("batch_size", 1),
            ("seq_len", 2),
            ("n_samples", 1),
            ("val_samples", 0),
            ("rung_rows", 1),
            ("report_every", 0),
        ):
            check_int(getattr(self, name), f"InnerConfig.{name}", minimum)
        for name in ("lr", "gate_lr", "tau_start", "tau_end", "init_log_alpha"):
            check_number(getattr(self, name), f"InnerConfig.{name}")
        for name in ("dual_lr", "penalty", "margin", "choice_margin"):
            check_number(getattr(self, name), f"InnerConfig.{name}", positive=False)
        for name in ("straight_through", "fill", "checkpoint_activations", "engine_relaxation"):
            check_bool(getattr(self, name), f"InnerConfig.{name}")
        if self.val_samples >= self.n_samples:
            raise ConfigError(
                f"InnerConfig.val_samples={self.val_samples} must be smaller than n_samples={self.n_samples}"
            )
        if self.tau_end > self.tau_start:
            raise ConfigError(f"InnerConfig.tau_end={self.tau_end} must not exceed tau_start={self.tau_start}")
        check_choice(self.init, "InnerConfig.init", ("budget", "parent"))
        check_choice(self.width_step, "InnerConfig.width_step", WIDTH_STEPS)
        check_int(self.ffn_unit, "InnerConfig.ffn_unit", also=(None,))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> InnerConfig:
        """Build from a mapping; unknown keys are rejected with a suggestion."""
        data = dict(data or {})
        valid = [f.name for f in fields(cls)]
        for key in data:
            if key not in valid:
                raise ConfigError(
                    f"unknown inner-search key {key!r}{suggest(str(key), valid)}; valid: {', '.join(valid)}"
                )
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def measure_every(self) -> int:
        """Steps between two measurements for an ``on_step`` listener (``report_every``, resolved)."""
        return self.report_every or max(1, self.steps // 8)

    def measures(self, done: int, at: Collection[int] | None = None) -> bool:
        """Whether a listener hears a measurement after ``done`` steps: at the steps ``at`` (a study
        under ASHA passes its rungs, :func:`~autocompress_opt.search.study.schedulers.rung_steps`, the
        only steps whose KL anyone reads), or, for None, every :attr:`measure_every` steps."""
        return done in at if at is not None else done % self.measure_every == 0

    def tau(self, step: int) -> float:
        """Geometric schedule from ``tau_start`` (step 0) to ``tau_end`` (last step)."""
        if self.steps <= 1:
            return self.tau_end
        return self.tau_start * (self.tau_end / self.tau_start) ** (step / (self.steps - 1))
