"""Shared bits of the benchmarks: where results go and how they are stamped."""

from __future__ import annotations

import json
import os
import platform
import pstats
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def machine() -> dict[str, Any]:
    import numpy
    import torch

    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "numpy": numpy.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def provenance(**seeds: Any) -> dict[str, Any]:
    """What a result depends on besides its inputs: the code version (git commit, and whether the
    tree had uncommitted changes), the versions of the packages that compute it, and the seeds."""
    import subprocess
    from importlib import metadata

    root = Path(__file__).parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    versions = {}
    for dist in ("autocompress-opt", "torch", "transformers", "optuna", "ray", "numpy"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "code": {
            "commit": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--", "autocompress_opt", "benchmarks", ":!benchmarks/results")),
        },
        "versions": versions,
        "seeds": seeds,
    }


def code_hash(*parts: str) -> str:
    """A short hash of the package sources that compute a stage: the ``.py`` files of the named
    subpackages or modules of ``autocompress_opt`` (e.g. ``"prune", "hf", "arch"``). A stage cached
    under a key that includes it is recomputed whenever that code changes."""
    import hashlib

    root = Path(__file__).parent.parent / "autocompress_opt"
    digest = hashlib.sha256()
    for part in sorted(parts):
        where = root / part
        files = sorted(where.rglob("*.py")) if where.is_dir() else [where.with_suffix(".py")]
        for f in files:
            digest.update(str(f.relative_to(root)).encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()[:12]


def write(name: str, data: dict[str, Any], results: Path | None = None) -> Path:
    """Write ``data`` with the date and machine to ``<results>/<name>.json`` (default :data:`RESULTS`)."""
    results = results or RESULTS
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{name}.json"
    payload = {
        "benchmark": name,
        "date": f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}",
        "machine": machine(),
        **data,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")
    return path


def _function_name(key: tuple[str, int, str], tree: Path) -> str:
    """A profiled function as ``path:line(name)``, its path relative to ``tree`` or site-packages."""
    path, line, name = key
    for root in (str(tree) + "/", str(Path(sys.prefix)) + "/lib/"):
        if path.startswith(root):
            path = path[len(root) :]
            break
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    return f"{path}:{line}({name})" if line else name


def top_functions(stats: pstats.Stats, key: str, tree: Path, n: int) -> list[dict[str, Any]]:
    """The ``n`` functions with the most ``key`` CPU seconds ("cumulative" or "tottime") in a profile
    of code under ``tree``."""
    index = {"cumulative": 3, "tottime": 2}[key]
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][index], reverse=True)[:n]  # type: ignore[attr-defined]
    return [
        {"function": _function_name(func, tree), "calls": nc, "tottime_s": round(tt, 3), "cumtime_s": round(ct, 3)}
        for func, (_cc, nc, tt, ct, _callers) in rows
    ]


def git_in(tree: Path, *args: str) -> str:
    """``git -C tree args`` output, stripped; "" when git or the tree is not there."""
    import subprocess

    try:
        return subprocess.run(
            ["git", "-C", str(tree), *args], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def import_tree(tree: Path) -> Any:
    """Import ``autocompress_opt`` from the checkout ``tree`` (put first on ``sys.path``) with torch on one
    thread, so CPU seconds hardly depend on the machine's load; returns torch. Exits when another copy
    was imported (an installed one shadowing ``tree``)."""
    sys.path.insert(0, str(tree))
    import torch

    torch.set_num_threads(1)
    import autocompress_opt

    if Path(autocompress_opt.__file__).resolve().parent.parent != tree:
        raise SystemExit(f"imported autocompress_opt from {autocompress_opt.__file__}, not from --tree {tree}")
    return torch
