"""``study run``'s flags or study YAML → :class:`~autocompress_opt.search.study.StudyConfig`
(the CLI's only logic): defaults, YAML keys, constraints, targets, the search space."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autocompress_opt._data import REPO_SEARCH_SPACES
from autocompress_opt.cli._common import engine_options, setting_options

__all__ = ["DEFAULTS", "RUN_KEYS", "build_config", "gpus_per_trial", "merged", "study_space"]

DEFAULTS = {
    "model": "smollm2-135m",
    "targets": "rtx5070,rtx5080,h100-sxm,b200",
    "workload": "datacenter",
    "tp": 1,
    "mode": "plan",
    "trials": 40,
    "seed": 0,
}


RUN_KEYS = (
    "model",
    "targets",
    "workload",
    "engine",
    "dtype",
    "tp",
    "input_len",
    "output_len",
    "concurrency",
    "max_ttft_ms",
    "max_tpot_ms",
    "min_throughput",
    "max_memory_gib",
    "engine_option",
    "mode",
    "trials",
    "name",
    "storage",
    "space",
    "sampler",
    "objectives",
    "seed",
    "parallel",
    "address",
    "plugin",
    "inner",
    "data",
    "importance",
    "seed_baselines",
    "seed_top_k",
    "runners_up",
    "plan_quality",
    "proxy_quality",
    "scheduler",
    "proxy",
    "time_budget",
    "finalists",
    "serve_as",
    "hardware_file",
    "confidence",
    "device",
    "compute_dtype",
    "gpus_per_trial",
    "cache_dir",
    "driver_device",
)


def merged(args: argparse.Namespace) -> dict[str, Any]:
    """A run's values: :data:`DEFAULTS`, then the ``--config`` YAML's keys (unknown ones rejected),
    then every flag given on the command line."""
    import yaml

    from autocompress_opt.errors import ConfigError, suggest, yaml_problem

    values: dict[str, Any] = dict(DEFAULTS)
    if args.config:
        if not args.config.is_file():
            raise ConfigError(f"study config {str(args.config)!r} does not exist")
        try:
            data = yaml.safe_load(args.config.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError:
            raise ConfigError(f"study config {str(args.config)!r} is not UTF-8 text") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"study config {str(args.config)!r} is not valid YAML ({yaml_problem(exc)})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"study config {str(args.config)!r} must be a mapping of keys, got {type(data).__name__}")
        valid = set(RUN_KEYS)
        for key, value in data.items():
            key = key.replace("-", "_")
            if key not in valid:
                raise ConfigError(
                    f"unknown key {key!r} in {args.config}{suggest(key, valid)}; valid: {', '.join(sorted(valid))}"
                )
            values[key] = value
    values.update(
        {
            k: v
            for k, v in vars(args).items()
            if v is not None and v != [] and k not in ("run", "verb", "action", "config")
        }
    )
    return values


def _seed_top_k(value: Any) -> Any:
    """``seed_top_k`` from the YAML (a mapping, passed on) or the flags (``NAME=K`` strings)."""
    from autocompress_opt.errors import ConfigError

    if not isinstance(value, list):
        return value
    out: dict[str, Any] = {}
    for item in value:
        name, sep, k = str(item).partition("=")
        if not sep or not k.strip().isdigit():
            raise ConfigError(f"--seed-top-k {item!r}: expected NAME=K, e.g. minitron=3")
        out[name.strip()] = int(k)
    return out


def build_config(values: dict[str, Any]) -> Any:
    """Flags/YAML values → StudyConfig (the CLI's only logic)."""
    from autocompress_opt.errors import check_int
    from autocompress_opt.search.study import Objective, StudyConfig
    from autocompress_opt.serving.targets import Target

    profiles = _hardware_profiles(values.get("hardware_file"))  # registered before the targets name them
    for key in ("tp", "input_len", "output_len", "concurrency"):  # 0 is an error, as in 'cost', not "the default"
        if values.get(key) is not None:
            check_int(values[key], key, also=("max",) if key == "concurrency" else ())
    constraints = {
        metric: str(values[key])
        for key, metric in (
            ("max_ttft_ms", "ttft_ms"),
            ("max_tpot_ms", "tpot_ms"),
            ("min_throughput", "output_throughput_tok_s"),
            ("max_memory_gib", "peak_memory_gib"),
        )
        if values.get(key)
    }
    targets = []
    raw_targets = values["targets"] if isinstance(values["targets"], list) else str(values["targets"]).split(",")
    for item in raw_targets:
        hardware, _, workload = str(item).strip().partition(":")
        targets.append(
            Target(
                hardware=hardware,
                workload=workload or values["workload"],
                engine=values.get("engine"),
                dtype=values.get("dtype"),
                tp=int(values["tp"]),
                input_len=values.get("input_len"),
                output_len=values.get("output_len"),
                concurrency=values.get("concurrency"),
                constraints=constraints,
                engine_options=engine_options(values.get("engine_option") or []),
                confidence=values.get("confidence"),
            )
        )
    model = str(values["model"])
    space = study_space(model, str(values["mode"]), values.get("space"))
    if values.get("sampler"):
        from dataclasses import replace

        space = replace(space, sampler=values["sampler"])
    objectives = (
        tuple(Objective.parse(o) for o in str(values["objectives"]).split(",")) if values.get("objectives") else ()
    )
    name = values.get("name") or Path(model).stem.replace(".", "-")
    return StudyConfig(
        name=name,
        model=model,
        targets=tuple(targets),
        space=space,
        trials=check_int(values["trials"], "trials"),
        objectives=objectives,
        mode=str(values["mode"]),
        storage=values.get("storage"),
        seed=check_int(values["seed"], "seed", minimum=0),
        concurrency=check_int(values["parallel"], "parallel") if values.get("parallel") is not None else None,
        address=values.get("address"),
        plugins=tuple(values.get("plugin") or ()),
        inner=_inner(values.get("inner"), values),
        importance=values.get("importance"),
        seed_baselines=values.get("seed_baselines"),
        seed_top_k=_seed_top_k(values.get("seed_top_k")),
        allow_data_change=bool(values.get("allow_data_change")),
        scheduler=values.get("scheduler"),
        proxy=values.get("proxy"),
        runners_up=values.get("runners_up"),
        plan_quality=values.get("plan_quality") or "params",
        proxy_quality=values.get("proxy_quality") or "importance",
        time_budget=values.get("time_budget"),
        finalists=values.get("finalists") or 0,
        serve_as=values.get("serve_as"),
        hardware=profiles,
        gpus_per_trial=values.get("gpus_per_trial"),
        cache_dir=values.get("cache_dir"),
        driver_device=values.get("driver_device") or "cpu",
    )


def study_space(model: str, mode: str, space: str | None = None) -> Any:
    """The search space a study of ``model`` searches: ``space`` (a YAML path or a bundled name) when
    given, else the bundled ``search_spaces/<model>.yaml``, else the one derived from the parent
    (``prune --baseline`` snaps its choice onto the same space)."""
    from autocompress_opt.arch.search_space import load_search_space

    if space:
        return load_search_space(space)
    bundled = REPO_SEARCH_SPACES / f"{model}.yaml"
    return load_search_space(bundled) if bundled.is_file() else _default_space(model, mode)


def _default_space(model: str, mode: str) -> Any:
    """The parent's default space; in weights mode a MoE parent's prunes its depth, hidden size,
    attention heads and experts only (the sparse trial's axes,
    :func:`~autocompress_opt.search.study.config.expert_space`)."""
    from autocompress_opt.arch.catalog import load_architecture
    from autocompress_opt.arch.hybrid import is_moe
    from autocompress_opt.arch.search_space import default_space

    parent = load_architecture(model)
    if mode == "weights" and is_moe(parent):
        from autocompress_opt.search.study.config import expert_space

        return expert_space(parent)
    return default_space(parent)


def gpus_per_trial(text: str) -> float:
    """``--gpus-per-trial`` as a number (the range is :class:`StudyConfig`'s check)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"gpus per trial must be a number, e.g. 0.5, 1 or 2, got {text!r}") from None


def _hardware_profiles(raw: Any) -> tuple[dict[str, Any], ...]:
    """``--hardware-file`` paths (flags: a list; YAML: a path or a list) → the profiles they define,
    registered in the catalog (``serving.hardware.load_hardware_file``: collisions with built-in
    names or aliases are errors)."""
    from autocompress_opt.errors import ConfigError
    from autocompress_opt.serving.hardware import load_hardware_file

    paths = [raw] if isinstance(raw, (str, Path)) else raw or []
    if not isinstance(paths, list) or not all(isinstance(p, (str, Path)) for p in paths):
        raise ConfigError(f"hardware_file must be a path or a list of paths, got {raw!r}")
    return tuple(item.to_dict() for path in paths for item in load_hardware_file(path))


def _inner(raw: Any, values: dict[str, Any]) -> dict[str, Any]:
    """``{steps: 24}`` from YAML, or ``["steps=24"]`` from flags (or a YAML list), with ``--device`` /
    ``--compute-dtype``: :func:`~autocompress_opt.search.study.config.inner_settings`."""
    from autocompress_opt.errors import ConfigError
    from autocompress_opt.search.study import inner_settings

    pairs = None if not raw else raw if isinstance(raw, dict) else setting_options(list(raw), "--inner")
    inner = inner_settings(
        pairs, mode=str(values.get("mode")), device=values.get("device"), compute_dtype=values.get("compute_dtype")
    )
    data = values.get("data")
    if data:  # --data (a list) or the YAML key (a spec or a list of them): the trials' text
        specs = [data] if isinstance(data, str) else data
        if not isinstance(specs, list) or not all(isinstance(s, str) for s in specs):
            raise ConfigError(f"data must be a spec or a list of specs such as [code.jsonl:0.7], got {data!r}")
        if values.get("mode") != "weights":
            raise ConfigError(
                f"--data applies to weights mode (trials on the real model); this is {values.get('mode')} mode"
            )
        from autocompress_opt.data.user import resolve_data

        resolve_data(specs)  # the YAML's specs checked before any model loads, as --data's are (cli.main)
        inner["data"] = list(specs)
    return inner
