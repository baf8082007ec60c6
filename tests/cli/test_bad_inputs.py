"""Every verb turns a bad input into one line: exit code 2, a single stderr line that names the bad
value, no traceback, and nothing written (the input files and folders hash the same before and
after, and no output appears).

The table below is the user's view of issue 13: malformed ``config.json`` files, broken
safetensors, bad hardware YAML, output locations that cannot be written, unknown names and
impossible numbers, fed to the real CLI in-process (``autocompress_opt.cli.main``). Every input
lives in one folder that is hashed around each case; the command runs from inside it, so a default
output location (``plots/``, ``studies/``) would show up as a change too.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from autocompress_opt.cli import main


# ------------------------------------------------------------------ the inputs
def _write_inputs(root: Path) -> None:
    """Every bad (and the few good) input files the table refers to, under ``root``."""
    from tiny_lm import save_hf_dir, tiny_model, write_qwen2_gguf

    good = {
        "model_type": "llama",
        "vocab_size": 260,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 48,
        "max_position_embeddings": 128,
    }

    def config(name: str, **changes: Any) -> None:
        folder = root / "configs" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({**good, **changes}))

    config("non-numeric", hidden_size="thirty-two")
    config("list-value", num_hidden_layers=[2, 2])
    config("zero-heads", num_attention_heads=0)
    config("huge-layers", num_hidden_layers=10**12)
    config("float-layers", num_hidden_layers=1e12)
    config("nan-hidden", hidden_size=float("nan"))
    config("negative-vocab", vocab_size=-5)
    config("bool-hidden", hidden_size=True)
    config("gpt2", model_type="gpt2")
    config("hetero-no-blocks", model_type="autocompress_decilm", base_family="llama")
    (root / "configs" / "not-json").mkdir()
    (root / "configs" / "not-json" / "config.json").write_text('{"model_type": "llama", ')
    (root / "configs" / "latin1").mkdir()
    (root / "configs" / "latin1" / "config.json").write_bytes(b'{"model_type": "llam\xe9"}')
    (root / "configs" / "a-list").mkdir()
    (root / "configs" / "a-list" / "config.json").write_text("[1, 2]")
    (root / "arch.yaml").write_text("layers: [unclosed\n")
    (root / "arch-bad.json").write_text(json.dumps({"vocab_size": 10, "hidden_size": -1, "layers": []}))
    (root / "garbage.gguf").write_bytes(b"GGUF" + os.urandom(60))

    # tiny llama checkpoints: one intact, one truncated, one of garbage bytes
    model = save_hf_dir(tiny_model("llama", seed=0), root / "models" / "good")
    for name, damage in (
        ("truncated", lambda data: data[: len(data) // 2]),
        ("garbage", lambda data: os.urandom(len(data))),
    ):
        broken = root / "models" / name
        broken.mkdir()
        for item in model.iterdir():
            data = item.read_bytes()
            (broken / item.name).write_bytes(damage(data) if item.suffix == ".safetensors" else data)

    # a tiny Qwen2 GGUF cut short (tensor data missing) and cut inside its header
    gguf = write_qwen2_gguf(tiny_model("qwen2", seed=1), root / "models" / "tiny.gguf").read_bytes()
    (root / "models" / "truncated.gguf").write_bytes(gguf[: len(gguf) * 2 // 3])
    (root / "models" / "header-only.gguf").write_bytes(gguf[:200])
    (root / "models" / "tiny.gguf").unlink()

    hw = root / "hw"
    hw.mkdir()
    entry = "- {name: mygpu, memory_gib: %s, bandwidth_gb_s: %s, peak_tflops: %s}\n"
    (hw / "invalid.yaml").write_text("- {name: mygpu, memory_gib: [\n")
    (hw / "latin1.yaml").write_bytes(b"- {name: gp\xe9, memory_gib: 8}\n")
    (hw / "str-memory.yaml").write_text(entry % ("lots", 100, "{bf16: 10}"))
    (hw / "nan-memory.yaml").write_text(entry % (".nan", 100, "{bf16: 10}"))
    (hw / "inf-bandwidth.yaml").write_text(entry % (8, ".inf", "{bf16: 10}"))
    (hw / "negative-memory.yaml").write_text(entry % (-8, 100, "{bf16: 10}"))
    (hw / "list-peaks.yaml").write_text(entry % (8, 100, "[10, 20]"))
    (hw / "str-peak.yaml").write_text(entry % (8, 100, "{bf16: fast}"))
    (hw / "nan-peak.yaml").write_text(entry % (8, 100, "{bf16: .nan}"))
    (hw / "scalar.yaml").write_text("just a string\n")
    (hw / "list-of-strings.yaml").write_text("- h100\n- b200\n")
    (hw / "name-list.yaml").write_text("- {name: [a, b], memory_gib: 8, bandwidth_gb_s: 100, peak_tflops: {bf16: 1}}\n")

    (root / "measurements-latin1.csv").write_bytes(b"id,model\n1,caf\xe9\n")
    (root / "measurements-garbage.csv").write_text("this is not,a measurements file\n1,2\n")
    (root / "file.txt").write_text("a regular file; paths under it cannot be created\n")
    (root / "not-a-db.db").write_text("plain text, not SQLite\n")

    studies = root / "study-yaml"
    studies.mkdir()
    (studies / "invalid.yaml").write_text("targets: [rtx5070\n")
    (studies / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    (studies / "trials-word.yaml").write_text("trials: lots\n")
    (studies / "trials-nan.yaml").write_text("trials: .nan\n")
    (studies / "list.yaml").write_text("- trials\n- 3\n")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad-inputs")
    _write_inputs(root)
    return root


def _tree_hash(root: Path) -> dict[str, str]:
    """Every path under ``root`` → the SHA-256 of its bytes (``dir`` for a folder)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


# ------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Case:
    """One bad invocation: ``argv`` (``{in}`` is the inputs folder) and what the error line must name."""

    id: str
    argv: tuple[str, ...]
    names: tuple[str, ...]


def case(id: str, argv: str, *names: str) -> Any:
    return pytest.param(Case(id, tuple(argv.split()), names), id=id)


COST = "cost --model smollm2-135m --hardware rtx5070 --engine vllm --dtype bf16 --input-len 64 --output-len 8"
PRUNE = "prune --model smollm2-135m --params 1 --out {in}/pruned --cache-dir {in}/cache --no-progress"
DISTILL = (
    "distill --student {in}/models/good --teacher {in}/models/good --steps 1 --seq-len 16 --out {in}/distilled"
    " --no-progress"
)
EVAL = "eval --model {in}/models/good --seq-len 16 --no-progress"
STUDY = "study run --model smollm2-135m --mode plan --trials 2 --name bad --storage {in}/studies.db --quiet"
CALIBRATE = "calibrate --hardware cpu --out {in}/profile.yaml --json"

CASES = [
    # ---- config.json that is not a model
    case("arch-config-non-numeric", "arch --model {in}/configs/non-numeric", "hidden_size", "thirty-two"),
    case("arch-config-list", "arch --model {in}/configs/list-value", "num_hidden_layers", "[2, 2]"),
    case("arch-config-zero-heads", "arch --model {in}/configs/zero-heads", "num_attention_heads", "0"),
    case("arch-config-1e12-layers", "arch --model {in}/configs/huge-layers", "num_hidden_layers", "1000000000000"),
    case("arch-config-float-layers", "arch --model {in}/configs/float-layers", "num_hidden_layers", "1000000000000"),
    case("arch-config-nan", "arch --model {in}/configs/nan-hidden", "hidden_size", "nan"),
    case("arch-config-negative-vocab", "arch --model {in}/configs/negative-vocab", "vocab_size", "-5"),
    case("arch-config-bool", "arch --model {in}/configs/bool-hidden", "hidden_size", "True"),
    case("arch-config-gpt2", "arch --model {in}/configs/gpt2", "gpt2"),
    case("arch-hetero-no-block-configs", "arch --model {in}/configs/hetero-no-blocks", "block_configs"),
    case("arch-config-invalid-json", "arch --model {in}/configs/not-json", "not valid JSON"),
    case("arch-config-non-utf8", "arch --model {in}/configs/latin1", "config.json"),
    case("arch-config-a-list", "arch --model {in}/configs/a-list/config.json", "list"),
    case("arch-yaml-invalid", "arch --model {in}/arch.yaml", "arch.yaml"),
    case("arch-json-negative-hidden", "arch --model {in}/arch-bad.json", "hidden_size", "-1"),
    case("arch-gguf-garbage", "arch --model {in}/garbage.gguf", "garbage.gguf"),
    case("arch-gguf-header-only", "arch --model {in}/models/header-only.gguf", "header-only.gguf"),
    case("arch-unknown-name", "arch --model smollm3-135m", "smollm3-135m"),
    case("arch-missing-path", "arch --model {in}/nope/config.json", "nope"),
    case("arch-kv-dtype", "arch --model smollm2-135m --kv-dtype fp7", "fp7"),
    # ---- hardware YAML
    case("hw-invalid-yaml", "hardware list --hardware-file {in}/hw/invalid.yaml", "invalid.yaml"),
    case("hw-non-utf8", "hardware list --hardware-file {in}/hw/latin1.yaml", "latin1.yaml"),
    case("hw-string-memory", "hardware list --hardware-file {in}/hw/str-memory.yaml", "memory_gib", "lots"),
    case("hw-nan-memory", "hardware list --hardware-file {in}/hw/nan-memory.yaml", "memory_gib", "nan"),
    case("hw-inf-bandwidth", "hardware list --hardware-file {in}/hw/inf-bandwidth.yaml", "bandwidth_gb_s", "inf"),
    case("hw-negative-memory", "hardware list --hardware-file {in}/hw/negative-memory.yaml", "memory_gib", "-8"),
    case("hw-peaks-list", "hardware list --hardware-file {in}/hw/list-peaks.yaml", "peak_tflops", "[10, 20]"),
    case("hw-peak-string", "hardware list --hardware-file {in}/hw/str-peak.yaml", "peak_tflops", "fast"),
    case("hw-peak-nan", "hardware list --hardware-file {in}/hw/nan-peak.yaml", "peak_tflops", "nan"),
    case("hw-scalar", "hardware list --hardware-file {in}/hw/scalar.yaml", "str"),
    case("hw-list-of-strings", "hardware list --hardware-file {in}/hw/list-of-strings.yaml", "h100"),
    case("hw-name-list", "hardware list --hardware-file {in}/hw/name-list.yaml", "name", "['a', 'b']"),
    case("hw-missing-file", "hardware list --hardware-file {in}/hw/nope.yaml", "nope.yaml"),
    case("hw-unknown-action", "hardware lsit", "lsit"),
    # ---- cost
    case("cost-engine-option-word", COST + " --engine-option memory_fraction=high", "memory_fraction", "high"),
    case("cost-engine-option-no-equals", COST + " --engine-option memory_fraction", "memory_fraction"),
    case("cost-unknown-hardware", COST.replace("rtx5070", "rtx9090"), "rtx9090"),
    case("cost-unknown-engine", COST.replace("vllm", "vlm"), "vlm"),
    case("cost-unknown-dtype", COST.replace("bf16", "bf17"), "bf17"),
    case("cost-input-len-word", COST.replace("--input-len 64", "--input-len many"), "many"),
    case("cost-concurrency-word", COST + " --concurrency lots", "lots"),
    case("cost-zero-tp", COST + " --tp 0", "tp", "0"),
    case("cost-zero-concurrency", COST + " --concurrency 0", "concurrency", "0"),
    case("cost-zero-input-len", COST.replace("--input-len 64", "--input-len 0"), "input_len", "0"),
    case("cost-negative-output-len", COST.replace("--output-len 8", "--output-len -1"), "output_len", "-1"),
    case("cost-memory-fraction-nan", COST + " --engine-option memory_fraction=nan", "memory_fraction", "nan"),
    case("cost-memory-fraction-negative", COST + " --engine-option memory_fraction=-0.5", "memory_fraction", "-0.5"),
    case("cost-memory-fraction-inf", COST + " --engine-option memory_fraction=inf", "memory_fraction", "inf"),
    case("cost-unknown-engine-option", COST + " --engine-option bogus=1", "bogus"),
    case("cost-unknown-kv-dtype", COST + " --kv-dtype fp7", "fp7"),
    case("cost-hardware-file-nan", COST + " --hardware-file {in}/hw/nan-memory.yaml", "memory_gib", "nan"),
    # ---- report
    case("report-out-under-file", "report --out {in}/file.txt/plots", "file.txt"),
    case("report-unknown-workload", "report --workload datacentre --out {in}/plots", "datacentre"),
    case("report-unknown-hardware", "report --hardware rtx9090 --out {in}/plots", "rtx9090"),
    case("report-unknown-model", "report --model smollm9 --out {in}/plots", "smollm9"),
    # ---- validate
    case("validate-missing-csv", "validate --measurements {in}/nope.csv", "nope.csv"),
    case("validate-folder-not-csv", "validate --measurements {in}", "is a folder", "measurements.csv"),
    case("validate-non-utf8-csv", "validate --measurements {in}/measurements-latin1.csv", "measurements-latin1.csv"),
    case("validate-wrong-columns", "validate --measurements {in}/measurements-garbage.csv", "measurements-garbage"),
    case("validate-fit-out-under-file", "validate --fit --out {in}/file.txt/p.yaml", "file.txt"),
    case("validate-out-without-fit", "validate --out {in}/p.yaml", "--out", "--fit"),
    # ---- calibrate (every check before the timing sweep)
    case("calibrate-zero-archs", CALIBRATE + " --archs 0", "--archs", "0"),
    case("calibrate-negative-prompt", CALIBRATE + " --prompt-len -1", "--prompt-len", "-1"),
    case("calibrate-zero-passes", CALIBRATE + " --passes 0", "--passes", "0"),
    case("calibrate-zero-batch", CALIBRATE + " --batch 0", "--batch", "0"),
    case("calibrate-negative-seed", CALIBRATE + " --seed -1", "--seed", "-1"),
    case("calibrate-unknown-hardware", CALIBRATE.replace("cpu", "rtx9090", 1), "rtx9090"),
    case("calibrate-out-under-file", "calibrate --out {in}/file.txt/p.yaml --json", "file.txt"),
    case("calibrate-bad-device", CALIBRATE + " --device tpu", "tpu"),
    case("calibrate-bad-compute-dtype", CALIBRATE + " --compute-dtype int4", "int4"),
    case("calibrate-cuda-absent", CALIBRATE + " --device cuda", "cuda"),
    # ---- calibrate --engine (checked before the engine is looked for or any model is built)
    case("calibrate-engine-unknown", CALIBRATE + " --engine sglang", "--engine", "sglang"),
    case("calibrate-engine-gguf-type", CALIBRATE + " --engine llamacpp --gguf-type q3_k", "q3_k", "q4_k_m"),
    case("calibrate-engine-vllm-dtype", CALIBRATE + " --engine vllm --vllm-dtype int8", "int8", "bfloat16"),
    case("calibrate-engine-one-model", CALIBRATE + " --engine llamacpp --archs 1", "--archs", "1"),
    case("calibrate-engine-heldout", CALIBRATE + " --engine llamacpp --heldout-fraction 1.5", "--heldout", "1.5"),
    case("calibrate-engine-none-fitted", CALIBRATE + " --engine llamacpp --archs 3 --heldout-fraction 0.9", "0.9"),
    case("calibrate-engine-concurrency", CALIBRATE + " --engine vllm --concurrency 0", "--concurrency", "0"),
    case("calibrate-engine-gen-len", CALIBRATE + " --engine vllm --gen-len 1", "--gen-len", "1"),
    case("calibrate-engine-threads", CALIBRATE + " --engine llamacpp --threads 0", "--threads", "0"),
    case("calibrate-engine-unknown-hardware", CALIBRATE.replace("cpu", "rtx9090", 1) + " --engine llamacpp", "rtx9090"),
    # ---- plot
    case("plot-missing-study", "plot nosuchstudy --out {in}/plots", "nosuchstudy"),
    case("plot-out-under-file", "plot nosuchstudy --out {in}/file.txt/plots", "file.txt"),
    case("plot-storage-not-sqlite", "plot demo --storage sqlite:///{in}/not-a-db.db --out {in}/plots", "not-a-db.db"),
    # ---- eval (every check before the model loads)
    case("eval-truncated-safetensors", EVAL.replace("good", "truncated"), "truncated"),
    case("eval-device-gpu", EVAL + " --device gpu", "gpu"),
    case("eval-compute-dtype-int8", EVAL + " --compute-dtype int8", "int8"),
    case("prune-device-gpu", PRUNE + " --device gpu", "gpu"),
    case("eval-garbage-safetensors", EVAL.replace("good", "garbage"), "garbage"),
    case("eval-truncated-gguf", "eval --model {in}/models/truncated.gguf", "truncated.gguf"),
    case("eval-header-only-gguf", "eval --model {in}/models/header-only.gguf", "header-only.gguf"),
    case("eval-zero-samples", EVAL + " --samples 0", "--samples", "0"),
    case("eval-negative-seq-len", EVAL + " --seq-len -1", "--seq-len", "-1"),
    case("eval-seq-len-beyond-context", EVAL + " --seq-len 1000", "--seq-len 1000", "128"),
    case("eval-zero-batch", EVAL + " --batch-size 0", "--batch-size", "0"),
    case("eval-out-under-file", EVAL + " --out {in}/file.txt/eval.json", "file.txt"),
    case("eval-out-is-a-folder", EVAL + " --out {in}/models", "models"),
    case("eval-unknown-task", EVAL + " --tasks wordnet-defin", "wordnet-defin"),
    case("eval-zero-items", EVAL + " --tasks all --items 0", "--items", "0"),
    case("eval-missing-model", "eval --model {in}/models/nope", "nope"),
    case("eval-missing-parent", EVAL + " --parent {in}/models/nope", "nope"),
    case("eval-config-only-dir", "eval --model {in}/configs/zero-heads", "num_attention_heads"),
    # ---- prune
    case("prune-truncated-safetensors", PRUNE.replace("smollm2-135m", "{in}/models/truncated"), "truncated"),
    case("prune-garbage-safetensors", PRUNE.replace("smollm2-135m", "{in}/models/garbage"), "garbage"),
    case("prune-truncated-gguf", PRUNE.replace("smollm2-135m", "{in}/models/truncated.gguf"), "truncated.gguf"),
    case("prune-params-nan", PRUNE.replace("--params 1", "--params nan"), "nan"),
    case("prune-params-negative", PRUNE.replace("--params 1", "--params -0.5"), "-0.5"),
    case("prune-params-zero", PRUNE.replace("--params 1", "--params 0"), "0"),
    case("prune-out-under-file", PRUNE.replace("{in}/pruned", "{in}/file.txt/pruned"), "file.txt"),
    # ---- distill (every check before a model loads)
    case("distill-truncated-student", DISTILL.replace("good", "truncated", 1), "truncated"),
    case(
        "distill-garbage-teacher",
        DISTILL.replace("--teacher {in}/models/good", "--teacher {in}/models/garbage"),
        "garbage",
    ),
    case(
        "distill-truncated-gguf-teacher",
        DISTILL.replace("-teacher {in}/models/good", "-teacher {in}/models/truncated.gguf"),
        "truncated.gguf",
    ),
    case("distill-zero-steps", DISTILL.replace("--steps 1", "--steps 0"), "steps", "0"),
    case("distill-nan-lr", DISTILL + " --lr nan", "lr", "nan"),
    case("distill-inf-lr", DISTILL + " --lr inf", "lr", "inf"),
    case("distill-zero-temperature", DISTILL + " --temperature 0", "temperature", "0"),
    case("distill-out-under-file", DISTILL.replace("{in}/distilled", "{in}/file.txt/distilled"), "file.txt"),
    case("distill-missing-student", DISTILL.replace("models/good", "models/nope", 1), "nope"),
    case("distill-bad-device", DISTILL + " --device tpu", "tpu"),
    # ---- serve-check
    case("serve-check-missing-dir", "serve-check {in}/models/nope --engine vllm", "nope"),
    case("serve-check-unknown-engine", "serve-check {in}/models/good --engine sglang", "sglang"),
    # ---- memory
    case("memory-config-zero-heads", "memory --model {in}/configs/zero-heads --mode weights", "num_attention_heads"),
    case("memory-zero-gpus", "memory --model smollm2-135m --mode distill --gpus 0", "gpus", "0"),
    case("memory-unknown-dtype", "memory --model smollm2-135m --mode weights --compute-dtype fp7", "fp7"),
    # ---- study (only inputs study.py already refuses in one line; the rest are listed in the issue notes)
    case("study-missing-config", STUDY + " --config {in}/nope.yaml", "nope.yaml"),
    case("study-zero-trials", STUDY.replace("--trials 2", "--trials 0"), "trials", "0"),
    case("study-unknown-target", STUDY + " --targets rtx9090", "rtx9090"),
    case("study-unknown-engine", STUDY + " --engine vlm", "vlm"),
    case("study-unknown-scheduler", STUDY + " --scheduler hyperband", "hyperband", "asha"),
    case("study-asha-in-plan-mode", STUDY + " --scheduler asha", "asha", "plan"),
    case("study-unknown-serve-as", STUDY + " --serve-as vlm", "vlm"),
    case("study-gpus-per-trial-negative", STUDY + " --gpus-per-trial -1", "-1"),
    case("study-proxy-negative", STUDY.replace("--mode plan", "--mode weights") + " --proxy -1", "proxy", "-1"),
    case("study-proxy-in-plan-mode", STUDY + " --proxy 3", "proxy", "plan"),
    case("study-time-budget-zero", STUDY + " --time-budget 0", "time_budget", "0"),
    case("study-time-budget-nan", STUDY + " --time-budget nan", "time_budget", "nan"),
    case(
        "study-finalists-negative",
        STUDY.replace("--mode plan", "--mode weights") + " --finalists -1",
        "finalists",
        "-1",
    ),
    case("study-finalists-in-plan-mode", STUDY + " --finalists 2", "finalists", "plan"),
    case("study-engine-option-word", STUDY + " --engine-option memory_fraction=high", "memory_fraction", "high"),
    case("study-negative-input-len", STUDY + " --input-len -1", "input_len", "-1"),
    case("study-unknown-mode", STUDY.replace("--mode plan", "--mode plen"), "plen"),
    case("study-inner-in-plan-mode", STUDY + " --inner steps=3", "--inner"),
    case("study-constraint-word", STUDY + " --max-ttft-ms abc", "abc"),
    case("study-show-not-a-database", "study show demo --storage {in}/not-a-db.db", "not-a-db.db"),
    case("study-show-sqlite-not-a-database", "study show demo --storage sqlite:///{in}/not-a-db.db", "not-a-db.db"),
    case("study-list-not-a-database", "study list --storage {in}/not-a-db.db", "not-a-db.db"),
    case("study-delete-missing-storage", "study delete demo --yes --storage {in}/nope.db", "nope.db"),
    case("study-yaml-invalid", STUDY + " --config {in}/study-yaml/invalid.yaml", "invalid.yaml", "line"),
    case("study-yaml-non-utf8", STUDY + " --config {in}/study-yaml/latin1.yaml", "latin1.yaml", "UTF-8"),
    case(
        "study-yaml-trials-word",
        STUDY.replace(" --trials 2", "") + " --config {in}/study-yaml/trials-word.yaml",
        "trials",
        "lots",
    ),
    case(
        "study-yaml-trials-nan",
        STUDY.replace(" --trials 2", "") + " --config {in}/study-yaml/trials-nan.yaml",
        "trials",
        "nan",
    ),
    case("study-yaml-not-a-mapping", STUDY + " --config {in}/study-yaml/list.yaml", "list.yaml", "mapping"),
    case("study-storage-under-file", STUDY.replace("{in}/studies.db", "{in}/file.txt/studies.db"), "file.txt"),
    case(
        "study-storage-sqlite-under-file", STUDY.replace("{in}/studies.db", "sqlite:///{in}/file.txt/s.db"), "file.txt"
    ),
    case("study-storage-text-file", STUDY.replace("{in}/studies.db", "{in}/file.txt"), "file.txt"),
    case(
        "study-storage-sqlite-text-file", STUDY.replace("{in}/studies.db", "sqlite:///{in}/not-a-db.db"), "not-a-db.db"
    ),
    # ---- the command line itself
    case("unknown-verb", "prnue --model x", "prnue"),
    case("unknown-flag", "arch --model smollm2-135m --jsn", "--jsn"),
    case("int-flag-word", "eval --model smollm2-135m --samples many", "many"),
]


def _exit_code(argv: list[str]) -> int:
    """``main(argv)``'s exit code, argparse's SystemExit included; any other exception propagates
    (and fails the test with its traceback, which is what a user would have seen)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


@pytest.mark.parametrize("bad", CASES)
def test_bad_input_is_one_line_exit_2_and_changes_nothing(
    bad: Case, inputs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(inputs)
    monkeypatch.setenv("HOME", str(inputs / "home"))
    argv = [arg.replace("{in}", str(inputs)) for arg in bad.argv]
    before = _tree_hash(inputs)
    code = _exit_code(argv)
    out, err = capsys.readouterr()
    assert code == 2, f"exit {code}\nstdout: {out}\nstderr: {err}"
    assert "Traceback" not in err, err
    assert err.count("\n") == 1 and err.endswith("\n"), f"not one line:\n{err}"
    assert err.startswith("autocompress"), err
    for name in bad.names:
        assert name.replace("{in}", str(inputs)) in err, f"{name!r} not named in: {err}"
    assert _tree_hash(inputs) == before, "the command changed or created files"


def test_the_table_covers_every_verb() -> None:
    from autocompress_opt.cli import _VERBS

    verbs = {p.values[0].argv[0] for p in CASES}  # type: ignore[union-attr]
    assert len(CASES) >= 40
    missing = {module.replace("_", "-") for module in _VERBS} - verbs
    assert not missing, missing


READ_ONLY = [
    ("report", "report --out {ro}/plots"),
    ("plot", "plot nosuchstudy --out {ro}/plots"),
    ("eval", EVAL + " --out {ro}/eval.json"),
    ("calibrate", "calibrate --out {ro}/profile.yaml --json"),
    ("validate", "validate --fit --out {ro}/profile.yaml"),
    ("distill", DISTILL.replace("{in}/distilled", "{ro}/distilled")),
    ("prune", PRUNE.replace("{in}/pruned", "{ro}/pruned")),
]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only folders anyway")
@pytest.mark.parametrize("verb,argv", READ_ONLY, ids=[verb for verb, _ in READ_ONLY])
def test_read_only_output_folder_is_one_line_exit_2(
    verb: str,
    argv: str,
    inputs: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A folder without write permission (the table above covers root's case: a path under a file)."""
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    monkeypatch.chdir(inputs)
    try:
        code = _exit_code([a.replace("{in}", str(inputs)).replace("{ro}", str(read_only)) for a in argv.split()])
    finally:
        read_only.chmod(0o755)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert str(read_only) in err and "cannot write" in err, err
    assert not any(read_only.iterdir())
