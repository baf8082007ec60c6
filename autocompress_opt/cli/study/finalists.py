"""``autocompress study finalists``: a weights-mode study's best trials ranked again after the same
short recovery (:mod:`autocompress_opt.recover.finalists`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from autocompress_opt.cli._common import print_json, table

EXAMPLES = """examples:

  autocompress study finalists smollm2-weights.rtx5070
  autocompress study finalists demo.b200 --storage sqlite:///studies/demo.db --top 5 --steps 60
  autocompress prune --from-study demo.b200 --storage sqlite:///studies/demo.db --trial recovered --out pruned/b200

Each of the --top best feasible trials (distinct models, by the KL the study stored) is cut as its
trial cut it, distilled from the parent for --steps updates of --batch-size x --seq-len tokens with
one --seed, and scored again on the trial's selection rows (never the test split). The finalist
with the lowest KL after recovery is the recommendation; 'prune --trial recovered' exports it.
Ranking before recovery favours cuts that distillation does not forgive (heads, KV groups): see
docs/studies.md. Each result is stored on the study as it lands: a rerun resumes, a finished
ranking prints at once. Costs about --top x --steps training steps (SmolLM2-135M on 2 CPU cores:
about 1 s a step at the defaults).
"""


def add_parser(actions: Any) -> None:
    p = actions.add_parser(
        "finalists",
        help="rank the best trials again after the same short recovery",
        description=__doc__.split("\n\n")[0].replace("``", "'"),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", help="one study, NAME.hardware (or a group NAME with one target)")
    p.add_argument("--storage", help="storage URL (default sqlite:///studies/NAME.db)")
    p.add_argument("--top", type=int, default=3, help="finalists: the best distinct feasible trials (default 3)")
    p.add_argument("--steps", type=int, default=30, help="distillation updates per finalist (default 30)")
    p.add_argument("--batch-size", type=int, default=4, help="rows per update (default 4)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per row (default 128)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (default 1e-4)")
    p.add_argument("--seed", type=int, default=0, help="the recovery's seed, the same for every finalist")
    p.add_argument("--cache-dir", default=None, help="the trials' caches (default .autocompress: as for study run)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-progress", action="store_true", help="no distillation progress bars")
    p.set_defaults(run=_finalists)


def _finalists(args: argparse.Namespace) -> int:
    from autocompress_opt.errors import ConfigError
    from autocompress_opt.recover.finalists import FinalistRecipe, rank_finalists
    from autocompress_opt.search.study import default_storage, group_members

    recipe = FinalistRecipe(
        top=args.top, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr, seed=args.seed
    )
    url = args.storage or default_storage(args.name.split(".")[0])
    members = group_members(args.name, url)
    if len(members) != 1:
        raise ConfigError(f"{args.name!r} names {len(members)} studies ({', '.join(members)}); name one of them")
    report = (lambda line: print(line, file=sys.stderr)) if args.json else print
    ranking = rank_finalists(
        url, members[0], recipe, cache_dir=args.cache_dir, progress=not args.no_progress, report=report
    )
    if args.json:
        print_json(ranking.to_dict())
        return 0
    print_ranking(ranking)
    return 0


def print_ranking(ranking: Any) -> None:
    """The finalists as a table, the chosen one marked, and whether recovery changed the study's choice."""
    chosen, steps = ranking.chosen.trial, ranking.recipe.steps
    rows = [
        [
            str(f.trial),
            f.summary.split(": ", 1)[-1].removesuffix(f", {f.params / 1e6:.1f}M params"),  # the shape, once
            f"{f.params / 1e6:.1f}M",
            f"{f.kl_in_study:.4f}",
            f"{f.kl_recovered:.4f}" if f.kl_recovered is not None else "-",
            "<- chosen" if f.trial == chosen else "",
        ]
        for f in ranking.finalists
    ]
    print(table(rows, ["trial", "model", "params", "KL in study", f"KL after {steps} steps", ""]))
    best = ranking.finalists[0].trial
    if chosen != best:
        print(f"recovery changes the ranking: trial {chosen} replaces the study's best, trial {best}")
    else:
        print(f"recovery keeps the study's best, trial {best}")
