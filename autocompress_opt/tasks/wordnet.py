"""A reader of the WordNet 3.0 database files, and the definition → word tasks built on it.

The files are parsed directly (no nltk), following ``wndb(5WN)``:

- ``data.<pos>``: ``offset lex_filenum ss_type w_cnt word lex_id [word lex_id...] p_cnt
  [ptr_symbol offset pos source/target...] [frames...] | gloss`` — ``w_cnt`` is two hex digits,
  ``lex_id`` one hex digit, ``p_cnt`` three decimal digits; license lines start with two spaces.
- ``index.<pos>``: ``lemma pos synset_cnt p_cnt [ptr_symbol...] sense_cnt tagsense_cnt
  synset_offset...`` — offsets are ordered by frequency in the SemCor corpus and the first
  ``tagsense_cnt`` are the senses seen there at least once.

Items use only *familiar* senses — a lemma's sense counts when it is among its ``tagsense_cnt``
SemCor-tagged senses — so a small model is asked about ``dog`` and ``sigh``, not ``dissilient``.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from autocompress_opt.tasks.items import Item

__all__ = [
    "Synset",
    "WordNet",
    "definition_item",
    "gold_word",
    "load_wordnet",
    "parse_wordnet_data",
    "parse_wordnet_index",
    "sister_words",
]

POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
_HYPERNYM = "@"  # "@i" (instance hypernym) is left out: its hyponyms are proper names
_ADJ_MARKER = re.compile(r"\((?:a|p|ip)\)$")  # syntactic marker on adjectives: "galore(ip)"
_PLAIN_WORD = re.compile(r"[a-z]{3,}")  # single lower-case word: no collocations, names or abbreviations
_N_CHOICES = 4
# Distractors are drawn first among words whose length is within this many letters of the gold
# word, so the length of a choice says little about which is right.
_LENGTH_SLACK = 3
_DRAWS = 64  # words drawn from a pool per item: enough for 3 close ones, cheap on a 9,000-word pool


@dataclass(frozen=True)
class Synset:
    """One synonym set: ``pos`` is n/v/a/r (adjective satellites ``s`` are folded into ``a``)."""

    offset: str
    pos: str
    lemmas: tuple[str, ...]
    hypernyms: tuple[str, ...]
    gloss: str

    @property
    def key(self) -> str:
        return f"{self.pos}:{self.offset}"


def parse_wordnet_data(lines: Iterable[str]) -> list[Synset]:
    """Synsets of one ``data.<pos>`` file; ``gloss`` keeps only the definition (examples dropped)."""
    synsets = []
    for line in lines:
        if not line.strip() or line.startswith("  "):  # license header
            continue
        fields, _, gloss = line.partition(" | ")
        tokens = fields.split()
        offset, ss_type, n_words = tokens[0], tokens[2], int(tokens[3], 16)
        lemmas = tuple(_ADJ_MARKER.sub("", tokens[4 + 2 * i]) for i in range(n_words))
        at = 4 + 2 * n_words
        n_pointers = int(tokens[at])
        pointers = [tokens[at + 1 + 4 * i : at + 5 + 4 * i] for i in range(n_pointers)]
        pos = "a" if ss_type == "s" else ss_type
        hypernyms = tuple(
            target for symbol, target, target_pos, _ in pointers if symbol == _HYPERNYM and target_pos == pos
        )
        synsets.append(Synset(offset, pos, lemmas, hypernyms, _definition(gloss)))
    return synsets


def _definition(gloss: str) -> str:
    """The definition part of a gloss: the ``;``-separated parts before the first quoted example."""
    parts = []
    for part in gloss.strip().split("; "):
        if part.lstrip().startswith('"'):
            break
        parts.append(part.strip())
    return "; ".join(parts).strip().rstrip(";").strip()


def parse_wordnet_index(lines: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """``index.<pos>`` → {lemma: offsets of its SemCor-tagged senses} (lemmas with none are left out)."""
    tagged = {}
    for line in lines:
        if not line.strip() or line.startswith("  "):
            continue
        tokens = line.split()
        n_synsets, n_pointers = int(tokens[2]), int(tokens[3])
        tag_count = int(tokens[5 + n_pointers])
        offsets = tokens[6 + n_pointers : 6 + n_pointers + n_synsets]
        if tag_count:
            tagged[tokens[0]] = tuple(offsets[:tag_count])
    return tagged


@dataclass(frozen=True)
class WordNet:
    """Synsets of every part of speech and the familiar (SemCor-tagged) senses of each lemma.

    ``familiar[pos][lemma]`` holds offsets; a (lemma, synset) pair is familiar when the synset's
    offset is there.
    """

    synsets: Mapping[str, Synset]  # by Synset.key
    familiar: Mapping[str, Mapping[str, frozenset[str]]]

    def is_familiar(self, lemma: str, synset: Synset) -> bool:
        return synset.offset in self.familiar[synset.pos].get(lemma.lower(), frozenset())

    def familiar_words(self, pos: str) -> tuple[str, ...]:
        """Plain single words with at least one familiar sense of ``pos``, sorted."""
        return tuple(sorted(w for w in self.familiar[pos] if _PLAIN_WORD.fullmatch(w)))

    @functools.cached_property
    def hyponyms(self) -> dict[str, tuple[Synset, ...]]:
        """{hypernym key: its hyponym synsets sorted by key}."""
        children: dict[str, list[Synset]] = {}
        for synset in self.synsets.values():
            for parent in synset.hypernyms:
                children.setdefault(f"{synset.pos}:{parent}", []).append(synset)
        return {k: tuple(sorted(v, key=lambda s: s.key)) for k, v in children.items()}


def load_wordnet(folder: Path) -> WordNet:
    """Parse ``data.*`` and ``index.*`` of all four parts of speech in ``folder``."""
    synsets: dict[str, Synset] = {}
    familiar: dict[str, dict[str, frozenset[str]]] = {}
    for pos, name in POS_FILES.items():
        with open(folder / f"data.{name}", encoding="utf-8", errors="replace") as handle:
            synsets.update((s.key, s) for s in parse_wordnet_data(handle))
        with open(folder / f"index.{name}", encoding="utf-8", errors="replace") as handle:
            familiar[pos] = {lemma: frozenset(offs) for lemma, offs in parse_wordnet_index(handle).items()}
    return WordNet(synsets, familiar)


def gold_word(wordnet: WordNet, synset: Synset) -> str | None:
    """The synset's first plain, familiar lemma whose definition does not give it away, or None."""
    for lemma in synset.lemmas:
        if _PLAIN_WORD.fullmatch(lemma) and wordnet.is_familiar(lemma, synset) and not _gives_away(lemma, synset.gloss):
            return lemma
    return None


def _gives_away(word: str, gloss: str) -> bool:
    """Whether the gloss contains the word or a word sharing its stem ("sigh" / "sighed", "abridge")."""
    for token in re.findall(r"[a-z]+", gloss.lower()):
        shared = len(_common_prefix(word, token))
        if shared == len(word) or shared == len(token) >= 4 or shared >= 5:
            return True
    return False


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _same_stem(a: str, b: str) -> bool:
    """Whether two words share a stem: one begins the other, or they share 5 leading letters."""
    shared = len(_common_prefix(a, b))
    return shared >= 5 or shared == min(len(a), len(b))


def definition_item(task: str, synset: Synset, word: str, pool: Sequence[str], rng: random.Random) -> Item | None:
    """An item "Definition: <gloss>\\nWord:" → `` word`` among 3 distractors from ``pool`` (sorted).

    Distractors are not lemmas of the synset (they would be right too) nor words of the gold
    word's stem ("parallel" / "parallelism"). They are drawn from up to :data:`_DRAWS` words of
    the pool, preferring those within :data:`_LENGTH_SLACK` letters of ``word``. None when fewer
    than 3 qualify.
    """
    drawn = [w for w in rng.sample(pool, min(len(pool), _DRAWS)) if w not in synset.lemmas and not _same_stem(w, word)]
    close = [w for w in drawn if abs(len(w) - len(word)) <= _LENGTH_SLACK]
    distractors = list(dict.fromkeys(close + drawn))[: _N_CHOICES - 1]
    if len(distractors) < _N_CHOICES - 1:
        return None
    choices = [f" {w}" for w in distractors]
    gold = rng.randrange(_N_CHOICES)
    choices.insert(gold, f" {word}")
    return Item(
        task=task,
        id=f"{task}/{synset.key}",
        context=f"Definition: {synset.gloss}\nWord:",
        choices=tuple(choices),
        gold=gold,
    )


def sister_words(wordnet: WordNet, synset: Synset, hyponyms: Mapping[str, Sequence[Synset]]) -> list[str]:
    """Plain familiar lemmas of the synset's sister terms (other hyponyms of any of its hypernyms)."""
    words: set[str] = set()
    for parent in synset.hypernyms:
        for sister in hyponyms.get(f"{synset.pos}:{parent}", ()):
            if sister.key == synset.key:
                continue
            words.update(w for w in sister.lemmas if _PLAIN_WORD.fullmatch(w) and wordnet.is_familiar(w, sister))
    return sorted(words)
