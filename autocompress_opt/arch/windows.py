"""Which decoder layers attend within a sliding window, as each family's transformers model applies it.

A layer's window is part of its :class:`~autocompress_opt.arch.architecture.LayerSpec`; these
functions read it from a Hugging Face config (the family's
:class:`~autocompress_opt.arch.families.WindowRule`). Moved out of ``architecture.py``, which
re-exports :func:`hf_layer_windows`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autocompress_opt.arch.families import WindowRule, family_for_model_type
from autocompress_opt.errors import ConfigError, check_int

__all__ = ["FULL", "SLIDING", "hf_layer_windows", "layer_windows"]


# ------------------------------------------------------------------------ windows
# Which layers slide is each family's WindowRule (arch/families.py, with its sources): a layer attends
# within ``config.sliding_window`` iff its ``layer_types`` entry is "sliding_attention" (Qwen2/3 only
# when ``use_sliding_window``), or every layer does (Mistral), or none (Llama).
SLIDING, FULL = "sliding_attention", "full_attention"


def hf_layer_windows(config: Any) -> tuple[int | None, ...]:
    """Each layer's attention window (None = full attention) under a transformers config or its dict,
    as that family's transformers model applies it (its :class:`~autocompress_opt.arch.families.WindowRule`);
    full attention everywhere for a model_type of no registered family."""
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    if "num_hidden_layers" not in cfg and isinstance(getattr(config, "num_hidden_layers", None), int):
        cfg["num_hidden_layers"] = config.num_hidden_layers  # a property, not in to_dict() (NemotronHConfig)
    cfg = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg
    return layer_windows(cfg, str(cfg.get("model_type", "")).lower(), int(cfg["num_hidden_layers"]))


def layer_windows(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> tuple[int | None, ...]:
    """:func:`hf_layer_windows` of a config dict whose layer count is known (``num_layers``)."""
    fam = family_for_model_type(model_type)
    rule = fam.windows if fam is not None else WindowRule()
    window = cfg.get("sliding_window", rule.default_window)
    if rule.switch is not None and not cfg.get(rule.switch, False):
        window = None
    if rule.kind == "none" or window is None:
        return (None,) * num_layers
    check_int(window, f"{model_type} config sliding_window")
    if rule.kind == "every_layer":
        return (int(window),) * num_layers
    kinds = cfg.get("layer_types")
    if kinds is None and rule.default_pattern is not None:
        pattern = check_int(
            cfg.get("sliding_window_pattern", rule.default_pattern), f"{model_type} config sliding_window_pattern"
        )
        kinds = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    elif kinds is None:
        first = check_int(
            cfg.get("max_window_layers", rule.default_max_window_layers),
            f"{model_type} config max_window_layers",
            minimum=0,
        )
        kinds = [SLIDING if i >= first else FULL for i in range(num_layers)]
    if not isinstance(kinds, Sequence) or isinstance(kinds, str):
        raise ConfigError(f"{model_type} config layer_types must be a list, got {kinds!r}")
    if len(kinds) != num_layers:
        raise ConfigError(f"{model_type} config has {len(kinds)} layer_types for {num_layers} layers")
    return tuple(int(window) if kind == SLIDING else None for kind in kinds)
