"""The package as a whole: the lazily imported public API, the old import paths kept for users,
the layering contract, and the generic registry's lazy and built-in entries."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import autocompress_opt as ac
from autocompress_opt.errors import ConfigError, UnknownNameError, check_int
from autocompress_opt.registry import Registry

ROOT = Path(__file__).parents[1]


def _run(code: str) -> str:
    """Run ``code`` in a fresh interpreter (so nothing this test process imported leaks in)."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize("name", ac.__all__)
def test_every_public_name_resolves_to_its_defining_module(name: str) -> None:
    value = getattr(ac, name)
    module = ac._API[name]
    assert getattr(value, "__module__", module) == module, f"{name} comes from {value.__module__}, not {module}"


def test_unknown_public_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'estimate_costs'"):
        ac.estimate_costs  # noqa: B018


def test_import_is_light_and_the_api_works_without_torch() -> None:
    """``import autocompress_opt`` and the cost model load neither torch nor transformers."""
    printed = _run("""
        import sys
        import autocompress_opt as ac
        light = not {"torch", "transformers", "ray", "optuna"} & set(sys.modules)
        arch = ac.load_architecture("smollm2-135m")
        cost = ac.estimate_cost(arch, "h100-sxm", "vllm", ac.Scenario(concurrency=8))
        print(light, "torch" in sys.modules, cost.tpot_ms > 0)
    """)
    assert printed == "True False True"


def test_old_import_paths_still_work() -> None:
    """Exported checkpoints say ``import autocompress_opt.hetero_model``; ``--plugin`` modules import
    ``autocompress_opt.trials``."""
    printed = _run("""
        import autocompress_opt.hetero_model as old
        from transformers import AutoConfig
        from autocompress_opt.hf.hetero_model import AutocompressDeciLMForCausalLM
        from autocompress_opt.trials import TRIAL_MODES, Target, quality_proxy
        from autocompress_opt.search.study.trials import TRIAL_MODES as new_modes, retained_fraction
        print(old.AutocompressDeciLMForCausalLM is AutocompressDeciLMForCausalLM,
              AutoConfig.for_model("autocompress_decilm").model_type, TRIAL_MODES is new_modes,
              sorted(TRIAL_MODES.names()), quality_proxy is retained_fraction)
    """)
    assert printed == "True autocompress_decilm True ['plan', 'weights'] True"


def test_the_layering_contract_holds() -> None:
    """Imports only run downwards and nothing imports in a cycle (pyproject [tool.importlinter])."""
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.skip("import-linter is not installed: pip install import-linter==2.16")
    result = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]


# ------------------------------------------------------------------ registry
def test_lazy_entry_is_imported_on_first_lookup_only() -> None:
    registry: Registry[object] = Registry("thing")
    registry.register_lazy("dumps", "json:dumps", aliases=("to-json",))
    assert "dumps" in registry and "to-json" in registry and registry.names() == ["dumps"]
    import json

    assert registry.get("TO-JSON") is json.dumps


def test_lazy_entry_with_a_bad_target_is_refused() -> None:
    registry: Registry[object] = Registry("thing")
    with pytest.raises(ValueError, match="expected 'package.module:attribute', got 'json.dumps'"):
        registry.register_lazy("dumps", "json.dumps")


def test_a_name_registered_twice_is_refused_lazy_or_not() -> None:
    registry: Registry[object] = Registry("thing")
    registry.register("a", 1)
    with pytest.raises(ValueError, match="already registered"):
        registry.register_lazy("a", "json:dumps")
    registry.register_lazy("a", "json:dumps", replace=True)
    assert callable(registry.get("a"))


def test_builtins_are_registered_on_first_use_not_at_construction() -> None:
    calls: list[int] = []

    def builtins(registry: Registry[int]) -> None:
        calls.append(1)
        registry.register("one", 1)

    registry: Registry[int] = Registry("number", builtins=builtins)
    assert calls == []
    assert registry.get("one") == 1 and registry.names() == ["one"] and "one" in registry
    assert calls == [1]
    with pytest.raises(UnknownNameError, match="unknown number 'onr' — did you mean 'one'"):
        registry.get("onr")


@pytest.mark.parametrize(
    ("value", "minimum", "message"),
    [
        (0, 1, "n must be a positive int, got 0"),
        (True, 1, "n must be a positive int, got True"),
        (-1, 0, "n must be a non-negative int, got -1"),
        (1, 2, "n must be an int >= 2, got 1"),
        (2.0, 2, "n must be an int >= 2, got 2.0"),
    ],
)
def test_check_int_names_the_field_and_the_value(value: object, minimum: int, message: str) -> None:
    """The one int check of the package: bools and floats are not ints; the minimum is inclusive."""
    with pytest.raises(ConfigError, match=f"^{message}$"):
        check_int(value, "n", minimum=minimum)
    assert check_int(minimum, "n", minimum=minimum) == minimum


def test_cli_help_loads_no_torch() -> None:
    """Every verb's parser is built for ``autocompress --help``; none may import torch or transformers
    (the help would take seconds; benchmarks/bench_cli_help.py times it)."""
    printed = _run("""
        import sys
        from autocompress_opt.cli import build_parser
        build_parser()
        print(sorted({"torch", "transformers", "ray", "optuna"} & set(sys.modules)))
    """)
    assert printed == "[]"


def test_the_install_holds_what_data_readers_need_and_pins_lm_eval() -> None:
    """``--data`` works on a plain install: ``datasets`` and ``pyarrow`` are core dependencies (not an
    extra), and lm-eval, whose internals the evaluator reads, has an upper bound (the range tested)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"]}
    assert {"datasets", "pyarrow"} <= names
    torch = next(d for d in project["dependencies"] if d.startswith("torch"))
    assert torch == "torch>=2.4"  # admits the 2.13.0 CPU build the Makefile installs first
    for spec in (*project["optional-dependencies"]["lmeval"], *project["optional-dependencies"]["dev"]):
        if spec.startswith("lm-eval"):
            assert "<" in spec, spec
