"""Deterministic single-edit mutants of a Python function body (mutation testing, by token).

Each mutant changes one token of the canonical solution so that the code still parses but
(almost always) computes something else:

=================  ==================================================
kind               edit
=================  ==================================================
``comparison``     ``<`` ↔ ``>=``, ``<=`` ↔ ``>``, ``==`` ↔ ``!=``
``arithmetic``     ``+`` ↔ ``-``, ``*`` ↔ ``/``, ``//`` ↔ ``%``, ``**`` → ``*``, ``+=`` ↔ ``-=``
``boolean``        ``and`` ↔ ``or``, ``True`` ↔ ``False``, drop a ``not``, ``is`` → ``is not``,
                   ``in`` → ``not in`` (a membership test, not a ``for`` loop's ``in``)
``off-by-one``     an integer literal ``n`` → ``n + 1`` (``n - 1`` for n > 1)
``call-swap``      ``min`` ↔ ``max``, ``lower`` ↔ ``upper``, ``set`` → ``list``, ``len`` ↔ ``sum``, ...
``string``         ``' '`` ↔ ``''``, ``'0'`` ↔ ``'1'`` (either quote)
``return-name``    ``return x`` → ``return y``: x and y parameters or assigned names
=================  ==================================================

Comparisons are negated rather than nudged (``<`` → ``>=``, not ``<=``) so that a mutant rarely
behaves like the original. No mutant is executed: "wrong" means "differs from the canonical
solution by an edit of these kinds", which is what a log-likelihood choice between them tests.
"""

from __future__ import annotations

import ast
import io
import keyword
import token
import tokenize
from dataclasses import dataclass

__all__ = ["Mutant", "mutants"]

_KIND_OF = {
    "<": "comparison",
    ">=": "comparison",
    "<=": "comparison",
    ">": "comparison",
    "==": "comparison",
    "!=": "comparison",
    "+": "arithmetic",
    "-": "arithmetic",
    "*": "arithmetic",
    "/": "arithmetic",
    "//": "arithmetic",
    "%": "arithmetic",
    "**": "arithmetic",
    "+=": "arithmetic",
    "-=": "arithmetic",
    "and": "boolean",
    "or": "boolean",
    "True": "boolean",
    "False": "boolean",
}
_REPLACEMENT = {
    "<": ">=",
    ">=": "<",
    "<=": ">",
    ">": "<=",
    "==": "!=",
    "!=": "==",
    "+": "-",
    "-": "+",
    "*": "/",
    "/": "*",
    "//": "%",
    "%": "//",
    "**": "*",
    "+=": "-=",
    "-=": "+=",
    "and": "or",
    "or": "and",
    "True": "False",
    "False": "True",
}
_BINARY_ONLY = frozenset({"+", "-", "*", "/", "//", "%", "**"})  # "-x", "*args" and "%" in no other role are skipped
# One-way where the reverse is often a no-op: "list" -> "set" inside sorted(...) changes nothing
# when the items are already unique.
_CALL_SWAPS = {
    "min": "max",
    "max": "min",
    "lower": "upper",
    "upper": "lower",
    "any": "all",
    "all": "any",
    "startswith": "endswith",
    "endswith": "startswith",
    "isupper": "islower",
    "islower": "isupper",
    "ceil": "floor",
    "floor": "ceil",
    "set": "list",
    "len": "sum",
    "sum": "len",
    "sorted": "reversed",
    "reversed": "sorted",
    "isdigit": "isalpha",
    "isalpha": "isdigit",
}
_STRING_SWAPS = {
    "' '": "''",
    "''": "' '",
    '" "': '""',
    '""': '" "',
    "'0'": "'1'",
    "'1'": "'0'",
    '"0"': '"1"',
    '"1"': '"0"',
}
_OPERAND_KEYWORDS = frozenset({"True", "False", "None"})


@dataclass(frozen=True)
class Mutant:
    """A mutated body: ``body[where:]`` starts with ``after`` where the original had ``before``."""

    kind: str
    where: int
    before: str
    after: str
    body: str


def mutants(prompt: str, body: str) -> list[Mutant]:
    """Every single-edit mutant of ``body`` that parses after ``prompt`` and differs from ``body``.

    Pure and ordered by position in the body, so any seeded choice among them is reproducible.
    """
    source = prompt + body
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    line_starts = [0]
    for line in source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    context = _Context(tokens, _loop_ins(tokens), _local_names(source))
    found: list[Mutant] = []
    for i, tok in enumerate(tokens):
        start = line_starts[tok.start[0] - 1] + tok.start[1] - len(prompt)
        if start < 0:
            continue
        for kind, before, after in _edits(context, i):
            mutated = body[:start] + after + body[start + len(before) :]
            if mutated != body and _parses(prompt + mutated):
                found.append(Mutant(kind, start, before, after, mutated))
    return found


@dataclass(frozen=True)
class _Context:
    tokens: list[tokenize.TokenInfo]
    loop_ins: frozenset[int]  # indices of the "in" of for-loops and comprehensions
    locals_: list[str]


def _edits(context: _Context, i: int) -> list[tuple[str, str, str]]:
    """(kind, text replaced, replacement) for token ``i``; the replaced text starts at the token."""
    tokens = context.tokens
    tok, previous = tokens[i], _previous_significant(tokens, i)
    following = tokens[i + 1] if i + 1 < len(tokens) else None
    text = tok.string
    if tok.type == token.STRING and text in _STRING_SWAPS:
        return [("string", text, _STRING_SWAPS[text])]
    if tok.type not in (token.OP, token.NAME, token.NUMBER):
        return []
    if text in _KIND_OF:
        if text in _BINARY_ONLY and not _ends_operand(previous):
            return []  # a unary sign or a star-argument, not an arithmetic operator
        return [(_KIND_OF[text], text, _REPLACEMENT[text])]
    if text == "not" and following is not None and following.start == (tok.end[0], tok.end[1] + 1):
        return [("boolean", "not ", "")]  # "not x" -> "x", "a not in b" -> "a in b"
    if text == "is" and following is not None and following.string != "not":
        return [("boolean", "is", "is not")]
    if text == "in" and i not in context.loop_ins and (previous is None or previous.string != "not"):
        return [("boolean", "in", "not in")]
    if tok.type == token.NAME and text in _CALL_SWAPS:
        return [("call-swap", text, _CALL_SWAPS[text])]
    if tok.type == token.NUMBER and text.isdigit():
        value = int(text)
        return [("off-by-one", text, str(value - 1 if value > 1 else value + 1))]
    if (
        tok.type == token.NAME
        and text in context.locals_
        and previous is not None
        and previous.string == "return"
        and following is not None
        and following.type in (token.NEWLINE, token.COMMENT, token.ENDMARKER)
    ):
        return [("return-name", text, name) for name in context.locals_ if name != text][:1]
    return []


def _loop_ins(tokens: list[tokenize.TokenInfo]) -> frozenset[int]:
    """Indices of the ``in`` that belongs to a ``for`` (statement or comprehension) at its bracket depth."""
    depth, pending, found = 0, [], set()
    for i, tok in enumerate(tokens):
        if tok.string in ("(", "[", "{"):
            depth += 1
        elif tok.string in (")", "]", "}"):
            depth -= 1
        elif tok.string == "for" and tok.type == token.NAME:
            pending.append(depth)
        elif tok.string == "in" and pending and pending[-1] == depth:
            pending.pop()
            found.add(i)
    return frozenset(found)


def _previous_significant(tokens: list[tokenize.TokenInfo], i: int) -> tokenize.TokenInfo | None:
    for j in range(i - 1, -1, -1):
        if tokens[j].type not in (token.NL, token.NEWLINE, token.INDENT, token.DEDENT, token.COMMENT):
            return tokens[j]
    return None


def _ends_operand(tok: tokenize.TokenInfo | None) -> bool:
    """Whether an operator after ``tok`` is binary: ``tok`` closes an operand (``x``, ``2``, ``)``)."""
    if tok is None:
        return False
    if tok.type == token.NAME:
        return not keyword.iskeyword(tok.string) or tok.string in _OPERAND_KEYWORDS
    return tok.type in (token.NUMBER, token.STRING) or tok.string in (")", "]", "}")


def _local_names(source: str) -> list[str]:
    """Parameters and assigned names of the last top-level function in ``source``, in order of appearance."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    functions = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not functions:
        return []
    function = functions[-1]
    names = [a.arg for a in function.args.posonlyargs + function.args.args + function.args.kwonlyargs]
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and not keyword.iskeyword(node.id):
            names.append(node.id)
    return list(dict.fromkeys(names))


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True
