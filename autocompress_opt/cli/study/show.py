"""``autocompress study show``: a study group's Pareto table (or every trial), and with ``--test``
the Pareto points' quality on the test split."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from autocompress_opt.cli._common import dropped_rows_note, print_json, table

if TYPE_CHECKING:
    from autocompress_opt.arch.architecture import Architecture


def add_parser(actions: Any) -> None:
    show = actions.add_parser("show", help="Pareto table of a study group")
    show.add_argument("name", help="group name (or one study, NAME.hardware)")
    show.add_argument("--storage", help="storage URL (default sqlite:///studies/NAME.db)")
    show.add_argument("--all", action="store_true", help="every trial, not only the Pareto set")
    show.add_argument("--json", action="store_true")
    show.add_argument(
        "--test",
        action="store_true",
        help="weights mode: also score each Pareto point on the test split, which no trial read (the point's "
        "model rebuilt as its trial built it; the first time loads the parent and cuts each point, then cached)",
    )
    show.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="the trials' caches, where --test finds the importance scores and keeps its results "
        "(default .autocompress: as for study run)",
    )
    show.add_argument(
        "--backend",
        choices=["auto", "own", "aic"],
        default="auto",
        help="check each shown point's constraints again with this cost backend: aic (NVIDIA AIConfigurator's "
        "measured kernels summed per layer; pip install 'autocompress-opt[aic]'; H100-SXM, H200, B200 with vllm "
        "or trtllm), auto (default: aic where installed and it covers the target), own (no second check: the "
        "trials were judged by this toolkit's model)",
    )
    show.set_defaults(run=_show)


def _backend_checks(view: Any, records: Any, requested: str) -> dict[int, dict[str, Any]]:
    """Per trial number, its constraints checked again by the backend (serving.aic.backend_check);
    only complete trials with an architecture, and only where the backend is not the own model."""
    from autocompress_opt.serving.aic import backend_check
    from autocompress_opt.serving.targets import Target

    parent = view.parent
    if requested == "own" or parent is None or not view.target:
        return {}
    target = Target.from_dict(view.target)
    out = {}
    for r in records:
        arch = r.arch()
        if r.state == "COMPLETE" and arch is not None:
            check = backend_check(arch, target, parent, requested)
            if check is not None:
                out[r.number] = check
    return out


def _check_cell(check: dict[str, Any] | None) -> str:
    if check is None:
        return "-"
    if check["feasible"]:
        return "meets"
    missed = [f"{k} by {100 * v:.1f} %" for k, v in check["violations"].items() if v > 0]
    return "misses " + "; ".join(missed)


def _data_line(view: Any) -> str | None:
    """A weights study's text: the user's --data, or the built-in text its target's workload picks;
    and which split decided what (None for a plan-mode study, which reads no text)."""
    from autocompress_opt.search.study.weights_trial import TrialConfig

    identity = view.attrs.get("identity") or {}
    if identity.get("mode") != "weights":
        return None
    config = TrialConfig.from_dict(identity.get("inner") or None).for_workload(view.target.get("workload"))
    return (
        f"{config.data_label()} for the {view.target.get('workload')} workload; importance and inner-search training "
        "on its calibration split, the inner search's choice and the quality column on its selection split "
        "(the test split is for reported numbers: prune --from-study cards, eval)"
    )


def _test_scores(view: Any, cache_dir: str | None) -> dict[int, dict[str, Any]]:
    """``study show --test``: the test-split quality of each Pareto point of a weights study, by trial
    number (:func:`~autocompress_opt.search.study.testsplit.trial_test_quality`: computed once, cached)."""
    from autocompress_opt.search.study.placement import DEFAULT_CACHE_DIR
    from autocompress_opt.search.study.testsplit import trial_test_quality

    identity = view.attrs.get("identity") or {}
    if identity.get("mode") != "weights" or not identity.get("model"):
        return {}
    out = {}
    for record in view.pareto():
        arch = record.arch()
        if arch is None:
            continue
        out[record.number], _ = trial_test_quality(
            identity["model"],
            dict(identity.get("inner") or {}),
            arch,
            workload=view.target.get("workload"),
            cache_dir=cache_dir or DEFAULT_CACHE_DIR,
            kept=record.kept,
        )
    return out


def _test_line(scores: dict[int, dict[str, Any]]) -> str:
    """Which rows the test column is on, in words."""
    first = next(iter(scores.values()))
    domains = ", ".join(first["objective_domains"])
    return (
        f"test quality: exp(-KL) on the test split ({first['n_samples']} rows x {first['seq_len']} tokens per "
        f"domain; the objective's text: {domains}), documents no trial read; the Pareto points only"
        f"{dropped_rows_note(first.get('data') or {})}"
    )


def _show(args: argparse.Namespace) -> int:
    from autocompress_opt.search.study.studyio import load_group

    views = load_group(args.name, args.storage)
    tests = {v.name: _test_scores(v, args.cache_dir) if args.test else {} for v in views}
    checks = {v.name: _backend_checks(v, v.records if args.all else v.pareto(), args.backend) for v in views}
    if args.json:
        print_json(
            [
                {
                    "study": v.name,
                    "target": v.target,
                    "objectives": v.attrs.get("objectives"),
                    "quality": v.quality_label,
                    "quality_split": "selection" if (v.attrs.get("identity") or {}).get("mode") == "weights" else None,
                    "pareto": [
                        {
                            **r.__dict__,
                            **({"test": tests[v.name][r.number]} if r.number in tests[v.name] else {}),
                            **({"backend_check": checks[v.name][r.number]} if r.number in checks[v.name] else {}),
                        }
                        for r in v.pareto()
                    ],
                }
                for v in views
            ]
        )
        return 0
    for view in views:
        states: dict[str, int] = {}
        for r in view.records:  # PRUNED: stopped early, screened out by the proxy, or a duplicate never run
            state = r.state if r.state != "PRUNED" else _pruned_kind(r)
            state += " (PRUNED)" if r.state == "PRUNED" else ""
            states[state] = states.get(state, 0) + 1
        feasible = sum(r.feasible for r in view.records)
        print(f"\n== {view.name}: {view.label}, objectives {', '.join(view.attrs.get('objectives', []))}")
        print("   trials: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())) + f"; {feasible} feasible")
        constraints = sorted({k for r in view.records for k in r.constraints})
        print("   constraints: " + ("; ".join(constraints) or "none"))
        for reason, numbers in _failures(view.records).items():
            print(f"   failed ({len(numbers)}): {reason} (trials {', '.join(f'#{n}' for n in numbers)})")
        layout = _moe_layout(view)
        if layout:
            print(f"   MoE layers: {layout}")
        data = _data_line(view)
        split = " on the selection split, which chose the points" if data else ""
        print(f"   quality: {view.quality_label}{split} (higher is better; 1.0 = the parent)")
        test, check = tests[view.name], checks[view.name]
        if check:
            print(
                "   checked again with AIConfigurator's measured kernels, summed per layer (the trials were judged "
                "by this toolkit's model; relative limits against the parent priced the same way)"
            )
        if test:
            print(f"   {_test_line(test)}")
        elif data:
            print(f"   test split: `autocompress study show {view.name} --test` scores the Pareto points on it")
        if data:
            print(f"   data: {data}")
        counts = view.candidate_counts()
        if counts:
            picked = ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))
            print(f"   inner search returned: {picked} (trained masks / greedy start point / uniform allocation)")
        shown = sorted(view.records, key=lambda r: r.number) if args.all else view.pareto()
        if not shown:
            print("   no feasible trial yet")
            continue
        moe = any(_experts(r.arch()) for r in shown)  # a MoE study: the expert sizes and active params
        rows = [
            [
                str(r.number) + (f" ({r.baseline})" if r.baseline else ""),
                _summary(r.arch()),
                *([_experts(r.arch()) or "-", *_param_counts(r.arch())] if moe else []),
                f"{r.quality:.3f}" if r.quality is not None else "-",
                *(
                    f"{r.metrics.get(k, float('nan')):,.2f}"
                    for k in ("ttft_ms", "tpot_ms", "output_throughput_tok_s", "peak_memory_gib")
                ),
                "yes" if r.feasible else ("no" if r.state == "COMPLETE" else _state(r)),
                *([_candidate(r.selection)] if counts else []),
                *([f"{test[r.number]['quality']:.3f}" if r.number in test else "-"] if test else []),
                *([_check_cell(check.get(r.number))] if check else []),
            ]
            for r in shown
        ]
        header = ["#", "architecture", *(["experts", "params", "active"] if moe else [])]
        header += ["quality (selection)" if data else "quality", "ttft_ms", "tpot_ms", "tok/s", "mem_gib", "feasible"]
        header += ["inner (val KL)"] if counts else []
        header += ["test quality"] if test else []
        print(table(rows, header + (["aic check"] if check else [])))
    return 0


def _pruned_kind(record: Any) -> str:
    """Why a PRUNED trial has no result: stopped early by the scheduler, kept from running by the
    proxy (``proxy infeasible``), or a duplicate point never run."""
    if record.stopped_early:
        return "stopped early"
    return "proxy infeasible" if record.proxy_infeasible else "duplicate"


def _state(record: Any) -> str:
    """The feasible column of a trial that did not complete: ``stopped 6/24`` for one the scheduler
    stopped early, ``proxy`` for a point the proxy kept from running, else its state (``pruned``: a
    duplicate point, ``fail``, ``running``)."""
    early = record.stopped_early
    if early:
        return f"stopped {early.get('inner_step')}/{early.get('inner_steps')}"
    if record.proxy_infeasible:
        return "proxy"
    return str(record.state).lower()


def _failures(records: Any) -> dict[str, list[int]]:
    """FAIL trials grouped by their error's first line, in trial order."""
    from autocompress_opt.search.study import first_line

    out: dict[str, list[int]] = {}
    for r in sorted(records, key=lambda r: r.number):
        if r.state == "FAIL":
            out.setdefault(first_line(r.error) or "no error recorded", []).append(r.number)
    return out


def _moe_layout(view: Any) -> str | None:
    """Whether the study's MoE layers may each keep their own size, and why (None for a dense parent):
    the per-layer (Puzzle) form where the study's engine reads it, else one size per kind, naming
    the engines that would read it (:data:`~autocompress_opt.arch.hybrid.PER_LAYER_MOE`)."""
    from autocompress_opt.arch.hybrid import PER_LAYER_MOE, is_moe
    from autocompress_opt.search.study.trials import searches_per_layer

    parent = view.parent
    if parent is None or not is_moe(parent):
        return None
    identity = view.attrs.get("identity") or {}
    serve_as = str(identity.get("serve_as") or "any")
    per_layer = searches_per_layer(parent, serve_as)
    if per_layer and (identity.get("mode") == "weights" or identity.get("plan_quality") == "estimate-per-layer"):
        who = ", ".join(PER_LAYER_MOE[parent.family]) if serve_as == "any" else serve_as
        return f"each its own expert width and experts per token (the per-layer Puzzle form, read by {who})"
    readers = PER_LAYER_MOE.get(parent.family)
    if not readers:
        return f"one size for every layer: no engine here reads a per-layer form of {parent.family}"
    if per_layer:  # plan mode without the per-layer estimate
        return "one size for every layer: plan mode sizes them per layer with --plan-quality estimate-per-layer"
    return (
        f"one size for every layer: {serve_as} reads no per-layer form of {parent.family} "
        f"(the Puzzle form is read by {', '.join(readers)}; --serve-as picks the engine whose rules apply)"
    )


def _candidate(selection: dict[str, Any] | None) -> str:
    """``"uniform 0.412 (trained 0.430, start 0.425)"``: the returned candidate's held-out calibration
    KL, then the others' ("-" for one not measured); "-" without a record."""
    if not selection or not selection.get("chosen"):
        return "-"
    chosen = selection["chosen"]
    if selection.get("stopped_at_step") is not None:  # a seeded trial stopped early: its baseline's own model
        return f"{chosen}'s own model (search stopped at step {selection['stopped_at_step']})"
    kls = selection.get("val_kl", {})
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    others = ", ".join(f"{n} {fmt(v)}" for n, v in kls.items() if n != chosen)
    return f"{chosen} {fmt(kls.get(chosen))}" + (f" ({others})" if others else "")


def _experts(arch: Architecture | None) -> str:
    """``"4 x 8ch, top-2"``: the routed experts, their width and top-k of a MoE architecture's MoE
    layers (one size per layer kind), then a shared expert's width and a hybrid's Mamba-2 heads
    (``"5 x 8ch, top-1, shared 30ch; 6 SSM heads"``); "" for a dense one or none. MoE layers that
    differ only in width and top-k (the per-layer Puzzle form) list them layer by layer:
    ``"6 x [9,7]ch, top-[1,2], shared 32ch"``, or their span beyond 8 layers (``"352 x [1408..2176]ch"``)."""
    specs = _moe_specs(arch)
    sizes = sorted({(m.num_experts, m.expert_width, m.experts_per_token, m.shared_width) for m in specs})
    if len(sizes) > 1 and len({(e, s) for e, _, _, s in sizes}) == 1:
        (e, _, _, s) = sizes[0]

        def listed(values: Any) -> str:  # every layer's, or the span of a long list (Nemotron 3 Super: 40)
            values = list(values)
            return "[" + (",".join(map(str, values)) if len(values) <= 8 else f"{min(values)}..{max(values)}") + "]"

        widths, ks = listed(m.expert_width for m in specs), listed(m.experts_per_token for m in specs)
        text = f"{e} x {widths}ch, top-{ks}" + (f", shared {s}ch" if s else "")
    else:
        text = ", ".join(f"{e} x {w}ch, top-{k}" + (f", shared {s}ch" if s else "") for e, w, k, s in sizes)
    layers = [] if arch is None else [layer for layer in arch.layers if not layer.is_noop]
    heads = {layer.mamba.num_heads for layer in layers if layer.mamba is not None}
    return text + "".join(f"; {h} SSM heads" for h in sorted(heads))


def _moe_specs(arch: Architecture | None) -> list[Any]:
    return [] if arch is None else [layer.moe for layer in arch.layers if layer.moe is not None and not layer.is_noop]


def _param_counts(arch: Architecture | None) -> list[str]:
    """The total and active (per token) parameters of ``arch``, e.g. ``["30.5B", "3.3B"]``."""
    if arch is None:
        return ["-", "-"]
    return [_count(arch.num_params), _count(arch.active_params())]


def _count(n: float) -> str:
    """A parameter count with a unit: 412.3K, 30.5M, 3.35B (three significant digits)."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def _summary(arch: Architecture | None) -> str:
    """An architecture's one-line summary without its name, or "-" when the trial recorded none."""
    return arch.summary().split(": ", 1)[-1] if arch is not None else "-"
