"""What each serving engine can load: re-exported from :mod:`autocompress_opt.prune.engine_rules`,
where the rules live as pure data below :mod:`~autocompress_opt.search`, which searches by them."""

from autocompress_opt.prune.engine_rules import (
    ENGINE_RULES,
    SERVE_AS_ANY,
    SERVE_AS_CHOICES,
    EngineRules,
    ShapeRules,
    check_serve_as,
    loadable_problems,
    parent_problems,
    rules_engine_for,
    shape_rules,
)

__all__ = [
    "ENGINE_RULES",
    "SERVE_AS_ANY",
    "SERVE_AS_CHOICES",
    "EngineRules",
    "ShapeRules",
    "check_serve_as",
    "loadable_problems",
    "parent_problems",
    "rules_engine_for",
    "shape_rules",
]
