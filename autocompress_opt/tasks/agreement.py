"""Subject–verb agreement minimal pairs from reStructuredText prose (BLiMP-style).

:func:`prose_sentences` turns a reST document into plain sentences (directives that hold code,
literal blocks, tables, headings and field lists dropped; inline markup reduced to its text).
:func:`agreement_site` finds a verb whose number is fixed by a determiner + noun right before it,
and :func:`minimal_pair` flips that verb's number (``is`` ↔ ``are``).

A site is kept only when the determiner (or, after *the*, the noun's ending) agrees with the verb
as written: that the documentation is grammatical is the premise, so this check rejects the
cases where a flipped verb could still be right — a subjunctive "if the file *were*", "that" as
a conjunction ("shows that objects *are*"), "the following *are*".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "AgreementSite",
    "MinimalPair",
    "agreement_site",
    "flip_verb",
    "minimal_pair",
    "prose_sentences",
    "strip_markup",
]

_SINGULAR_VERBS = ("is", "was", "has", "does", "isn't", "wasn't", "hasn't", "doesn't")
_PLURAL_VERBS = ("are", "were", "have", "do", "aren't", "weren't", "haven't", "don't")
_FLIP = {**dict(zip(_SINGULAR_VERBS, _PLURAL_VERBS)), **dict(zip(_PLURAL_VERBS, _SINGULAR_VERBS))}
_SINGULAR_DETERMINERS = frozenset({"a", "an", "this", "that", "each", "every", "another", "either", "neither"})
_PLURAL_DETERMINERS = frozenset({"these", "those", "both", "many", "several", "few"})
# Function words that can sit between a determiner and a verb without being its subject's noun.
_NOT_NOUNS = frozenset(
    {
        "that",
        "which",
        "who",
        "whom",
        "whose",
        "what",
        "it",
        "its",
        "there",
        "this",
        "these",
        "those",
        "they",
        "he",
        "she",
        "we",
        "you",
        "also",
        "not",
        "only",
        "then",
        "now",
        "one",
        "ones",
        "same",
        "other",
        "others",
        "following",
        "former",
        "latter",
        "rest",
        "number",
        "majority",
        "data",
        "media",
        "criteria",
    }
)  # Latin plurals used as singulars
_VERB_PATTERN = "|".join(re.escape(v) for v in sorted(_FLIP, key=len, reverse=True))
# determiner, optional modifier, noun, verb: "The (return) value is", "each (new) thread has". A
# lookahead, so that candidates may overlap ("a few bytes are" is tried at "a" and at "few").
_SITE = re.compile(
    rf"(?=\b(?P<det>[A-Za-z]+)\s+(?:(?P<mod>[a-z]+)\s+)?(?P<noun>[a-z]{{3,}})\s+(?P<verb>{_VERB_PATTERN})\b)"
)

MIN_WORDS, MAX_WORDS = 6, 40
# Directives whose content is prose; the content of any other directive (code-block, doctest,
# productionlist, tables, toctree...) is skipped.
_PROSE_DIRECTIVES = frozenset(
    {
        "note",
        "warning",
        "seealso",
        "versionadded",
        "versionchanged",
        "deprecated",
        "deprecated-removed",
        "function",
        "method",
        "class",
        "attribute",
        "data",
        "exception",
        "decorator",
        "classmethod",
        "staticmethod",
        "decoratormethod",
        "coroutinefunction",
        "coroutinemethod",
        "abstractmethod",
        "describe",
        "impl-detail",
        "admonition",
        "important",
        "tip",
        "caution",
        "attention",
        "hint",
        "topic",
        "opcode",
        "cmdoption",
        "option",
        "envvar",
        "c:function",
        "c:macro",
        "c:type",
        "c:member",
        "c:var",
    }
)
_DIRECTIVE = re.compile(r"^\s*\.\.\s+([\w:-]+)::")
_FIELD = re.compile(r"^\s*:[\w ()-]+:(\s|$)")  # ":param x:", ":synopsis:" (but not a role ":mod:`x`")
_UNDERLINE = re.compile(r"^\s*([=\-~^\"'`#*+.:_])\1{2,}\s*$")
_TABLE_BORDER = re.compile(r"^\s*={2,}(?: +={2,})+\s*$")  # "=====  ======" of a simple table
_LIST_MARKER = re.compile(r"^(?:[*+-]|#\.|\d+\.|\([a-z0-9]\))\s+")
_PLAIN = re.compile(r"[A-Za-z0-9 ,.;:'\"()?!-]+")  # what a kept sentence may contain after stripping
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.")


def strip_markup(text: str) -> str:
    """Inline reST reduced to its text: ``:func:`~os.path.join``` → ``join``, ``*x*`` → ``x``, links → text."""
    text = re.sub(r"\[#?[\w-]*\]_", "", text)  # footnote refs
    text = re.sub(r":[\w:+-]+:`!?~?([^`<]*?)\s*<[^`>]*>`", r"\1", text)  # :ref:`text <target>`
    text = re.sub(r":[\w:+-]+:`!?~([^`]*)`", lambda m: m.group(1).rsplit(".", 1)[-1], text)
    text = re.sub(r":[\w:+-]+:`!?([^`]*)`", r"\1", text)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r"`([^`<]*?)\s*<[^`>]*>`__?", r"\1", text)  # `text <url>`_
    text = re.sub(r"`([^`]+)`__?", r"\1", text)
    text = re.sub(r"`([^`]+)`", r"\1", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", text)
    text = re.sub(r"\*([^*\s][^*]*)\*", r"\1", text)
    text = text.replace("\\ ", "").replace("\\", "")
    text = re.sub(r"\s+", " ", text)
    return re.sub(r" ([.,;:])(?=\s|$)", r"\1", text).strip()  # "path [#f1]_." left "path ."


def _paragraphs(text: str) -> Iterator[str]:
    """Prose paragraphs of a reST document (raw inline markup, lines joined)."""
    lines = text.splitlines()
    skip_deeper_than: int | None = None  # skipping a block indented more than this
    table_borders = 0  # inside a simple table: the borders seen so far
    paragraph: list[str] = []
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if _TABLE_BORDER.match(line):
            yield from _flush(paragraph)
            table_borders += 1
            continue
        if table_borders:  # it ends at the first blank line right after its second or later border
            if not line.strip() and table_borders >= 2 and _TABLE_BORDER.match(lines[i - 1]):
                table_borders = 0
            continue
        if skip_deeper_than is not None:
            if not line.strip() or indent > skip_deeper_than:
                continue
            skip_deeper_than = None
        if not line.strip():
            yield from _flush(paragraph)
            continue
        directive = _DIRECTIVE.match(line)
        next_line = lines[i + 1] if i + 1 < len(lines) else ""
        if (
            directive
            or _FIELD.match(line)
            or _UNDERLINE.match(line)
            or _UNDERLINE.match(next_line)
            or line.lstrip().startswith(("..", ">>>", "|", "+-", "+="))
        ):
            yield from _flush(paragraph)
            if directive is None or directive.group(1) not in _PROSE_DIRECTIVES:
                skip_deeper_than = indent  # its content (code, options, table, comment) goes too
            continue
        paragraph.append(_LIST_MARKER.sub("", line.strip()))
        if line.rstrip().endswith("::"):  # a literal block follows
            yield from _flush(paragraph)
            skip_deeper_than = indent
    yield from _flush(paragraph)


def _flush(paragraph: list[str]) -> Iterator[str]:
    if paragraph:
        yield " ".join(paragraph)
        paragraph.clear()


def prose_sentences(text: str) -> Iterator[str]:
    """Plain sentences of a reST document: 6–40 words, capitalised, ending in ``.``, no code characters."""
    for paragraph in _paragraphs(text):
        plain = strip_markup(paragraph)
        for abbreviation in _ABBREVIATIONS:
            plain = plain.replace(abbreviation + " ", abbreviation + "\x00")
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z])", plain):
            sentence = sentence.replace("\x00", " ").strip()
            if (
                MIN_WORDS <= len(sentence.split()) <= MAX_WORDS
                and sentence[0].isupper()
                and sentence.endswith(".")
                and _PLAIN.fullmatch(sentence)
                and not re.search(r"\w\.\w|\(\)", sentence)
            ):
                yield sentence


def flip_verb(verb: str) -> str:
    """The same verb in the other number: ``is`` → ``are``, ``doesn't`` → ``don't``."""
    return _FLIP[verb]


def _is_plural_noun(noun: str) -> bool:
    return noun.endswith("s") and not noun.endswith(("ss", "us", "is"))


@dataclass(frozen=True)
class AgreementSite:
    """Where the verb is in a sentence: ``sentence[start:end] == verb``."""

    start: int
    end: int
    verb: str


def agreement_site(sentence: str) -> AgreementSite | None:
    """The first verb whose number a determiner (+ modifier) + noun right before it fixes, or None."""
    for match in _SITE.finditer(sentence):
        det, mod, noun, verb = match["det"].lower(), match["mod"], match["noun"], match["verb"]
        if noun in _NOT_NOUNS or mod in _NOT_NOUNS or mod in _FLIP:
            continue
        plural_verb = verb in _PLURAL_VERBS
        if det in _SINGULAR_DETERMINERS:
            agrees = not plural_verb
        elif det in _PLURAL_DETERMINERS:
            agrees = plural_verb
        elif det == "the":
            agrees = plural_verb == _is_plural_noun(noun)
        else:
            continue
        if agrees and match.start("verb") > 0:
            return AgreementSite(match.start("verb"), match.end("verb"), verb)
    return None


@dataclass(frozen=True)
class MinimalPair:
    """A sentence split at its agreement site: ``context + grammatical`` is the sentence itself.

    Both continuations are ``" " + verb + rest`` and differ only in the verb's number; the context
    never ends in whitespace. ``plural`` tells the number of the grammatical verb.
    """

    context: str
    grammatical: str
    flipped: str
    plural: bool


def minimal_pair(sentence: str) -> MinimalPair | None:
    """The :class:`MinimalPair` of the sentence's first agreement site, or None when it has none."""
    site = agreement_site(sentence)
    if site is None:
        return None
    context, rest = sentence[: site.start].rstrip(), sentence[site.end :]
    return MinimalPair(context, f" {site.verb}{rest}", f" {flip_verb(site.verb)}{rest}", site.verb in _PLURAL_VERBS)
