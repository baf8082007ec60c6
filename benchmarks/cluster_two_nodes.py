"""Two-node Ray cluster on this machine: trials on both nodes; killing the worker node loses nothing.

1. ``ray start --head`` and a second ``ray start --address`` (one CPU each, token auth);
2. ``autocompress study run --address ...`` with slow plan-mode trials (tests/study_plugins.py);
3. once both nodes have run trials, kill -9 the worker node's raylet mid-study;
4. check: the study completes with exactly N COMPLETE trials, none lost, no duplicate points.

    .venv/bin/python benchmarks/cluster_two_nodes.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).parent))
from _util import write

ROOT = Path(__file__).parents[1]
BIN = Path(sys.executable).parent
PORT, TRIALS = 6391, 24
ENV = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT / "tests")}


def ray(*args: str) -> str:
    return subprocess.run([str(BIN / "ray"), *args], env=ENV, capture_output=True, text=True, timeout=180).stdout


def worker_raylet_pid() -> int:
    """The second node's raylet: started after the head's, its socket is ``.../sockets/raylet.1``."""
    out = subprocess.run(["pgrep", "-f", r"sockets/raylet\.1 "], capture_output=True, text=True).stdout.split()
    return int(out[0])


def main() -> None:
    os.environ.update({k: ENV[k] for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")})
    if not (Path.home() / ".ray" / "auth_token").exists():
        ray("get-auth-token", "--generate")
    ray("stop", "--force")
    ray("start", "--head", f"--port={PORT}", "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats")
    ray("start", f"--address=127.0.0.1:{PORT}", "--num-cpus=1", "--disable-usage-stats")
    tmp = Path(tempfile.mkdtemp(prefix="cluster-"))
    storage = f"sqlite:///{tmp}/cluster.db"
    cmd = [
        str(BIN / "autocompress"),
        "study",
        "run",
        "--model",
        "smollm2-135m",
        "--targets",
        "h100-sxm",
        "--workload",
        "datacenter",
        "--mode",
        "plan-slow",
        "--plugin",
        "study_plugins",
        "--trials",
        str(TRIALS),
        "--parallel",
        "2",
        "--name",
        "cluster",
        "--storage",
        storage,
        "--address",
        f"127.0.0.1:{PORT}",
        "--quiet",
    ]
    start = time.time()
    driver = subprocess.Popen(cmd, env=ENV, cwd=tmp)
    killed_at, before_kill = None, set()
    try:
        while driver.poll() is None and time.time() - start < 300:
            time.sleep(0.5)
            try:
                trials = optuna.load_study(study_name="cluster.h100-sxm", storage=storage).trials
            except Exception:
                continue
            nodes = {t.user_attrs.get("node") for t in trials if t.state.name == "COMPLETE"}
            if killed_at is None and len(nodes - {None}) >= 2 and len(trials) < TRIALS:
                before_kill = {t.number for t in trials if t.state.name == "COMPLETE"}
                os.kill(worker_raylet_pid(), signal.SIGKILL)
                killed_at = time.time() - start
                print(f"killed the worker node at {killed_at:.1f} s with {len(before_kill)} trials complete")
        code = driver.wait(timeout=300)
    finally:
        ray("stop", "--force")
    study = optuna.load_study(study_name="cluster.h100-sxm", storage=storage)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    nodes = sorted({str(t.user_attrs.get("node"))[:12] for t in done})
    result = {
        "command": "python benchmarks/cluster_two_nodes.py",
        "driver_exit_code": code,
        "trials_requested": TRIALS,
        "complete": len(done),
        "distinct_points": len({tuple(sorted(t.params.items())) for t in done}),
        "running_left": sum(t.state.name == "RUNNING" for t in study.trials),
        "nodes_that_ran_trials": nodes,
        "worker_killed_at_s": killed_at,
        "completed_before_kill": len(before_kill),
        "completed_before_kill_kept": before_kill <= {t.number for t in done},
        "seconds": round(time.time() - start, 1),
    }
    print(result)
    write("cluster_two_nodes", result)


if __name__ == "__main__":
    main()
