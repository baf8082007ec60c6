"""``autocompress study list``, ``delete`` and ``export``: stored trials listed, removed or written
out; nothing is run or scored."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from autocompress_opt.cli._common import print_json, table


def add_list_parser(actions: Any) -> None:
    lst = actions.add_parser("list", help="list studies under studies/ (or in --storage)")
    lst.add_argument("--storage", action="append", help="storage URL(s) to list (default every studies/*.db)")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(run=_list)


def add_delete_parser(actions: Any) -> None:
    delete = actions.add_parser("delete", help="delete a study group (or one study) and its trials")
    delete.add_argument("name", help="group name (or one study, NAME.hardware)")
    delete.add_argument("--storage", help="storage URL (default sqlite:///studies/NAME.db)")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    delete.set_defaults(run=_delete)


def add_export_parser(actions: Any) -> None:
    exp = actions.add_parser("export", help="one row per trial as CSV or JSON")
    exp.add_argument("name")
    exp.add_argument("--storage")
    exp.add_argument("--format", choices=["csv", "json"], default="csv")
    exp.add_argument("--out", type=Path, help="file to write (default stdout)")
    exp.set_defaults(run=_export)


def _list(args: argparse.Namespace) -> int:
    from autocompress_opt.search.study.studyio import list_studies

    urls = args.storage or [f"sqlite:///{p}" for p in sorted(Path("studies").glob("*.db"))]
    rows = [row for url in urls for row in list_studies(url)]
    if args.json:
        print_json(rows)
    elif not rows:
        print("no studies yet: run 'autocompress study run --help'")
    else:
        print(
            table(
                [[r["study"], str(r["trials"]), ",".join(r["directions"]), r["storage"]] for r in rows],
                ["study", "trials", "directions", "storage"],
            )
        )
    return 0


def _delete(args: argparse.Namespace) -> int:
    from autocompress_opt.search.study import default_storage, delete_studies, group_members

    url = args.storage or default_storage(args.name.split(".")[0])
    names = group_members(args.name, url)
    if not args.yes:
        try:
            answer = input(f"delete {', '.join(names)} (every trial) from {url}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted", file=sys.stderr)
            return 1
    delete_studies(url, names)
    print(f"deleted {', '.join(names)} from {url}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from autocompress_opt.search.study.studyio import export_rows, load_group, rows_to_csv

    rows = [row for view in load_group(args.name, args.storage) for row in export_rows(view)]
    text = rows_to_csv(rows) if args.format == "csv" else json.dumps(rows, indent=2, default=str)
    if args.out:
        args.out.write_text(text)
        print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
