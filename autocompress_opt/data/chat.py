"""A chat document rendered as the model sees it, with nothing the user did not write.

Two renderings (``#template=`` on a ``--data`` spec; the choice is written in the data record):

- ``model`` (default): the tokenizer's chat template, *without the template's default system
  prompt*. Templates such as SmolLM2's and Qwen2.5's insert a system turn ("You are a helpful AI
  assistant named SmolLM, ...") into every conversation that has none; calibrating on it would
  weight the pruned model towards text the user never serves. :func:`injected_system_turn` finds
  that turn by rendering two probe conversations, ``[user]`` and ``[system, user]``: where the
  template writes its own text in the place of the given system content, it injects a default,
  and the turn around it (from its header to the user turn's header) is cut from every rendering
  of a conversation without a system message. A conversation with a system message is rendered as
  the template renders it.
- ``plain``: ``role: content`` paragraphs, for a tokenizer without a chat template.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from autocompress_opt.errors import ConfigError

__all__ = ["TEMPLATES", "chat_rendering", "injected_system_turn", "render_chat"]

TEMPLATES = ("model", "plain")
# Probe contents no template writes itself (control characters never appear in a template's text).
_USER, _SYSTEM = "\x02user-probe\x03", "\x02system-probe\x03"
_ROLE = "system"


def render_chat(messages: Sequence[dict[str, str]], tokenizer: Any, template: str = "model") -> str:
    """``messages`` (``{"role", "content"}``) as text: the model's template without its default
    system prompt, or ``plain`` paragraphs (module doc)."""
    if template == "plain":
        return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)
    _require_template(tokenizer)
    rendered = str(tokenizer.apply_chat_template(list(messages), tokenize=False))
    if any(m["role"] == _ROLE for m in messages):
        return rendered
    turn = injected_system_turn(tokenizer)
    if turn is None:
        return rendered
    head, injected = turn
    if rendered.startswith(head + injected):
        return head + rendered[len(head) + len(injected) :]
    return rendered.replace(injected, "", 1)


def chat_rendering(tokenizer: Any, template: str) -> dict[str, Any]:
    """The data record's entry for chat documents: the rendering, the template's SHA-256, and
    whether a default system turn was found in it (and so cut)."""
    if template == "plain":
        return {"template": "plain"}
    _require_template(tokenizer)
    turn = injected_system_turn(tokenizer)
    return {
        "template": "model",
        "chat_template_sha256": hashlib.sha256(str(tokenizer.chat_template).encode()).hexdigest(),
        "default_system_turn_removed": turn is not None,
    }


_PROBED: dict[str, tuple[str, str] | None] = {}  # chat template text -> its injected turn


def injected_system_turn(tokenizer: Any) -> tuple[str, str] | None:
    """``(text before it, the turn)`` when the tokenizer's chat template writes a system turn of its
    own into a conversation without one, else None. Raises :class:`ConfigError` when a default is
    injected but its turn cannot be told apart (then ``#template=plain`` is the way out)."""
    key = str(tokenizer.chat_template)
    if key not in _PROBED:
        _PROBED[key] = _probe(tokenizer)
    return _PROBED[key]


def _probe(tokenizer: Any) -> tuple[str, str] | None:
    render = lambda messages: str(tokenizer.apply_chat_template(messages, tokenize=False))
    alone = render([{"role": "user", "content": _USER}])
    given = render([{"role": _ROLE, "content": _SYSTEM}, {"role": "user", "content": _USER}])
    k = _common_prefix(alone, given)
    m = _common_prefix(alone[k:][::-1], given[k:][::-1])
    default, theirs = alone[k : len(alone) - m], given[k : len(given) - m]
    if theirs != _SYSTEM or not default:
        return None  # the template writes no text where a system message's content goes
    # The system turn: its header "X system Y" ends at k; the user turn's header "X user Y" ends
    # where the user's content begins. Cut from X (system) to X (user).
    role_at = alone.rfind(_ROLE, 0, k)
    user_at = alone.index(_USER)
    tail = alone[role_at + len(_ROLE) : k]
    user_header_end = user_at - len(tail)
    if role_at < 0 or alone[user_header_end:user_at] != tail or alone[user_header_end - 4 : user_header_end] != "user":
        raise ConfigError(
            f"the chat template of {getattr(tokenizer, 'name_or_path', '') or 'this tokenizer'!r} writes a default "
            "system prompt that could not be separated from the conversation; use #template=plain on the --data spec"
        )
    opener = _turn_opener(alone[:role_at], alone[: user_header_end - 4], tokenizer)
    start, end = role_at - len(opener), user_header_end - 4 - len(opener)
    return alone[:start], alone[start:end]


def _turn_opener(before_system: str, before_user: str, tokenizer: Any) -> str:
    """What opens a turn (``<|im_start|>``, ``<|start_header_id|>``): the longest common end of the
    texts before the two role names that begins at a special token (or is all the text before)."""
    n = _common_prefix(before_system[::-1], before_user[::-1])
    specials = [str(t) for t in getattr(tokenizer, "all_special_tokens", [])] + [
        str(t) for t in (getattr(tokenizer, "get_added_vocab", lambda: {})() or {})
    ]
    for size in range(n, 0, -1):
        opener = before_system[len(before_system) - size :]
        if size == len(before_system) or any(s and opener.startswith(s) for s in specials):
            return opener
    return ""


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _require_template(tokenizer: Any) -> None:
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ConfigError(
            f"chat rows need a chat template but the tokenizer {name!r} has no chat template; "
            "add #template=plain to the --data spec (role: content paragraphs), or use a model whose tokenizer has one"
        )
