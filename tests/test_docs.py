"""The docs and their numbers: README.md and docs/ equal their rendering from benchmarks/results/,
the README stays a doorway, links stay inside the repository and resolve, prose carries no commit
hashes; and the demo's result (benchmarks/demo_result.py) is written from a finished study and
rendered, or rendered as "not yet measured" when there is none."""

from __future__ import annotations

import json
import re
import shlex
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import demo_result  # noqa: E402
import render  # noqa: E402

DOCS = render.markdown_files()
# Markdown links and images: [text](target) / ![alt](target "title")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# a git hash as git prints it: 7-40 lowercase hex digits with at least one letter and one digit
HASH = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/-])")


def prose(text: str) -> str:
    """``text`` without its rendered blocks (the hand-written part)."""
    return render.BLOCK.sub("", text)


def links(path: Path) -> list[str]:
    return LINK.findall(path.read_text())


def test_the_docs_exist_and_have_rendered_blocks() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    for page in ("README.md", "docs/studies.md", "docs/results/index.md", "docs/results/head-to-head.md"):
        assert page in names
    blocks = [m["name"] for p in DOCS for m in render.BLOCK.finditer(p.read_text())]
    assert "h2h-summary" in blocks and "demo-line" in blocks
    assert set(blocks) <= set(render.RENDERERS)


def test_committed_markdown_equals_its_rendering_from_the_results() -> None:
    stale = render.differences()
    assert not stale, (
        f"{', '.join(str(p.relative_to(ROOT)) for p in stale)} differ from their rendering from "
        "benchmarks/results/: run `python benchmarks/render.py` and commit the result"
    )


def test_readme_is_a_doorway_of_at_most_200_lines() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_stay_inside_the_repository_and_resolve(path: Path) -> None:
    for target in links(path):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):  # https:, mailto:, an anchor on the page
            continue
        assert "../" not in target, f"{path.name}: link {target!r} climbs out of its folder"
        resolved = (path.parent / target.split("#", 1)[0]).resolve()
        assert resolved.is_relative_to(ROOT), f"{path.name}: link {target!r} leaves the repository"
        assert resolved.exists(), f"{path.name}: link {target!r} points to nothing"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_prose_carries_no_commit_hashes(path: Path) -> None:
    found = HASH.findall(prose(path.read_text()))
    assert not found, f"{path.name}: commit-hash-looking tokens in prose {found}; results carry provenance in JSON"


def examples(path: Path) -> list[list[str]]:
    """The arguments of every ``autocompress`` command in the page's bash blocks (continuation lines
    joined, comments dropped)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            match = re.search(r"(?:^\$A|autocompress\)?|\.venv/bin/autocompress)\s+([a-z].*)", line.split(" #")[0])
            if match and not line.startswith(("make", "A=")):
                out.append(shlex.split(match[1]))
    return out


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_autocompress_example_is_accepted_by_the_cli(path: Path) -> None:
    """Each example's verb and flags parse with this tree's CLI (nothing runs)."""
    from autocompress_opt.cli import build_parser

    for args in examples(path):
        try:
            build_parser().parse_args(args)
        except SystemExit:
            pytest.fail(f"{path.name}: `autocompress {shlex.join(args)}` is refused by the CLI")


def test_the_example_reader_finds_commands() -> None:
    found = examples(ROOT / "README.md")
    assert ["prune", "--from-study", "smollm2-weights.h100-sxm", "--out", "out/best-h100"] in found
    assert sum(len(examples(p)) for p in DOCS) >= 40


def test_the_hash_and_link_patterns_catch_what_they_should() -> None:
    text = "measured at 665d7a5 (see [x](../shared/DESIGN.md)); 1,234,567 tokens, a decade, sha deadbeef"
    assert HASH.findall(text) == ["665d7a5"]
    assert LINK.findall(text) == ["../shared/DESIGN.md"]
    assert prose("a <!-- render:demo -->\nat 665d7a5\n<!-- /render:demo --> b") == "a  b"


def test_render_rewrites_a_stale_block_and_check_fails_with_a_diff(tmp_path: Path, capsys) -> None:
    (tmp_path / "docs").mkdir()
    page = "# t\n\n<!-- render:demo-line -->\nstale number 42\n<!-- /render:demo-line -->\n"
    (tmp_path / "README.md").write_text(page)
    assert render.main(["--check"], root=tmp_path) == 1
    out = capsys.readouterr().out
    assert "-stale number 42" in out and "README.md (rendered)" in out
    assert (tmp_path / "README.md").read_text() == page  # --check changes nothing
    assert render.main([], root=tmp_path) == 0
    assert "stale number 42" not in (tmp_path / "README.md").read_text()
    assert render.main(["--check"], root=tmp_path) == 0


def test_an_unknown_block_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown rendered block 'h2h-sumary'; known: .*h2h-summary"):
        render.render_text("<!-- render:h2h-sumary -->\n<!-- /render:h2h-sumary -->", "x.md")


def test_without_a_demo_json_the_demo_is_not_yet_measured(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    assert render.NOT_MEASURED in render.demo()
    assert render.NOT_MEASURED in render.demo_line()


def test_the_head_to_head_summary_has_one_row_per_target() -> None:
    summary = json.loads((ROOT / "benchmarks" / "results" / "head_to_head.json").read_text())
    rows = [line for line in render.h2h_summary().splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + len(summary["targets"])  # the header and one row per target
    first = summary["targets"][0]
    searched = first["arms"]["searched"]
    if "quality_split" in summary:  # on the test split: the searched KL after recovery, then paired intervals
        assert f"| {searched['kl_after']['mean']:.2f} | minitron " in rows[1]
        assert "95 % CI paired over test rows" in rows[0]
    else:
        assert f"{searched['kl_before']:.2f} / " in rows[1]


# ------------------------------------------------------------------------------ the demo's result
def test_timings_parse_and_bad_ones_are_refused() -> None:
    assert demo_result.parse_timing("study_run=812.5") == ("study_run", 812.5)
    for bad in ("study_run", "=3", "plot=-1", "plot=fast", "plot=nan"):
        with pytest.raises(Exception, match="PHASE=SECONDS"):
            demo_result.parse_timing(bad)


def test_code_version_outside_a_git_checkout_is_the_package_version(tmp_path: Path) -> None:
    assert demo_result.code_version(tmp_path).startswith("autocompress-opt ")
    assert re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?|.*-g[0-9a-f]+(-dirty)?", demo_result.code_version(ROOT))


def test_machine_names_cores_cpu_and_memory() -> None:
    m = demo_result.machine()
    assert m["cores"] >= 1 and m["cpu_model"] and (m["memory_gib"] is None or m["memory_gib"] > 0)


def test_a_failed_phase_stops_the_demo_with_its_exit_code_and_writes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(f"name: bad\nmodel: smollm2-135m\ntrials: 2\nmode: plann\nstorage: sqlite:///{tmp_path}/b.db\n")
    out = tmp_path / "demo.json"
    code = demo_result.main(["run", "--config", str(config), "--plots", str(tmp_path), "--out", str(out)])
    assert code == 2  # `study run` refuses a bad option with exit code 2
    assert not out.exists()


@pytest.mark.slow
def test_the_demo_runs_times_its_phases_and_records_the_study(tmp_path: Path, monkeypatch) -> None:
    """A tiny plan-mode study group run as the demo runs its own: the JSON holds each phase's time,
    per target the trial counts and the best feasible trial as `study show` reads it, and renders."""
    config = tmp_path / "tiny.yaml"
    config.write_text(
        textwrap.dedent(f"""\
            model: smollm2-135m
            targets: rtx5070:in-game,b200:datacenter
            mode: plan
            trials: 4
            name: tiny
            storage: sqlite:///{tmp_path}/tiny.db
            """)
    )
    out = tmp_path / "results" / "demo.json"
    assert (
        demo_result.main(["run", "--config", str(config), "--plots", str(tmp_path / "plots"), "--out", str(out)]) == 0
    )
    result = json.loads(out.read_text())
    assert set(result["timings_s"]) == {"study_run", "study_show", "plot", "total"}
    phases = [result["timings_s"][k] for k in ("study_run", "study_show", "plot")]
    assert all(t > 0 for t in phases) and result["timings_s"]["total"] == pytest.approx(sum(phases), abs=0.2)
    assert result["machine"]["cores"] >= 1 and result["code_version"]
    assert [t["hardware"] for t in result["targets"]] == ["rtx5070", "b200"]
    # when things happened, in seconds from the start of `study run`: within that phase
    assert 0 < result["first_trial_s"] <= result["timings_s"]["study_run"]
    for target in result["targets"]:
        assert 0 <= target["prepared_s"] <= target["first_trial_s"] <= result["timings_s"]["study_run"]
        assert 0 <= target["preparation_s"] <= target["prepared_s"]
    assert result["first_trial_s"] == min(t["first_trial_s"] for t in result["targets"])

    from autocompress_opt.search.study.studyio import load_group

    views = {v.target["hardware"]: v for v in load_group("tiny", f"sqlite:///{tmp_path}/tiny.db")}
    for target in result["targets"]:
        view = views[target["hardware"]]
        assert sum(target["trials"].values()) == len(view.records) and target["trials"].get("COMPLETE") == 4
        best = view.best_feasible()
        assert (target["best"] or {}).get("trial") == (best.number if best else None)
        if best:
            assert target["best"]["quality"] == best.quality and target["best"]["kl_to_parent"] is None  # plan mode
    assert list((tmp_path / "plots").glob("tiny-pareto.png"))

    monkeypatch.setattr(render, "RESULTS", out.parent)
    page = render.demo()
    assert render.NOT_MEASURED not in page and "rtx5070 in-game" in page and result["code_version"] in page
    assert f"{result['machine']['cores']} cores" in render.demo_line() and "first trial" in render.demo_line()
    assert "prepared at" in page


def test_the_demo_records_and_renders_how_far_a_best_points_widths_spread() -> None:
    from dataclasses import replace

    from autocompress_opt.arch.catalog import load_architecture

    parent = load_architecture("smollm2-135m")
    uniform = demo_result.width_spread(parent)
    assert (uniform["layers"], uniform["ffn_min"], uniform["ffn_max"], uniform["ffn_distinct"]) == (30, 1536, 1536, 1)
    assert render._spread(uniform) == "uniform (30 attention / 30 FFN of 30 layers)"
    layers = list(parent.layers)
    layers[0] = replace(layers[0], ffn_width=512)
    layers[1] = replace(layers[1], ffn=False, ffn_width=0)
    layers[2] = replace(layers[2], attention=False, num_heads=0, num_kv_heads=0, head_dim=0, ffn=False, ffn_width=0)
    spread = demo_result.width_spread(replace(parent, layers=tuple(layers)))
    assert spread["ffn_widths"][:3] == [512, 0, 0] and spread["layers"] == 29
    assert render._spread(spread) == "FFN 512..1536 (2 widths), 29 attention / 28 FFN of 29 layers"
    assert render._spread(None) == "—"
