"""``autocompress study``: run, list, show, export and delete Pareto studies.

One module per action: :mod:`.run` (its flags and what it prints), :mod:`.config` (those flags or a
study YAML → :class:`~autocompress_opt.search.study.StudyConfig`), :mod:`.show` (the Pareto table),
:mod:`.manage` (list, delete, export: stored trials read or removed, nothing run or scored),
:mod:`.finalists` (the best trials ranked again after a short recovery).
"""

from __future__ import annotations

from typing import Any

from autocompress_opt.cli._common import add_verb
from autocompress_opt.cli.study import finalists, manage, run, show
from autocompress_opt.cli.study.config import build_config
from autocompress_opt.cli.study.run import RUN_EXAMPLES

__all__ = ["add_parser", "build_config"]


def add_parser(sub: Any) -> None:
    p = add_verb(
        sub,
        "study",
        "Pareto studies: Ray Tune runs trials, a persistent Optuna study (SQLite under "
        "studies/ by default) proposes the global architecture choices.",
        RUN_EXAMPLES,
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    # in the order `autocompress study --help` lists them
    run.add_parser(actions)
    manage.add_list_parser(actions)
    show.add_parser(actions)
    finalists.add_parser(actions)
    manage.add_delete_parser(actions)
    manage.add_export_parser(actions)
