#!/usr/bin/env bash
# The first run on a machine with one NVIDIA GPU: one command, one results JSON (issue 31).
#
#   benchmarks/gpu_first_run.sh                # on the GPU machine, from the repository root
#   benchmarks/gpu_first_run.sh --dry-run      # anywhere (CI): probes the machine, runs nothing heavy
#
# Steps, each timed, its output kept under build/gpu_first_run/ and its exit status recorded; a failing step
# does not stop the later ones (the JSON says which failed):
#   1. install     make install-gpu (torch's CUDA build, then everything `make install` installs)
#   2. env         torch, CUDA, the GPU's name and compute capability, which engines are found where
#   3. tests-gpu   pytest tests/gpu on cuda, its figures (seconds, peak memory, bf16/fp32 KL) and its passed /
#                  skipped / failed counts recorded; "skipped", never "ok", when a test skipped (pytest exits 0 then)
#   4. bench-gpu   benchmarks/bench_gpu.py: one SmolLM2 weights trial in bf16 and fp32 (results/gpu_smollm2.json)
#   5. study       a short SmolLM2 weights study on cuda (4 trials, one target, one trial at a time)
#   6. serve-check a pruned SmolLM2 served by vLLM on the GPU, when a vLLM is found (AUTOCOMPRESS_VLLM_PYTHON,
#                  --vllm-python, or `make engines`'s); recorded as skipped otherwise
# and writes benchmarks/results/gpu_first_run.json (--out FILE for elsewhere). Expected under 10 minutes
# on one H100-class GPU once the wheels are downloaded (the install step is most of a first run).
#
# --dry-run: no install and no GPU work: steps 1 and 3-6 are recorded with the commands they would run
# and status "dry-run"; step 2 runs for real. Its JSON goes to ${TMPDIR:-/tmp}/gpu_first_run_dry.json
# unless --out is given (tests/gpu/test_gpu_first_run.py runs it so in CI).
# Options: --out FILE, --python PY (default .venv/bin/python), --skip-install (the venv is ready),
#          --vllm-python PATH (exported as AUTOCOMPRESS_VLLM_PYTHON).
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0 INSTALL=1 OUT="" PY=".venv/bin/python"
while [ $# -gt 0 ]; do
	case "$1" in
	--dry-run) DRY=1 ;;
	--skip-install) INSTALL=0 ;;
	--out) OUT="$2"; shift ;;
	--python) PY="$2"; shift ;;
	--vllm-python) export AUTOCOMPRESS_VLLM_PYTHON="$2"; shift ;;
	-h | --help) sed -n '2,25p' "$0"; exit 0 ;;
	*) echo "gpu_first_run.sh: unknown option '$1' (--dry-run, --skip-install, --out FILE, --python PY, --vllm-python PATH)" >&2; exit 2 ;;
	esac
	shift
done
if [ -z "$OUT" ]; then
	if [ $DRY = 1 ]; then OUT="${TMPDIR:-/tmp}/gpu_first_run_dry.json"; else OUT="benchmarks/results/gpu_first_run.json"; fi
fi
if [ $DRY = 1 ] && [ ! -x "$PY" ]; then PY=$(command -v python3); fi
CLI=("$PY" -c 'import sys; from autocompress_opt.cli import main; sys.exit(main())')
# Each step's stdout/stderr: build/gpu_first_run/ (git-ignored) for a real run, beside the JSON for a dry one.
if [ $DRY = 1 ]; then LOGS="$OUT.logs"; else LOGS="build/gpu_first_run"; fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-first-run.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$LOGS" "$(dirname "$OUT")"
STEPS="$LOGS/steps.tsv"
: >"$STEPS"
T0=$SECONDS

# step NAME COMMAND...: run it (or, in a dry run, only record it), timing it; one TSV line per step.
step() {
	local name=$1 t=$SECONDS rc status cmd
	shift
	cmd=$(printf '%s ' "$@" | tr '\n\t' '  ')  # one TSV field
	if [ $DRY = 1 ] && [ "$name" != env ]; then
		printf '%s\t%s\t%s\t%s\t%s\n' "$name" "dry-run" "" 0 "$cmd" >>"$STEPS"
		return 0
	fi
	echo "== $name: ${cmd:0:160}"
	"$@" >"$LOGS/$name.log" 2>"$LOGS/$name.err"
	rc=$?
	if [ $rc = 0 ]; then status=ok; else status=failed; echo "   $name failed (exit $rc): see $LOGS/$name.log"; fi
	printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$((SECONDS - t))" "$cmd" >>"$STEPS"
}

skipped() {  # skipped NAME WHY
	printf '%s\t%s\t%s\t%s\t%s\n' "$1" "skipped" "" 0 "$2" >>"$STEPS"
}

if [ $INSTALL = 1 ]; then step install make install-gpu; else skipped install "--skip-install"; fi

step env "$PY" -c '
import json, torch
from autocompress_opt.runtimes import install
gpus = [{"name": torch.cuda.get_device_name(i), "capability": "%d.%d" % torch.cuda.get_device_capability(i),
         "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
        for i in range(torch.cuda.device_count())]
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": gpus, "engines": install.status()}))'

step tests-gpu env AUTOCOMPRESS_GPU_SUITE_DEVICE=cuda AUTOCOMPRESS_GPU_SUITE_RECORD="$WORK/tests_gpu.json" \
	"$PY" -m pytest -q tests/gpu -rs -p no:cacheprovider --junitxml="$WORK/tests_gpu.xml"

step bench-gpu "$PY" benchmarks/bench_gpu.py

# One target and four trials, one at a time on the one GPU; its own SQLite file, so nothing is left behind.
step study "${CLI[@]}" study run --model smollm2-135m --targets h100-sxm:datacenter \
	--mode weights --trials 4 --parallel 1 --gpus-per-trial 1 --device cuda --compute-dtype bf16 \
	--name gpu-first-run --storage "sqlite:///$WORK/study.db" --cache-dir "$WORK/cache" --quiet

VLLM_FOUND=$([ $DRY = 1 ] && echo yes || "$PY" -c 'from autocompress_opt.runtimes import install
try:
    install.vllm(); print("yes")
except install.EngineMissing as exc:
    print(exc)' 2>&1 | tail -1)
if [ "$VLLM_FOUND" = yes ]; then
	step prune "${CLI[@]}" prune --model smollm2-135m --params 0.6 --out "$WORK/pruned" \
		--device cuda --no-progress
	step serve-check "${CLI[@]}" serve-check "$WORK/pruned" --engine vllm --json
else
	skipped serve-check "no vLLM: $VLLM_FOUND"
fi

# The results JSON: every step, the machine, and the figures the steps wrote.
"$PY" - "$STEPS" "$LOGS" "$OUT" "$DRY" "$((SECONDS - T0))" "$WORK" <<'EOF'
import datetime, json, platform, subprocess, sys
from pathlib import Path

steps_tsv, logs, out, dry, total_s, work = sys.argv[1:7]


def suite_counts(report):
    """passed / skipped / failed test counts of a pytest JUnit XML report, and the skips' messages."""
    from xml.etree import ElementTree

    if not report.is_file():
        return {}
    cases = list(ElementTree.parse(report).getroot().iter("testcase"))
    skips = [c.find("skipped") for c in cases]
    failed = sum(c.find("failure") is not None or c.find("error") is not None for c in cases)
    skipped = [s.get("message", "") for s in skips if s is not None]
    return {"passed": len(cases) - failed - len(skipped), "skipped": len(skipped), "failed": failed,
            "skip_reasons": sorted(set(skipped))}


steps = []
for line in Path(steps_tsv).read_text(encoding="utf-8").splitlines():
    name, status, rc, seconds, command = line.split("\t", 4)
    entry = {"name": name, "status": status, "exit_code": int(rc) if rc else None, "seconds": int(seconds),
             "command": command}
    log, err = Path(logs) / f"{name}.log", Path(logs) / f"{name}.err"
    if log.is_file():
        text = log.read_text(encoding="utf-8", errors="replace")
        entry["stdout_tail"] = text[-1500:]
        entry["stderr_tail"] = err.read_text(encoding="utf-8", errors="replace")[-1500:] if err.is_file() else ""
        if name in ("env", "serve-check") and status == "ok":  # both print one JSON document on stdout
            try:
                entry["result"] = json.loads(text[text.index("{"):])
            except ValueError:
                pass
    if name == "tests-gpu" and status == "ok":  # pytest exits 0 when every test skips: a skip is no pass
        entry.update(suite_counts(Path(work) / "tests_gpu.xml"))
        if entry.get("skipped"):
            entry["status"] = "skipped"
    steps.append(entry)


def read(path):
    p = Path(path)
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    commit = ""
record = {
    "benchmark": "gpu_first_run",
    "dry_run": dry == "1",
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "machine": {"host": platform.node(), "platform": platform.platform(), "python": platform.python_version()},
    "code_version": commit,
    "total_s": int(total_s),
    "ok": all(s["status"] in ("ok", "skipped", "dry-run") for s in steps),
    "steps": steps,
    "tests_gpu": read(Path(work) / "tests_gpu.json"),
    "bench_gpu": None if dry == "1" else read("benchmarks/results/gpu_smollm2.json"),
}
Path(out).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
print(f"wrote {out} ({'dry run, ' if dry == '1' else ''}{sum(s['status'] == 'ok' for s in steps)} steps ok, "
      f"{sum(s['status'] == 'failed' for s in steps)} failed, {total_s} s)")
sys.exit(0 if record["ok"] else 1)
EOF
